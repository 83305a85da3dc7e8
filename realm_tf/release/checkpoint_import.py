"""Reads Google's released TF1 REALM and ORQA checkpoints by variable name into our Keras networks.

The released models (REALM, Guu et al., 2020; ORQA, Lee et al., 2019) are TF1 checkpoints and TF-Hub v1 modules
(whose weights are the checkpoint ``<module>/variables/variables``). Their variable names come from the original
code in google-research/language and google-research/bert:

* a BERT is ``bert/embeddings/{word_embeddings, position_embeddings, token_type_embeddings, LayerNorm}``,
  ``bert/encoder/layer_<i>/attention/{self/{query,key,value}, output/{dense,LayerNorm}}``,
  ``bert/encoder/layer_<i>/{intermediate/dense, output/dense, output/LayerNorm}``, ``bert/pooler/dense``, and
  its masked-LM head ``cls/predictions/{transform/dense, transform/LayerNorm, output_bias}`` (bert ``modeling.py``
  and ``run_pretraining.py``; :func:`realm_tf.networks.bert_weight_import.original_bert_name`);
* every TF-Hub nesting level adds ``module/`` (``hub.Module``'s default name): ORQA's ICT module wraps a BERT
  module (``language/orqa/models/ict_model.py``: ``module_fn`` projects the BERT module's ``pooled_output``
  with ``tf.layers.dense`` → ``dense/``, then a LayerNorm); the released REALM embedder
  (``gs://realm-data/cc_news_pretrained/embedder``) is ``module/module/module/bert/...`` with its projection in
  ``module/module/{dense, LayerNorm}``;
* ORQA's fine-tuned model (``language/orqa/models/orqa_model.py``, also ``gs://realm-data/orqa_*_model_from_realm``)
  instantiates the retriever module at the top (one more ``module/``: ``module/module/module/module/bert/...``,
  ``module/module/module/{dense, LayerNorm}``) and, in ``tf.variable_scope("reader")``, the reader's BERT module
  (``reader/module/bert/...``, ``reader/module/cls/...``), ``tf.layers.dense(2·span_hidden)`` → ``reader/dense``,
  ``tf.keras.layers.LayerNormalization()`` → ``reader/layer_normalization`` and ``tf.layers.dense(1)`` →
  ``reader/dense_1``. The block embeddings are a local variable (``scann_utils.load_scann_searcher``), not part of it.

:class:`Tf1CheckpointImport` pairs each Keras variable with the checkpoint variable(s) it comes from and checks
both directions before anything is assigned: a model variable without a source, a source that is missing or
mis-shaped, and a checkpoint variable that nothing consumed are all listed in one :class:`WeightImportError`.
Only variables explicitly declared as not being weights of the model are left, each with its reason, in
:attr:`Tf1CheckpointImport.ignored`: the optimizer's state and global step, and the MLM / NSP heads of BERT
modules whose outputs the original graph never reads.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf.networks import bert_weight_import

WeightImportError = bert_weight_import.WeightImportError

#: What a TF1 training checkpoint holds next to the weights (BERT's ``AdamWeightDecayOptimizer`` slots
#: ``<variable>/adam_m``, ``<variable>/adam_v``, and the global step): state of the optimizer, not of the model.
TRAINING_STATE = {
    r"(^|/)adam_[mv]$": "optimizer state (BERT's AdamWeightDecayOptimizer slot)",
    r"^global_step$": "training step counter",
}
#: ε of ``tf.contrib.layers.layer_norm`` (BERT's ``modeling.layer_norm``, the REALM embedder's ``LayerNorm``) and of
#: ``tf.keras.layers.LayerNormalization()`` (ORQA's open-source code: ``layer_normalization``).
LAYER_NORM_EPSILON = {"LayerNorm": 1e-12, "layer_normalization": 1e-3}
#: The tanh GELU of the original BERT code (``modeling.gelu``): ``encoder.hidden_act`` of every released model.
ORIGINAL_HIDDEN_ACT = "gelu_new"
#: Attention head width of every released BERT (BERT-base: 768 / 12); the checkpoint does not record the heads.
HEAD_SIZE = 64

Combine = Callable[[Sequence[np.ndarray]], np.ndarray]


class Tf1CheckpointImport:
    """Assignments from a TF1 checkpoint's variables, by their original names, to Keras variables.

    Args:
      path: a checkpoint, TF-Hub module or ORQA model directory (:func:`checkpoint_prefix`), on any
        ``tf.io.gfile`` filesystem (local, gs://).
      ignore: extra ``{regex: reason}`` of checkpoint variables that are not weights of the model (beside
        :data:`TRAINING_STATE`); each ignored variable is listed in :attr:`ignored` with its reason.

    Declare what fills every model variable with :meth:`assign` (or the ``add_*`` functions of this module), then
    :meth:`apply`. Nothing is assigned unless every check passes.
    """

    def __init__(self, path: str, ignore: dict[str, str] | None = None) -> None:
        self.path = path = checkpoint_prefix(path)
        try:
            self._reader = tf.train.load_checkpoint(path)
        except (tf.errors.OpError, ValueError) as e:
            raise WeightImportError(f"{path}: cannot read a TF checkpoint: {e}") from e
        self.shapes: dict[str, tuple[int, ...]] = {
            name: tuple(int(d) for d in shape) for name, shape in self._reader.get_variable_to_shape_map().items()}
        self._ignore = {**TRAINING_STATE, **(ignore or {})}
        self._assignments: dict[Any, tuple[tf.Variable, tuple[str, ...], Combine]] = {}
        self.problems: list[str] = []
        self.ignored: dict[str, str] = {}
        self.assigned: dict[str, list[str]] = {}

    @property
    def names(self) -> list[str]:
        """Every variable name in the checkpoint, sorted."""
        return sorted(self.shapes)

    def ignore(self, pattern: str, reason: str) -> None:
        """Checkpoint variables matching ``pattern`` (a regex) are not weights of the model, for ``reason``."""
        self._ignore[pattern] = reason

    def assign(self, variable: tf.Variable, sources: Sequence[str], shapes: Sequence[Sequence[int]],
               combine: Combine | None = None) -> None:
        """``variable`` gets ``combine([source values])`` (default: the one source reshaped to the variable).

        ``shapes`` are the shapes the original graph gives ``sources``; a missing source or another shape is a
        problem reported by :meth:`apply`, with the variable it was needed for.
        """
        if variable.ref() in self._assignments:
            raise ValueError(f"{variable.name} is assigned twice")
        for source, shape in zip(sources, shapes):
            if source not in self.shapes:
                self.problems.append(f"missing checkpoint variable '{source}' {list(shape)} (for {variable.name})")
            elif self.shapes[source] != tuple(shape):
                self.problems.append(f"checkpoint variable '{source}' has shape {list(self.shapes[source])}, "
                                     f"expected {list(shape)} (for {variable.name} {list(variable.shape)})")
        self._assignments[variable.ref()] = (variable, tuple(sources), combine or _reshaped(variable))

    def apply(self, modules: Iterable[tf.Module]) -> dict[str, Any]:
        """Checks that every variable of ``modules`` has a source and every checkpoint variable was consumed
        (or is ignored), then assigns them all.

        Returns:
          ``{"checkpoint", "assigned": {model variable: [sources]}, "ignored": {checkpoint variable: reason}}``.

        Raises:
          WeightImportError: naming the checkpoint and listing every problem (model variables not filled, missing
            or mis-shaped sources, checkpoint variables not consumed).
        """
        problems = list(self.problems)
        wanted = {}
        for module in modules:
            for variable in module.variables:
                wanted.setdefault(variable.ref(), variable)
        unfilled = sorted(v.name for ref, v in wanted.items() if ref not in self._assignments)
        problems += [f"model variable {name} has no source in the checkpoint" for name in unfilled]
        consumed = {source for _, sources, _ in self._assignments.values() for source in sources}
        self.ignored = {}
        for name in self.names:
            if name in consumed:
                continue
            reason = next((r for pattern, r in self._ignore.items() if re.search(pattern, name)), None)
            if reason is None:
                problems.append(f"checkpoint variable '{name}' {list(self.shapes[name])} is not consumed by the "
                                "model")
            else:
                self.ignored[name] = reason
        if problems:
            raise WeightImportError(f"{self.path}: the checkpoint does not match the model ({len(problems)} "
                                    "problem(s)):\n  " + "\n  ".join(problems))
        values = []
        for variable, sources, combine in self._assignments.values():
            value = np.asarray(combine([self._reader.get_tensor(s) for s in sources]))
            if value.shape != tuple(variable.shape):
                raise WeightImportError(f"{self.path}: {', '.join(sources)} give shape {list(value.shape)} for "
                                        f"{variable.name} {list(variable.shape)}")
            values.append((variable, value))
        for variable, value in values:
            variable.assign(value.astype(variable.dtype.as_numpy_dtype))
        self.assigned = {v.name: list(sources) for v, sources, _ in self._assignments.values()}
        return {"checkpoint": self.path, "assigned": self.assigned, "ignored": self.ignored}

    def find_scopes(self, tail: str, scope_pattern: str = r"(?:module/)*") -> list[str]:
        """The scopes (prefixes matching ``scope_pattern``) under which the checkpoint holds ``tail``."""
        found = []
        for name in self.names:
            if name.endswith(tail) and re.fullmatch(scope_pattern, name[:len(name) - len(tail)]):
                found.append(name[:len(name) - len(tail)])
        return found


def checkpoint_prefix(src: str) -> str:
    """The checkpoint of a released model: ``src`` itself (a prefix), a TF-Hub module's ``variables/variables``,
    an ORQA model directory's best export (``export/best_default/checkpoint/model.ckpt-N``, what
    ``orqa_model.get_predictor`` restores; the highest N) or a directory's latest checkpoint."""
    src = src.rstrip("/")
    if tf.io.gfile.exists(src + ".index"):
        return src
    module = f"{src}/variables/variables"
    if tf.io.gfile.exists(module + ".index"):
        return module
    best = tf.io.gfile.glob(f"{src}/export/best_default/checkpoint/*.index")
    if best:
        return max((p[:-len(".index")] for p in best), key=lambda p: (_step_of(p), p))
    latest = tf.train.latest_checkpoint(src) if tf.io.gfile.isdir(src) else None
    if latest:
        return latest
    raise WeightImportError(f"{src}: no TF checkpoint: neither a checkpoint prefix ({src}.index), a TF-Hub module "
                            f"({module}.index), an ORQA model directory (export/best_default/checkpoint/*.index) "
                            "nor a directory with a checkpoint state file")


