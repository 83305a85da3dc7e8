"""A tiny REALM workspace for the pre-training tests: real bundled passages run through the real data jobs."""
import gzip
import itertools
import os

import pytest

from realm_tf import cli

TINY = "configs/tiny.yaml"


@pytest.fixture(scope="session")
def workspace_overrides():
    """``overrides(root, shared)``: a tiny config on the shared blocks/examples, per-test index/export/model."""
    return lambda root, shared: [f"data.blocks_dir={shared}/blocks", f"data.pretraining_dir={shared}/pretraining",
            f"index.index_dir={root}/index", f"refresh.export_dir={root}/export", f"trainer.model_dir={root}/model",
            "data.batch_size=2", "data.shuffle_buffer=8", "trainer.warmup_steps=0", "trainer.eval_examples=4",
            "refresh.poll_seconds=0.2"]


@pytest.fixture(scope="session")
def pretraining_workspace(tmp_path_factory):
    """``(shared_dir)`` holding ``blocks/`` (80 passages) and ``pretraining/`` (salient-span examples)."""
    shared = tmp_path_factory.mktemp("realm_shared")
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt") as f:
        lines = list(itertools.islice(f, 80))
    with open(shared / "corpus.jsonl", "w") as f:
        f.writelines(lines)
    sets = ["--set", f"data.blocks_dir={shared}/blocks", "--set", f"data.pretraining_dir={shared}/pretraining"]
    assert cli.main(["preprocess", "--config", TINY, *sets, "--input", str(shared / "corpus.jsonl"),
                     "--output", str(shared / "blocks")]) == 0
    assert cli.main(["generate-pretraining-data", "--config", TINY, *sets]) == 0
    assert os.listdir(shared / "pretraining")
    return shared


@pytest.fixture(scope="session")
def read_scalars():
    """``read(logdir) -> {tag: [(step, value), ...]}`` of the TensorBoard scalars under ``logdir``."""
    return _read_scalars


def _read_scalars(logdir):
    import glob

    import tensorflow as tf

    out = {}
    for path in sorted(glob.glob(os.path.join(str(logdir), "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return {k: sorted(v) for k, v in out.items()}
