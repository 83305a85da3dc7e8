"""Inverse Cloze Task: the retriever warm start REALM inherits from ORQA (Lee et al., 2019, §5;
Guu et al., 2020, §3.4 "Initialization").

A sentence is a pseudo-query, its block the positive context (with the sentence removed from it with
probability 0.9); the other blocks of the batch are negatives. The loss is the softmax cross-entropy of the
in-batch scores f(x, z) = Embed_input(x)ᵀ Embed_doc(z), which trains both towers' [CLS] projections, the
part of the retriever a BERT/MiniLM import leaves untrained.
"""
from __future__ import annotations

from typing import Mapping

import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf.data import example_schemas
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_retriever
from realm_tf.networks import bert_encoder
from realm_tf.tasks import distribution
from realm_tf.tasks import optimizer as optimizer_lib
from realm_tf.tasks import training_loop

class IctTask:
    """Builds the ICT model, input pipeline, loss and metrics from an experiment config."""

    def __init__(self, cfg: config_lib.ExperimentConfig):
        self.cfg = cfg
        self.tokenizer = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, cfg.model.lower_case)

    def build_model(self) -> knowledge_retriever.KnowledgeRetriever:
        return knowledge_retriever.build_knowledge_retriever(self.cfg.model)

    def pack(self, records: Mapping[str, tf.RaggedTensor]) -> dict[str, tf.Tensor]:
        """Packs parsed ICT records into ``query_*`` ``[batch, query_len]`` and ``block_*`` ``[batch, block_len]``."""
        m, static = self.cfg.model, self.cfg.data.static_padding
        query = self.tokenizer.pack_single(records[example_schemas.QUERY_IDS], m.query_seq_length, static)
        block = self.tokenizer.join_bert(records[example_schemas.TITLE_IDS], records[example_schemas.BODY_IDS],
                                         m.block_seq_length, static)
        return {**{"query_" + k: v for k, v in query.items()}, **{"block_" + k: v for k, v in block.items()}}

    def build_dataset(self, file_pattern: str, batch_size: int, repeat: bool = True,
                      seed: int | None = None) -> tf.data.Dataset:
        """Shuffled, batched, packed ICT examples from ``ict-*.tfrecord`` shards.

        Without ``data.static_padding``, examples are bucketed by context length before batching, so a
        batch is padded to about its own length instead of the longest block in the corpus.
        """
        files = tf.io.gfile.glob(file_pattern)
        if not files:
            raise FileNotFoundError(f"no ICT records match {file_pattern!r} (run `realm-tf generate-ict-data`)")
        spec = example_schemas.ict_feature_spec()
        ds = tf.data.TFRecordDataset(sorted(files), num_parallel_reads=tf.data.AUTOTUNE)
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

    @staticmethod
    def compute_loss(model: knowledge_retriever.KnowledgeRetriever, batch: Mapping[str, tf.Tensor],
                     training: bool) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """Per-example in-batch softmax cross-entropy ``[batch]`` and metrics (accuracy, mean positive rank)."""
        query = {k: batch["query_" + k] for k in bert_encoder.INPUT_KEYS}
        blocks = {k: batch["block_" + k] for k in bert_encoder.INPUT_KEYS}
        logits = model.in_batch_scores(query, blocks, training=training)["retrieval_logits"]  # [batch, batch]
        labels = tf.range(tf.shape(logits)[0])  # [batch]: query i's positive is block i
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)  # [batch]
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32)
        positive = tf.linalg.diag_part(logits)[:, None]  # [batch, 1]
        rank = tf.reduce_sum(tf.cast(logits > positive, tf.float32), axis=-1)  # [batch]
        return per_example, {"accuracy": tf.reduce_mean(correct), "positive_rank": tf.reduce_mean(rank)}

    def make_step_fn(self, model: knowledge_retriever.KnowledgeRetriever, optimizer: tf_keras.optimizers.Optimizer,
                     global_batch_size: int) -> training_loop.StepFn:
        def step_fn(batch: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            per_example, metrics = training_loop.minimize(lambda: self.compute_loss(model, batch, training=True),
                                                          model.trainable_variables, optimizer, global_batch_size)
            return {"loss": tf.reduce_mean(per_example), **metrics,
                    "learning_rate": training_loop.learning_rate(optimizer)}
        return step_fn


def train_ict(cfg: config_lib.ExperimentConfig, file_pattern: str | None = None,
              hooks: tuple[training_loop.Hook, ...] = ()) -> tuple[knowledge_retriever.KnowledgeRetriever,
                                                                   dict[str, float], int]:
    """Trains the retriever with ICT for ``ict.steps`` (resuming from ``ict.model_dir``).

    Returns the model, the last logs and the global step reached.
    """
    config_lib.save_params(cfg, cfg.ict.model_dir)
    strategy = distribution.make_strategy(cfg.ict.strategy)
    task = IctTask(cfg)
    global_batch = cfg.data.batch_size
    with strategy.scope():
        model = task.build_model()
        optimizer = optimizer_lib.build_optimizer(cfg.ict, model)
    loop = training_loop.TrainingLoop(cfg.ict, strategy, {"model": model, "optimizer": optimizer}, global_batch)
    pattern = file_pattern or f"{cfg.data.ict_dir}/ict-*.tfrecord*"
    dataset = task.build_dataset(pattern, global_batch, seed=cfg.ict.seed)
    logs = loop.run(dataset, task.make_step_fn(model, optimizer, global_batch), hooks=hooks)
    return model, logs, loop.step
