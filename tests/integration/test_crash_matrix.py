"""The crash matrix (``benchmarks/crash_matrix.py``) at test size: its invariant checks catch what they must, and
``preprocess`` SIGKILLed mid-run leaves the previous corpus readable and a rerun that finishes clean."""
import json
import os
import pathlib
import shutil
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import crash_matrix  # noqa: E402  (benchmarks/)

from realm_tf import artifacts  # noqa: E402


def _version(root, number, payload):
    with artifacts.staged(str(root / str(number)), artifacts.INDEX) as staging:
        (pathlib.Path(staging.path) / "embeddings.npy").write_bytes(payload)
        staging.metadata = {"version": number}


def test_the_checks_flag_a_damaged_version_a_lost_version_and_a_failed_reader(tmp_path):
    root = tmp_path / "index"
    _version(root, 1, b"one")
    reads = []
    writer = crash_matrix.Writer("w", lambda t: [], lambda t: None, lambda t: reads.append(t))
    before = crash_matrix.complete_artifacts(str(tmp_path))
    assert crash_matrix.check(str(tmp_path), before, writer) == {"intact": "", "newest": "", "readable": ""}
    _version(root, 2, b"two")  # a new complete version: fine
    assert not any(crash_matrix.check(str(tmp_path), before, writer).values())
    (root / "2" / "embeddings.npy").write_bytes(b"tw")  # torn
    assert "truncated" in crash_matrix.check(str(tmp_path), before, writer)["intact"]
    shutil.rmtree(root / "2")
    shutil.rmtree(root / "1")  # the version served before is gone, nothing newer
    assert "no complete version left" in crash_matrix.check(str(tmp_path), before, writer)["newest"]

    def fail(trial):
        raise OSError("cannot load")

    broken = crash_matrix.Writer("w", lambda t: [], lambda t: None, fail)
    assert "cannot load" in crash_matrix.check(str(tmp_path), before, broken)["readable"]
    assert not crash_matrix.check(str(tmp_path), {}, broken)["readable"]  # nothing was ever published to read
    (tmp_path / ".staging-x-1").mkdir()
    assert crash_matrix.leftovers(str(tmp_path)) == [".staging-x-1"]
    points = crash_matrix.kill_points(10, 4, seed=0)
    assert points == crash_matrix.kill_points(10, 4, seed=0) and points == sorted(points)
    assert all(0 <= p < 10 for p in points) and len(set(points)) > 1  # spread over the write events


@pytest.mark.slow
def test_preprocess_killed_mid_run_keeps_the_previous_corpus(pretraining_workspace, tmp_path):
    corpus = os.path.join(pretraining_workspace, "corpus.jsonl")

    def seed(trial):
        shutil.copytree(os.path.join(pretraining_workspace, "blocks"), os.path.join(trial, "blocks"))

    def read(trial):
        from realm_tf.data import block_store

        block_store.BlockStore.load(os.path.join(trial, "blocks", "blocks-*.tfrecord*"))

    writer = crash_matrix.Writer(
        "preprocess", lambda t: ["preprocess", "--config", "configs/tiny.yaml", "--input", corpus, "--output",
                                 os.path.join(t, "blocks"), "--overwrite", "--progress-interval", "0"], seed, read)
    result = crash_matrix.run_writer(writer, str(tmp_path), points=2, seed=0)
    assert len(result["rows"]) == 2 and result["events"] > 0
    for row in result["rows"]:
        assert not any(row[k] for k in crash_matrix.INVARIANTS), json.dumps(row)
