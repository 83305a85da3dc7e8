"""RETRO's retrieval-neighbour encoder (Borgeaud et al., 2021, §2.4 "Encoding retrieval neighbours", and the
ENCODER of the architecture listing in App. A).

Each of the k neighbours [N; F] (r tokens) retrieved for decoder chunk C_u is encoded separately by a
bidirectional (non-causal) transformer; it is conditioned on the decoder's activations H_u of that chunk through
cross-attention, which lets the neighbour representations depend on the retrieving chunk in a differentiable way:

    E_u^j = ENCODER(RET(C_u)^j, H_u),   j = 1 .. k

The paper's encoder has 2 layers and cross-attends H_u in its first layer only (P_enc = {1}); each layer is

    E ← E + ATTN(LN(E));   if layer ∈ P_enc: E ← E + CA(LN(E), H_u);   E ← E + FFW(LN(E))

(pre-LayerNorm, as in the decoder), followed by a final LayerNorm. Positions: self-attention over r tokens is
permutation-equivariant, so learned absolute position embeddings ``[r, d]`` are added to the neighbour token
embeddings first (the paper uses relative encodings, App. B.1.2; absolute ones are simpler and the
neighbours all have the same fixed length r). H_u carries the decoder's own positions and gets none here.

``neighbour_mask`` ``bool[batch, num_chunks, k, r]`` (False: padding, empty neighbour) removes tokens as
attention keys, so the real tokens' outputs do not depend on them; the outputs at masked positions are finite
but meaningless, and are masked again by :class:`realm_tf.retro.chunked_cross_attention.ChunkedCrossAttention`.
"""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf
import tf_keras


