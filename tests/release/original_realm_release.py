"""Tiny stand-ins for Google's released REALM / ORQA checkpoints, and the original graphs written out in numpy.

Checkpoints are written as the originals were: ``tf.compat.v1`` variables in a graph, saved by
``tf.compat.v1.train.Saver``, under the names google-research/bert's ``modeling.py`` gives a BERT and
google-research/language's REALM / ORQA code gives the rest (each TF-Hub nesting level adds ``module/``). ORQA's span
scorer is not spelt out here: its variables are created by running ``orqa_model.read``'s own layer calls in a TF1
graph (``tf.compat.v1.layers.dense`` and ``tf.keras.layers.LayerNormalization`` in ``variable_scope("reader")``),
so their names, shapes and the LayerNorm's epsilon are TF1's, and that graph's output is a second reference.

The numpy references (float64) are the original graphs: BERT with the tanh GELU (``modeling.gelu``), LayerNorm
ε = 1e-12 and the attention mask's -10000; its pooler tanh(W·h_[CLS] + b); the embedder's dense → LayerNorm over the
pooled output (``ict_model.module_fn``); ORQA's span scores dense_1(LayerNorm(ReLU(start[s] + end[e])));
BERT's MLM head (``run_pretraining.get_masked_lm_output``).
"""
from __future__ import annotations

import math
import os
from typing import Callable

import numpy as np
import tensorflow as tf

#: A 2-layer, 32-wide BERT (2 heads of 16) with 48 positions.
DIMS = {"vocab": 40, "hidden": 32, "layers": 2, "heads": 2, "intermediate": 64, "positions": 48, "types": 2}


def _normal(rng: np.random.Generator, shape, scale: float = 0.1) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _layer_norm_variables(rng, name: str, width: int) -> dict[str, np.ndarray]:
    return {name + "/gamma": 1.0 + _normal(rng, [width]), name + "/beta": _normal(rng, [width])}


def _dense_variables(rng, name: str, fan_in: int, fan_out: int) -> dict[str, np.ndarray]:
    return {name + "/kernel": _normal(rng, [fan_in, fan_out], 0.3), name + "/bias": _normal(rng, [fan_out])}


def bert_variables(rng: np.random.Generator, scope: str, dims: dict = DIMS) -> dict[str, np.ndarray]:
    """A BERT's variables, named as google-research/bert ``modeling.py`` names them, under ``<scope>bert/``."""
    h, b = dims["hidden"], scope + "bert/"
    out = {b + "embeddings/word_embeddings": _normal(rng, [dims["vocab"], h], 0.5),
           b + "embeddings/token_type_embeddings": _normal(rng, [dims["types"], h], 0.5),
           b + "embeddings/position_embeddings": _normal(rng, [dims["positions"], h], 0.5),
           **_layer_norm_variables(rng, b + "embeddings/LayerNorm", h)}
    for i in range(dims["layers"]):
        layer = f"{b}encoder/layer_{i}/"
        for name in ("query", "key", "value"):
            out.update(_dense_variables(rng, layer + "attention/self/" + name, h, h))
        out.update(_dense_variables(rng, layer + "attention/output/dense", h, h))
        out.update(_layer_norm_variables(rng, layer + "attention/output/LayerNorm", h))
        out.update(_dense_variables(rng, layer + "intermediate/dense", h, dims["intermediate"]))
        out.update(_dense_variables(rng, layer + "output/dense", dims["intermediate"], h))
        out.update(_layer_norm_variables(rng, layer + "output/LayerNorm", h))
    out.update(_dense_variables(rng, b + "pooler/dense", h, h))
    return out


def mlm_variables(rng: np.random.Generator, scope: str, dims: dict = DIMS) -> dict[str, np.ndarray]:
    """BERT's masked-LM head (``run_pretraining.get_masked_lm_output``) under ``<scope>cls/predictions/``."""
    p = scope + "cls/predictions/"
    return {**_dense_variables(rng, p + "transform/dense", dims["hidden"], dims["hidden"]),
            **_layer_norm_variables(rng, p + "transform/LayerNorm", dims["hidden"]),
            p + "output_bias": _normal(rng, [dims["vocab"]])}


def projection_variables(rng: np.random.Generator, scope: str, layer_norm: str, hidden: int,
                         size: int) -> dict[str, np.ndarray]:
    """The embedder's projection: ``tf.layers.dense`` → ``<scope>dense``, then ``<scope><layer_norm>``."""
    return {**_dense_variables(rng, scope + "dense", hidden, size),
            **_layer_norm_variables(rng, scope + layer_norm, size)}


