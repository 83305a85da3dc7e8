"""``realm-tf demo``: the whole loop (corpus, data jobs, pre-training, index, reader, fine-tuning, evaluation,
export, questions) on the tiny config, in a separate process (its stages in that one process)."""
import json
import os
import subprocess
import sys

import pytest

from realm_tf import config


def _run(*args):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "realm_tf.cli", *args], capture_output=True, text=True, env=env,
                          timeout=900)


@pytest.mark.slow
def test_demo_runs_the_whole_loop_on_the_tiny_config(tmp_path):
    work = tmp_path / "demo"
    # --one-process: the same stages, called in this child instead of one child each (a TensorFlow start each);
    # the child-process runner make demo uses is tested in tests/test_cli.py.
    result = _run("demo", "--config", "configs/tiny.yaml", "--workdir", str(work), "--questions", "40",
                  "--pretrain-steps", "2", "--finetune-steps", "4", "--reader-steps", "2", "--squad-paragraphs", "4",
                  "--one-process", "--minutes", "1")
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    for name in ("corpus", "preprocess", "pretraining-data", "init-retriever", "index", "pretrain", "train-reader",
                 "finetune", "evaluate", "export", "ask"):
        assert f"] {name}:" in result.stdout and f"=== {name} done" in result.stdout, name
    *_, scores, nq_open = result.stdout.strip().splitlines()
    assert scores.startswith("EM ") and "accuracy@5" in scores
    metrics = json.loads((work / "metrics.json").read_text())
    short = metrics["short_answers"]
    assert nq_open == (f"on NQ-open's {short['num_questions']} questions (an answer of at most 5 tokens, as REALM's "
                       f"NQ): EM {short['exact_match']:.3f}  F1 {short['f1']:.3f}")
    assert metrics["num_questions"] > 0 and 0 <= metrics["exact_match"] <= 1
    assert (work / "params.yaml").exists() and (work / "served" / "realm_qa.json").exists()
    params = config.load_config(str(work / "params.yaml"))
    assert params.pretrain.precision == params.reader.precision == params.finetune.precision  # --precision
    assert 'model_checkpoint_path: "ckpt-2"' in (work / "reader" / "checkpoints" / "checkpoint").read_text()
    assert "SQuAD questions for the reader warm start" in result.stdout
    # A one-minute budget is spent before the warm start on any machine, which then gets its floor of one minute
    # (its 2 steps take less).
    assert "(at most 1 min)" in result.stdout
    # The warm start read every bundled NQ training question on the whole bundled corpus, preprocessed for reading
    # only: the index holds the demo's own corpus.
    reading = json.loads((work / "reading_blocks" / "manifest.json").read_text())
    indexed = json.loads((work / "blocks" / "manifest.json").read_text())
    assert reading["blocks"] > indexed["blocks"]
    assert "qa_qed_train.jsonl.gz" in result.stderr and "SQuAD + every bundled NQ training question" in result.stdout
    # Pre-training kept the retriever frozen, so fine-tuning read the first index (no refresh was built).
    from realm_tf.index import index_publisher  # pylint: disable=import-outside-toplevel
    assert len(index_publisher.complete_versions(str(work / "index"))) == 1
    assert "A: " in result.stdout  # the sample questions were answered