class RetroEncoder(tf_keras.layers.Layer):
    """Bidirectional pre-LN transformer over each retrieved neighbour, cross-attending its chunk's H_u.

    Args:
      num_heads: attention heads (self- and cross-attention).
      head_size: width of each head.
      intermediate_size: FFW hidden width.
      neighbour_length: r, the tokens of each neighbour (size of the position-embedding table).
      num_layers: transformer layers (RETRO: 2).
      cross_attention_layers: 0-based layers that cross-attend H_u (RETRO: the first only, ``(0,)``).
      dropout_rate: dropout on attention weights and on each residual branch, in training.
      activation: of the FFW hidden layer.
      layer_norm_epsilon: of every LayerNorm.
      initializer_range: stddev of the truncated-normal initialiser of kernels and position embeddings.

    Inputs of :meth:`call`: ``neighbours`` token embeddings ``[batch, num_chunks, k, r, d]``, ``chunk_hidden``
    H_u ``[batch, num_chunks, m, d]`` (the decoder activations of the chunk that retrieved them) and optional
    ``neighbour_mask`` ``bool[batch, num_chunks, k, r]``. Returns ``[batch, num_chunks, k, r, d]``.
    """

    def __init__(self, num_heads: int, head_size: int, intermediate_size: int, neighbour_length: int,
                 num_layers: int = 2, cross_attention_layers: Sequence[int] = (0,), dropout_rate: float = 0.0,
                 activation: str = "gelu", layer_norm_epsilon: float = 1e-6, initializer_range: float = 0.02,
                 **kwargs: Any):
        super().__init__(**kwargs)
        if min(num_heads, head_size, intermediate_size, neighbour_length, num_layers) < 1:
            raise ValueError(f"num_heads={num_heads}, head_size={head_size}, intermediate_size={intermediate_size}, "
                             f"neighbour_length={neighbour_length} and num_layers={num_layers} must be positive")
        cross_attention_layers = tuple(int(i) for i in cross_attention_layers)
        if any(not 0 <= i < num_layers for i in cross_attention_layers):
            raise ValueError(f"cross_attention_layers={cross_attention_layers} must be in [0, {num_layers})")
        self._num_heads = num_heads
        self._head_size = head_size
        self._intermediate_size = intermediate_size
        self._neighbour_length = neighbour_length
        self._num_layers = num_layers
        self._cross_attention_layers = cross_attention_layers
        self._dropout_rate = dropout_rate
        self._activation = activation
        self._layer_norm_epsilon = layer_norm_epsilon
        self._initializer_range = initializer_range

    def build(self, input_shape: tf.TensorShape) -> None:
        """``input_shape``: that of ``neighbours``, ``[batch, num_chunks, k, r, d]``."""
        width = tf.TensorShape(input_shape)[-1]
        if width is None:
            raise ValueError(f"the width of neighbours must be known, got shape {input_shape}")
        width = int(width)
        init = lambda: tf_keras.initializers.TruncatedNormal(stddev=self._initializer_range)
        norm = lambda name: tf_keras.layers.LayerNormalization(epsilon=self._layer_norm_epsilon, name=name)
        attention = lambda name: tf_keras.layers.MultiHeadAttention(
            self._num_heads, self._head_size, dropout=self._dropout_rate, kernel_initializer=init(), name=name)
        self.position_embeddings = self.add_weight("position_embeddings", shape=[self._neighbour_length, width],
                                                   initializer=init(), trainable=True)
        self.blocks = []
        for i in range(self._num_layers):
            block = {"self_attention_norm": norm(f"layer_{i}/self_attention_norm"),
                     "self_attention": attention(f"layer_{i}/self_attention"),
                     "ffw_norm": norm(f"layer_{i}/ffw_norm"),
                     "ffw_hidden": tf_keras.layers.Dense(self._intermediate_size, activation=self._activation,
                                                         kernel_initializer=init(), name=f"layer_{i}/ffw_hidden"),
                     "ffw_output": tf_keras.layers.Dense(width, kernel_initializer=init(),
                                                         name=f"layer_{i}/ffw_output")}
            if i in self._cross_attention_layers:
                block["cross_attention_norm"] = norm(f"layer_{i}/cross_attention_norm")
                block["cross_attention"] = attention(f"layer_{i}/cross_attention")
            self.blocks.append(block)
        self.output_norm = norm("output_norm")
        self._dropout = tf_keras.layers.Dropout(self._dropout_rate)
        super().build(input_shape)

    def call(self, neighbours: tf.Tensor, chunk_hidden: tf.Tensor, neighbour_mask: tf.Tensor | None = None,
             training: bool | None = None) -> tf.Tensor:
        r = self._neighbour_length
        neighbours = tf.cast(neighbours, self.compute_dtype)  # [batch, num_chunks, k, r, d]
        chunk_hidden = tf.cast(chunk_hidden, self.compute_dtype)  # [batch, num_chunks, m, d]
        if neighbours.shape.rank != 5 or neighbours.shape[3] not in (None, r):
            raise ValueError(f"neighbours must be [batch, num_chunks, k, {r}, d], got {neighbours.shape}")
        if chunk_hidden.shape.rank != 4:
            raise ValueError(f"chunk_hidden must be [batch, num_chunks, m, d], got {chunk_hidden.shape}")
        shape = tf.shape(neighbours)
        batch, num_chunks, k = shape[0], shape[1], shape[2]
        width = int(neighbours.shape[-1])
        m = tf.shape(chunk_hidden)[2]
        rows = batch * num_chunks * k
        x = tf.reshape(neighbours, [rows, r, width])  # [rows, r, d]; rows = batch * num_chunks * k
        x += tf.cast(self.position_embeddings, x.dtype)[None]  # [rows, r, d]
        # H_u for every one of its k neighbours.
        context = tf.broadcast_to(chunk_hidden[:, :, None], [batch, num_chunks, k, m, width])  # [b, c, k, m, d]
        context = tf.reshape(context, [rows, m, width])  # [rows, m, d]
        if neighbour_mask is None:
            neighbour_mask = tf.ones([batch, num_chunks, k, r], tf.bool)  # [batch, num_chunks, k, r]
        keys = tf.reshape(tf.cast(neighbour_mask, tf.bool), [rows, 1, r])  # [rows, 1, r]
        self_mask = tf.broadcast_to(keys, [rows, r, r])  # [rows, r (queries), r (keys)]

        for block in self.blocks:
            y = block["self_attention_norm"](x)  # [rows, r, d]
            y = block["self_attention"](y, y, attention_mask=self_mask, training=training)  # [rows, r, d]
            x += self._dropout(y, training=training)  # [rows, r, d]
            if "cross_attention" in block:
                y = block["cross_attention_norm"](x)  # [rows, r, d]
                y = block["cross_attention"](y, context, training=training)  # [rows, r, d]
                x += self._dropout(y, training=training)  # [rows, r, d]
            y = block["ffw_output"](block["ffw_hidden"](block["ffw_norm"](x)))  # [rows, r, d]
            x += self._dropout(y, training=training)  # [rows, r, d]
        x = self.output_norm(x)  # [rows, r, d]
        return tf.reshape(x, [batch, num_chunks, k, r, width])  # [batch, num_chunks, k, r, d]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_heads": self._num_heads, "head_size": self._head_size,
                "intermediate_size": self._intermediate_size, "neighbour_length": self._neighbour_length,
                "num_layers": self._num_layers, "cross_attention_layers": list(self._cross_attention_layers),
                "dropout_rate": self._dropout_rate, "activation": self._activation,
                "layer_norm_epsilon": self._layer_norm_epsilon, "initializer_range": self._initializer_range}