# ---- the original names of our networks' variables ----------------------------------------------------------------


def add_bert(imp: Tf1CheckpointImport, encoder: tf_keras.layers.Layer, scope: str) -> None:
    """Every variable of a BertEncoderV2 from ``<scope>bert/...`` (google-research/bert names)."""
    bert_weight_import.ensure_built(encoder)
    for variable in encoder.weights:
        key = bert_weight_import.encoder_variable_key(variable, imp.path)
        name = scope + "bert/" + bert_weight_import.original_bert_name(key, imp.path)
        imp.assign(variable, [name], [_original_shape(key, tuple(variable.shape))])


def add_masked_lm(imp: Tf1CheckpointImport, masked_lm: tf_keras.layers.Layer, scope: str) -> None:
    """tf-models' ``MaskedLM`` from BERT's ``<scope>cls/predictions/{transform/dense, transform/LayerNorm,
    output_bias}`` (the output embedding is the encoder's word embedding table, tied as in BERT)."""
    prefix = scope + "cls/predictions/"
    add_dense(imp, masked_lm.dense, prefix + "transform/dense")
    add_layer_norm(imp, masked_lm.layer_norm, prefix + "transform/LayerNorm")
    imp.assign(masked_lm.bias, [prefix + "output_bias"], [tuple(masked_lm.bias.shape)])


