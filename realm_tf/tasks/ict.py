"""Inverse Cloze Task: the retriever warm start REALM inherits from ORQA (Lee et al., 2019, §5;
Guu et al., 2020, §3.4 "Initialization").

A sentence is a pseudo-query, its block the positive context (with the sentence removed from it with
probability 0.9); the other blocks of the batch are negatives. The loss is the softmax cross-entropy of the
in-batch scores f(x, z) = Embed_input(x)ᵀ Embed_doc(z), which trains both towers' [CLS] projections, the
part of the retriever a BERT/MiniLM import leaves untrained.
"""
from __future__ import annotations

from typing import Any, Mapping

import tensorflow as tf

from realm_tf import config as config_lib
from realm_tf.core import base_task
from realm_tf.core import experiment
from realm_tf.core import warm_start
from realm_tf.data import example_schemas
from realm_tf.export import retriever_export
from realm_tf.models import knowledge_retriever
from realm_tf.networks import bert_encoder


class IctTask(base_task.Task):
    """ICT's model, input pipeline, loss and metrics from an experiment config (trainer section ``ict``).

    Args:
      file_pattern: the ``ict-*.tfrecord`` shards (default: under ``data.ict_dir``).
    """

    trainer_section = "ict"

    def __init__(self, cfg: config_lib.ExperimentConfig, file_pattern: str | None = None):
        super().__init__(cfg)
        self.file_pattern = file_pattern or f"{cfg.data.ict_dir}/ict-*.tfrecord*"

    def build_model(self) -> knowledge_retriever.KnowledgeRetriever:
        """The retriever from ``model.init_checkpoint`` with a new projection (ORQA), or from
        ``model.retriever_checkpoint`` when set (e.g. the import with its projection fitted to the corpus,
        ``realm-tf init-retriever``); a resumed run then restores its own checkpoint over it."""
        retriever = knowledge_retriever.build_knowledge_retriever(self.cfg.model)
        if self.cfg.model.retriever_checkpoint:
            warm_start.restore_from_run(self.cfg.model.retriever_checkpoint, retriever=retriever)
        return retriever

    def pack(self, records: Mapping[str, tf.RaggedTensor]) -> tuple[dict[str, tf.Tensor], dict[str, tf.Tensor]]:
        """Packs parsed ICT records into features ``query_*`` ``[batch, query_len]`` and ``block_*``
        ``[batch, block_len]``; no labels (query i's positive is block i)."""
        m, static = self.cfg.model, self.cfg.data.static_padding
        query = self.tokenizer.pack_single(records[example_schemas.QUERY_IDS], m.query_seq_length, static)
        block = self.tokenizer.join_bert(records[example_schemas.TITLE_IDS], records[example_schemas.BODY_IDS],
                                         m.block_seq_length, static)
        return {**{"query_" + k: v for k, v in query.items()}, **{"block_" + k: v for k, v in block.items()}}, {}

    def build_inputs(self, input_context: tf.distribute.InputContext | None = None, seed: int | None = None,
                     repeat: bool = True) -> tf.data.Dataset:
        """Shuffled, batched, packed ICT examples ``(features, labels)`` from the ``ict-*.tfrecord`` shards.

        Without ``data.static_padding``, examples are bucketed by context length before batching, so a
        batch is padded to about its own length instead of the longest block in the corpus.
        """
        _ = self.tokenizer  # its lookup tables made eagerly, not inside the traced map below
        files = tf.io.gfile.glob(self.file_pattern)
        if not files:
            raise FileNotFoundError(f"no ICT records match {self.file_pattern!r} (run `realm-tf generate-ict-data`)")
        batch_size = self.global_batch_size
        ds = tf.data.TFRecordDataset(sorted(files), num_parallel_reads=tf.data.AUTOTUNE)
        if input_context is not None:
            batch_size = input_context.get_per_replica_batch_size(batch_size)
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        spec = example_schemas.ict_feature_spec()
        if repeat:
            ds = ds.repeat()
        ds = ds.shuffle(self.cfg.data.shuffle_buffer, seed=seed)
        if self.cfg.data.static_padding:
            ds = ds.batch(batch_size, drop_remainder=True)
        else:
            length = self.cfg.model.block_seq_length
            boundaries = [b for b in (64, 96, 128, 160, 192, 224, 256) if b < length]
            ds = ds.map(lambda s: (s, tf.io.parse_single_example(s, {
                example_schemas.BODY_IDS: tf.io.RaggedFeature(tf.int64),
                example_schemas.TITLE_IDS: tf.io.RaggedFeature(tf.int64)})))
            ds = ds.bucket_by_sequence_length(
                lambda s, r: tf.cast(tf.size(r[example_schemas.BODY_IDS]) + tf.size(r[example_schemas.TITLE_IDS])
                                     + 3, tf.int32),
                bucket_boundaries=boundaries, bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
                drop_remainder=True)
            ds = ds.map(lambda s, r: s)
        ds = ds.map(lambda s: self.pack(tf.io.parse_example(s, spec)), num_parallel_calls=tf.data.AUTOTUNE)
        return ds.prefetch(tf.data.AUTOTUNE)

    def call_model(self, model: knowledge_retriever.KnowledgeRetriever, features: Mapping[str, tf.Tensor],
                   training: bool) -> dict[str, tf.Tensor]:
        """In-batch scores ``retrieval_logits`` ``[batch, batch]``: every query against every block."""
        query = {k: features["query_" + k] for k in bert_encoder.INPUT_KEYS}
        blocks = {k: features["block_" + k] for k in bert_encoder.INPUT_KEYS}
        return model.in_batch_scores(query, blocks, training=training)

    def build_losses(self, labels: Mapping[str, tf.Tensor],
                     outputs: Mapping[str, tf.Tensor]) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """Per-example in-batch softmax cross-entropy ``[batch]``; terms ``correct`` and ``positive_rank``."""
        logits = outputs["retrieval_logits"]  # [batch, batch]
        positives = tf.range(tf.shape(logits)[0])  # [batch]: query i's positive is block i
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=positives, logits=logits)  # [batch]
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), positives), tf.float32)
        positive = tf.linalg.diag_part(logits)[:, None]  # [batch, 1]
        rank = tf.reduce_sum(tf.cast(logits > positive, tf.float32), axis=-1)  # [batch]
        return per_example, {"correct": correct, "positive_rank": rank}

    def build_metrics(self, labels: Mapping[str, tf.Tensor], terms: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """``accuracy`` (the positive block scores highest) and ``positive_rank`` (blocks above it), means."""
        return {"accuracy": tf.reduce_mean(terms["correct"]), "positive_rank": tf.reduce_mean(terms["positive_rank"])}


def train_ict(cfg: config_lib.ExperimentConfig, file_pattern: str | None = None) -> dict[str, Any]:
    """``realm-tf train-ict``: ICT for ``ict.steps`` (resuming from ``ict.model_dir``), then the trained retriever
    handed to the index builder: exported to ``refresh.export_dir/<step>/``, the first index REALM pre-training
    searches (Guu et al., 2020, §3.4). Returns :func:`experiment.run_experiment`'s result with ``export``, the
    export's path."""
    result = experiment.run_experiment(IctTask(cfg, file_pattern=file_pattern))
    return {**result, "export": retriever_export.export_retriever(result["model"], cfg, result["step"])}
