"""Multi-head dot-product attention (Vaswani et al., 2017, §3.2.2) with its two products as batched matmuls.

Every BERT of REALM (Guu et al., 2020, §3.2: Embed_input, Embed_doc and the knowledge-augmented encoder) spends
its attention FLOPs in two products per head, softmax(Q Kᵀ / √d) V. Keras' ``MultiHeadAttention`` writes them
as ``tf.einsum`` over the projections' ``[batch, seq_len, heads, head_size]`` layout. On CPU, TensorFlow's
oneDNN einsum moves that layout into and out of a head-major one inside the op, and the op costs several times
its matmul (``docs/performance.md``).

:class:`HeadMajorAttention` transposes Q, K and V to ``[batch, heads, seq_len, head_size]`` once and multiplies
with ``tf.matmul`` (oneDNN's batched matmul). Its four projections are
:class:`realm_tf.layers.matmul_einsum_dense.MatmulEinsumDense`: one matmul with its bias each. The scale and the
mask are applied right after the scores product, where oneDNN applies them as the scores are written. The
weights, their names, the mask's values and the returned scores are Keras' own; only the order of the
floating-point work differs, so the outputs agree with ``MultiHeadAttention``'s to float rounding. In training,
dropout on the attention probabilities decides each element on 16 random bits and multiplies the probabilities by
its 0/1 mask (:mod:`realm_tf.layers.integer_dropout`); the inverted-dropout scale is applied to the product with V,
``[batch, heads, target_len, value_dim]``, instead of to the ``[batch, heads, target_len, source_len]``
probabilities: ((P ⊙ M) · s) V = s ((P ⊙ M) V).
"""
from __future__ import annotations

import math

import tensorflow as tf
import tf_keras

from realm_tf.layers import integer_dropout
from realm_tf.layers import matmul_einsum_dense


class HeadMajorAttention(tf_keras.layers.MultiHeadAttention):
    """``tf_keras.layers.MultiHeadAttention`` with the products computed head-major (see the module docstring).

    Takes the same arguments and weights. Self- and cross-attention over one attention axis (``[batch, seq_len,
    width]`` inputs, the only kind a BERT has) take the batched-matmul path; any other layout falls back to
    Keras' einsum.
    """

    def _build_from_signature(self, query: tf.Tensor, value: tf.Tensor, key: tf.Tensor | None = None) -> None:
        """Keras' projections, each computed as one matmul with its bias (same weights)."""
        super()._build_from_signature(query, value, key)
        for dense in (self._query_dense, self._key_dense, self._value_dense, self._output_dense):
            if type(dense) is tf_keras.layers.EinsumDense:  # pylint: disable=unidiomatic-typecheck
                dense.__class__ = matmul_einsum_dense.MatmulEinsumDense  # adds no state: only `call` differs

    def _compute_attention(self, query: tf.Tensor, key: tf.Tensor, value: tf.Tensor,
                           attention_mask: tf.Tensor | None = None,
                           training: bool | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """softmax(Q Kᵀ / √key_dim + mask) V per head.

        Args:
          query: ``[batch, target_len, heads, key_dim]``, projected.
          key: ``[batch, source_len, heads, key_dim]``, projected.
          value: ``[batch, source_len, heads, value_dim]``, projected.
          attention_mask: ``[batch, target_len, source_len]``, 1 where a query may attend a key, or None.
          training: applies dropout to the attention probabilities.

        Returns:
          ``(attention_output [batch, target_len, heads, value_dim], attention_scores [batch, heads, target_len,
          source_len])``, the scores being the probabilities before dropout, as Keras returns them.
        """
        if query.shape.rank != 4 or tuple(self._attention_axes) != (1,):
            return super()._compute_attention(query, key, value, attention_mask, training)
        query = tf.transpose(query, [0, 2, 1, 3])  # [batch, heads, target_len, key_dim]
        key = tf.transpose(key, [0, 2, 1, 3])  # [batch, heads, source_len, key_dim]
        value = tf.transpose(value, [0, 2, 1, 3])  # [batch, heads, source_len, value_dim]
        # Keras scales Q and adds the mask inside its softmax. Here the scale and the mask follow the product as
        # one Mul by a constant and one AddV2, which grappler fuses into oneDNN's batched matmul as post-ops
        # (`_MklFusedBatchMatMulV2`), so the [batch, heads, target_len, source_len] scores are written once.
        scores = tf.matmul(query, key, transpose_b=True)  # [batch, heads, target_len, source_len]
        scores = tf.multiply(scores, 1.0 / math.sqrt(float(self._key_dim)))
        if attention_mask is not None:
            keep = tf.cast(tf.expand_dims(attention_mask, 1), scores.dtype)  # [batch, 1, target_len, source_len]
            scores = tf.add(scores, (1.0 - keep) * _masked_score(scores.dtype))
        scores = self._softmax(scores)  # [batch, heads, target_len, source_len]
        if isinstance(training, bool) and 0.0 < self._dropout < 1.0:  # the usual case: a Python flag
            output = _dropped_product(scores, value, self._dropout) if training else tf.matmul(scores, value)
        else:  # a symbolic flag, or no dropout: Keras' layer decides
            dropped = self._dropout_layer(scores, training=training)  # [batch, heads, target_len, source_len]
            output = tf.matmul(dropped, value)  # [batch, heads, target_len, value_dim]
        return tf.transpose(output, [0, 2, 1, 3]), scores  # [batch, target_len, heads, value_dim]


def _dropped_product(probabilities: tf.Tensor, value: tf.Tensor, rate: float) -> tf.Tensor:
    """dropout(P) V for ``probabilities`` P ``[batch, heads, target_len, source_len]`` and ``value`` V ``[batch,
    heads, source_len, value_dim]`` → ``[batch, heads, target_len, value_dim]``: P times a 16-bit keep mask, times
    V, times the inverted-dropout scale (:mod:`realm_tf.layers.integer_dropout`)."""
    mask = integer_dropout.keep_mask(tf.shape(probabilities), rate, probabilities.dtype)  # [batch, heads, target_len,
    # source_len]
    output = tf.matmul(probabilities * mask, value)  # [batch, heads, target_len, value_dim]
    return output * tf.constant(integer_dropout.keep_scale(rate), output.dtype)


def _masked_score(dtype: tf.dtypes.DType) -> float:
    """What Keras' softmax adds to a masked score: -1e9, or half float16's minimum in float16."""
    return tf.float16.min / 2.0 if dtype == tf.float16 else -1e9
