"""`realm-tf pretrain` end to end on a tiny config, as separate processes: the asynchronous index refresh (with
the index builder SIGKILLed mid-publish), then the trainer SIGKILLed and rerun, in one run of the loop."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from realm_tf.index import index_publisher

pytestmark = pytest.mark.slow  # separate processes, minutes each: `make test-fast` skips them

TINY = "configs/tiny.yaml"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def _cli(args, sets, log):
    argv = [sys.executable, "-m", "realm_tf.cli", *args, "--config", TINY]
    for s in sets:
        argv += ["--set", s]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=ENV)  # pylint: disable=consider-using-with


def _wait(condition, timeout, what, processes=()):
    deadline = time.time() + timeout
    while not condition():
        for p in processes:
            assert p.poll() is None, f"process {p.args[3]} exited with {p.returncode} while waiting for {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _staged(index_dir):
    """Staging directories holding a fully written version (index.json present, not yet committed)."""
    if not os.path.isdir(index_dir):
        return []
    return [n for n in os.listdir(index_dir) if n.startswith(".staging")
            and os.path.exists(os.path.join(index_dir, n, "index.json"))]


def _trainer_step(path):
    """The trainer's step from its progress bar (``N/100000``) in its log."""
    steps = re.findall(r"(\d+)/100000", _tail(path, chars=None))
    return int(steps[-1]) if steps else 0


def _switch_step(path):
    """The step at which the trainer's input pipeline first moved to a refreshed index (None before)."""
    found = re.search(r"pretrain: step (\d+): input pipeline switched to index version", _tail(path, chars=None))
    return int(found.group(1)) if found else None


def _tail(path, chars=4000):
    with open(path, errors="replace") as f:
        return f.read()[-chars:] if chars else f.read()


def test_async_refresh_builder_killed_mid_publish_trainer_killed_and_rerun(tmp_path, pretraining_workspace,
                                                                          workspace_overrides, read_scalars):
    """The trainer bootstraps the first index and exports; a builder process refreshes it and the trainer's input
    pipeline switches; a second builder is SIGKILLed with its version staged, not committed; the trainer is
    SIGKILLed, and its rerun resumes from the last checkpoint on the existing index, then stops on SIGTERM."""
    sets = workspace_overrides(tmp_path, pretraining_workspace) + [
        "refresh.mode=external", "refresh.export_every_steps=3", "pretrain.steps=100000", "pretrain.max_minutes=8",
        "pretrain.summary_every_steps=1", "pretrain.checkpoint_every_steps=5"]
    index_dir = str(tmp_path / "index")
    logs = {name: open(tmp_path / f"{name}.log", "w")  # noqa: SIM115
            for name in ("trainer", "builder", "killed", "rerun")}
    trainer = _cli(["pretrain"], sets, logs["trainer"])
    builder = killed = rerun = None
    try:
        # The trainer bootstraps index version 0 itself, then exports every 3 steps.
        _wait(lambda: index_publisher.complete_versions(index_dir), 240, "the first index version", [trainer])
        builder = _cli(["refresh-index", "--watch"], sets, logs["builder"])
        _wait(lambda: max(index_publisher.complete_versions(index_dir)) > 0, 240, "a refreshed index version",
              [trainer, builder])
        _wait(lambda: "input pipeline switched to index version" in _tail(tmp_path / "trainer.log", chars=None), 240,
              "the trainer to use the refreshed index", [trainer, builder])
        builder.terminate()
        builder.wait(60)
        previous = max(index_publisher.complete_versions(index_dir))
        # A second builder is SIGKILLed with its new version fully staged but not committed.
        killed = _cli(["refresh-index", "--watch", "--pause-before-commit", "120"], sets, logs["killed"])
        _wait(lambda: _staged(index_dir), 240, "a staged index version", [trainer, killed])
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        assert max(index_publisher.complete_versions(index_dir)) == previous  # the half-published one is invisible
        assert _staged(index_dir)  # left behind, ignored by readers
        time.sleep(3)
        assert trainer.poll() is None, _tail(tmp_path / "trainer.log")  # still training
        # Batches retrieved before the switch are still in the prefetch buffer: train past them.
        switched = _switch_step(tmp_path / "trainer.log")
        _wait(lambda: _trainer_step(tmp_path / "trainer.log") >= switched + 6 and _checkpoint_step(tmp_path) >= 5,
              300, "training on the new index", [trainer])
        trainer.send_signal(signal.SIGKILL)  # no checkpoint, no evaluation: the rerun starts from the last saved one
        trainer.wait(30)
        killed_at = _checkpoint_step(tmp_path)
        rerun = _cli(["pretrain"], sets, logs["rerun"])
        _wait(lambda: _trainer_step(tmp_path / "rerun.log") >= killed_at + 2, 300, "the rerun's steps", [rerun])
        rerun.terminate()  # SIGTERM: checkpoint, stop, evaluate, exit 143 (stopped early, not finished)
        assert rerun.wait(300) == 128 + signal.SIGTERM, _tail(tmp_path / "rerun.log")
    finally:
        for p in (trainer, builder, killed, rerun):
            if p is not None and p.poll() is None:
                p.kill()
        for f in logs.values():
            f.close()
    out = _tail(tmp_path / "rerun.log", chars=None)
    assert f"-{killed_at} at step {killed_at}" in out, out[:3000]  # "resumed from .../ckpt-N at step N"
    assert "no index in" not in out  # the index the first run built and refreshed is used
    assert "held-out salient spans" in out and "stopping at step" in out and "SIGTERM" in out
    assert "input pipeline switched to index version" in _tail(tmp_path / "trainer.log", chars=None)
    # One value per step: the rerun repeats the steps after its checkpoint, on the same index version or a newer one.
    scalars = read_scalars(tmp_path / "model" / "train")
    versions = [v for _, v in sorted(dict(scalars["index_version"]).items())]
    assert len(set(versions)) >= 2 and versions[0] == 0.0, versions  # the first index, then refreshed ones
    assert max(versions) == previous  # never the killed builder's version
    assert versions == sorted(versions)  # the trainers only move forward
    assert min(v for _, v in scalars["off_policy_delay_steps"]) >= 0
    assert min(v for _, v in scalars["off_policy_delay_seconds"]) >= 0