def add_dense(imp: Tf1CheckpointImport, layer: tf_keras.layers.Dense, name: str) -> None:
    """A Keras Dense from ``tf.layers.dense``'s ``<name>/kernel`` [in, out] and ``<name>/bias`` [out]."""
    imp.assign(layer.kernel, [name + "/kernel"], [tuple(layer.kernel.shape)])
    imp.assign(layer.bias, [name + "/bias"], [tuple(layer.bias.shape)])


def add_layer_norm(imp: Tf1CheckpointImport, layer: tf_keras.layers.LayerNormalization, name: str) -> None:
    """A Keras LayerNormalization from ``<name>/gamma`` and ``<name>/beta``."""
    imp.assign(layer.gamma, [name + "/gamma"], [tuple(layer.gamma.shape)])
    imp.assign(layer.beta, [name + "/beta"], [tuple(layer.beta.shape)])


def add_embedder(imp: Tf1CheckpointImport, embedder: tf_keras.Model, scope: str, layer_norm_name: str) -> None:
    """An :class:`~realm_tf.networks.embedder.Embedder` (``pooling="pooled"``) from an ICT/REALM embedder module:
    its projection ``<scope>dense`` and ``<scope><layer_norm_name>``, its BERT one module deeper,
    ``<scope>module/bert/...``; the BERT module's own heads (``<scope>module/cls/...``) are ignored, the embedder
    never reads them."""
    add_bert(imp, embedder.encoder, scope + "module/")
    add_dense(imp, embedder.projection, scope + "dense")
    add_layer_norm(imp, embedder.layer_norm, scope + layer_norm_name)
    imp.ignore("^" + re.escape(scope + "module/cls/"), "the embedder's BERT module's pre-training heads: the "
               "embedder projects pooled_output only (ORQA ict_model.module_fn)")


