"""AdamW with linear warm-up and linear decay, REALM's optimiser (Guu et al., 2020, App. A), built with
tf-models' ``official.modeling.optimization``; optionally with per-variable learning-rate scales and a
constant-then-cool-down schedule (:class:`CooldownDecay`)."""
from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Sequence

import tensorflow as tf
import tf_keras
from official.modeling import optimization
from official.modeling.optimization import legacy_adamw
from official.modeling.optimization import lr_schedule

from realm_tf import config as config_lib

logger = logging.getLogger(__name__)


class ScaledAdamWeightDecay(legacy_adamw.AdamWeightDecay):
    """tf-models' AdamW where variables matching a pattern take ``learning_rate × scale`` (the update and the
    decoupled weight decay both scale; the schedule, moments and checkpoint layout are AdamW's), and where a
    gradient that arrives as rows (``tf.IndexedSlices``: a word-embedding table's) is applied as the dense gradient
    it stands for.

    Adam's sparse update (Kingma & Ba, 2015, as Keras writes it) still decays both moments of every row and moves
    every row, in five passes over the table plus the scattered rows; applied densely, the rows scattered into zeros,
    the same update is one fused ``ApplyAdam`` pass, and the table's reads stop copying it (a variable updated by
    scatters is read by copy). The two give the same values up to float rounding: a row without gradient has its
    moments decayed and moves by ``m / (√v + ε)`` either way.

    Adam's update is invariant to the scale of the gradient, so scaling gradients cannot do this. REALM trains
    every parameter at one rate because its reader starts from BERT with its MLM head; on an import without
    one (MiniLM) the head starts from scratch, and a higher rate for it is the usual remedy. A lower rate for
    the retriever keeps its warm start while the reader learns to use retrieval.

    A variable's name depends on where it was first built: an encoder restored from an import is built on its
    own (``query_embedder_bert/...``), a fresh one inside its model (``knowledge_retriever/...``). Patterns are
    therefore matched against the variable's *path*, ``<component>/<name>`` (see :func:`variable_paths`), so
    ``knowledge_retriever`` means the same variables either way.

    Args:
      lr_scales: ``(regex, scale)`` pairs; a variable takes the scale of the first regex found in its path
        (``re.search``), 1 when none matches.
      paths: variable name -> path (:func:`variable_paths` of the model); a name not in it is its own path.
      **kwargs: ``AdamWeightDecay``'s arguments.
    """

    def __init__(self, lr_scales: Sequence[tuple[str, float]] = (), paths: Mapping[str, str] | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.lr_scales = tuple((str(p), float(s)) for p, s in lr_scales)
        self._compiled = [(re.compile(p), s) for p, s in self.lr_scales]
        self._paths = dict(paths or {})

    def lr_scale(self, variable_name: str) -> float:
        """The learning-rate scale of the variable called ``variable_name``: a MirroredStrategy replica's copy
        (``<name>/replica_<i>:0`` on every replica after the first) takes its variable's."""
        variable_name = _REPLICA_COPY.sub(r"\1", variable_name)
        path = self._paths.get(variable_name, variable_name)
        return next((s for pattern, s in self._compiled if pattern.search(path)), 1.0)

    def _scaled_state(self, var: Any, apply_state: dict | None) -> dict | None:
        scale = self.lr_scale(var.name)
        if scale == 1.0:
            return apply_state
        key = (var.device, var.dtype.base_dtype)
        coefficients = (apply_state or {}).get(key) or self._fallback_apply_state(*key)
        # Adam's dense update (embedding rows included, applied densely) reads lr_t; Keras' sparse one, lr.
        return {key: dict(coefficients, lr_t=coefficients["lr_t"] * scale, lr=coefficients["lr"] * scale)}

    def _resource_apply_dense(self, grad: Any, var: Any, apply_state: dict | None = None) -> Any:
        return super()._resource_apply_dense(grad, var, self._scaled_state(var, apply_state))

    def _resource_apply_sparse(self, grad: Any, var: Any, indices: Any, apply_state: dict | None = None) -> Any:
        # grad [rows, *var.shape[1:]] at unique ``indices`` [rows] (Keras sums duplicates first) -> var's shape
        dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(var, out_type=indices.dtype)[0])
        return self._resource_apply_dense(dense, var, apply_state)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "lr_scales": [list(item) for item in self.lr_scales]}