def embedder_variables(rng: np.random.Generator, scope: str, layer_norm: str = "LayerNorm", size: int = 16,
                       dims: dict = DIMS) -> dict[str, np.ndarray]:
    """An embedder module (REALM's ``cc_news_pretrained/embedder`` at ``scope="module/module/"``): the projection in
    ``<scope>``, its BERT module one level deeper (``<scope>module/bert/``, with that module's MLM head)."""
    return {**bert_variables(rng, scope + "module/", dims), **mlm_variables(rng, scope + "module/", dims),
            **projection_variables(rng, scope, layer_norm, dims["hidden"], size)}


def write_checkpoint(prefix: str, variables: dict[str, np.ndarray], training_state: bool = False,
                     build: Callable[[], dict] | None = None, feed: Callable[[], dict] | None = None) -> dict:
    """Saves ``variables`` with ``tf.compat.v1.train.Saver`` at ``prefix``, as a TF1 program would.

    Args:
      training_state: also BERT's ``AdamWeightDecayOptimizer`` slots (``<name>/adam_m``, ``<name>/adam_v``) and
        ``global_step``, as in a checkpoint saved during training.
      build: called inside the graph after the variables exist: may create more variables (with TF1's own naming)
        and returns named output tensors.
      feed: ``{placeholder name: value}`` for evaluating ``build``'s outputs (none: they are not evaluated).

    Returns ``{"prefix", "values": {name: every saved variable's value}, "outputs": build's outputs evaluated}``.
    """
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    with tf.Graph().as_default() as graph:
        tf.compat.v1.set_random_seed(1)
        for name, value in variables.items():
            tf.compat.v1.get_variable(name, initializer=tf.constant(value))
        outputs = build() if build else {}
        weights = list(tf.compat.v1.global_variables())
        if training_state:
            for v in list(weights):
                for slot in ("adam_m", "adam_v"):
                    tf.compat.v1.get_variable(f"{v.op.name}/{slot}", shape=v.shape, initializer=tf.zeros_initializer())
            tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver(tf.compat.v1.global_variables())
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            values = session.run({v.op.name: v for v in tf.compat.v1.global_variables()})
            feed_dict = {graph.get_tensor_by_name(k + ":0"): v for k, v in (feed() if feed else {}).items()}
            evaluated = session.run(outputs, feed_dict=feed_dict) if outputs and feed else {}
            path = saver.save(session, prefix, write_meta_graph=False)
    return {"prefix": path, "values": values, "outputs": evaluated}


def write_hub_module(directory: str, variables: dict[str, np.ndarray], vocab_file: str | None = None) -> str:
    """A TF-Hub v1 module's weights (``<directory>/variables/variables``) and ``assets/vocab.txt``."""
    write_checkpoint(os.path.join(directory, "variables", "variables"), variables)
    if vocab_file:
        os.makedirs(os.path.join(directory, "assets"), exist_ok=True)
        tf.io.gfile.copy(vocab_file, os.path.join(directory, "assets", "vocab.txt"), overwrite=True)
    return directory


def orqa_span_scorer_graph(span_hidden: int, hidden: int = DIMS["hidden"]) -> Callable[[], dict]:
    """``build`` for :func:`write_checkpoint`: ORQA's span scoring (``orqa_model.read``) in
    ``variable_scope("reader")``, fed ``reader_token_emb`` [beam, len, hidden], ``reader_starts`` /
    ``reader_ends`` [num_spans]."""

    def build() -> dict:
        token_emb = tf.compat.v1.placeholder(tf.float32, [None, None, hidden], name="reader_token_emb")
        starts = tf.compat.v1.placeholder(tf.int32, [None], name="reader_starts")
        ends = tf.compat.v1.placeholder(tf.int32, [None], name="reader_ends")
        with tf.compat.v1.variable_scope("reader"):
            init = tf.compat.v1.truncated_normal_initializer(stddev=0.3)
            projection = tf.compat.v1.layers.dense(token_emb, span_hidden * 2, kernel_initializer=init,
                                                   bias_initializer=init)
            start_projection, end_projection = tf.split(projection, 2, -1)
            hidden_state = tf.nn.relu(tf.gather(start_projection, starts, axis=1)
                                      + tf.gather(end_projection, ends, axis=1))
            norm = tf.keras.layers.LayerNormalization(axis=-1, beta_initializer=init,
                                                      gamma_initializer=tf.compat.v1.random_normal_initializer(1., .3))
            hidden_state = norm(hidden_state)
            logits = tf.squeeze(tf.compat.v1.layers.dense(hidden_state, 1, kernel_initializer=init,
                                                          bias_initializer=init), -1)
        return {"reader_logits": logits, "layer_norm_epsilon": tf.constant(norm.epsilon)}

    return build


