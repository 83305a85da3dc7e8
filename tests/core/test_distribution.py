"""``pretrain.intra_op_threads``: applied before TensorFlow starts (ops then run on one thread each), kept with a
warning once it has started, rejected when negative; strategies by name."""
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf import errors
from realm_tf.core import distribution

# A fresh process: TensorFlow sizes its intra-op pool once, when its runtime starts.
_CHILD = """
import logging, os, resource, sys, time
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf
from realm_tf.core import distribution
logging.basicConfig(level=logging.WARNING)
threads = int(sys.argv[1])
print("set", distribution.set_intra_op_threads(threads))
a = tf.random.normal([1024, 1024])
(a @ a).numpy()  # warm-up
usage, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(40):
    a = tf.linalg.matmul(a, a) * 1e-3
a.numpy()
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime - usage.ru_utime + after.ru_stime - usage.ru_stime
print("busy", cpu / (time.perf_counter() - start))
print("again", distribution.set_intra_op_threads(threads + 1))
"""


def _child(threads):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_NUM_INTRAOP_THREADS", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(threads)], env=env, capture_output=True, text=True,
                         check=True)
    values = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0] in
                  ("set", "busy", "again"))
    return values, out.stderr


def test_one_intra_op_thread_runs_each_op_on_one_core_and_cannot_change_later():
    values, stderr = _child(1)
    assert values["set"] == "1"
    # Each matmul runs whole on the thread that runs it: the process keeps about one core busy (a pool of one
    # thread per core would keep every core busy on a multi-core machine).
    assert float(values["busy"]) < 1.3, values
    assert values["again"] == "1"  # the runtime has started: the pool keeps its size ...
    assert "intra_op_threads=2 not applied" in stderr  # ... and says so


def test_zero_keeps_tensorflows_default():
    values, stderr = _child(0)
    assert values["set"] == "0"
    assert values["again"] == "0"
    assert "intra_op_threads=1 not applied" in stderr


def test_negative_threads_are_rejected_in_the_config_and_at_run_time(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("reader:\n  steps: 10\n  intra_op_threads: -1\n")
    with pytest.raises(config.ConfigError, match=rf"{path}:3: reader.intra_op_threads must be >= 0"):
        config.load_config(str(path))
    assert config.load_config(str(path), ["reader.intra_op_threads=1"]).reader.intra_op_threads == 1
    with pytest.raises(ValueError, match="must be >= 0"):
        distribution.set_intra_op_threads(-1)


def test_strategies_by_name():
    assert distribution.make_strategy("default") is tf.distribute.get_strategy()
    with pytest.raises(ValueError, match="expected one of"):
        distribution.make_strategy("parameter_server")


@pytest.mark.parametrize("env, expected", [({}, "local"), ({"TPU_NAME": "node-1"}, "node-1"),
                                           ({"TPU_CONFIG": '{"tpu_node_name": "n"}'}, None),
                                           ({"TPU_NAME": "node-1", "TPU_CONFIG": "{}"}, "node-1")])
def test_the_tpu_address_is_the_named_node_the_config_or_the_vms_own_chips(monkeypatch, env, expected):
    for key in ("TPU_NAME", "TPU_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert distribution.tpu_address() == expected


def test_no_tpu_is_a_clear_error_naming_where_it_looked(monkeypatch):
    def resolver(tpu):  # what TensorFlow's resolver raises on a machine without TPUs
        raise ValueError("TPUs not found in the cluster")
    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", resolver)
    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.delenv("TPU_CONFIG", raising=False)
    with pytest.raises(errors.UserError, match=r"strategy=tpu: no TPU found at local .*TPU_NAME"):
        distribution.make_strategy("tpu")


@pytest.mark.parametrize("section, key, value", [("pretrain", "strategy", "tpu"), ("finetune", "jit_compile", "true")])
def test_xla_settings_need_static_shapes_and_name_the_settings(tmp_path, section, key, value):
    path = tmp_path / "xla.yaml"
    path.write_text(f"name: t\n{section}:\n  {key}: {value}\n")
    with pytest.raises(config.ConfigError, match=rf"xla.yaml:3: {section}.{key}={value} needs static shapes.*"
                                                 r"data.static_padding=false, model.reader_length_buckets=4"):
        config.load_config(path)
    fixed = config.load_config(path, ["data.static_padding=true", "model.reader_length_buckets=1",
                                      "model.candidate_length_buckets=1"])
    assert str(getattr(getattr(fixed, section), key)).lower() == value and not fixed.ict.jit_compile


def test_the_start_line_names_the_strategy_replicas_devices_and_settings():
    trainer = config.load_config("configs/tiny.yaml", ["pretrain.precision=mixed_bfloat16"]).pretrain
    line = distribution.describe(distribution.make_strategy("default"), "pretrain", trainer)
    assert line == ("pretrain: strategy default, 1 replica on CPU:0 (no GPU visible); jit_compile off; "
                    "precision mixed_bfloat16")
