"""Embed_input / Embed_doc of REALM's knowledge retriever (Guu et al., 2020, §3.2, eq. (1)).

    Embed(x) = W_proj · BERT_CLS(join_BERT(x))        then LayerNorm, as in ORQA (Lee et al., 2019)

so the relevance f(x, z) = Embed_input(x)ᵀ Embed_doc(z) is an inner product of 128-d vectors that a MIPS
index can search. The released REALM and ORQA embedders project BERT's *pooled* output instead of the [CLS]
output (``pooling="pooled"``: the pooler's tanh(W·h_[CLS] + b); ORQA's ``ict_model.module_fn`` reads the BERT
module's ``pooled_output``).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf.networks import bert_encoder  # noqa: F401  (registers BertEncoder for from_config)
from realm_tf.networks import length_buckets as length_buckets_lib


class Embedder(tf_keras.Model):
    """BERT → pooled summary ([CLS], masked mean or BERT's pooler) → Dense(projection_size) → LayerNorm.

    Args:
      encoder: a BERT network taking ``input_word_ids``/``input_mask``/``input_type_ids`` and returning a dict
        with ``sequence_output`` and ``pooled_output`` (e.g. tf-models' ``networks.BertEncoderV2``).
      projection_size: size of the embedding (REALM: 128).
      pooling: ``"cls"`` (REALM's paper), ``"mean"`` (sentence-transformers style, for zero-shot MiniLM) or
        ``"pooled"`` (BERT's pooler output, as the released REALM/ORQA embedders).
      initializer_range: stddev of the projection's truncated-normal initialiser.
      layer_norm_epsilon: ε of the LayerNorm after the projection (BERT's 1e-12).
      compiled_inference: BERT's inference pass runs as XLA programs
        (:func:`realm_tf.networks.length_buckets.encode`'s ``compiled``); training is not compiled.
    """

    def __init__(self, encoder: tf_keras.layers.Layer, projection_size: int = 128, pooling: str = "cls",
                 initializer_range: float = 0.02, layer_norm_epsilon: float = 1e-12,
                 compiled_inference: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        poolings = config_lib.choices(config_lib.Pooling)
        if pooling not in poolings:
            raise ValueError(f"pooling={pooling!r}: expected one of {', '.join(poolings)}")
        self.encoder = encoder
        self._projection_size = projection_size
        self._pooling = pooling
        self._initializer_range = initializer_range
        self._layer_norm_epsilon = layer_norm_epsilon
        self._compiled_inference = compiled_inference
        self.projection = tf_keras.layers.Dense(
            projection_size,
            # A fixed seed: a retriever built from the same pre-trained BERT gets the same projection in every
            # process, so an index embedded by one job matches the query tower another job builds.
            kernel_initializer=tf_keras.initializers.TruncatedNormal(stddev=initializer_range, seed=1234),
            name="projection")
        self.layer_norm = tf_keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="layer_norm")

    def call(self, inputs: dict[str, tf.Tensor], training: bool | None = None,
             length_buckets: int = 1) -> tf.Tensor:
        """Embeds packed BERT inputs (each ``int32[batch, seq_len]``) into ``float32[batch, projection_size]``.

        ``length_buckets`` > 1 reads the rows in that many groups of similar length
        (:mod:`realm_tf.networks.length_buckets`): the same embeddings up to float rounding, for less work when
        the rows' lengths vary (a training step's retrieved candidates)."""
        pooled = self.pool(inputs, training=training, length_buckets=length_buckets)  # [batch, hidden]
        return tf.cast(self.layer_norm(self.projection(pooled)), tf.float32)  # [batch, projection_size]

    def pool(self, inputs: dict[str, tf.Tensor], training: bool | None = None, length_buckets: int = 1) -> tf.Tensor:
        """The BERT summary before the projection, ``float32[batch, hidden]`` ([CLS], masked mean or pooler)."""
        outputs = length_buckets_lib.encode(self.encoder, inputs, length_buckets, training,
                                            compiled=self._compiled_inference)
        if self._pooling == "pooled":
            return outputs["pooled_output"]  # [batch, hidden]: tanh(W·h_[CLS] + b)
        sequence = outputs["sequence_output"]  # [batch, seq_len, hidden]
        if self._pooling == "cls":
            pooled = sequence[:, 0, :]  # [batch, hidden]
        else:
            mask = tf.cast(inputs["input_mask"], sequence.dtype)[:, :, None]  # [batch, seq_len, 1]
            pooled = tf.reduce_sum(sequence * mask, axis=1) / tf.maximum(
                tf.reduce_sum(mask, axis=1), 1.0)  # [batch, hidden]
        return pooled

    def get_config(self) -> dict[str, Any]:
        return {
            "encoder": tf_keras.layers.serialize(self.encoder),
            "projection_size": self._projection_size,
            "pooling": self._pooling,
            "initializer_range": self._initializer_range,
            "layer_norm_epsilon": self._layer_norm_epsilon,
            "compiled_inference": self._compiled_inference,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "Embedder":
        config = dict(config)
        config["encoder"] = tf_keras.layers.deserialize(config["encoder"], custom_objects=custom_objects)
        return cls(**config)