def add_orqa_span_scorer(imp: Tf1CheckpointImport, span_hidden: tf_keras.layers.Dense,
                         span_layer_norm: tf_keras.layers.LayerNormalization, span_logit: tf_keras.layers.Dense,
                         scope: str = "reader/") -> None:
    """The span MLP of a :class:`~realm_tf.models.span_reader.SpanReader` (``span_layer_norm`` on) from ORQA's
    reader (``orqa_model.read``): ``<scope>dense`` [hidden, 2·span_hidden] projects every position and its halves
    are the start and end projections, ``<scope>layer_normalization``, ``<scope>dense_1`` [span_hidden, 1].

    ``span_hidden`` computes ReLU(h_s·K[:hidden] + h_e·K[hidden:] + b): K stacks the two halves of ORQA's kernel
    ([hidden, 2S] → [2·hidden, S]) and b is the sum of its bias halves, since ORQA adds the two projections.
    """
    width = int(span_hidden.kernel.shape[1])
    hidden = int(span_hidden.kernel.shape[0]) // 2
    imp.assign(span_hidden.kernel, [scope + "dense/kernel"], [(hidden, 2 * width)],
               lambda v: np.concatenate([v[0][:, :width], v[0][:, width:]], axis=0))  # [2 * hidden, width]
    imp.assign(span_hidden.bias, [scope + "dense/bias"], [(2 * width,)],
               lambda v: v[0][:width] + v[0][width:])  # [width]
    add_layer_norm(imp, span_layer_norm, scope + "layer_normalization")
    add_dense(imp, span_logit, scope + "dense_1")


# ---- what the checkpoint says about the architecture -------------------------------------------------------------


def embedder_scope(imp: Tf1CheckpointImport, nested: bool = False) -> tuple[str, str]:
    """``(scope, layer_norm_name)`` of the one embedder the checkpoint holds: the ``(module/)*`` scope with a
    ``dense`` projection, a LayerNorm (``LayerNorm`` or ``layer_normalization``) and a BERT module below it.
    ``nested``: the embedder was instantiated inside another graph (ORQA's fine-tuned model: ``module/...``)."""
    scopes = [s for s in imp.find_scopes("dense/kernel")
              if s + "module/bert/embeddings/word_embeddings" in imp.shapes and (s or not nested)]
    if len(scopes) != 1:
        found = ", ".join(repr(s) for s in scopes) or "none"
        raise WeightImportError(
            f"{imp.path}: expected one REALM/ORQA embedder (<scope>dense/kernel and <scope>module/bert/..., "
            f"<scope> made of 'module/'), found {found}; top-level names: {_top_level(imp.names)}")
    names = [n for n in LAYER_NORM_EPSILON if scopes[0] + n + "/gamma" in imp.shapes]
    if len(names) != 1:
        raise WeightImportError(f"{imp.path}: expected one LayerNorm of the projection, {scopes[0]}LayerNorm or "
                                f"{scopes[0]}layer_normalization; found {names or 'neither'}")
    return scopes[0], names[0]


