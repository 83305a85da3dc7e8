"""Two replicas train as one: a training job run by the product's driver on one device and under MirroredStrategy
over two logical CPUs, with its real optimizer (AdamW, learning-rate scales and all), gives the same weights.

:func:`check_two_replicas_train_as_one` runs, in a child process (the CPU must be split into two logical devices
before TensorFlow starts), ``experiment.run_experiment`` twice from the same seed: ``strategy: default`` with the
global batch ``b``, then ``strategy: mirrored`` (2 replicas × ``b/2``). Each replica's share of the batch is half
of the one-device batch (``distribute_datasets_from_function`` with one input pipeline on one host), read whole
or in micro-batches (gradient accumulation), so the summed gradients are the same and so, up to float rounding,
are the weights after the run. Every copy of every variable is compared, so that an update applied on one replica
and not the other (a per-variable setting looked up by a name only replica 0 has) shows up. A
positive control: the weights moved by much more than the tolerance."""
from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import importlib, json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_keras
from realm_tf import config
from realm_tf.core import distribution
from realm_tf.core import experiment

spec = json.loads(sys.argv[1])
module, name = spec["task"].split(":")
task_class = getattr(importlib.import_module(module), name)
kwargs = dict(spec["kwargs"])
for key, value in spec.get("callables", {}).items():
    where, attribute = value.split(":")
    kwargs[key] = getattr(importlib.import_module(where), attribute)


def run(strategy_name, model_dir, extra):
    cfg = config.load_config(spec["config"], spec["sets"] + extra + [
        f"{spec['section']}.strategy={strategy_name}", f"{spec['section']}.model_dir={model_dir}"])
    tf_keras.utils.set_random_seed(spec["seed"])
    task = task_class(cfg, *spec["args"], **kwargs)
    initialize, start = task.initialize, []

    def recording_initialize(model, loop):  # the weights the first step starts from (after any warm start)
        initialize(model, loop)
        start.extend(v.numpy() for v in model.variables if v.dtype != tf.string)
    task.initialize = recording_initialize
    strategy = distribution.make_strategy(strategy_name)
    result = experiment.run_experiment(task, strategy=strategy)
    assert result["step"] == getattr(cfg, spec["section"]).steps, result["step"]
    variables = [v for v in result["model"].variables if v.dtype != tf.string]
    copies = [[c.numpy() for c in strategy.experimental_local_results(v)] for v in variables]
    run.names = [v.name for v in variables]
    return copies, start, strategy.num_replicas_in_sync


single, start, one = run("default", spec["root"] + "/one", [])
mirrored, mirrored_start, two = run("mirrored", spec["root"] + "/two", spec["mirrored_sets"])
assert (one, two) == (1, 2) and len(single) == len(mirrored) == len(start), (one, two, len(single), len(start))
differences = []
for a, b in zip(single, mirrored):
    assert len(b) == 2, len(b)
    differences.append(max(float(np.abs(copy - a[0]).max()) for copy in b))
print(json.dumps({"variables": len(single), "max_difference": max(differences),
                  "worst": run.names[int(np.argmax(differences))],
                  "start_difference": max(float(np.abs(a - b).max()) for a, b in zip(start, mirrored_start)),
                  "moved": max(float(np.abs(a[0] - s).max()) for a, s in zip(single, start))}))
"""


def check_two_replicas_train_as_one(task: str, section: str, sets: list[str], root: str, args: list | None = None,
                                    kwargs: dict | None = None, callables: dict | None = None,
                                    seed: int = 0, atol: float = 1e-4, config: str = "configs/tiny.yaml",
                                    accumulation: int = 1) -> dict:
    """Runs the job ``task`` (``"module:Class"``, built as ``Class(cfg, *args, **kwargs)``, ``callables`` naming
    ``"module:function"`` keyword arguments, its config ``config`` with ``sets``) on 1 and on 2 replicas, each of
    the two reading its share of the batch in ``accumulation`` micro-batches (``gradient_accumulation_steps``);
    asserts equal weights to ``atol``."""
    spec = {"config": config, "task": task, "section": section, "sets": sets, "root": root, "args": args or [],
            "kwargs": kwargs or {}, "callables": callables or {}, "seed": seed,
            "mirrored_sets": [f"{section}.gradient_accumulation_steps={accumulation}"]}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(spec)], capture_output=True, text=True,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=600, cwd=repo)
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(report))  # shown with pytest -rP
    assert report["start_difference"] == 0.0, report  # both runs start from the same weights ...
    assert report["moved"] > 5 * atol, report  # ... the job's update is not trivially small ...
    assert report["max_difference"] < atol, report  # ... and two replicas end where one device does
    return report
