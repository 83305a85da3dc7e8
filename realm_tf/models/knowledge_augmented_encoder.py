"""REALM's knowledge-augmented encoder p(y | z, x) for masked-LM pre-training (Guu et al., 2020, §3.2, eq. (2)).

    p(y | z, x) = Π_j p(y_j | z, x),   p(y_j | z, x) ∝ exp(w_jᵀ BERT_MASK(j)(join_BERT(x, z_body)))

A BERT (tf-models' BertEncoderV2) reads the masked query joined with a retrieved document; an MLM head
(dense → GELU → LayerNorm → output embedding tied to the word embeddings, tf-models' ``MaskedLM``) predicts
the masked wordpieces. A checkpoint without an MLM head (MiniLM has none) leaves the head at its fresh
initialisation; the tied output embedding still starts from the pre-trained word embeddings.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras
from official.nlp.modeling import layers

from realm_tf import config as config_lib
from realm_tf.networks import bert_encoder
from realm_tf.networks import bert_weight_import
from realm_tf.networks import length_buckets


class KnowledgeAugmentedEncoder(tf_keras.Model):
    """BERT over join_BERT(x, z) with a tied masked-LM head.

    Args:
      encoder: a BertEncoderV2 (anything returning ``sequence_output`` with ``get_embedding_table()``).
      initializer_range: stddev of the MLM transform's initialiser.
      hidden_act: the MLM transform's activation, as ``encoder.hidden_act`` (BERT's ``cls/predictions/transform``
        uses the encoder's activation: the tanh GELU, ``gelu_new``, in the original code).
      length_buckets: BERT reads the rows in this many groups of similar length, each padded only to its own
        longest row (:mod:`realm_tf.networks.length_buckets`); the logits are the same up to float rounding.
        REALM's joined rows (a query of up to 96 wordpieces and a block of up to 288, cut to 320) vary widely.

    Inputs of :meth:`call`: ``input_word_ids`` / ``input_mask`` / ``input_type_ids`` ``int32[batch, len]`` and
    ``masked_positions`` ``int32[batch, num_masked]`` (indices into the joined sequence).

    Returns: ``{"mlm_logits": float32[batch, num_masked, vocab_size], "sequence_output": [batch, len, hidden]}``
    (with ``length_buckets`` > 1, zeros in ``sequence_output`` past the longest row of a row's group).
    """

    def __init__(self, encoder: tf_keras.layers.Layer, initializer_range: float = 0.02, hidden_act: str = "gelu",
                 length_buckets: int = 1, **kwargs: Any):
        super().__init__(**kwargs)
        if length_buckets < 1:
            raise ValueError(f"length_buckets={length_buckets}: must be at least 1")
        self.encoder = encoder
        self._length_buckets = length_buckets
        self._initializer_range = initializer_range
        self._hidden_act = hidden_act
        bert_weight_import.ensure_built(encoder)  # the tied head needs the word-embedding variable to exist
        self.masked_lm = layers.MaskedLM(
            embedding_table=encoder.get_embedding_table(), activation=bert_encoder.activation(hidden_act),
            initializer=tf_keras.initializers.TruncatedNormal(stddev=initializer_range), name="masked_lm")

    def call(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> dict[str, tf.Tensor]:
        outputs = length_buckets.encode(self.encoder, inputs, self._length_buckets, training)
        sequence = outputs["sequence_output"]  # [batch, len, hidden]
        logits = self.masked_lm(sequence, masked_positions=inputs["masked_positions"])  # [batch, masked, vocab]
        logits = tf.cast(logits, tf.float32)  # bfloat16 under mixed precision: the loss takes float32
        return {"mlm_logits": logits, "sequence_output": sequence}

    def get_config(self) -> dict[str, Any]:
        return {"encoder": tf_keras.layers.serialize(self.encoder), "initializer_range": self._initializer_range,
                "hidden_act": self._hidden_act, "length_buckets": self._length_buckets, "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "KnowledgeAugmentedEncoder":
        config = dict(config)
        config["encoder"] = tf_keras.layers.deserialize(config["encoder"], custom_objects=custom_objects)
        return cls(**config)


def build_knowledge_augmented_encoder(cfg: config_lib.ModelConfig, restore: bool = True) -> KnowledgeAugmentedEncoder:
    """Builds the encoder from ``cfg`` (loading ``cfg.init_checkpoint`` into its BERT) and creates its variables."""
    encoder = bert_encoder.build_bert_encoder(cfg.encoder, name="reader_bert")
    if restore and cfg.init_checkpoint:
        bert_weight_import.restore_encoder(encoder, cfg.init_checkpoint)
    model = KnowledgeAugmentedEncoder(encoder, cfg.encoder.initializer_range, hidden_act=cfg.encoder.hidden_act,
                                      length_buckets=cfg.reader_length_buckets, name="knowledge_augmented_encoder")
    dummy = tf.zeros([1, 2], tf.int32)  # [batch, len]
    model({"input_word_ids": dummy, "input_mask": tf.ones_like(dummy), "input_type_ids": dummy,
           "masked_positions": tf.zeros([1, 1], tf.int32)})
    return model
