"""RETRO's chunked cross-attention, CCA (Borgeaud et al., 2021, "Improving language models by retrieving from
trillions of tokens", §2.4 and the CCA listing of App. A).

The decoder's ``n = num_chunks * m`` tokens are split into chunks C_1 .. C_l of ``m`` tokens, and each chunk C_u
comes with ``k`` encoded neighbours E_u = ENCODER(RET(C_u)) of ``r`` tokens each (the retrieved chunk N and its
continuation F, §2.3). E_u may only inform tokens that come after all of C_u, so CCA shifts the sequence left by
``m - 1``: the *attending chunk* u (``u = 0 .. num_chunks - 1``) is the ``m`` positions ``u*m + m - 1 ..
u*m + 2m - 2``, i.e. the last token of chunk u and the first ``m - 1`` tokens of chunk u + 1, and it
cross-attends E_u. Token ``t = c*m + j`` of chunk c therefore attends the neighbours of chunk c - 1, except the
last token of a chunk (``j = m - 1``), which attends its own chunk's neighbours (it predicts the first token of
the next chunk and has seen all of C_c). The first ``m - 1`` tokens attend nothing: their output is zero (the
caller adds the residual, §2.4: ``H + CCA(H, E)``). The ``m - 1`` positions past the end that the last attending
chunk would cover are padding and dropped.

Within an attending chunk the query tokens attend the ``k * r`` tokens of its ``k`` neighbours concatenated
along time, with ``num_heads`` heads: ``softmax(Q Kᵀ / √head_size + B) V``, then an output projection.

Positions: the paper (App. B.1.2) gives the CA logits relative positional terms, because neighbour [N; F] is
expected to be aligned with the attending tokens: N matches chunk u and F its continuation. Here this is the
simplest form of that idea, a learned scalar bias per head and relative distance (Shaw et al. 2018; T5), not
Transformer-XL's sinusoidal terms: query i of attending chunk u sits ``m - 1 + i`` tokens after the start of
chunk u, neighbour token j sits ``j`` tokens after the start of N, so their distance is ``m - 1 + i - j`` in
``[m - r, 2m - 2]``: ``m + r - 1`` values, table ``relative_bias[num_heads, m + r - 1]`` indexed by
``i - j + r - 1``, shared by the k neighbours and initialised to zero (plain content attention at first).
``use_relative_bias=False`` drops it.

Masking: ``neighbour_mask`` ``bool[batch, num_chunks, k, r]`` marks the real neighbour tokens (False for
padding and empty neighbours). Masked tokens get zero attention weight; an attending chunk whose neighbours
are all masked outputs exactly zero (no NaN, no bias), like the first ``m - 1`` tokens.
"""
from __future__ import annotations

import math
from typing import Any

import tensorflow as tf
import tf_keras