def _checkpoint_step(root):
    latest = tf.train.latest_checkpoint(str(root / "model" / "checkpoints"))
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def test_a_failing_index_builder_child_stops_the_trainer_with_its_error(tmp_path, pretraining_workspace,
                                                                         workspace_overrides, read_scalars):
    """``refresh.mode: process`` on the DirectRunner, the child's every build made to fail (an unknown Beam
    runner): each failure is recorded where the trainer reads it, and the trainer stops with the child's error
    once there are ``refresh.max_failures`` of them, instead of training on against the first index."""
    from beam_jobs import embed_blocks  # pylint: disable=import-outside-toplevel
    from realm_tf import config  # pylint: disable=import-outside-toplevel
    from realm_tf import errors  # pylint: disable=import-outside-toplevel
    from realm_tf.index import refresh_failures  # pylint: disable=import-outside-toplevel
    from realm_tf.tasks import realm_pretraining  # pylint: disable=import-outside-toplevel

    sets = workspace_overrides(tmp_path, pretraining_workspace) + ["pretrain.summary_every_steps=1"]
    first = config.load_config(TINY, sets + ["pretrain.steps=1", "refresh.mode=external"])
    assert realm_pretraining.pretrain(first, evaluate=False, index_builder=embed_blocks.embed_and_publish)["step"] == 1
    failing = config.load_config(TINY, sets + [
        "pretrain.steps=100000", "refresh.mode=process", "refresh.export_every_steps=1", "refresh.max_failures=2",
        'refresh.beam_options=["--runner=NoSuchRunner"]'])
    start = time.time()
    with pytest.raises(errors.UserError, match=r"index builder failed \d+ times since index version 0 .*"
                                               r"refresh.max_failures=2.*NoSuchRunner"):
        realm_pretraining.pretrain(failing, evaluate=False)
    assert time.time() - start < 300
    failures, error = refresh_failures.since_last_index(failing.refresh.export_dir, failing.index.index_dir)
    assert failures >= 2 and "NoSuchRunner" in error
    assert max(v for _, v in read_scalars(f"{failing.pretrain.model_dir}/train")["index_refresh_failures"]) >= 1
    assert "refresh-index: export" in _tail(f"{failing.pretrain.model_dir}/refresh-index.log", chars=None)
