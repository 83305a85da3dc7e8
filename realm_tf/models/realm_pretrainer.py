"""REALM's retrieve-then-predict model for masked-LM pre-training (Guu et al., 2020, §3.1-3.2).

For a masked query x and k candidate documents z (selected by the MIPS index; candidate 0 is the null
document ∅, "[CLS] [SEP] [SEP]"), the model computes in one differentiable pass:

* f(x, z) = Embed_input(x)ᵀ Embed_doc(z), **re-embedding every candidate with the current weights** so the
  gradient reaches both towers (the index only selected them, §3.4);
* the reader's masked-LM logits on join_BERT(x, z) for every candidate.

The task (``realm_tf.tasks.realm_loss``) turns these into log p(y|x) = logsumexp_z log p(z|x) + log p(y|z,x).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras

from realm_tf.models import knowledge_augmented_encoder
from realm_tf.models import knowledge_retriever
from realm_tf.networks import bert_encoder


class RealmPretrainer(tf_keras.Model):
    """Knowledge retriever + knowledge-augmented encoder over k candidates per query.

    Inputs (a dict):
      ``query_*`` ``int32[batch, query_len]``: the masked query, ``[CLS] x [SEP]``.
      ``candidates_*`` ``int32[batch, num_candidates, block_len]``: ``[CLS] title [SEP] body [SEP]`` per candidate.
      ``reader_*`` ``int32[batch, num_candidates, reader_len]``: join_BERT(x, z) per candidate.
      ``masked_positions`` ``int32[batch, num_masked]``: positions of the masks in the reader input (x comes
        first, so they are the same for every candidate).

    Returns: ``retrieval_logits`` ``[batch, num_candidates]``, ``mlm_logits``
    ``[batch, num_candidates, num_masked, vocab]``, ``query_embedding`` ``[batch, dim]``,
    ``candidate_embeddings`` ``[batch, num_candidates, dim]``.
    """

    def __init__(self, retriever: knowledge_retriever.KnowledgeRetriever,
                 encoder: knowledge_augmented_encoder.KnowledgeAugmentedEncoder, **kwargs: Any):
        super().__init__(**kwargs)
        self.retriever = retriever
        self.encoder = encoder

    def call(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> dict[str, tf.Tensor]:
        retrieval = self.retriever({k: v for k, v in inputs.items() if k.startswith(("query_", "candidates_"))},
                                   training=training)
        reader = {k: inputs["reader_" + k] for k in bert_encoder.INPUT_KEYS}  # each [batch, num_cand, reader_len]
        shape = tf.shape(reader["input_word_ids"])
        batch, num_candidates, length = shape[0], shape[1], shape[2]
        flat = {k: tf.reshape(v, [batch * num_candidates, length]) for k, v in reader.items()}
        positions = inputs["masked_positions"]  # [batch, num_masked]
        num_masked = tf.shape(positions)[1]
        flat["masked_positions"] = tf.reshape(
            tf.tile(positions[:, None, :], [1, num_candidates, 1]), [batch * num_candidates, num_masked])
        logits = self.encoder(flat, training=training)["mlm_logits"]  # [batch * num_cand, num_masked, vocab]
        vocab = tf.shape(logits)[-1]
        return {
            "retrieval_logits": retrieval["retrieval_logits"],  # [batch, num_cand]
            "mlm_logits": tf.reshape(logits, [batch, num_candidates, num_masked, vocab]),
            "query_embedding": retrieval["query_embedding"],  # [batch, dim]
            "candidate_embeddings": retrieval["candidate_embeddings"],  # [batch, num_cand, dim]
        }

    def get_config(self) -> dict[str, Any]:
        return {"retriever": tf_keras.layers.serialize(self.retriever),
                "encoder": tf_keras.layers.serialize(self.encoder), "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "RealmPretrainer":
        return cls(tf_keras.layers.deserialize(config["retriever"], custom_objects=custom_objects),
                   tf_keras.layers.deserialize(config["encoder"], custom_objects=custom_objects),
                   name=config.get("name"))
