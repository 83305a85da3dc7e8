"""One driver for every training task: ``run_experiment(task)``.

It writes ``<model_dir>/params.yaml``, builds the strategy named by the task's trainer section, the model and
optimizer under it, restores the newest checkpoint (a rerun resumes), lets the task initialise, then runs the
task's phases through :class:`realm_tf.core.training_loop.TrainingLoop` (checkpoints, TensorBoard scalars,
``max_minutes``, SIGTERM). ICT, REALM pre-training (Guu et al., 2020, §3), the reader warm start and Open-QA
fine-tuning (§4) all run here.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterator, Sequence

import tensorflow as tf

from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf.core import base_task
from realm_tf.core import distribution
from realm_tf.core import evaluation
from realm_tf.core import optimizer as optimizer_lib
from realm_tf.core import precision
from realm_tf.core import training_loop

logger = logging.getLogger(__name__)


def run_experiment(task: base_task.Task, strategy: tf.distribute.Strategy | None = None,
                   hooks: Sequence[training_loop.Hook] = (), train: bool = True) -> dict[str, Any]:
    """Trains ``task`` to its trainer section's ``steps`` (or ``max_minutes``), resuming from its ``model_dir``.

    ``hooks`` are called after every step with ``(step, logs)``, after the task's own. With ``train=False`` the
    latest checkpoint is restored and only the task's ``initialize`` and ``finish`` run (its held-out
    evaluation); the run's ``params.yaml`` is left as training wrote it.

    Returns ``step`` (the global step reached), ``train`` (the last summary's logs, floats), ``model`` and
    whatever the task's :meth:`~realm_tf.core.base_task.Task.finish` adds.
    """
    trainer = task.trainer_config
    _refuse_worker_clocks(task)
    if train:
        config_lib.save_params(task.cfg, trainer.model_dir)
    distribution.set_intra_op_threads(trainer.intra_op_threads)  # before the strategy's first op
    distribution.allow_memory_growth()
    strategy = strategy or distribution.make_strategy(trainer.strategy)
    _refuse_xla_all_reduce_on_cpus(task, strategy)
    logger.info("%s", distribution.describe(strategy, task.trainer_section, trainer))
    # The tokenizer's lookup tables: after the strategy (MultiWorkerMirroredStrategy must precede every op),
    # eagerly (not first inside a traced input or step function, whose graph would own them).
    _ = task.tokenizer
    with strategy.scope(), precision.policy_scope(trainer.precision):
        model = task.build_model()
        optimizer = optimizer_lib.build_optimizer(trainer, model)
    loop = training_loop.TrainingLoop(trainer, strategy, {**task.checkpoint_items(model), "optimizer": optimizer},
                                      task.global_batch_size)
    result: dict[str, Any] = {"model": model, "train": {}}
    logs: dict[str, float] = {}
    try:
        task.initialize(model, loop)
        all_hooks = (*task.train_hooks(model, loop), *_train_and_eval(task, model, loop), *hooks)
        iterators: dict[tuple, Iterator] = {}
        for phase in task.phases(loop.step) if train else ():
            if loop.step >= (phase.until_step if phase.until_step is not None else trainer.steps):
                continue  # nothing left of this phase (e.g. the whole run frozen): no input pipeline, no trace
            if phase.name != "train":
                logger.info("%s: phase %r until step %s", trainer.model_dir, phase.name,
                            phase.until_step or trainer.steps)
            if phase.input_options not in iterators:
                iterators[phase.input_options] = iter(_distributed_inputs(task, strategy, loop.step,
                                                                          dict(phase.input_options)))
            options = dict(phase.options)
            with strategy.scope():  # the phase's optimizer state before its step is traced (one trace, not two)
                optimizer_lib.create_slots(optimizer, task.trainable_variables(model, **options))
            step_fn = _replica_step(task, model, optimizer, loop.global_step, options)
            logs = loop.run(iterators[phase.input_options], step_fn, hooks=all_hooks, distribute_dataset=False,
                            until_step=phase.until_step)
            if phase.until_step is not None and loop.step < phase.until_step:
                break  # stopped early (max_minutes, SIGTERM, input exhausted): later phases wait for a rerun
        result.update(task.finish(model, loop))
    finally:
        task.close()
    result["step"] = loop.step
    result["stopped_by"] = loop.stopped_by
    result["train"] = logs
    return result


def _replica_step(task: base_task.Task, model: Any, optimizer: Any, global_step: tf.Variable,
                  options: dict[str, Any]) -> training_loop.StepFn:
    """One replica's step of a phase, a function of the batch alone: the task's :meth:`~base_task.Task.
    prepare_inputs`, then its update (forward, loss, gradients, optimizer), which with ``jit_compile`` is one XLA
    program (the step's ``update``)."""
    def update(inputs: Any) -> Any:
        return task.train_step(inputs, model, optimizer, global_step=global_step, **options)

    if task.trainer_config.jit_compile:
        update = tf.function(update, jit_compile=True, autograph=False)

    def step_fn(inputs: Any) -> Any:
        return update(task.prepare_inputs(inputs, model))

    step_fn.update = update
    return step_fn


def _refuse_xla_all_reduce_on_cpus(task: base_task.Task, strategy: tf.distribute.Strategy) -> None:
    """``jit_compile`` with replicas on CPUs: (MultiWorker)MirroredStrategy sums the replicas' gradients inside an
    XLA program only between GPUs (NCCL); between CPU devices it needs a ``merge_call``, which a compiled function
    cannot make."""
    trainer = task.trainer_config
    if (trainer.jit_compile and strategy.num_replicas_in_sync > 1
            and not isinstance(strategy, tf.distribute.TPUStrategy) and not tf.config.list_logical_devices("GPU")):
        raise config_lib.ConfigError(
            f"{task.trainer_section}.jit_compile=true with {strategy.num_replicas_in_sync} replicas on CPUs: "
            f"TensorFlow all-reduces gradients inside XLA only between GPUs (or on a TPU); set "
            f"{task.trainer_section}.jit_compile=false here")


def _refuse_worker_clocks(task: base_task.Task) -> None:
    """``max_minutes`` needs one clock: with several workers each would stop by its own, and leave the others
    waiting in an all-reduce."""
    trainer = task.trainer_config
    if trainer.strategy == "multi_worker" and trainer.max_minutes > 0:
        raise config_lib.ConfigError(f"{task.trainer_section}.max_minutes needs a single-worker strategy: each "
                                     "worker would stop at its own time and leave the others waiting in an all-reduce")


BEST_DIR = "best"  # <model_dir>/best: the model of the best evaluation of a train-and-eval run
BEST_MARKER = "best.json"


def _train_and_eval(task: base_task.Task, model: Any, loop: training_loop.TrainingLoop) -> list[training_loop.Hook]:
    """With ``eval_every_steps`` > 0 and held-out inputs: a hook that evaluates the model every that many steps
    (:func:`evaluation.run_evaluation`; TensorBoard ``<model_dir>/eval``) and, when the score named by the task's
    ``best_metric`` beats the best so far (``<model_dir>/best/best.json``, which a resumed run reads), publishes
    the model as ``<model_dir>/best`` (a checkpoint ``ckpt``, written atomically)."""
    every = task.trainer_config.eval_every_steps
    inputs = task.eval_inputs() if every > 0 and loop.chief else None  # one writer of eval/ and best/: the chief
    if inputs is None:
        return []
    model_dir = task.trainer_config.model_dir
    best_dir = os.path.join(model_dir, BEST_DIR)
    name, mode = task.best_metric
    if mode not in ("min", "max"):
        raise ValueError(f"{type(task).__name__}.best_metric: mode {mode!r} is not 'min' or 'max'")

    def hook(step: int, logs: Any) -> None:
        del logs
        if step % every:
            return
        metrics = evaluation.run_evaluation(task, model, inputs)
        evaluation.write_scalars(metrics, os.path.join(model_dir, "eval"), step)
        best = artifacts.read_marker(best_dir, BEST_MARKER) if artifacts.is_complete(best_dir, BEST_MARKER) else None
        value = float(metrics[name])
        if best is not None and not (value < best["value"] if mode == "min" else value > best["value"]):
            return
        with artifacts.staged(best_dir, BEST_MARKER, replace=True) as staging:
            tf.train.Checkpoint(**task.checkpoint_items(model)).write(os.path.join(staging.path, "ckpt"))
            staging.metadata = {"step": step, "metric": name, "value": value,
                                "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
        logger.info("%s: step %d: %s %.5g, the best so far: kept in %s", model_dir, step, name, value, best_dir)

    return [hook]


def _distributed_inputs(task: base_task.Task, strategy: tf.distribute.Strategy, step: int,
                        options: dict[str, Any]) -> Any:
    """The task's inputs split over the replicas; each input pipeline gets its own seed. A resumed run of a task
    that ``resumes_exactly`` continues the order from ``step`` (the seed's order, the first ``step`` batches
    skipped); other tasks draw a new order (seed + step) instead of replaying the examples already seen."""
    seed = options.pop("seed", task.trainer_config.seed)
    if task.resumes_exactly:
        options["start_step"] = step
    else:
        seed += step
    return strategy.distribute_datasets_from_function(
        lambda ctx: task.build_inputs(ctx, seed=seed + ctx.input_pipeline_id, **options))
