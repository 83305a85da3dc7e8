"""One evaluation loop for every task, in tf-models' protocol (``official/core/base_task.py``): a traced
``validation_step`` per batch (per-example tensors), ``aggregate_logs`` on the host, ``reduce_aggregated_logs``
into the metrics; then the metrics as TensorBoard scalars and a JSON file.

Open-QA evaluation (REALM, Guu et al. 2020, §4.1: exact match over held-out questions) runs through it, so does
any task whose :meth:`Task.validation_step` is its loss (the default aggregation averages the logs).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Iterable, Mapping, Protocol

import tensorflow as tf
import tf_keras
import tqdm

from realm_tf import config as config_lib
from realm_tf.core import base_task
from realm_tf.core import tracing


class Evaluator(Protocol):
    """What :func:`run_evaluation` runs: a :class:`base_task.Task`, or any object with the same three methods."""

    def validation_step(self, inputs: Any, model: tf_keras.Model) -> Any: ...

    def aggregate_logs(self, state: Any, step_outputs: Any) -> Any: ...

    def reduce_aggregated_logs(self, state: Any) -> Any: ...


def run_evaluation(task: Evaluator | base_task.Task, model: tf_keras.Model, dataset: tf.data.Dataset | Iterable,
                   total: int | None = None, description: str = "evaluate",
                   count: Callable[[Any], int] | None = None) -> Any:
    """Runs ``task.validation_step`` over ``dataset`` (traced once), folds each batch's outputs with
    ``task.aggregate_logs`` and returns ``task.reduce_aggregated_logs`` of the whole.

    Args:
      total / count: a progress bar on stderr over ``total`` items, ``count(batch)`` of them per batch (None: none).
    """
    step = tracing.trace_once(lambda batch: task.validation_step(batch, model), dataset)
    progress = (tqdm.tqdm(total=total, desc=description, unit="question", file=sys.stderr, mininterval=10.0)
                if count is not None else None)
    state = None
    for batch in dataset:
        if progress is not None:
            progress.update(count(batch))
        state = task.aggregate_logs(state, step(batch))
    if progress is not None:
        progress.close()
    return task.reduce_aggregated_logs(state)


def write_scalars(metrics: Mapping[str, Any], logdir: str, step: int) -> None:
    """The float metrics as TensorBoard scalars of ``logdir`` at ``step``; a figure with an interval
    (``{"value", "low", "high"}``) inside a group of metrics as ``<group>/<name>``, its value."""
    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default(step=step):
        for key, value in metrics.items():
            if isinstance(value, float):
                tf.summary.scalar(key, value)
            elif isinstance(value, Mapping):
                for name, figure in value.items():
                    if isinstance(figure, Mapping) and isinstance(figure.get("value"), float):
                        tf.summary.scalar(f"{key}/{name}", figure["value"])
    writer.flush()


def write_metrics(metrics: Mapping[str, Any], path: str) -> None:
    """The metrics as one JSON file, written atomically."""
    config_lib.atomic_write_text(path, json.dumps(dict(metrics), indent=2, default=float) + "\n")


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: str) -> None:
    """One JSON object a line (predictions), at ``path`` (local or gs://)."""
    tf.io.gfile.makedirs(os.path.dirname(path) or ".")
    with tf.io.gfile.GFile(path, "w") as f:
        f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
