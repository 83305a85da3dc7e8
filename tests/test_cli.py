"""The realm-tf command line: help text, config printing, errors without tracebacks."""
import os
import subprocess
import sys

from realm_tf import cli


def _run(*args):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "realm_tf.cli", *args], capture_output=True, text=True, env=env,
                          timeout=900)


def test_help_lists_every_subcommand_with_one_line():
    result = _run("--help")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    for name in [c.name for c in cli.COMMANDS]:
        matching = [line for line in lines if line.startswith(f"    {name} ")]
        assert len(matching) == 1, f"{name} not listed on one line:\n{result.stdout}"
        assert len(matching[0].split(name, 1)[1].strip()) > 10  # with an explanation


def test_config_prints_overrides_and_bad_key_is_a_clean_error():
    result = _run("config", "--config", "configs/tiny.yaml", "--set", "pretrain.steps=77")
    assert result.returncode == 0 and "steps: 77" in result.stdout
    result = _run("config", "--config", "configs/tiny.yaml", "--set", "pretrain.nope=1")
    assert result.returncode == 2
    assert "unknown key 'pretrain.nope'" in result.stderr and "Traceback" not in result.stderr
    # Printing a config starts no TensorFlow (a fraction of a second, not TensorFlow's seconds); a command that
    # runs TensorFlow imports it before its handler, quietly.
    probe = ("import sys; from realm_tf import cli; cli.main(sys.argv[1:]); "
             "print('TF' if 'tensorflow' in sys.modules else 'no TF')")
    for argv, expected in ((["config", "--config", "configs/tiny.yaml"], "no TF"),
                           (["verify", "configs"], "TF")):
        out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3"))
        assert out.stdout.strip().splitlines()[-1] == expected, (argv, out.stdout[-500:], out.stderr[-2000:])


def test_export_retriever_from_a_run_without_checkpoints_is_a_clean_error(tmp_path, capsys):
    empty = tmp_path / "run"
    empty.mkdir()
    assert cli.main(["export-retriever", "--config", "configs/tiny.yaml", "--model-dir", str(empty),
                     "--set", f"refresh.export_dir={tmp_path}/export"]) == 2
    assert f"{empty}/checkpoints" in capsys.readouterr().err
    assert not (tmp_path / "export").exists()


def test_verify_passes_a_clean_index_and_names_each_damaged_file(tmp_path, capsys):
    import numpy as np

    from realm_tf.index import brute_force_index
    from realm_tf.index import index_publisher

    embeddings = np.random.default_rng(0).normal(size=[30, 8]).astype(np.float32)  # [num_blocks, dim]
    index = brute_force_index.BruteForceIndex()
    index.build(embeddings)
    for version in (1, 2):
        index_publisher.publish(str(tmp_path), version, embeddings, index, {"vocab_hash": "v", "export_step": version,
                                                                           "export_path": "none"}, 5)
    capsys.readouterr()
    assert cli.main(["verify", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("ok ") == 2 and "DAMAGED" not in out
    damaged = tmp_path / "0000000002" / "embeddings.npy"
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0xFF  # same size: only the digest can tell
    damaged.write_bytes(bytes(data))
    assert cli.main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED  {tmp_path / '0000000002'}" in out and str(damaged) in out and "corrupted" in out
    assert f"ok       {tmp_path / '0000000001'}" in out
    assert cli.main(["verify", str(tmp_path / "nothing")]) == 2  # no artifact there: a clear error, no traceback
    assert "no artifact here" in capsys.readouterr().err


def test_train_runs_the_named_experiments_own_command(capsys):
    """``realm-tf train --experiment NAME ARGS`` is the experiment's command with ARGS (here it stops at the
    config, before any training: the error names the command it reached)."""
    from realm_tf.commands import experiments

    required = {"finetune": ["--train", "questions.jsonl"]}  # the command's own required arguments
    for name, experiment in experiments.EXPERIMENTS.items():
        assert cli.main(["train", "--experiment", name, "--config", "configs/tiny.yaml", *required.get(name, []),
                         "--set", f"{experiment.section}.nope=1"]) == 2
        err = capsys.readouterr().err
        assert f"realm-tf {experiment.train}: error:" in err and f"unknown key '{experiment.section}.nope'" in err


def test_evaluate_runs_the_named_experiments_evaluation(capsys):
    """``realm-tf evaluate --experiment NAME ARGS`` reaches the command that scores NAME, with ARGS."""
    reached = {"pretrain": "pretrain", "retro": "evaluate-lm", "reader": "evaluate", "finetune": "evaluate"}
    for name, command_name in reached.items():
        assert cli.main(["evaluate", "--experiment", name, "--config", "configs/tiny.yaml", "--questions", "q.jsonl",
                         "--set", "nope.key=1"] if command_name == "evaluate" else
                        ["evaluate", f"--experiment={name}", "--config", "configs/tiny.yaml", "--set",
                         "nope.key=1"]) == 2
        err = capsys.readouterr().err
        assert f"realm-tf {command_name}: error:" in err and "nope" in err, (name, err)
    assert cli.main(["evaluate", "--experiment", "ict", "--config", "configs/tiny.yaml"]) == 2
    assert "has no held-out evaluation of its own" in capsys.readouterr().err


def test_resolve_rewrites_only_evaluate_of_an_experiment_with_its_own_command():
    from realm_tf.commands import experiments

    assert experiments.resolve(["evaluate", "--config", "c.yaml", "--experiment", "retro", "--split", "test"]) == [
        "evaluate-lm", "--config", "c.yaml", "--split", "test"]
    assert experiments.resolve(["evaluate", "--experiment=pretrain", "--config", "c.yaml"]) == [
        "pretrain", "--eval-only", "--config", "c.yaml"]
    for unchanged in (["evaluate", "--experiment", "reader", "--questions", "q"], ["evaluate", "--questions", "q"],
                      ["evaluate", "--experiment", "nope"], ["pretrain", "--experiment", "retro"], []):
        assert experiments.resolve(unchanged) == unchanged


def test_train_refuses_an_unknown_experiment():
    result = _run("train", "--experiment", "nope", "--config", "configs/tiny.yaml")
    assert result.returncode == 2 and "invalid choice: 'nope'" in result.stderr


def test_generate_world_writes_a_seeded_world_and_refuses_one_too_large(tmp_path, capsys):
    assert cli.main(["generate-world", "--output", str(tmp_path / "w"), "--seed", "5", "--people", "30"]) == 0
    out = capsys.readouterr().out
    assert "90 facts of 30 people" in out and (tmp_path / "w" / "questions-test.jsonl").exists()
    first = (tmp_path / "w" / "passages.jsonl").read_text()
    assert cli.main(["generate-world", "--output", str(tmp_path / "again"), "--seed", "5", "--people", "30"]) == 0
    assert (tmp_path / "again" / "passages.jsonl").read_text() == first  # the seed decides the world
    assert cli.main(["generate-world", "--output", str(tmp_path / "big"), "--places", "20000000"]) == 2
    assert "too large" in capsys.readouterr().err


def test_the_project_papers_agree_on_the_version():
    import pathlib
    import re

    import yaml

    import realm_tf

    root = pathlib.Path(__file__).resolve().parents[1]
    assert re.search(r'version="([^"]+)"', (root / "setup.py").read_text()).group(1) == realm_tf.__version__
    assert yaml.safe_load((root / "CITATION.cff").read_text())["version"] == realm_tf.__version__
    assert "Apache License" in (root / "LICENSE").read_text() and (root / "CHANGELOG.md").exists()
