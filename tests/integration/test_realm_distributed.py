"""REALM pre-training under tf.distribute: `realm-tf pretrain` under MirroredStrategy on 2 logical CPUs and
MultiWorkerMirroredStrategy with 2 worker processes on 127.0.0.1 through TF_CONFIG."""
import json
import os
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

pytestmark = pytest.mark.slow  # separate processes, minutes each: `make test-fast` skips them

TINY = "configs/tiny.yaml"

MIRRORED_SCRIPT = r"""
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from beam_jobs import embed_blocks
from realm_tf import config
from realm_tf.core import distribution
from realm_tf.tasks import realm_pretraining

sets = json.loads(sys.argv[1])
cfg = config.load_config("configs/tiny.yaml", sets + ["pretrain.strategy=mirrored", "pretrain.steps=3",
                                                      "data.batch_size=4", "refresh.export_every_steps=0"])
# 1. `realm-tf pretrain` itself under MirroredStrategy (2 replicas): bootstraps the index, trains, evaluates
#    (exports during distributed training: test_multi_worker_mirrored_two_processes).
result = realm_pretraining.pretrain(cfg, index_builder=embed_blocks.embed_and_publish)
compiled = config.apply_override(config.apply_override(cfg, "pretrain.jit_compile=true"), "data.static_padding=true")
try:  # XLA all-reduces between GPUs only: on CPU replicas a clear error before anything is built
    realm_pretraining.pretrain(compiled, index_builder=embed_blocks.embed_and_publish)
    raise AssertionError("jit_compile on 2 CPU replicas was not refused")
except config.ConfigError as e:
    assert "all-reduces gradients inside XLA only between GPUs" in str(e), e
mirrored = distribution.make_strategy("mirrored")
assert mirrored.num_replicas_in_sync == 2, mirrored.num_replicas_in_sync
line = distribution.describe(mirrored, "pretrain", cfg.pretrain)
assert line.startswith("pretrain: strategy mirrored, 2 replicas on CPU:0, CPU:1 (no GPU visible)"), line

print(json.dumps({"step": result["step"], "versions": sorted(result["index_versions"]), "eval": result["eval"]}))
"""


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _sets(root, shared, overrides):
    return overrides(root, shared) + ["refresh.mode=external", "refresh.poll_seconds=0.2"]


def test_mirrored_strategy_on_two_logical_cpus(tmp_path, pretraining_workspace, workspace_overrides):
    sets = _sets(tmp_path, pretraining_workspace, workspace_overrides)
    result = subprocess.run([sys.executable, "-c", MIRRORED_SCRIPT, json.dumps(sets)], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["step"] == 3 and out["eval"]["num_examples"] > 0
    # that 2 replicas give the weights of one device, with AdamW: test_realm_pretraining's
    # test_two_replicas_train_as_one (and every other job's, beside its task's tests)


def test_multi_worker_mirrored_two_processes(tmp_path, pretraining_workspace, workspace_overrides):
    sets = _sets(tmp_path, pretraining_workspace, workspace_overrides) + [
        "pretrain.strategy=multi_worker", "pretrain.steps=4", "refresh.export_every_steps=2"]
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    workers = []
    for index in range(2):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
               "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        argv = [sys.executable, "-m", "realm_tf.cli", "pretrain", "--config", TINY, "--no-eval"]
        for s in sets:
            argv += ["--set", s]
        log = open(tmp_path / f"worker{index}.log", "w")  # noqa: SIM115
        workers.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    try:
        codes = [p.wait(timeout=600) for p, _ in workers]
    finally:
        for p, log in workers:
            if p.poll() is None:
                p.kill()
            log.close()
    logs = [open(tmp_path / f"worker{i}.log").read() for i in range(2)]
    assert codes == [0, 0], "\n\n".join(l[-3000:] for l in logs)
    assert "pretrain: step 4:" in logs[0] and "pretrain: step 4:" in logs[1]
    # Only the chief (worker 0) writes the real checkpoints and exports.
    assert tf.train.latest_checkpoint(str(tmp_path / "model" / "checkpoints")).endswith("-4")
    assert sorted(os.listdir(tmp_path / "export")) == ["0", "2"]