class ChunkedCrossAttention(tf_keras.layers.Layer):
    """CCA(H, E): each attending chunk of H cross-attends the k neighbours retrieved for one chunk.

    Args:
      num_heads: attention heads.
      head_size: width of each head's queries, keys and values.
      chunk_length: m, the decoder chunk length (RETRO: 64).
      neighbour_length: r, the tokens of each encoded neighbour (RETRO: 128 = the chunk and its continuation);
        fixes the size of the relative-position table.
      use_relative_bias: add the learned relative-position bias (see the module docstring).
      dropout_rate: dropout on the attention weights, in training.
      kernel_initializer: for the four projections.

    Inputs of :meth:`call`: ``hidden`` H ``[batch, n, d]`` with ``n = num_chunks * m``; ``neighbours`` E
    ``[batch, num_chunks, k, r, d_e]``; optional ``neighbour_mask`` ``bool[batch, num_chunks, k, r]``.
    Returns ``[batch, n, d]``, zero at positions ``0 .. m - 2``.

    Weights (in :meth:`get_weights` order): ``query_kernel [d, heads, head_size]``, ``query_bias [heads,
    head_size]``, ``key_kernel [d_e, heads, head_size]``, ``key_bias``, ``value_kernel [d_e, heads,
    head_size]``, ``value_bias``, ``output_kernel [heads, head_size, d]``, ``output_bias [d]`` and, with
    ``use_relative_bias``, ``relative_bias [heads, m + r - 1]``. ``d_e`` is the neighbours' width, taken equal
    to ``d`` unless ``neighbour_width`` is given.
    """

    def __init__(self, num_heads: int, head_size: int, chunk_length: int, neighbour_length: int,
                 use_relative_bias: bool = True, dropout_rate: float = 0.0, neighbour_width: int | None = None,
                 kernel_initializer: Any = "glorot_uniform", **kwargs: Any):
        super().__init__(**kwargs)
        if min(num_heads, head_size, chunk_length, neighbour_length) < 1:
            raise ValueError(f"num_heads={num_heads}, head_size={head_size}, chunk_length={chunk_length} and "
                             f"neighbour_length={neighbour_length} must be positive")
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"dropout_rate={dropout_rate} must be in [0, 1)")
        self._num_heads = num_heads
        self._head_size = head_size
        self._chunk_length = chunk_length
        self._neighbour_length = neighbour_length
        self._use_relative_bias = use_relative_bias
        self._dropout_rate = dropout_rate
        self._neighbour_width = neighbour_width
        self._kernel_initializer = tf_keras.initializers.get(kernel_initializer)
        self._dropout = tf_keras.layers.Dropout(dropout_rate)

    def build(self, input_shape: tf.TensorShape) -> None:
        """``input_shape``: that of ``hidden``, ``[batch, n, d]`` (Keras builds from the first input)."""
        width = tf.TensorShape(input_shape)[-1]
        if width is None:
            raise ValueError(f"the width of hidden must be known, got shape {input_shape}")
        self._width = int(width)
        memory_width = self._neighbour_width or self._width
        heads, size = self._num_heads, self._head_size

        def weight(name: str, shape: list[int], initializer: Any) -> tf.Variable:
            if isinstance(initializer, tf_keras.initializers.Initializer):  # a fresh copy: kernels differ
                initializer = initializer.__class__.from_config(initializer.get_config())
            return self.add_weight(name, shape=shape, initializer=initializer, trainable=True)

        self.query_kernel = weight("query_kernel", [self._width, heads, size], self._kernel_initializer)
        self.query_bias = weight("query_bias", [heads, size], "zeros")
        self.key_kernel = weight("key_kernel", [memory_width, heads, size], self._kernel_initializer)
        self.key_bias = weight("key_bias", [heads, size], "zeros")
        self.value_kernel = weight("value_kernel", [memory_width, heads, size], self._kernel_initializer)
        self.value_bias = weight("value_bias", [heads, size], "zeros")
        self.output_kernel = weight("output_kernel", [heads, size, self._width], self._kernel_initializer)
        self.output_bias = weight("output_bias", [self._width], "zeros")
        if self._use_relative_bias:
            self.relative_bias = weight("relative_bias", [heads, self._chunk_length + self._neighbour_length - 1],
                                        "zeros")
        super().build(input_shape)

    def call(self, hidden: tf.Tensor, neighbours: tf.Tensor, neighbour_mask: tf.Tensor | None = None,
             training: bool | None = None) -> tf.Tensor:
        m, r = self._chunk_length, self._neighbour_length
        memory_width = self._neighbour_width or self._width
        hidden = tf.cast(hidden, self.compute_dtype)  # [batch, n, d]
        neighbours = tf.cast(neighbours, self.compute_dtype)  # [batch, num_chunks, k, r, d_e]
        if neighbours.shape.rank != 5 or neighbours.shape[3] not in (None, r) or neighbours.shape[4] not in (
                None, memory_width):
            raise ValueError(f"neighbours must be [batch, num_chunks, k, {r}, {memory_width}], got {neighbours.shape}")
        hidden_shape = tf.shape(hidden)
        batch, n = hidden_shape[0], hidden_shape[1]
        memory_shape = tf.shape(neighbours)
        num_chunks, k = memory_shape[1], memory_shape[2]
        if hidden.shape[1] is not None and neighbours.shape[1] is not None:
            if hidden.shape[1] != neighbours.shape[1] * m:
                raise ValueError(f"hidden has {hidden.shape[1]} tokens, not num_chunks * m = "
                                 f"{neighbours.shape[1]} * {m}")
        else:
            tf.debugging.assert_equal(n, num_chunks * m, message="hidden length != num_chunks * chunk_length")

        # Attending chunks: H shifted left by m - 1, padded at the end back to n tokens.
        attending = tf.pad(hidden[:, m - 1:], [[0, 0], [0, m - 1], [0, 0]])  # [batch, n, d]
        attending = tf.reshape(attending, [batch, num_chunks, m, self._width])  # [batch, num_chunks, m, d]
        memory = tf.reshape(neighbours, [batch, num_chunks, k * r, memory_width])  # [batch, num_chunks, k*r, d_e]

        query = tf.einsum("bcid,dhe->bchie", attending, self.query_kernel)  # [batch, num_chunks, heads, m, size]
        query += self.query_bias[:, None, :]
        key = tf.einsum("bcjd,dhe->bchje", memory, self.key_kernel)  # [batch, num_chunks, heads, k*r, size]
        key += self.key_bias[:, None, :]
        value = tf.einsum("bcjd,dhe->bchje", memory, self.value_kernel)  # [batch, num_chunks, heads, k*r, size]
        value += self.value_bias[:, None, :]

        logits = tf.einsum("bchie,bchje->bchij", query, key)  # [batch, num_chunks, heads, m, k*r]
        logits *= tf.cast(1.0 / math.sqrt(self._head_size), logits.dtype)
        if self._use_relative_bias:
            query_pos = tf.range(m)[:, None]  # [m, 1]
            memory_pos = tf.range(k * r)[None, :] % r  # [1, k*r]: position inside its own neighbour
            table = tf.cast(self.relative_bias, logits.dtype)  # [heads, m + r - 1]
            logits += tf.gather(table, query_pos - memory_pos + r - 1, axis=1)  # [heads, m, k*r] broadcast

        if neighbour_mask is None:
            neighbour_mask = tf.ones([batch, num_chunks, k, r], tf.bool)  # [batch, num_chunks, k, r]
        mask = tf.reshape(tf.cast(neighbour_mask, tf.bool), [batch, num_chunks, 1, 1, k * r])  # [b, c, 1, 1, k*r]
        logits = tf.where(mask, logits, tf.constant(logits.dtype.min, logits.dtype))  # [b, c, heads, m, k*r]
        weights = tf.nn.softmax(logits, axis=-1) * tf.cast(mask, logits.dtype)  # [b, c, heads, m, k*r]: 0 if all masked
        weights = self._dropout(weights, training=training)
        context = tf.einsum("bchij,bchje->bchie", weights, value)  # [batch, num_chunks, heads, m, size]
        out = tf.einsum("bchie,hed->bcid", context, self.output_kernel) + self.output_bias  # [b, c, m, d]
        attends = tf.reduce_any(mask, axis=-1)[:, :, 0, :, None]  # [batch, num_chunks, 1, 1]
        out *= tf.cast(attends, out.dtype)  # [batch, num_chunks, m, d]: a chunk with no neighbour token adds 0

        # Back to token positions: attending chunk u starts at u*m + m - 1.
        out = tf.reshape(out, [batch, n, self._width])  # [batch, n, d]
        return tf.pad(out, [[0, 0], [m - 1, 0], [0, 0]])[:, :n]  # [batch, n, d]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_heads": self._num_heads, "head_size": self._head_size,
                "chunk_length": self._chunk_length, "neighbour_length": self._neighbour_length,
                "use_relative_bias": self._use_relative_bias, "dropout_rate": self._dropout_rate,
                "neighbour_width": self._neighbour_width,
                "kernel_initializer": tf_keras.initializers.serialize(self._kernel_initializer)}