#: The name MirroredStrategy gives a variable's copy on replica i > 0: ``<name>/replica_<i>:<output>``.
_REPLICA_COPY = re.compile(r"/replica_\d+(:\d+)$")


def variable_paths(model: tf_keras.layers.Layer) -> dict[str, str]:
    """``{variable name: "<component>/<variable name>"}`` for the trainable variables of ``model``'s direct
    sub-layers (e.g. ``knowledge_retriever/query_embedder_bert/...``); a variable two components share keeps
    the first one's path."""
    paths: dict[str, str] = {}
    for layer in getattr(model, "layers", ()):
        for variable in layer.trainable_variables:
            paths.setdefault(variable.name, f"{layer.name}/{variable.name}")
    return paths


def parse_lr_scales(items: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """``("REGEX=SCALE", ...)`` (``pretrain.learning_rate_scales``) → ``((regex, scale), ...)``; ConfigError
    naming the item when it is malformed."""
    parsed = []
    for item in items:
        pattern, sep, scale = str(item).rpartition("=")
        try:
            if not sep or not pattern:
                raise ValueError("expected REGEX=SCALE")
            re.compile(pattern)
            value = float(scale)
            if value < 0:
                raise ValueError("the scale must be >= 0")
        except (ValueError, re.error) as e:
            raise config_lib.ConfigError(f"learning_rate_scales item {item!r}: {e}") from e
        parsed.append((pattern, value))
    return tuple(parsed)


#: Variables without weight decay (regexes searched in their names): every normalisation's scale and offset
#: (BERT's ``LayerNorm``/``layer_norm``, RETRO's ``attention_norm``, ``cca_norm``, ``output_norm``, ...) and every
#: bias, as BERT's AdamW (Devlin et al., 2019; Loshchilov & Hutter, 2019) leaves them.
NO_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "_norm/", "bias")


class CooldownDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
    """``initial_learning_rate`` until ``steps - cooldown_steps``, then linear decay to 0 at ``steps``: the
    warm-up-stable-decay schedule (Hu et al., 2024, "MiniCPM", §4.1; Hägele et al., 2024, "Scaling Laws and
    Compute-Optimal Training Beyond Fixed Training Durations"). A run at a constant rate has no length fixed in
    advance; resumed from any of its checkpoints with ``steps`` set ``cooldown_steps`` further on, it is annealed
    as a linear schedule's end would anneal it."""

    def __init__(self, initial_learning_rate: float, steps: int, cooldown_steps: int,
                 name: str = "CooldownDecay") -> None:
        super().__init__()
        if cooldown_steps < 1 or steps < cooldown_steps:
            raise config_lib.ConfigError(f"learning_rate_decay: cooldown needs 1 <= cooldown_steps <= steps, got "
                                         f"cooldown_steps={cooldown_steps}, steps={steps}")
        self.initial_learning_rate = float(initial_learning_rate)
        self.steps = int(steps)
        self.cooldown_steps = int(cooldown_steps)
        self.name = name

    def __call__(self, step: Any) -> tf.Tensor:
        remaining = (float(self.steps) - tf.cast(step, tf.float32)) / float(self.cooldown_steps)  # []
        return self.initial_learning_rate * tf.clip_by_value(remaining, 0.0, 1.0)

    def get_config(self) -> dict[str, Any]:
        return {"initial_learning_rate": self.initial_learning_rate, "steps": self.steps,
                "cooldown_steps": self.cooldown_steps, "name": self.name}