def bert_scope(imp: Tf1CheckpointImport, scope_pattern: str = r"(?:module/)*") -> str:
    """The one scope (matching ``scope_pattern``) of ``<scope>bert/embeddings/word_embeddings``."""
    scopes = imp.find_scopes("bert/embeddings/word_embeddings", scope_pattern)
    if len(scopes) != 1:
        raise WeightImportError(f"{imp.path}: expected one BERT (<scope>bert/embeddings/word_embeddings with <scope> "
                                f"matching {scope_pattern!r}), found {scopes or 'none'}; top-level names: "
                                f"{_top_level(imp.names)}")
    return scopes[0]


def encoder_config(imp: Tf1CheckpointImport, scope: str,
                   num_attention_heads: int = 0) -> config_lib.EncoderConfig:
    """The :class:`EncoderConfig` of the BERT under ``<scope>bert/``, read from its variables' shapes.

    The heads are not in the checkpoint: ``num_attention_heads`` or hidden / :data:`HEAD_SIZE`. The activation is
    the original code's tanh GELU (:data:`ORIGINAL_HIDDEN_ACT`).
    """
    base = scope + "bert/"
    try:
        vocab, hidden = imp.shapes[base + "embeddings/word_embeddings"]
        positions = imp.shapes[base + "embeddings/position_embeddings"][0]
        types = imp.shapes[base + "embeddings/token_type_embeddings"][0]
        intermediate = imp.shapes[base + "encoder/layer_0/intermediate/dense/kernel"][1]
    except KeyError as e:
        raise WeightImportError(f"{imp.path}: missing checkpoint variable '{e.args[0]}' of the BERT under "
                                f"'{base}'") from e
    layers = {int(m.group(1)) for n in imp.names if (m := re.match(re.escape(base) + r"encoder/layer_(\d+)/", n))}
    heads = num_attention_heads or max(1, hidden // HEAD_SIZE)
    if hidden % heads:
        raise WeightImportError(f"{imp.path}: hidden size {hidden} is not divisible by {heads} attention heads "
                                "(--num-attention-heads)")
    return config_lib.EncoderConfig(vocab_size=vocab, hidden_size=hidden, num_layers=len(layers),
                                    num_attention_heads=heads, intermediate_size=intermediate,
                                    hidden_act=ORIGINAL_HIDDEN_ACT, max_position_embeddings=positions,
                                    type_vocab_size=types)


# ----------------------------------------------------------------------------------------------------------
# Implementation.


def _reshaped(variable: tf.Variable) -> Combine:
    shape = tuple(variable.shape)
    return lambda values: np.reshape(values[0], shape)


def _original_shape(key: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape BERT's code gives the variable that BertEncoderV2 holds as ``key`` of ``shape``: attention
    projections are one [hidden, hidden] matrix there, [hidden, heads, head_size] (or its transpose) here."""
    if re.search(r"self_attention/(query|key|value)/kernel$", key):
        return shape[0], shape[1] * shape[2]  # [hidden, heads * head_size]
    if re.search(r"self_attention/(query|key|value)/bias$", key):
        return (shape[0] * shape[1],)  # [heads * head_size]
    if key.endswith("self_attention/attention_output/kernel"):
        return shape[0] * shape[1], shape[2]  # [heads * head_size, hidden]
    return shape


def _step_of(prefix: str) -> int:
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else -1


def _top_level(names: Sequence[str], limit: int = 12) -> str:
    scopes = sorted({n.split("/")[0] for n in names})
    return ", ".join(scopes[:limit]) + (f", ... ({len(scopes)} in all)" if len(scopes) > limit else "")
