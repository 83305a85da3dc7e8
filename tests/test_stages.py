"""Stages: a library call in a child process of its own, its output ours, its result and errors returned."""
import dataclasses
import os
from concurrent import futures

import numpy as np
import pytest

from realm_tf import config
from realm_tf import stages


def test_a_call_runs_in_a_fresh_child_and_returns_plain_data(capfd):
    cfg = config.load_config("configs/tiny.yaml", ["pretrain.steps=78"])
    call = stages.Call("realm_tf.config:to_dict", {"obj": cfg}, report="json:dumps", starts_tensorflow=False)
    result = stages.call_in_child(call)
    assert result == config.to_dict(cfg) and result["pretrain"]["steps"] == 78
    assert '"steps": 78' in capfd.readouterr().out  # the report, printed by the child, reaches our stdout
    assert stages.call_in_child(stages.Call("os:getpid", starts_tensorflow=False)) != os.getpid()
    # The same call here, for --one-process.
    assert stages.call_here(call) == result


def test_only_a_call_that_runs_tensorflow_has_its_child_import_it():
    loaded = stages.Call("sys:modules.__repr__")  # the child's modules, after its set-up
    assert "'tensorflow':" in stages.call_in_child(loaded)
    assert "'tensorflow':" not in stages.call_in_child(dataclasses.replace(loaded, starts_tensorflow=False))


def test_what_the_child_raises_is_raised_here_and_a_killed_child_is_reported():
    with pytest.raises(config.ConfigError, match="unknown key 'pretrain.nope'"):
        stages.call_in_child(stages.Call("realm_tf.config:load_config",
                                         {"path": "configs/tiny.yaml", "overrides": ["pretrain.nope=1"]},
                                         starts_tensorflow=False))
    with pytest.raises(futures.process.BrokenProcessPool):
        # dies without a result, as an OOM kill does
        stages.call_in_child(stages.Call("os:abort", starts_tensorflow=False))


def test_a_stage_runs_its_calls_in_order_and_returns_the_last_result(tmp_path):
    path = tmp_path / "params.yaml"
    stage = stages.Stage("write-then-read", "", (
        stages.Call("realm_tf.config:save_params", {"cfg": config.load_config("configs/tiny.yaml"),
                                                     "model_dir": str(tmp_path)}, starts_tensorflow=False),
        stages.Call("realm_tf.config:to_dict", {"obj": {"exists": str(path)}}, starts_tensorflow=False),
        stages.Call("os.path:exists", {"path": str(path)}, starts_tensorflow=False)))
    assert stages.run_stage(stage, in_children=False) is True
    assert stages.run_stage(stage) is True
    pids = stages.Stage("pids", "", (stages.Call("os:getpid", starts_tensorflow=False),) * 2)
    one_child = stages.run_stage(dataclasses.replace(pids, calls=pids.calls[:1]))
    assert one_child != os.getpid() and stages.run_stage(pids) != one_child  # a new child for each stage


def test_the_calls_of_a_stage_share_one_child_process():
    """One TensorFlow start a stage: what the first call leaves in its process, the second finds."""
    key = "REALM_TF_STAGE_TEST"
    stage = stages.Stage("same-child", "", (
        stages.Call("os:environ.update", {key: "seen"}, starts_tensorflow=False),
        stages.Call("os:environ.get", {"key": key}, starts_tensorflow=False)))
    assert stages.run_stage(stage) == "seen" and key not in os.environ  # not this process


def test_stages_that_share_a_process_name_run_in_one_child_and_the_next_gets_a_new_one():
    pid = stages.Call("os:getpid", starts_tensorflow=False)
    plan = [stages.Stage("a", "", (pid,), "light"), stages.Stage("b", "", (pid,), "light"),
            stages.Stage("own", "", (pid,)), stages.Stage("c", "", (pid,), "light"),
            stages.Stage("d", "", (pid,), "other")]
    with stages.ChildProcesses() as children:
        a, b, own, c, d = (children.run(stage) for stage in plan)
    assert a == b and len({a, own, c, d, os.getpid()}) == 5  # only neighbours share a child
    tensorflow = stages.Stage("tf", "", (stages.Call("os:getpid"),), "light")  # needs a child that started it
    with stages.ChildProcesses() as children:
        first, second, third = (children.run(stage) for stage in (plan[0], tensorflow, plan[0]))
    assert first != second == third
    with stages.ChildProcesses(in_children=False) as here:
        assert {here.run(stage) for stage in plan} == {os.getpid()}


def test_plain_keeps_data_and_leaves_out_objects():
    result = {"step": np.int64(3), "loss": np.float32(0.5), "model": object(), "logs": [1, object(), "x"],
              "nested": {"ok": (True, None)}}
    assert stages.plain(result) == {"step": 3, "loss": 0.5, "logs": [1, "x"], "nested": {"ok": [True, None]}}
    assert isinstance(stages.plain(result)["step"], int)


def test_a_target_names_module_and_attribute():
    with pytest.raises(ValueError, match="package.module:function"):
        stages.Call("realm_tf.config.load_config")
    assert stages.resolve("realm_tf.config:load_config") is config.load_config