def build_optimizer(cfg: config_lib.TrainerConfig,
                    model: tf_keras.layers.Layer | None = None) -> tf_keras.optimizers.Optimizer:
    """AdamW (weight decay off for normalisations and biases, :data:`NO_WEIGHT_DECAY`), global-norm clipping,
    wrapped in a dynamic ``LossScaleOptimizer`` for ``precision: mixed_float16``,
    warm-up then linear decay to 0 at ``cfg.steps`` (``learning_rate_decay: constant``: no decay, for a run whose
    length is not fixed in advance; ``cooldown``: constant, then to 0 over the last
    ``cfg.cooldown_steps``, :class:`CooldownDecay`);
    :class:`ScaledAdamWeightDecay`, with ``cfg.learning_rate_scales`` (their patterns match the paths of
    ``model``'s variables, :func:`variable_paths`; none: every variable at the schedule's rate)."""
    opt_config = optimization.OptimizationConfig({
        "optimizer": {"type": "adamw", "adamw": {
            "weight_decay_rate": cfg.weight_decay,
            "exclude_from_weight_decay": list(NO_WEIGHT_DECAY),
            # One clip, of the aggregated gradient (Keras' ``global_clipnorm``). AdamWeightDecay's own clip
            # (``gradient_clip_norm``, 1.0 by default) would run first on each replica's gradient and cap
            # ``pretrain.clip_norm`` at 1; it also costs a second global norm every step (107 L2Losses for MiniLM).
            "gradient_clip_norm": 0.0,
            "global_clipnorm": cfg.clip_norm,
        }},
        "learning_rate": {"type": "polynomial", "polynomial": {
            "initial_learning_rate": cfg.learning_rate,
            "decay_steps": max(cfg.steps, 1),
            "end_learning_rate": 0.0,
        }} if cfg.learning_rate_decay == "linear" else {"type": "constant", "constant": {
            "learning_rate": cfg.learning_rate}},
        "warmup": {"type": "linear", "linear": {"warmup_steps": cfg.warmup_steps}},
    })
    factory = optimization.OptimizerFactory(opt_config)
    schedule = factory.build_learning_rate()
    if cfg.learning_rate_decay == "cooldown":
        decay = CooldownDecay(cfg.learning_rate, cfg.steps, cfg.cooldown_steps)
        schedule = lr_schedule.LinearWarmup(decay, cfg.warmup_steps, warmup_learning_rate=0.0) \
            if cfg.warmup_steps > 0 else decay
    kwargs = {k: v for k, v in opt_config.optimizer.get().as_dict().items() if v is not None}
    adamw = ScaledAdamWeightDecay(lr_scales=parse_lr_scales(cfg.learning_rate_scales),
                                  paths=variable_paths(model) if model is not None else None, learning_rate=schedule,
                                  **kwargs)
    if cfg.precision != "mixed_float16":
        return adamw
    # Dynamic loss scaling (Micikevicius et al., 2018, §3.2): float16 gradients underflow without it.
    return tf_keras.mixed_precision.LossScaleOptimizer(adamw, dynamic_growth_steps=cfg.loss_scale_growth_steps)


def create_slots(optimizer: tf_keras.optimizers.Optimizer, variables: Sequence[tf.Variable]) -> None:
    """Creates ``optimizer``'s state (step counter, hyper-parameters, AdamW's moments) for ``variables`` now,
    under the caller's strategy scope, instead of inside the first traced step.

    ``tf.function`` traces a step that creates variables twice: once to create them, once more to run without
    creating any. For a REALM step that second trace costs as much as the first. Slots restored from a
    checkpoint are filled as they are created (deferred restoration), exactly as in the first step.
    """
    variables = list(variables)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's AdamW
    if hasattr(optimizer, "_create_all_weights"):  # tf_keras' legacy OptimizerV2 (tf-models' AdamWeightDecay)
        optimizer._create_all_weights(variables)  # pylint: disable=protected-access  (no public equivalent)
    else:
        optimizer.build(variables)
