"""Question split: deterministic, order-free, close to the requested fraction, disjoint."""
import gzip
import json

import pytest

from realm_tf.data import question_split


def test_split_fraction_and_determinism():
    with gzip.open("data/open_qa/qa_qed_train.jsonl.gz", "rt") as f:
        ids = [json.loads(line)["id"] for line in f]
    dev = [i for i in ids if question_split.is_dev(i, 0.1)]
    assert abs(len(dev) / len(ids) - 0.1) < 0.015
    assert dev == [i for i in reversed(ids) if question_split.is_dev(i, 0.1)][::-1]  # order-free
    assert set(dev) <= {i for i in ids if question_split.is_dev(i, 0.2)}  # nested as the fraction grows
    assert not any(question_split.is_dev(i, 0.0) for i in ids)
    with pytest.raises(ValueError):
        question_split.is_dev("x", 1.5)
