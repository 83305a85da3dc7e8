"""Multi-head dot-product attention (Vaswani et al., 2017, §3.2.2) with its two products as batched matmuls.

Every BERT of REALM (Guu et al., 2020, §3.2: Embed_input, Embed_doc and the knowledge-augmented encoder) spends
its attention FLOPs in two products per head, softmax(Q Kᵀ / √d) V. Keras' ``MultiHeadAttention`` writes them
as ``tf.einsum`` over the projections' ``[batch, seq_len, heads, head_size]`` layout. On CPU, TensorFlow's
oneDNN einsum moves that layout into and out of a head-major one inside the op, and the op costs several times
its matmul: at MiniLM's shapes (32 blocks of 160 wordpieces, 12 heads of 32) the scores product took 17 ms for
2 ms of oneDNN matmul, and the attention products were 27% of block embedding's op time for 6% of its FLOPs
(``benchmarks/bert_kernels.py``). Head-major, both products with the softmax between take half the time
(11.1 against 21.4 ms, ``benchmarks/bert_kernels.py``).

:class:`HeadMajorAttention` transposes Q, K and V to ``[batch, heads, seq_len, head_size]`` once and multiplies
with ``tf.matmul`` (oneDNN's batched matmul). Its four projections are
:class:`realm_tf.layers.matmul_einsum_dense.MatmulEinsumDense`: one matmul with its bias each. The scale and the
mask are applied right after the scores product, where oneDNN applies them as the scores are written. The
weights, their names, the mask's values and the returned scores are Keras' own; only the order of the
floating-point work differs, so the outputs agree with ``MultiHeadAttention``'s to float rounding. In training,
dropout on the attention probabilities draws 16 random bits per element and multiplies by its mask, at half the
cost of ``tf.nn.dropout`` (:func:`_attention_dropout`).
"""
from __future__ import annotations

import math

import tensorflow as tf
import tf_keras

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
        if isinstance(training, bool) and self._dropout > 0:  # the usual case: a Python flag
            dropped = _attention_dropout(scores, self._dropout) if training else scores
        else:  # a symbolic flag, or no dropout: Keras' layer decides
            dropped = self._dropout_layer(scores, training=training)  # [batch, heads, target_len, source_len]
        output = tf.matmul(dropped, value)  # [batch, heads, target_len, value_dim]
        return tf.transpose(output, [0, 2, 1, 3]), scores  # [batch, target_len, heads, value_dim]


#: Dropout decides on 16 random bits per element.
_DROPOUT_BITS = 16


def _attention_dropout(probabilities: tf.Tensor, rate: float) -> tf.Tensor:
    """Inverted dropout (Srivastava et al., 2014) on ``[batch, heads, target_len, source_len]`` attention
    probabilities, as BERT applies it (Devlin et al., 2019): each element is zeroed with probability ``rate`` and the
    rest are scaled so that the expectation is unchanged.

    ``tf.nn.dropout`` (inside Keras' ``Dropout``) draws one 32-bit Philox number per element, turns it into a float,
    compares, and selects between the scaled input and a broadcast zero. Here each element takes 16 random bits
    (half a 32-bit draw), kept when they are at least ``round(rate · 2¹⁶)``, and the mask is multiplied in.
    Forward and backward on ``[8, 12, 320, 320]`` bfloat16: 15.6 ms against 31.4 ms (``benchmarks/bert_kernels.py``).
    The scale is ``2¹⁶ / (2¹⁶ - threshold)``, the inverse of the exact keep probability (rounded to the compute
    dtype, as ``tf.nn.dropout``'s is); ``tf.nn.dropout`` on bfloat16 also keeps 89.85% at rate 0.1, not 90%
    (its uniform draws have 8 bits), and scales by 1/0.9.
    """
    levels = 1 << _DROPOUT_BITS
    threshold = int(round(rate * levels))
    shape = tf.shape(probabilities)
    pairs = (shape[-1] + 1) // 2  # two 16-bit halves per 32-bit draw along the last axis
    bits = tf.random.uniform(tf.concat([shape[:-1], [pairs]], 0), minval=-(1 << 31), maxval=(1 << 31) - 1,
                             dtype=tf.int32)  # [batch, heads, target_len, ceil(source_len / 2)]
    halves = tf.bitcast(bits, tf.uint16)  # [batch, heads, target_len, ceil(source_len / 2), 2]
    halves = tf.reshape(halves, tf.concat([shape[:-1], [2 * pairs]], 0))[..., :shape[-1]]  # a no-op when even
    keep = tf.cast(halves >= tf.constant(threshold, tf.uint16), probabilities.dtype)  # [batch, heads, target_len,
    # source_len]: 1 with probability (levels - threshold) / levels
    return probabilities * (keep * tf.constant(levels / (levels - threshold), probabilities.dtype))


def _masked_score(dtype: tf.dtypes.DType) -> float:
    """What Keras' softmax adds to a masked score: -1e9, or half float16's minimum in float16."""
    return tf.float16.min / 2.0 if dtype == tf.float16 else -1e9
