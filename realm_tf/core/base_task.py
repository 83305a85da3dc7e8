"""The shape every training task has, in the manner of tensorflow/models ``official/core/base_task.py``.

A task turns an experiment config into a model, its inputs, its losses and its metrics; one driver,
:func:`realm_tf.core.experiment.run_experiment`, trains any task under any tf.distribute strategy with
checkpoints, TensorBoard summaries, resume, ``max_minutes`` and SIGTERM handling in one place. ICT (ORQA §5),
REALM pre-training (Guu et al., 2020, §3), the reader warm start and Open-QA fine-tuning (§4) are tasks.

Inputs are ``(features, labels)`` pairs: ``features`` is exactly what the model is called with, ``labels`` is
what the loss and metrics need besides the model's outputs (targets, and per-example bookkeeping such as the
index version that chose the candidates).
"""
from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any, Callable, ClassVar, Mapping, Sequence

import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf.core import training_loop
from realm_tf.layers import bert_tokenizer

Features = Mapping[str, tf.Tensor]
Labels = Mapping[str, tf.Tensor]
Logs = dict[str, tf.Tensor]


@dataclasses.dataclass(frozen=True)
class Phase:
    """A stretch of training with its own inputs and trained variables (most tasks have one).

    Attributes:
      name: shown in the progress output.
      until_step: the phase ends at this global step (``None``: at ``steps``).
      input_options: keyword arguments of :meth:`Task.build_inputs`; phases with equal options share one
        iterator, so no example is seen twice across them.
      options: passed to :meth:`Task.train_step` (e.g. which variables train).
    """

    name: str = "train"
    until_step: int | None = None
    input_options: tuple[tuple[str, Any], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()


class Task(abc.ABC):
    """Base class of the training tasks: model, inputs, losses, metrics, steps.

    Subclasses set :attr:`trainer_section` (the ``TrainerConfig`` section of the experiment config that drives
    them: ``ict``, ``trainer``, ``reader`` or ``finetune``) and implement :meth:`build_model`,
    :meth:`build_inputs` and :meth:`build_losses`.
    """

    trainer_section: ClassVar[str] = "pretrain"
    #: The evaluation score that decides the best model of a train-and-eval run, and whether higher is better.
    best_metric: ClassVar[tuple[str, str]] = ("loss", "min")
    #: True when :meth:`build_inputs` takes ``start_step`` and continues the order a run from step 0 with the same
    #: seed draws (a resumed run sees the batches it would have seen); otherwise a resumed run draws a new order.
    resumes_exactly: ClassVar[bool] = False

    def __init__(self, cfg: config_lib.ExperimentConfig):
        self.cfg = cfg  # no TensorFlow op here: MultiWorkerMirroredStrategy must be created before any

    @functools.cached_property
    def tokenizer(self) -> bert_tokenizer.BertTokenizer:
        """The model's wordpiece tokenizer, built on first use."""
        return bert_tokenizer.BertTokenizer(self.cfg.model.vocab_file, self.cfg.model.lower_case)

    @property
    def trainer_config(self) -> config_lib.TrainerConfig:
        return getattr(self.cfg, self.trainer_section)

    @property
    def global_batch_size(self) -> int:
        """Examples per step over all replicas: the trainer section's ``batch_size``, else ``data.batch_size``."""
        return self.trainer_config.batch_size or self.cfg.data.batch_size

    # ---- what a task defines ------------------------------------------------------------------------------

    @abc.abstractmethod
    def build_model(self) -> tf_keras.Model:
        """The model, with any warm start applied (called inside the strategy's scope)."""

    @abc.abstractmethod
    def build_inputs(self, input_context: tf.distribute.InputContext | None = None, seed: int | None = None,
                     **options: Any) -> tf.data.Dataset:
        """Training batches of ``(features, labels)``, per replica when ``input_context`` is given."""

    @abc.abstractmethod
    def build_losses(self, labels: Labels, outputs: Mapping[str, tf.Tensor]) -> tuple[tf.Tensor, Logs]:
        """The per-example loss ``[batch]`` and named per-example terms the metrics read."""

    def build_metrics(self, labels: Labels, terms: Logs) -> Logs:
        """Scalar metrics of one batch (logged as TensorBoard scalars next to ``loss``), from the per-example
        ``terms`` of :meth:`build_losses` (a training step may read its batch in parts:
        ``gradient_accumulation_steps``)."""
        return {}

    def prepare_inputs(self, inputs: tuple[Features, Labels], model: tf_keras.Model) -> tuple[Features, Labels]:
        """The part of a training step with no XLA kernel (a search, ragged gathers), run before
        :meth:`train_step` and outside its compiled program (``jit_compile``). By default: nothing."""
        return inputs

    def call_model(self, model: tf_keras.Model, features: Features, training: bool) -> Mapping[str, tf.Tensor]:
        """The forward pass (a dict of named tensors)."""
        return model(features, training=training)

    def trainable_variables(self, model: tf_keras.Model, **options: Any) -> Sequence[tf.Variable]:
        """What :meth:`train_step` updates (``options``: the phase's)."""
        return model.trainable_variables

    def checkpoint_items(self, model: tf_keras.Model) -> dict[str, tf.Module]:
        """What the checkpoints hold besides the optimizer and the global step."""
        return {"model": model}

    # ---- the run around the steps -------------------------------------------------------------------------

    def phases(self, step: int) -> list[Phase]:
        """The phases still to run from global ``step`` on."""
        return [Phase()]

    def initialize(self, model: tf_keras.Model, loop: training_loop.TrainingLoop) -> None:
        """Work before the first step, after the checkpoint (if any) is restored (e.g. a head warm-up)."""

    def train_hooks(self, model: tf_keras.Model, loop: training_loop.TrainingLoop) -> Sequence[training_loop.Hook]:
        """Called after every step with ``(step, logs)`` (e.g. exporting the retriever for the index refresh)."""
        return ()

    def finish(self, model: tf_keras.Model, loop: training_loop.TrainingLoop) -> dict[str, Any]:
        """Called once training stopped; returns entries for the run's result (e.g. a held-out evaluation)."""
        return {}

    def close(self) -> None:
        """Releases what :meth:`initialize` started (also after an error)."""

    # ---- steps --------------------------------------------------------------------------------------------

    def train_step(self, inputs: tuple[Features, Labels], model: tf_keras.Model,
                   optimizer: tf_keras.optimizers.Optimizer, global_step: tf.Variable | None = None,
                   **options: Any) -> Logs:
        """One update inside a replica: forward, loss averaged over the global batch, gradients, update."""
        labels = inputs[1]

        def loss_fn(part: tuple[Features, Labels]) -> tuple[tf.Tensor, Logs]:
            part_features, part_labels = part
            return self.build_losses(part_labels, self.call_model(model, part_features, training=True))

        per_example, terms = training_loop.minimize(loss_fn, inputs, self.trainable_variables(model, **options),
                                                    optimizer, self.global_batch_size,
                                                    self.trainer_config.gradient_accumulation_steps)
        return {"loss": tf.reduce_mean(per_example), **self.build_metrics(labels, terms),
                "learning_rate": training_loop.learning_rate(optimizer)}

    def validation_step(self, inputs: tuple[Features, Labels], model: tf_keras.Model) -> Logs:
        """Loss and metrics of one batch without an update (a task whose evaluation is not its loss returns its
        per-example outputs instead, for :meth:`aggregate_logs`)."""
        features, labels = inputs
        outputs = self.call_model(model, features, training=False)
        per_example, terms = self.build_losses(labels, outputs)
        return {"loss": tf.reduce_mean(per_example), **self.build_metrics(labels, terms)}

    # ---- evaluation, in tf-models' protocol (official/core/base_task.py) ----------------------------------

    def eval_inputs(self) -> tf.data.Dataset | None:
        """The held-out batches :meth:`validation_step` reads during train-and-eval (``eval_every_steps``); None:
        the task has none."""
        return None

    def aggregate_logs(self, state: Any, step_outputs: Logs) -> Any:
        """Folds the outputs of one :meth:`validation_step` into the evaluation's state, on the host (``state`` is
        None before the first batch). By default: the sum of each log over the batches and their count."""
        state = state if state is not None else {"batches": 0}
        state["batches"] += 1
        for key, value in step_outputs.items():
            state[key] = state.get(key, 0.0) + float(value)
        return state

    def reduce_aggregated_logs(self, state: Any) -> dict[str, Any]:
        """The metrics of a whole evaluation from its state. By default: the mean of each log over the batches."""
        if not state:
            return {}
        return {key: value / state["batches"] for key, value in state.items() if key != "batches"}


def split_features(keys: Callable[[str], bool]) -> Callable[[Mapping[str, tf.Tensor]], tuple[Features, Labels]]:
    """``batch -> (features, labels)``: the entries whose key satisfies ``keys`` are the model's features."""
    def split(batch: Mapping[str, tf.Tensor]) -> tuple[Features, Labels]:
        return ({k: v for k, v in batch.items() if keys(k)}, {k: v for k, v in batch.items() if not keys(k)})
    return split
