"""RETRO's decoder: a causal transformer LM whose RETRO blocks cross-attend retrieved neighbours chunk by chunk
(Borgeaud et al., 2021, §2.4 and the architecture listing of App. A).

    H ← EMB(X) + POS
    for layer p = 1 .. L:
        H ← H + ATTN(LN(H))                               causal self-attention
        if p = min(P): E ← ENCODER(EMB(RET(C)), H_chunks)  the k neighbours of every chunk, encoded once
        if p ∈ P:      H ← H + CCA(LN(H), E)              chunked cross-attention with the causal shift
        H ← H + FFW(LN(H))
    logits ← LN(H) · EMBᵀ                                 tied input/output embeddings

P, the RETRO layers, are every third layer from the middle of the stack (paper: 6, 9, 12 of 12;
``retro.retro_layers`` overrides). The encoder (``retro/retro_encoder``) and CCA
(``retro/chunked_cross_attention``) are those layers. With no RETRO layer this is the baseline decoder, and a
RETRO model whose neighbours are all masked is the same model "with retrieval off": CCA then adds exactly zero.
Positions are learned absolute embeddings (the paper uses relative ones, App. B.1.2: simpler here, and the
sequence length is fixed). The outputs also carry the kNN-LM key of every token (Khandelwal et al., 2020: the
input of the final layer's feed-forward block, after its LayerNorm).
"""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf.retro import chunked_cross_attention
from realm_tf.retro import retro_encoder


