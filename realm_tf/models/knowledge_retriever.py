"""REALM's neural knowledge retriever p(z|x) (Guu et al., 2020, §3.2, eq. (1)).

    f(x, z) = Embed_input(x)ᵀ Embed_doc(z),      p(z|x) = exp(f(x, z) / τ) / Σ_z' exp(f(x, z') / τ)

(τ = 1 in the paper; ``model.retrieval_temperature`` sets it, see :class:`realm_tf.config.ModelConfig`.)

Each embedding is BERT [CLS] → 128-d projection → LayerNorm (:class:`realm_tf.networks.embedder.Embedder`).
The two towers have their own BERTs unless ``share_embedders`` is set. The model scores a batch of queries
against given candidate blocks (REALM pre-training and Open-QA, where the candidates come from the MIPS
index and are re-embedded with the current weights so gradients reach Embed_doc), or against the batch's
own blocks (the Inverse Cloze Task warm start of ORQA, Lee et al. 2019).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf.networks import bert_encoder
from realm_tf.networks import bert_weight_import
from realm_tf.networks import embedder


class KnowledgeRetriever(tf_keras.Model):
    """Embed_input and Embed_doc, and the relevance scores between them.

    Args:
      query_embedder: Embed_input.
      doc_embedder: Embed_doc; pass the same object as ``query_embedder`` to share weights.
      temperature: τ; the retrieval logits are f(x, z) / τ (REALM: 1).
      candidate_length_buckets: :meth:`call` re-embeds the ``batch × num_candidates`` blocks in this many groups
        of similar length, each padded to its own longest block (:mod:`realm_tf.networks.length_buckets`; the
        same embeddings up to float rounding).

    Inputs of :meth:`call` (a dict):
      ``query_*``: the packed query, each ``int32[batch, query_len]`` (``query_input_word_ids``, …).
      ``candidates_*``: packed candidate blocks, each ``int32[batch, num_candidates, block_len]``.

    Returns a dict of named tensors:
      ``query_embedding`` ``[batch, dim]``, ``candidate_embeddings`` ``[batch, num_candidates, dim]``,
      ``retrieval_logits`` ``[batch, num_candidates]`` = f(x, z) / τ.
    """

    def __init__(self, query_embedder: embedder.Embedder, doc_embedder: embedder.Embedder,
                 temperature: float = 1.0, candidate_length_buckets: int = 1, **kwargs: Any):
        super().__init__(**kwargs)
        if not temperature > 0:
            raise ValueError(f"retrieval temperature {temperature!r}: must be > 0")
        if candidate_length_buckets < 1:
            raise ValueError(f"candidate_length_buckets={candidate_length_buckets}: must be at least 1")
        self.candidate_length_buckets = candidate_length_buckets
        self.query_embedder = query_embedder
        self.doc_embedder = doc_embedder
        self.temperature = float(temperature)

    @property
    def shares_embedders(self) -> bool:
        return self.query_embedder is self.doc_embedder

    def embed_queries(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> tf.Tensor:
        """Embed_input of packed queries (each ``int32[batch, len]``) → ``[batch, dim]``."""
        return self.query_embedder({k: inputs[k] for k in bert_encoder.INPUT_KEYS}, training=training)

    def embed_blocks(self, inputs: dict[str, tf.Tensor], training: bool | None = None,
                     length_buckets: int = 1) -> tf.Tensor:
        """Embed_doc of packed blocks (each ``int32[batch, len]``) → ``[batch, dim]``."""
        return self.doc_embedder({k: inputs[k] for k in bert_encoder.INPUT_KEYS}, training=training,
                                 length_buckets=length_buckets)

    def score(self, query_embedding: tf.Tensor, doc_embeddings: tf.Tensor) -> tf.Tensor:
        """Retrieval logits f(x, z) / τ ``[batch, k]`` of ``[batch, dim]`` queries against ``[batch, k, dim]``
        blocks."""
        return self.logits(tf.einsum("bd,bkd->bk", query_embedding, doc_embeddings))  # [batch, k]

    def logits(self, inner_products: tf.Tensor) -> tf.Tensor:
        """Retrieval logits f(x, z) / τ of inner products f(x, z) (e.g. the scores MIPS returned)."""
        return inner_products / self.temperature

    def call(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> dict[str, tf.Tensor]:
        query = {k: inputs["query_" + k] for k in bert_encoder.INPUT_KEYS}  # each [batch, query_len]
        candidates = {k: inputs["candidates_" + k]
                      for k in bert_encoder.INPUT_KEYS}  # each [batch, num_cand, block_len]
        shape = tf.shape(candidates["input_word_ids"])
        batch, num_candidates, block_len = shape[0], shape[1], shape[2]
        flat = {k: tf.reshape(v, [batch * num_candidates, block_len]) for k, v in candidates.items()}
        query_embedding = self.embed_queries(query, training=training)  # [batch, dim]
        flat_embeddings = self.embed_blocks(flat, training=training,
                                            length_buckets=self.candidate_length_buckets)  # [batch * num_cand, dim]
        dim = tf.shape(flat_embeddings)[-1]
        candidate_embeddings = tf.reshape(flat_embeddings, [batch, num_candidates, dim])  # [batch, num_cand, dim]
        logits = self.score(query_embedding, candidate_embeddings)  # [batch, num_cand]
        return {"query_embedding": query_embedding, "candidate_embeddings": candidate_embeddings,
                "retrieval_logits": logits}

    def in_batch_scores(self, query: dict[str, tf.Tensor], blocks: dict[str, tf.Tensor],
                        training: bool | None = None) -> dict[str, tf.Tensor]:
        """Scores every query against every block of the batch (ICT's in-batch softmax).

        Args:
          query: packed queries, each ``int32[batch, query_len]``.
          blocks: packed blocks, each ``int32[batch, block_len]``; block i is query i's positive.

        Returns:
          ``query_embedding`` ``[batch, dim]``, ``block_embedding`` ``[batch, dim]``,
          ``retrieval_logits`` ``[batch, batch]`` (row i: query i against every block, divided by τ).
        """
        query_embedding = self.embed_queries(query, training=training)  # [batch, dim]
        block_embedding = self.embed_blocks(blocks, training=training)  # [batch, dim]
        logits = tf.matmul(query_embedding, block_embedding, transpose_b=True) / self.temperature  # [batch, batch]
        return {"query_embedding": query_embedding, "block_embedding": block_embedding,
                "retrieval_logits": logits}

    def get_config(self) -> dict[str, Any]:
        return {"query_embedder": tf_keras.layers.serialize(self.query_embedder),
                "doc_embedder": None if self.shares_embedders else tf_keras.layers.serialize(self.doc_embedder),
                "temperature": self.temperature, "candidate_length_buckets": self.candidate_length_buckets,
                "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "KnowledgeRetriever":
        query = tf_keras.layers.deserialize(config["query_embedder"], custom_objects=custom_objects)
        doc = (query if config["doc_embedder"] is None
               else tf_keras.layers.deserialize(config["doc_embedder"], custom_objects=custom_objects))
        return cls(query, doc, temperature=config.get("temperature", 1.0),
                   candidate_length_buckets=config.get("candidate_length_buckets", 1), name=config.get("name"))


def build_knowledge_retriever(cfg: config_lib.ModelConfig, restore: bool = True) -> KnowledgeRetriever:
    """Builds the two towers from ``cfg`` and, with ``restore``, loads ``cfg.init_checkpoint`` into each BERT."""
    def tower(name: str) -> embedder.Embedder:
        encoder = bert_encoder.build_bert_encoder(cfg.encoder, name=f"{name}_bert")
        if restore and cfg.init_checkpoint:
            bert_weight_import.restore_encoder(encoder, cfg.init_checkpoint)
        return embedder.Embedder(encoder, projection_size=cfg.projection_size, pooling=cfg.pooling,
                                 initializer_range=cfg.encoder.initializer_range,
                                 layer_norm_epsilon=cfg.projection_layer_norm_epsilon,
                                 compiled_inference=cfg.compiled_inference, name=name)

    query = tower("query_embedder")
    doc = query if cfg.share_embedders else tower("doc_embedder")
    retriever = KnowledgeRetriever(query, doc, temperature=cfg.retrieval_temperature,
                                   candidate_length_buckets=cfg.candidate_length_buckets, name="knowledge_retriever")
    dummy = tf.zeros([1, 1, 2], tf.int32)  # [batch, num_candidates, len]
    inputs = {"input_word_ids": dummy, "input_mask": tf.ones_like(dummy), "input_type_ids": dummy}
    # Creates every variable now, inside the caller's strategy scope, and marks the Keras model built.
    retriever({**{"query_" + k: v[:, 0] for k, v in inputs.items()},
               **{"candidates_" + k: v for k, v in inputs.items()}})
    if not cfg.share_embedders:
        # Both fresh projections start from the same matrix: with the same BERT weights in both towers,
        # f(x, z) then starts as a (Johnson-Lindenstrauss) projection of the pre-trained similarity instead
        # of the noise two independent random projections give; the towers still diverge in training.
        for source, target in ((query.projection, doc.projection), (query.layer_norm, doc.layer_norm)):
            for s_var, t_var in zip(source.weights, target.weights):
                t_var.assign(s_var)
    return retriever
