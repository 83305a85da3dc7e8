"""The accelerator contract of a training job's step, checked on CPU (``trainer.jit_compile``).

A TPU runs a step only as one XLA program over fixed shapes, and a GPU runs fastest that way. For a task whose
trainer section has ``jit_compile: true`` and ``data.static_padding: true``, :func:`run_compiled` trains it
through :func:`realm_tf.core.experiment.run_experiment` (the product's driver) for a few steps and asserts:

- its batches hold no string or float64 tensor, and every dimension but the batch's is static;
- each replica's update (forward, loss, gradients, optimizer) is one XLA program: it lowers to HLO
  (``experimental_get_compiler_ir``); only the task's ``prepare_inputs`` (a search, ragged gathers) runs
  before it, uncompiled;
- the step traced once over the run (the loop's function and the compiled update);
- the compiled function is the whole update: from the weights and optimizer state after step i, calling it alone
  on batch i + 1 gives the state after step i + 1. A variable the loop, a hook or the host changed outside it
  would make them differ.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from realm_tf.core import base_task
from realm_tf.core import experiment


@dataclasses.dataclass
class CompiledRun:
    """What :func:`run_compiled` saw: the run's result, its loop, the batches and the state after each step."""

    result: dict[str, Any]
    loop: Any
    batches: list[Any]
    states: list[list[np.ndarray]]


def check_batch_spec(spec: Any) -> None:
    """No string or float64 tensor, and every non-batch dimension static."""
    for path, tensor_spec in enumerate(tf.nest.flatten(spec)):
        assert tensor_spec.dtype not in (tf.string, tf.float64), (path, tensor_spec)
        assert all(d is not None for d in tensor_spec.shape[1:]), (path, tensor_spec)


def _state(loop: Any, model: Any) -> list[tf.Variable]:
    """Every numeric variable a step may change, but the global step (the loop's own counter); a corpus's texts
    are string variables no step writes."""
    optimizer_variables = loop.checkpoint.optimizer.variables  # a method of the legacy Keras optimizers
    variables = [*model.variables, *(optimizer_variables() if callable(optimizer_variables) else optimizer_variables)]
    return [v for v in variables if v.dtype != tf.string]


def _must_compile(loop: Any) -> bool:
    """Whether the loop's traced step calls a function marked for XLA (``_XlaMustCompile``)."""
    graph = loop._train_step.get_concrete_function().graph
    functions = [graph, *(f.graph for f in getattr(graph, "_functions", {}).values() if hasattr(f, "graph"))]
    for g in functions:
        for op in g.get_operations():
            try:
                if op.get_attr("_XlaMustCompile"):
                    return True
            except ValueError:
                continue
    return False


def run_compiled(task: base_task.Task, steps: int = 3) -> CompiledRun:
    """Trains ``task`` (its trainer section: ``jit_compile``, ``steps`` = ``steps``) and checks the contract."""
    assert task.trainer_config.jit_compile and task.trainer_config.steps == steps
    batches: list[Any] = []
    states: list[list[np.ndarray]] = []
    seen: dict[str, Any] = {}
    build_inputs, train_hooks = task.build_inputs, task.train_hooks

    def recorded_inputs(*args: Any, **kwargs: Any) -> tf.data.Dataset:
        dataset = build_inputs(*args, **kwargs)
        check_batch_spec(dataset.element_spec)
        batches.extend(dataset.take(steps))
        return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=dataset.element_spec)

    def recording_hooks(model: Any, loop: Any) -> list[Any]:
        seen.update(model=model, loop=loop)

        def record(step: int, logs: Any) -> None:
            states.append([v.numpy() for v in _state(loop, model)])
        return [*train_hooks(model, loop), record]

    task.build_inputs, task.train_hooks = recorded_inputs, recording_hooks
    result = experiment.run_experiment(task)
    loop, model = seen["loop"], seen["model"]
    assert result["step"] == steps and len(states) == steps
    update = loop.step_fn.update  # the replica's update, after the task's prepare_inputs
    assert loop.tracing_count == 1 and update.experimental_get_tracing_count() == 1
    prepared = task.prepare_inputs(batches[0], model)
    assert "HloModule" in update.experimental_get_compiler_ir(prepared)(stage="hlo")
    assert _must_compile(loop), "the loop's step does not call its replica step as an XLA program"
    variables = _state(loop, model)
    for before, batch, after in zip(states, batches[1:], states[1:]):
        for variable, value in zip(variables, before):
            variable.assign(value)
        loop._train_step(batch)  # the traced step: no hook, no host code between the two states
        for variable, want in zip(variables, after):
            np.testing.assert_allclose(variable.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=variable.name)
        changed = sum(not np.array_equal(a, b) for a, b in zip(before, after))
        assert changed > len(task.trainable_variables(model)) // 2, changed  # the step does update
    return CompiledRun(result, loop, batches, states)