def default_retro_layers(num_layers: int) -> tuple[int, ...]:
    """RETRO's rule, 1-based: every third layer from the middle of the stack (12 -> 6, 9, 12; 6 -> 3, 6)."""
    return tuple(range(max(1, num_layers // 2), num_layers + 1, 3))


class RetroDecoder(tf_keras.Model):
    """The RETRO language model (or, with ``retro_layers=()``, its baseline decoder).

    Args:
      vocab_size: wordpiece vocabulary (tied input and output embeddings).
      sequence_length: n (a multiple of ``chunk_length``).
      chunk_length: m.
      neighbour_length: r (chunk and continuation).
      num_layers / width / num_heads / intermediate_size: the decoder.
      retro_layers: 1-based layers with CCA.
      encoder_layers: layers of the neighbour encoder.
      dropout_rate: in training.
      initializer_range: stddev of the truncated-normal initialisers.

    Inputs of :meth:`call`: ``input_ids`` int32 ``[batch, n]``; with RETRO layers also ``neighbour_ids`` int32
    ``[batch, n / m, k, r]`` and ``neighbour_mask`` bool ``[batch, n / m, k, r]`` (False: padding, no neighbour,
    retrieval off). Returns ``{"logits": [batch, n, vocab], "knn_keys": [batch, n, width]}``; ``logits[:, t]``
    predicts token t + 1 and depends only on tokens <= t and on the neighbours of chunks that end at or before t.
    """

    def __init__(self, vocab_size: int, sequence_length: int, chunk_length: int, neighbour_length: int,
                 num_layers: int, width: int, num_heads: int, intermediate_size: int,
                 retro_layers: Sequence[int] = (), encoder_layers: int = 2, dropout_rate: float = 0.0,
                 initializer_range: float = 0.02, **kwargs: Any):
        super().__init__(**kwargs)
        if sequence_length % chunk_length:
            raise ValueError(f"sequence_length={sequence_length} is not a multiple of chunk_length={chunk_length}")
        if width % num_heads:
            raise ValueError(f"width={width} is not divisible by num_heads={num_heads}")
        retro_layers = tuple(sorted(int(p) for p in retro_layers))
        if any(not 1 <= p <= num_layers for p in retro_layers):
            raise ValueError(f"retro_layers={retro_layers} must be in 1..{num_layers}")
        self._config = {"vocab_size": vocab_size, "sequence_length": sequence_length, "chunk_length": chunk_length,
                        "neighbour_length": neighbour_length, "num_layers": num_layers, "width": width,
                        "num_heads": num_heads, "intermediate_size": intermediate_size,
                        "retro_layers": list(retro_layers), "encoder_layers": encoder_layers,
                        "dropout_rate": dropout_rate, "initializer_range": initializer_range}
        self.retro_layers = retro_layers
        self.chunk_length = chunk_length
        init = lambda: tf_keras.initializers.TruncatedNormal(stddev=initializer_range)  # noqa: E731
        head_size = width // num_heads
        self.token_embeddings = tf_keras.layers.Embedding(vocab_size, width, embeddings_initializer=init(),
                                                          name="token_embeddings")
        self.position_embeddings = self.add_weight("position_embeddings", shape=[sequence_length, width],
                                                   initializer=init(), trainable=True)
        norm = lambda name: tf_keras.layers.LayerNormalization(epsilon=1e-6, name=name)  # noqa: E731
        self.blocks = []
        for p in range(1, num_layers + 1):
            block = {
                "attention_norm": norm(f"layer_{p}/attention_norm"),
                "attention": tf_keras.layers.MultiHeadAttention(num_heads, head_size, dropout=dropout_rate,
                                                                kernel_initializer=init(), name=f"layer_{p}/attention"),
                "ffw_norm": norm(f"layer_{p}/ffw_norm"),
                "ffw_hidden": tf_keras.layers.Dense(intermediate_size, activation="gelu", kernel_initializer=init(),
                                                    name=f"layer_{p}/ffw_hidden"),
                "ffw_output": tf_keras.layers.Dense(width, kernel_initializer=init(), name=f"layer_{p}/ffw_output"),
            }
            if p in retro_layers:
                block["cca_norm"] = norm(f"layer_{p}/cca_norm")
                block["cca"] = chunked_cross_attention.ChunkedCrossAttention(
                    num_heads, head_size, chunk_length, neighbour_length, dropout_rate=dropout_rate,
                    kernel_initializer=init(), name=f"layer_{p}/cca")
            self.blocks.append(block)
        self.encoder = retro_encoder.RetroEncoder(
            num_heads, head_size, intermediate_size, neighbour_length, num_layers=encoder_layers,
            dropout_rate=dropout_rate, initializer_range=initializer_range,
            name="neighbour_encoder") if retro_layers else None
        self.output_norm = norm("output_norm")
        self._dropout = tf_keras.layers.Dropout(dropout_rate)

    def call(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> dict[str, tf.Tensor]:
        ids = tf.cast(inputs["input_ids"], tf.int32)  # [batch, n]
        n = tf.shape(ids)[1]
        h = self.token_embeddings(ids) + self.position_embeddings[None, :n]  # [batch, n, d]
        h = self._dropout(h, training=training)
        encoded = None
        knn_keys = None
        for p, block in enumerate(self.blocks, start=1):
            y = block["attention_norm"](h)  # [batch, n, d]
            h += self._dropout(block["attention"](y, y, use_causal_mask=True, training=training), training=training)
            if "cca" in block:
                mask = tf.cast(inputs["neighbour_mask"], tf.bool)  # [batch, c, k, r]
                if encoded is None:  # at the first RETRO layer, conditioned on the chunks' activations there
                    neighbours = self.token_embeddings(tf.cast(inputs["neighbour_ids"], tf.int32))  # [b, c, k, r, d]
                    chunks = tf.reshape(h, [tf.shape(h)[0], -1, self.chunk_length, h.shape[-1]])  # [b, c, m, d]
                    encoded = self.encoder(neighbours, chunks, mask, training=training)  # [b, c, k, r, d]
                y = block["cca"](block["cca_norm"](h), encoded, mask, training=training)  # [batch, n, d]
                h += self._dropout(y, training=training)
            y = block["ffw_norm"](h)  # [batch, n, d]
            if p == len(self.blocks):
                knn_keys = y  # kNN-LM key: the final FFW's input, after its LayerNorm
            h += self._dropout(block["ffw_output"](block["ffw_hidden"](y)), training=training)
        h = self.output_norm(h)  # [batch, n, d], in the compute dtype (bfloat16 under mixed_bfloat16)
        # The tied output layer: an Embedding's table is not cast to the compute dtype for us, so cast it; the
        # logits go to the softmax in float32.
        embeddings = tf.cast(self.token_embeddings.embeddings, h.dtype)  # [vocab, d]
        logits = tf.cast(tf.einsum("bnd,vd->bnv", h, embeddings), tf.float32)  # [batch, n, vocab]
        return {"logits": logits, "knn_keys": tf.cast(knn_keys, tf.float32)}

    def get_config(self) -> dict[str, Any]:
        return {**self._config, "name": self.name}


def build_retro_decoder(cfg: config_lib.ExperimentConfig, retrieval: bool = True) -> RetroDecoder:
    """The decoder of ``cfg.retro`` over ``model.encoder.vocab_size``: RETRO, or its baseline (``retrieval``
    False: no RETRO layers)."""
    retro = cfg.retro
    layers = (retro.retro_layers or default_retro_layers(retro.decoder_layers)) if retrieval else ()
    return RetroDecoder(
        vocab_size=cfg.model.encoder.vocab_size, sequence_length=retro.sequence_length,
        chunk_length=retro.chunk_length, neighbour_length=retro.chunk_length + retro.continuation_length,
        num_layers=retro.decoder_layers, width=retro.decoder_width, num_heads=retro.decoder_heads,
        intermediate_size=retro.decoder_intermediate, retro_layers=layers, encoder_layers=retro.encoder_layers,
        dropout_rate=retro.dropout_rate, initializer_range=cfg.model.encoder.initializer_range,
        name="retro" if layers else "baseline_decoder")
