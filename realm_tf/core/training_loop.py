"""A resumable custom training loop under any tf.distribute strategy.

REALM, ICT and Open-QA fine-tuning share it: the task supplies a per-replica ``step_fn(batch) -> logs``
(forward, loss, gradients, update); the loop owns the global step, checkpoints (``tf.train.CheckpointManager``
in ``<model_dir>/checkpoints``, restored on start, so rerunning a killed job resumes), TensorBoard scalars
(``<model_dir>/train``, with ``examples_per_second`` and ``input_wait_fraction``: the share of wall time the
trainer waited for its next batch), progress display and hooks (e.g. exporting the retriever for the index refresh,
Guu et al., 2020, §3.4). SIGTERM (a preemption notice) stops the loop after the current step, with a checkpoint.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import tensorflow as tf
import tf_keras
import tqdm

from realm_tf import config as config_lib
from realm_tf.core import checkpoint_reading
from realm_tf.core import distribution
from realm_tf.core import gradient_accumulation
from realm_tf.core import tracing

logger = logging.getLogger(__name__)

StepFn = Callable[[Mapping[str, tf.Tensor]], Mapping[str, tf.Tensor]]
Hook = Callable[[int, Mapping[str, float]], None]
LossFn = Callable[[Any], tuple[tf.Tensor, Any]]


def minimize(loss_fn: LossFn, inputs: Any, variables: Sequence[tf.Variable], optimizer: Any,
             global_batch_size: int, accumulation_steps: int = 1) -> tuple[tf.Tensor, Any]:
    """One optimizer update inside a replica: ``loss_fn(inputs) -> (per-example loss [batch], per-example terms)``.

    The per-example loss is averaged over the *global* batch (``tf.nn.compute_average_loss``), so summing the
    replicas' gradients gives the full-batch gradient. With ``accumulation_steps`` N > 1 the replica's batch is
    read in N micro-batches and their gradients summed before the update (``core/gradient_accumulation``).
    Variables without a gradient (BERT's pooler, which REALM does not use) are left alone. With a
    ``LossScaleOptimizer`` (``mixed_float16``) the loss is scaled and the gradients unscaled. Returns
    ``loss_fn``'s outputs for the whole batch.
    """
    scaling = isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    # float16: gradients of the loss × scale, unscaled before the update
    grads, per_example, terms = gradient_accumulation.gradients(
        loss_fn, inputs, variables, global_batch_size, accumulation_steps,
        optimizer.get_scaled_loss if scaling else None)
    if scaling:  # a step whose gradients are not finite is skipped, and the scale halves (apply_gradients)
        grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
    return per_example, terms


def learning_rate(optimizer: Any) -> tf.Tensor:
    """The optimizer's current learning rate (its schedule evaluated at its iteration count)."""
    lr = optimizer.learning_rate
    return lr(optimizer.iterations) if callable(lr) else tf.convert_to_tensor(lr)


class TrainingLoop:
    """Runs ``step_fn`` for ``pretrain.steps`` steps with checkpoints and summaries.

    Args:
      cfg: the trainer section of the experiment config.
      strategy: the strategy the model and optimizer were created under.
      checkpoint_items: what to checkpoint besides the step (``model=…, optimizer=…``).
      global_batch_size: examples per step over all replicas (for examples/s).
    """

    progress_keys = ("loss", "accuracy", "mlm_accuracy", "retrieval_utility", "index_version", "bits_per_byte",
                     "tokens_per_second")

    def __init__(self, cfg: config_lib.TrainerConfig, strategy: tf.distribute.Strategy,
                 checkpoint_items: Mapping[str, tf.Module | tf.Variable], global_batch_size: int):
        self.cfg = cfg
        self.strategy = strategy
        self.global_batch_size = global_batch_size
        self.chief = distribution.is_chief(strategy)
        with strategy.scope():
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.checkpoint = tf.train.Checkpoint(global_step=self.global_step, **checkpoint_items)
        directory = os.path.join(cfg.model_dir, "checkpoints")
        if not self.chief:  # non-chief workers write to a scratch directory they delete (MWMS convention)
            directory = os.path.join(cfg.model_dir, "checkpoints-worker-tmp", str(strategy.cluster_resolver.task_id))
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=cfg.keep_checkpoints,
                                                  step_counter=self.global_step,
                                                  checkpoint_interval=cfg.checkpoint_every_steps)
        newest = checkpoint_reading.newest_complete(directory)  # a damaged newest one skipped, with a warning
        if newest is not None and newest != self.manager.latest_checkpoint:
            checkpoint_reading.read(self.checkpoint, newest, resume=True)
            self.restored_from: str | None = newest
        else:
            try:
                self.restored_from = self.manager.restore_or_initialize()
            except checkpoint_reading.DAMAGE_ERRORS as e:
                raise checkpoint_reading.damaged(newest or directory, e) from e
        # Why the last ``run`` ended before its last step: "SIGTERM", "max_minutes", "input exhausted" or None.
        self.stopped_by: str | None = None
        self.writer = tf.summary.create_file_writer(os.path.join(cfg.model_dir, "train")) if self.chief \
            else tf.summary.create_noop_writer()

    @property
    def step(self) -> int:
        return int(self.global_step.numpy())

    @property
    def run_started(self) -> float:
        """When the first :meth:`run` of this loop started (``time.time()``): what ``max_minutes`` counts from."""
        return getattr(self, "_run_start", time.time())

    @property
    def tracing_count(self) -> int:
        """How many times the last :meth:`run` traced its step function (a handful, whatever the lengths)."""
        step = getattr(self, "_train_step", None)
        return step.experimental_get_tracing_count() if step is not None else 0

    def _stop_reason(self, stop: _StopOnSigterm, run_start: float) -> str | None:
        """Why the run stops before its next step (``SIGTERM``, ``max_minutes``), or None."""
        if stop.requested:
            logger.info("\nstopping at step %d: SIGTERM", self.step)
            return "SIGTERM"
        if self.cfg.max_minutes > 0 and time.time() - run_start > 60.0 * self.cfg.max_minutes:
            logger.info("\nstopping at step %d: max_minutes=%g reached", self.step, self.cfg.max_minutes)
            return "max_minutes"
        return None

    def _window_logs(self, sums: dict[str, float], steps: int, input_wait: float, seconds: float) -> dict[str, float]:
        """The scalars of one summary: means over the ``steps`` since the last summary (not the last, noisy step
        alone) and the throughput over its ``seconds``, of which ``input_wait`` went waiting for input."""
        elapsed = max(seconds, 1e-9)
        logs = {key: value / steps for key, value in sums.items()}
        logs["examples_per_second"] = steps * self.global_batch_size / elapsed
        logs["steps_per_second"] = steps / elapsed
        logs["input_wait_fraction"] = min(input_wait / elapsed, 1.0)
        if "tokens" in sums:  # a task's per-replica token count (a mean over replicas) -> throughput
            logs["tokens_per_second"] = sums["tokens"] * self.strategy.num_replicas_in_sync / elapsed
        return logs

    def run(self, dataset: tf.data.Dataset | Iterable, step_fn: StepFn, hooks: Iterable[Hook] = (),
            distribute_dataset: bool = True, until_step: int | None = None) -> dict[str, float]:
        """Trains until ``pretrain.steps`` (or ``until_step``, if smaller); returns the last step's logs (floats).

        A run in stages calls this once per stage with the same iterator (``iter(dataset)``) so no example
        is seen twice; ``pretrain.max_minutes`` counts from the first call.
        """
        if self.restored_from and not hasattr(self, "_run_start"):
            logger.info("resumed from %s at step %d", self.restored_from, self.step)
        if distribute_dataset and isinstance(dataset, tf.data.Dataset):
            dataset = self.strategy.experimental_distribute_dataset(dataset)
        iterator = iter(dataset)

        self.step_fn = step_fn

        def train_step(batch):
            logs = self.strategy.run(step_fn, args=(batch,))
            self.global_step.assign_add(1)
            return {k: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None) for k, v in logs.items()}

        train_step = self._train_step = tracing.trace_once(train_step, dataset)
        self._train_steps = _several_steps(train_step, self.cfg.steps_per_loop) if (
            self.cfg.steps_per_loop > 1 and getattr(dataset, "element_spec", None) is not None) else None
        total = self.cfg.steps if until_step is None else min(until_step, self.cfg.steps)
        bar = tqdm.tqdm(total=self.cfg.steps, initial=self.step, desc="train", unit="step", file=sys.stderr,
                        disable=not self.chief, dynamic_ncols=True, mininterval=2.0)
        self._run_start = getattr(self, "_run_start", time.time())
        stop = _StopOnSigterm()
        try:  # the bar closed before an error is reported (its last line is then the error's)
            last = self._loop(iterator, train_step, hooks, total, bar, stop)
        finally:
            bar.close()
            stop.restore()
        self._save_last_step()
        return last

    def _loop(self, iterator: Any, train_step: Callable[[Any], Mapping[str, tf.Tensor]], hooks: Iterable[Hook],
              total: int, bar: tqdm.tqdm, stop: _StopOnSigterm) -> dict[str, float]:
        """The steps of :meth:`run` up to ``total``; returns the last summary's logs."""
        last: dict[str, float] = {}
        window_start, window_steps, window_wait = time.time(), 0, 0.0
        window_sums: dict[str, float] = {}
        self.stopped_by = None
        while self.step < total:
            self.stopped_by = self._stop_reason(stop, self._run_start)
            if self.stopped_by:
                break
            waited = time.perf_counter()
            several = self._train_steps is not None and total - self.step >= self.cfg.steps_per_loop
            try:
                if several:  # steps_per_loop steps in one call: one host round trip (the mean of their logs)
                    logs, count = self._train_steps(iterator), self.cfg.steps_per_loop
                else:
                    batch = next(iterator)
                    window_wait += time.perf_counter() - waited  # idle while the input pipeline catches up
                    logs, count = train_step(batch), 1
            except (StopIteration, tf.errors.OutOfRangeError):
                logger.info("input exhausted at step %d", self.step)
                self.stopped_by = "input exhausted"
                break
            window_steps += count
            step = self.step
            last = {k: float(v) for k, v in logs.items()}
            for key, value in last.items():
                window_sums[key] = window_sums.get(key, 0.0) + value * count
            bar.update(count)
            if step % self.cfg.summary_every_steps == 0 or step == self.cfg.steps:
                last = self._window_logs(window_sums, window_steps, window_wait, time.time() - window_start)
                self._write_summaries(step, last)
                bar.set_postfix({k: f"{v:.4g}" for k, v in last.items() if k in self.progress_keys})
                window_start, window_steps, window_wait, window_sums = time.time(), 0, 0.0, {}
            for hook in hooks:
                hook(step, last)
            self.manager.save(checkpoint_number=self.global_step)  # no-op between checkpoint intervals
        return last

    def _save_last_step(self) -> None:
        """A checkpoint of the step the run stopped at (between checkpoint intervals too), summaries flushed."""
        latest = self.manager.latest_checkpoint
        if not latest or not latest.endswith(f"-{self.step}"):
            self.manager.save(checkpoint_number=self.global_step, check_interval=False)
        self.writer.flush()

    def _write_summaries(self, step: int, logs: Mapping[str, float]) -> None:
        with self.writer.as_default(step=step):
            for key, value in logs.items():
                tf.summary.scalar(key, value)


def _several_steps(train_step: Callable[[Any], Mapping[str, tf.Tensor]],
                   count: int) -> Callable[[Any], dict[str, tf.Tensor]]:
    """``count`` calls of the traced ``train_step`` on the iterator's next batches inside one ``tf.function`` (a
    ``tf.while_loop``, as Orbit's multi-step loops): the host waits once per ``count`` steps. Returns the mean of
    their logs."""
    def steps(iterator: Any) -> dict[str, tf.Tensor]:
        first = {k: tf.cast(v, tf.float32) for k, v in train_step(next(iterator)).items()}

        def body(i: tf.Tensor, sums: dict[str, tf.Tensor]) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
            logs = train_step(next(iterator))
            return i + 1, {k: sums[k] + tf.cast(logs[k], tf.float32) for k in sums}

        _, sums = tf.while_loop(lambda i, sums: i < count, body, (tf.constant(1), first))
        return {k: v / count for k, v in sums.items()}
    return tf.function(steps, autograph=False)


class _StopOnSigterm:
    """Turns SIGTERM (preemption, ``kill``, a supervisor) into "checkpoint and stop after this step"."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
