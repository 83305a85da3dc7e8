"""The refactorings of issue #17 changed no behaviour: on the tiny config the blocks and pre-training examples
are byte-identical, and the block embeddings, retrievals, pre-training losses and Open-QA predictions equal the
values recorded before them (``behaviour_before.json``, written by ``behaviour_fingerprint.py`` at commit
84193a5, before the Task protocol)."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import behaviour_fingerprint  # noqa: E402  (next to this file; tests are not a package)

pytestmark = pytest.mark.slow  # the whole loop, seeded: `make test-fast` skips it

BEFORE = os.path.join(os.path.dirname(__file__), "behaviour_before.json")


def _assert_same(got, want, where="values"):
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5, err_msg=where)
    else:
        assert got == want, where


def test_outputs_equal_the_values_recorded_before_the_refactoring(tmp_path, pretraining_workspace):
    with open(BEFORE, encoding="utf-8") as f:
        before = json.load(f)
    # The shared workspace is `preprocess` + `generate-pretraining-data` of the same 80 passages: its files are
    # hashed against the recorded values, not made a second time.
    _assert_same(behaviour_fingerprint.fingerprint(str(tmp_path), data=str(pretraining_workspace)), before)