# ---- the original graphs in numpy ----------------------------------------------------------------------------------


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """google-research/bert ``modeling.gelu``."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x: np.ndarray, values: dict, name: str, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * values[name + "/gamma"] + values[name + "/beta"]


def dense(x: np.ndarray, values: dict, name: str) -> np.ndarray:
    return x @ values[name + "/kernel"] + values[name + "/bias"]


def bert(values: dict, scope: str, ids: np.ndarray, mask: np.ndarray, types: np.ndarray,
         heads: int = DIMS["heads"]) -> tuple[np.ndarray, np.ndarray]:
    """``(sequence_output [batch, len, hidden], pooled_output [batch, hidden])`` of the BERT under
    ``<scope>bert/`` (google-research/bert ``BertModel``), in float64."""
    w = {k: v.astype(np.float64) for k, v in values.items() if k.startswith(scope + "bert/")}
    b = scope + "bert/"
    batch, length = ids.shape
    x = (w[b + "embeddings/word_embeddings"][ids] + w[b + "embeddings/token_type_embeddings"][types]
         + w[b + "embeddings/position_embeddings"][:length][None])
    x = layer_norm(x, w, b + "embeddings/LayerNorm", 1e-12)  # [batch, len, hidden]
    hidden = x.shape[-1]
    size = hidden // heads
    adder = (1.0 - mask[:, None, None, :].astype(np.float64)) * -10000.0  # [batch, 1, 1, len]
    layer = 0
    while f"{b}encoder/layer_{layer}/attention/self/query/kernel" in w:
        p = f"{b}encoder/layer_{layer}/"

        def heads_of(t: np.ndarray) -> np.ndarray:
            return t.reshape(batch, length, heads, size).transpose(0, 2, 1, 3)  # [batch, heads, len, size]

        q, k, v = (heads_of(dense(x, w, p + "attention/self/" + n)) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(size) + adder  # [batch, heads, len, len]
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        x = layer_norm(dense(context, w, p + "attention/output/dense") + x, w, p + "attention/output/LayerNorm", 1e-12)
        inner = gelu_tanh(dense(x, w, p + "intermediate/dense"))
        x = layer_norm(dense(inner, w, p + "output/dense") + x, w, p + "output/LayerNorm", 1e-12)
        layer += 1
    pooled = np.tanh(dense(x[:, 0], w, b + "pooler/dense"))  # [batch, hidden]
    return x, pooled


def embed(values: dict, scope: str, layer_norm_name: str, eps: float, ids: np.ndarray, mask: np.ndarray,
          types: np.ndarray) -> np.ndarray:
    """An ICT / REALM embedder module's ``projected`` signature: LayerNorm(dense(pooled_output)) [batch, size]."""
    w = {k: v.astype(np.float64) for k, v in values.items()}
    _, pooled = bert(values, scope + "module/", ids, mask, types)
    return layer_norm(dense(pooled, w, scope + "dense"), w, scope + layer_norm_name, eps)


def orqa_span_logits(values: dict, sequence: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                     eps: float = 1e-3, scope: str = "reader/") -> np.ndarray:
    """ORQA's reader logits [beam, num_spans] (``orqa_model.read``, before masking) for ``(starts, ends)``."""
    w = {k: v.astype(np.float64) for k, v in values.items()}
    projection = dense(sequence, w, scope + "dense")  # [beam, len, 2 * span_hidden]
    start, end = np.split(projection, 2, axis=-1)
    hidden = np.maximum(start[:, starts] + end[:, ends], 0.0)  # [beam, num_spans, span_hidden]
    hidden = layer_norm(hidden, w, scope + "layer_normalization", eps)
    return dense(hidden, w, scope + "dense_1")[..., 0]


def mlm_logits(values: dict, scope: str, sequence: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """BERT's masked-LM logits [batch, num_masked, vocab] at ``positions`` [batch, num_masked]."""
    w = {k: v.astype(np.float64) for k, v in values.items()}
    p = scope + "cls/predictions/"
    x = np.take_along_axis(sequence, positions[..., None], axis=1)  # [batch, num_masked, hidden]
    x = layer_norm(gelu_tanh(dense(x, w, p + "transform/dense")), w, p + "transform/LayerNorm", 1e-12)
    return x @ w[scope + "bert/embeddings/word_embeddings"].T + w[p + "output_bias"]
