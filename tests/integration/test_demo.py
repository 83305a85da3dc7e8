"""``realm-tf demo``: the whole loop (corpus, data jobs, pre-training, index, reader, fine-tuning, evaluation,
export, questions) on the tiny config, in a separate process (its stages in that one process), and its plan:
the same steps on every machine, nothing bound by the clock."""
import json
import os
import shlex
import subprocess
import sys

import pytest

from realm_tf import config
from realm_tf import demo
from realm_tf import process_settings


def _run(*args, cwd=None):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "realm_tf.cli", *args], capture_output=True, text=True, env=env,
                          timeout=900, cwd=cwd)


@pytest.mark.parametrize("native_bfloat16", [False, True])
def test_the_plan_trains_every_section_for_its_steps_with_no_clock(tmp_path, monkeypatch, native_bfloat16):
    """Every training section of the demo's plan runs its steps: no minute limit, no budget-bound schedule; the
    same steps on any machine, and float32 but for the reader warm start on a CPU that multiplies bfloat16."""
    monkeypatch.setattr(process_settings, "native_bfloat16", lambda: native_bfloat16)
    cfg = config.load_config("configs/minilm.yaml")
    work = str(tmp_path / "demo")
    for item in demo._overrides(work, 2, 20, 800, 128, 0, "auto"):  # noqa: SLF001  (the plan's own settings)
        cfg = config.apply_override(cfg, item)
    options = {"num_questions": 800, "squad_paragraphs": None, "reader_batch_size": 8, "samples": 3,
               "reading_blocks": demo.reading_cache(cfg, str(tmp_path / "cache")), "pretrain_batch_size": 1,
               "finetune_batch_size": 1}
    trained = 0
    reader_precision = "mixed_bfloat16" if native_bfloat16 else "float32"
    for stage in demo.plan(cfg, work, str(tmp_path / "params.yaml"), options):
        for call in stage.calls:
            section_cfg = call.kwargs.get("cfg")
            if section_cfg is None:
                continue
            for section in (section_cfg.pretrain, section_cfg.reader, section_cfg.finetune):
                assert section.max_minutes == 0 and section.learning_rate_decay != "budget"
            assert section_cfg.pretrain.precision == section_cfg.finetune.precision == "float32"
            assert section_cfg.reader.precision == reader_precision
            trained += call.target.endswith((":pretrain", ":train_reader", ":finetune"))
    assert trained == 3
    assert (cfg.pretrain.steps, cfg.reader.steps, cfg.finetune.steps, cfg.qa.reader_window) == (2, 800, 20, 128)
    assert demo.precisions("float32") == ("float32", "float32")
    with pytest.raises(ValueError, match="one of auto"):
        demo.precisions("float16")


def test_demo_minutes_is_gone():
    result = _run("demo", "--config", "configs/tiny.yaml", "--minutes", "1")
    assert result.returncode == 2 and "unrecognized argument --minutes" in result.stderr
    assert "did you mean" not in result.stderr  # no flag is near enough to suggest


@pytest.mark.slow
def test_demo_runs_the_whole_loop_on_the_tiny_config_and_its_ask_line_answers(tmp_path):
    work, cache = tmp_path / "demo", tmp_path / "cache"
    # --one-process: the same stages, called in this child instead of one child each (a TensorFlow start each);
    # the child-process runner make demo uses is tested in tests/test_cli.py.
    args = ("demo", "--config", "configs/tiny.yaml", "--workdir", str(work), "--cache-dir", str(cache),
            "--num-questions", "40", "--pretrain-steps", "2", "--finetune-steps", "4", "--reader-steps", "2",
            "--reader-window", "32", "--squad-paragraphs", "4", "--one-process")
    result = _run(*args)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    for name in ("corpus", "preprocess", "pretraining-data", "init-retriever", "index", "pretrain", "train-reader",
                 "finetune", "evaluate", "export", "ask"):
        assert f"] {name}:" in result.stdout and f"=== {name} done" in result.stdout, name
    first = result.stdout.splitlines()[0]
    assert first.startswith("realm-tf demo: ") and "GFLOP/s" in first and "minutes here" in first
    metrics = json.loads((work / "metrics.json").read_text())
    short = metrics["short_answers"]
    lines = result.stdout.strip().splitlines()
    table = lines[lines.index("realm-tf demo finished") + 1:]
    assert table[1].split() == ["exact", "match", f"{metrics['exact_match']:.3f}", "(NQ-open's:",
                                f"{short['exact_match']:.3f})"]
    assert any(line.split()[:2] == ["peak", "memory"] and float(line.split()[2]) > 0 for line in table)
    assert any(line.split()[:1] == ["steps"] and "reader 2," in line for line in table)
    assert metrics["num_questions"] > 0 and 0 <= metrics["exact_match"] <= 1
    assert (work / "params.yaml").exists() and (work / "served" / "realm_qa.json").exists()
    params = config.load_config(str(work / "params.yaml"))
    assert params.pretrain.precision == params.finetune.precision == "float32"
    assert params.reader.precision == demo.precisions("auto")[0]
    assert 'model_checkpoint_path: "ckpt-2"' in (work / "reader" / "checkpoints" / "checkpoint").read_text()
    assert "SQuAD questions for the reader warm start" in result.stdout
    # The warm start read every bundled NQ training question on the whole bundled corpus, preprocessed for reading
    # once into the cache: the index holds the demo's own corpus.
    [reading_dir] = cache.iterdir()
    reading = json.loads((reading_dir / "manifest.json").read_text())
    indexed = json.loads((work / "blocks" / "manifest.json").read_text())
    assert reading["blocks"] > indexed["blocks"]
    assert "qa_qed_train.jsonl.gz" in result.stderr and "each block read through a window of 32" in result.stderr
    # Pre-training kept the retriever frozen, so fine-tuning read the first index (no refresh was built).
    from realm_tf.index import index_publisher  # pylint: disable=import-outside-toplevel
    assert len(index_publisher.complete_versions(str(work / "index"))) == 1
    assert "A: " in result.stdout  # the sample questions were answered
    # The printed ask line, run verbatim (from the directory the demo ran in), answers.
    command = lines[-1].strip()
    assert lines[-2] == "ask it a question:" and f" ask --model {work}/served " in command
    asked = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3"))
    assert asked.returncode == 0 and "A: " in asked.stdout, asked.stderr[-2000:]
    assert "the bundled corpus for reading, kept in" in result.stdout
    # The next run finds the reading corpus in the cache and plans no second build of it.
    cfg = config.load_config(str(work / "params.yaml"))
    options = {"num_questions": 40, "squad_paragraphs": 4, "reader_batch_size": 8, "samples": 3,
               "reading_blocks": demo.reading_cache(cfg, str(cache)), "pretrain_batch_size": 1,
               "finetune_batch_size": 1}
    assert options["reading_blocks"] == str(reading_dir)
    [preprocess] = [s for s in demo.plan(cfg, str(work), str(work / "params.yaml"), options) if s.name == "preprocess"]
    assert len(preprocess.calls) == 1 and preprocess.calls[0].kwargs["output"] == cfg.data.blocks_dir
