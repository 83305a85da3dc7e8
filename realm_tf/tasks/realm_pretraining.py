"""REALM pre-training: retrieve, then predict the masked salient span (Guu et al., 2020, §2.3, §3, §3.4).

For a masked query x the trainer maximises log p(y|x) = logsumexp_z [log p(z|x) + log p(y|z,x)] over the
top-k candidates the MIPS index selected (candidate 0 the null document, the query's own source block
excluded), re-embedding those k blocks with the current Embed_doc so gradients reach both retriever towers
and the knowledge-augmented encoder. The index goes stale as the weights move; it is refreshed
asynchronously: every ``refresh.export_every_steps`` the trainer exports its retriever, an index builder
(:mod:`realm_tf.index.index_refresher`, a child process, a thread or your own Beam job) re-embeds the corpus,
and the input pipeline (:mod:`realm_tf.tasks.retrieval_augmented_input`) swaps to the new version.

TensorBoard (``<model_dir>/train``): ``loss``, ``mlm_accuracy`` (marginal prediction), ``retrieval_utility``
(log p(y|x) − log p(y|∅,x), §3.4/§4.4), ``null_probability`` (mean p(∅|x)), ``query_similarity`` (mean cosine
between a batch's query embeddings: near 1 = a collapsed retriever), ``off_policy_delay_steps`` and
``off_policy_delay_seconds`` (how old the Embed_doc that chose the candidates is), ``index_version``,
``examples_per_second``, ``input_wait_fraction``; held-out evaluation in ``<model_dir>/eval``.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.core import base_task
from realm_tf.core import evaluation
from realm_tf.core import experiment
from realm_tf.core import training_loop
from realm_tf.core import warm_start
from realm_tf.data import block_store
from realm_tf.data import corpus_versions
from realm_tf.data import example_schemas
from realm_tf.export import retriever_export
from realm_tf.index import index_publisher
from realm_tf.index import index_refresher
from realm_tf.index import refresh_supervisor
from realm_tf.models import knowledge_augmented_encoder
from realm_tf.models import knowledge_retriever
from realm_tf.models import realm_pretrainer
from realm_tf.tasks import mlm_head_warmup
from realm_tf.tasks import realm_loss
from realm_tf.tasks import retrieval_augmented_input

logger = logging.getLogger(__name__)

_MODEL_INPUT_PREFIXES = ("query_", "candidates_", "reader_", "masked_positions")


def is_model_input(key: str) -> bool:
    """Whether :class:`RealmPretrainer` reads this batch entry (the rest are labels and bookkeeping)."""
    return key.startswith(_MODEL_INPUT_PREFIXES)


class RealmPretrainingTask(base_task.Task):
    """REALM's model, inputs, losses and metrics, and the run around them: the MLM head warm-up, the first
    index, the refresh supervisor, the frozen-retriever phase and the held-out evaluation (trainer section
    ``trainer``).

    Args:
      pretraining_pattern: the ``pretraining-*.tfrecord`` shards (default: under ``data.pretraining_dir``).
      evaluate: score the held-out salient spans at the end (:meth:`evaluate`).
      eval_pattern: the shards whose held-out salient spans are scored (default: ``pretraining_pattern``). The
        held-out examples are chosen by their source block, so salient-span shards made from the same blocks
        score a run trained on another masking (``data.masking_strategy``) on blocks it never trained on.
      index_builder: builds index versions in this process (``beam_jobs.embed_blocks.embed_and_publish``): the
        first one when ``index.index_dir`` has none, and the refreshes in ``refresh.mode=thread``. Without it the
        first version is built by ``realm-tf refresh-index`` in a child process (see
        :class:`~realm_tf.index.refresh_supervisor.RefreshSupervisor`).
    """

    trainer_section = "pretrain"
    best_metric = ("mlm_accuracy", "max")  # train-and-eval (pretrain.eval_every_steps): the held-out MLM accuracy

    def __init__(self, cfg: config_lib.ExperimentConfig, pretraining_pattern: str | None = None,
                 evaluate: bool = True, eval_pattern: str | None = None,
                 index_builder: index_refresher.IndexBuilder | None = None):
        super().__init__(cfg)
        self.index_builder = index_builder
        trainer = cfg.pretrain
        if trainer.strategy == "multi_worker" and trainer.max_minutes > 0:
            raise config_lib.ConfigError("pretrain.max_minutes needs a single-worker strategy: each worker would stop "
                                         "at its own time and leave the others waiting in an all-reduce")
        rate = trainer.trivial_retrieval_rate_while_frozen
        if not 0.0 <= rate <= 1.0 or (rate > 0 and trainer.freeze_retriever_steps <= 0):
            raise config_lib.ConfigError(
                f"pretrain.trivial_retrieval_rate_while_frozen={rate}: must be in [0, 1], and > 0 only with "
                f"pretrain.freeze_retriever_steps > 0 (a trained retriever would learn exact string matching from "
                f"them, REALM §3.4)")
        self.pattern = pretraining_pattern or os.path.join(cfg.data.pretraining_dir, "pretraining-*.tfrecord*")
        self.eval_pattern = eval_pattern or self.pattern
        self.run_evaluation = evaluate
        self.inputs: retrieval_augmented_input.RetrievalAugmentedInput | None = None
        self.supervisor: refresh_supervisor.RefreshSupervisor | None = None
        self.chief = True

    def build_model(self) -> realm_pretrainer.RealmPretrainer:
        """Retriever (from ``model.retriever_checkpoint`` when set, e.g. ICT) + knowledge-augmented encoder."""
        retriever = knowledge_retriever.build_knowledge_retriever(self.cfg.model)
        if self.cfg.model.retriever_checkpoint:
            warm_start.restore_from_run(self.cfg.model.retriever_checkpoint, retriever=retriever)
        encoder = knowledge_augmented_encoder.build_knowledge_augmented_encoder(self.cfg.model)
        return realm_pretrainer.RealmPretrainer(retriever, encoder, name="realm_pretrainer")

    def build_inputs(self, input_context: tf.distribute.InputContext | None = None, seed: int | None = None,
                     trivial_retrieval_rate: float = 0.0, force_source: bool = False) -> tf.data.Dataset:
        """Training batches ``(features, labels)`` of the non-held-out masked queries with their candidates
        from the current index (:class:`RetrievalAugmentedInput`); needs :meth:`initialize` first."""
        if self.inputs is None:
            raise RuntimeError("RealmPretrainingTask.build_inputs before initialize: no index loader yet")
        batch_size = self.global_batch_size
        if input_context is not None:
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        train_split = heldout_predicate(self.cfg.data.pretraining_heldout_fraction, heldout=False)
        dataset = self.inputs.dataset(self.pattern, batch_size, input_context, seed=seed, split=train_split,
                                      trivial_retrieval_rate=trivial_retrieval_rate, force_source=force_source)
        return dataset.map(base_task.split_features(is_model_input))

    def build_losses(self, labels: Mapping[str, tf.Tensor],
                     outputs: Mapping[str, tf.Tensor]) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """−log p(y|x) per example ``[batch]`` and the per-example terms of :func:`realm_loss.realm_marginal_loss`."""
        terms = realm_loss.realm_marginal_loss(outputs["retrieval_logits"], outputs["mlm_logits"],
                                               labels["target_ids"], labels["target_weights"])
        terms["null_probability"] = tf.nn.softmax(outputs["retrieval_logits"], axis=-1)[:, 0]  # [batch]
        terms["query_similarity"] = query_similarity(outputs["query_embedding"])  # [batch]
        return terms["loss"], terms

    def trainable_variables(self, model: realm_pretrainer.RealmPretrainer,
                            train_retriever: bool = True) -> list[tf.Variable]:
        """The whole model, or the reader alone (``train_retriever=False``)."""
        return list(model.trainable_variables if train_retriever else model.encoder.trainable_variables)

    def train_step(self, inputs: tuple[base_task.Features, base_task.Labels], model: realm_pretrainer.RealmPretrainer,
                   optimizer: tf_keras.optimizers.Optimizer, global_step: tf.Variable | None = None,
                   train_retriever: bool = True) -> dict[str, tf.Tensor]:
        """One update of the whole model, or of the reader alone (``train_retriever=False``)."""
        labels = inputs[1]
        per_example, terms = training_loop.minimize(
            lambda part: self.build_losses(part[1], model(part[0], training=True)), inputs,
            self.trainable_variables(model, train_retriever), optimizer, self.global_batch_size,
            self.trainer_config.gradient_accumulation_steps)
        version = tf.cast(labels["index_version"], tf.float32)  # [batch]
        # The candidates were chosen with the weights exported at step `index_export_step` (= `index_version`
        # unless a corpus update numbered the version past it); this update uses the weights after
        # `global_step` updates.
        exported = tf.cast(labels.get("index_export_step", labels["index_version"]), tf.float32)  # [batch]
        step = tf.cast(global_step if global_step is not None else optimizer.iterations, tf.float32)
        delay_steps = step - exported  # [batch]
        return {
            "loss": tf.reduce_mean(per_example),
            "mlm_accuracy": tf.reduce_sum(terms["mlm_correct"]) / tf.maximum(tf.reduce_sum(terms["mlm_count"]), 1.0),
            "retrieval_utility": tf.reduce_mean(terms["retrieval_utility"]),
            "null_probability": tf.reduce_mean(terms["null_probability"]),
            "query_similarity": tf.reduce_mean(terms["query_similarity"]),
            "off_policy_delay_steps": tf.reduce_mean(delay_steps),
            "off_policy_delay_seconds": tf.reduce_mean(labels["index_age_seconds"]),
            "index_version": tf.reduce_max(version),
            "learning_rate": training_loop.learning_rate(optimizer),
        }

    # ---- the run ------------------------------------------------------------------------------------------

    def phases(self, step: int) -> list[base_task.Phase]:
        """The reader alone until ``pretrain.freeze_retriever_steps``, then everything. Both phases read one
        iterator (no example twice), unless the frozen phase keeps trivial retrievals: then it has its own
        (differently shuffled) and the second phase's, which excludes them all, starts after it."""
        trainer = self.cfg.pretrain
        frozen_until, rate = trainer.freeze_retriever_steps, trainer.trivial_retrieval_rate_while_frozen
        train = base_task.Phase("train", None, (("seed", trainer.seed), ("trivial_retrieval_rate", 0.0)),
                                (("train_retriever", True),))
        if step >= frozen_until:
            return [train]
        frozen_inputs = (("seed", trainer.seed + 1_000_003), ("trivial_retrieval_rate", rate),
                         ("force_source", trainer.force_source_block)) if rate else train.input_options
        return [base_task.Phase("reader_alone", frozen_until, frozen_inputs, (("train_retriever", False),)), train]

    def initialize(self, model: realm_pretrainer.RealmPretrainer, loop: training_loop.TrainingLoop) -> None:
        """The MLM head warm-up (a new run), the first index (chief), the index loader, the input pipeline and
        the refresh supervisor."""
        cfg = self.cfg
        self.chief = loop.chief
        if cfg.pretrain.mlm_head_warmup_blocks > 0 and loop.step == 0 and not loop.restored_from:
            # Every worker fits the same head (same blocks, same seed) before the first all-reduce.
            blocks = block_store.BlockStore.load(corpus_versions.current_pattern(cfg.data.blocks_dir))
            warmup = mlm_head_warmup.warm_up_mlm_head(model.encoder, blocks, self.tokenizer,
                                                      cfg.pretrain.mlm_head_warmup_blocks, seed=cfg.pretrain.seed)
            logger.info("pretrain: MLM head warm-up on the frozen reader: %s",
                        ", ".join(f"{k}={v:.4g}" for k, v in warmup.items()))
            with loop.writer.as_default(step=0):
                for key, value in warmup.items():
                    tf.summary.scalar("mlm_head_warmup/" + key, value)
        params_path = os.path.join(cfg.pretrain.model_dir, "params.yaml")
        self.supervisor = refresh_supervisor.RefreshSupervisor(cfg, params_path, self.index_builder)
        if self.chief:
            self.supervisor.bootstrap(
                loop.step, lambda: retriever_export.export_retriever(model.retriever, cfg, loop.step, self.tokenizer))
        loader_args = dict(index_dir=cfg.index.index_dir, expected_dim=cfg.model.projection_size,
                           expected_vocab_hash=self.tokenizer.vocab_hash, kind=cfg.index.kind,
                           min_refresh_interval_seconds=cfg.refresh.poll_seconds, blocks_dir=cfg.data.blocks_dir)
        # The blocks come with each index version (its corpus version): a corpus update swaps in like a refresh.
        loader = refresh_supervisor.wait_for_index(loader_args, timeout=3600.0)
        newest = index_publisher.export_step(loader.current()[2])
        if newest > loop.step + cfg.refresh.export_every_steps:
            logger.warning("%s: index version %d (export step %d) is ahead of trainer step %d: this run's refreshes "
                            "(versions = its steps) will not replace it until then", cfg.index.index_dir,
                            loader.version, newest, loop.step)
        trains_retriever = cfg.pretrain.steps > max(loop.step, cfg.pretrain.freeze_retriever_steps)
        if cfg.refresh.export_every_steps > 0 and trains_retriever and not export_steps(cfg, loop.step):
            logger.warning("pretrain: the retriever trains in steps %d-%d, but refresh.export_every_steps=%d puts no "
                           "export strictly inside them (a run does not export at its last step): the index it "
                           "searches is never refreshed (REALM §3.4). Lower refresh.export_every_steps",
                           max(loop.step, cfg.pretrain.freeze_retriever_steps) + 1, cfg.pretrain.steps,
                           cfg.refresh.export_every_steps)
        self.inputs = retrieval_augmented_input.RetrievalAugmentedInput(cfg, loader, None, self.tokenizer)
        if self.chief:
            self.supervisor.start()

    def train_hooks(self, model: realm_pretrainer.RealmPretrainer,
                    loop: training_loop.TrainingLoop) -> list[training_loop.Hook]:
        """Exports the retriever every ``refresh.export_every_steps`` (REALM §3.4) once it trains, and reports
        when the input pipeline switches to a new index version."""
        cfg, inputs = self.cfg, self.inputs
        exporting = export_steps(cfg, 0)
        last_version = [inputs.loader.version]

        def export_hook(step: int, logs: Mapping[str, float]) -> None:
            if step in exporting:
                if self.chief:
                    path = retriever_export.export_retriever(model.retriever, cfg, step, self.tokenizer)
                    logger.info("\npretrain: step %d: exported the retriever to %s", step, path)
                else:  # every MultiWorkerMirrored worker takes part in saving; only the chief's copy is kept
                    with tempfile.TemporaryDirectory() as scratch:
                        retriever_export.export_retriever(model.retriever, cfg, step, self.tokenizer,
                                                          export_dir=scratch)
            if inputs.loader.version != last_version[0]:
                last_version[0] = inputs.loader.version
                logger.info("\npretrain: step %d: input pipeline switched to index version %d", step,
                            inputs.loader.version)
        return [export_hook, *self._refresh_failure_hooks(loop)]

    def _refresh_failure_hooks(self, loop: training_loop.TrainingLoop) -> list[training_loop.Hook]:
        """The chief's check of the index builder, every ``refresh.poll_seconds``: its failures since the newest
        index version as the ``index_refresh_failures`` scalar, and the run stopped with the builder's error once
        they reach ``refresh.max_failures`` (:meth:`RefreshSupervisor.check`)."""
        if not self.chief or self.supervisor is None or self.cfg.refresh.export_every_steps <= 0:
            return []
        supervisor, every, last = self.supervisor, self.cfg.refresh.poll_seconds, [0.0]

        def refresh_hook(step: int, logs: Mapping[str, float]) -> None:
            if time.time() - last[0] < every:
                return
            last[0] = time.time()
            def report(failures: int) -> None:
                with loop.writer.as_default(step=step):
                    tf.summary.scalar("index_refresh_failures", failures)
                loop.writer.flush()

            supervisor.check(report)
        return [refresh_hook]

    def close(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()

    def finish(self, model: realm_pretrainer.RealmPretrainer, loop: training_loop.TrainingLoop) -> dict[str, Any]:
        """What the input pipeline did, and the held-out evaluation (``eval``, chief only, TensorBoard ``eval``)."""
        self.close()  # the index builder is not needed for the evaluation
        stats = self.inputs.stats
        result: dict[str, Any] = {"index_versions": dict(stats.versions),
                                  "excluded_source_blocks": stats.excluded_source_blocks,
                                  "trivial_retrievals_kept": stats.trivial_retrievals_kept}
        if self.run_evaluation and self.chief:
            scores = self.evaluate(model, self.eval_inputs())
            if not scores["num_examples"]:
                logger.warning("pretrain: the evaluation scored no example: no salient span of the %s split in %s "
                               "(pretrain.eval_split, --eval-input)", self.cfg.pretrain.eval_split, self.eval_pattern)
            writer = tf.summary.create_file_writer(os.path.join(self.cfg.pretrain.model_dir, self.eval_name()))
            with writer.as_default(step=loop.step):
                for key, value in scores.items():
                    tf.summary.scalar(key, value)
            writer.flush()
            result["eval"], result["eval_name"] = scores, self.eval_name()
        return result

    def eval_name(self) -> str:
        """The evaluation's TensorBoard run: ``eval`` (REALM's held-out spans), or ``eval_train`` and/or
        ``..._source_kept`` / ``..._source_forced`` for the training split's spans and the copying test (the
        source block kept where ranked, or forced in), so no curve mixes them."""
        trainer = self.cfg.pretrain
        source = ("" if not trainer.eval_keep_source_block else
                  "_source_forced" if trainer.force_source_block else "_source_kept")
        return "eval" + ("_train" if trainer.eval_split == "train" else "") + source

    def eval_inputs(self) -> tf.data.Dataset | None:
        """The held-out salient spans (``pretrain.eval_examples`` of them; held out by source block), or the
        training split's (``pretrain.eval_split``), as ``(features, labels)`` batches, with their retrievals from
        the current index (chief only); each query's source block excluded, or kept where the index ranks it
        (``pretrain.eval_keep_source_block``), or forced in (and ``pretrain.force_source_block``)."""
        if not self.chief:
            return None
        batch = self.global_batch_size
        heldout = self.inputs.dataset(self.eval_pattern, batch, repeat=False, shuffle=False,
                                      split=salient_predicate(self.cfg.data.pretraining_heldout_fraction,
                                                              self.cfg.pretrain.eval_split == "heldout"),
                                      trivial_retrieval_rate=1.0 if self.cfg.pretrain.eval_keep_source_block else 0.0,
                                      force_source=self.cfg.pretrain.force_source_block)
        heldout = heldout.take(max(1, self.cfg.pretrain.eval_examples // batch))
        return heldout.map(base_task.split_features(is_model_input))

    def evaluate(self, model: realm_pretrainer.RealmPretrainer, dataset: tf.data.Dataset) -> dict[str, float]:
        """Held-out scores (``dataset``: ``(features, labels)`` batches) of the marginal model and of the same model
        reading only the null document.

        Returns ``mlm_accuracy`` (marginal over the k candidates), ``mlm_accuracy_null_only`` (k = 1: ∅ alone),
        ``retrieval_utility``, ``log_likelihood`` and ``log_likelihood_null_only`` (per example),
        ``span_recall_top1`` / ``span_recall`` (fraction of examples whose masked wordpieces appear, in order,
        in the reader's view of the top-1 / any retrieved block: what retrieval can give at most),
        ``mlm_accuracy_span_retrieved`` / ``mlm_accuracy_null_only_span_retrieved`` (the two accuracies on the
        examples with the span in some retrieved block: does the reader copy it?), ``source_in_candidates``
        (fraction of examples whose own source block is a candidate: 1.0 with it forced in), on those examples
        ``mlm_accuracy_source_alone`` (the reader's accuracy reading the source block alone, p(y | x, z = source),
        which a low p(z = source | x) cannot hide) beside ``mlm_accuracy_source_held`` (the marginal's), and
        ``num_examples``.
        """
        return evaluation.run_evaluation(self, model, dataset)

    # ---- evaluation (realm_tf.core.evaluation: validation_step, aggregate_logs, reduce_aggregated_logs) ----

    #: What the host needs of a batch to find the masked span in the retrieved blocks (span_in_candidates).
    _SPAN_INPUTS = ("reader_input_word_ids", "reader_input_type_ids", "reader_input_mask", "target_ids",
                    "target_weights")
    _SUMS = ("correct", "correct_null", "count", "utility", "log_likelihood", "log_likelihood_null", "examples",
             "top1", "any", "correct_found", "correct_null_found", "count_found", "source_held", "correct_source",
             "correct_source_held", "count_source")

    def validation_step(self, inputs: tuple[base_task.Features, base_task.Labels],
                        model: realm_pretrainer.RealmPretrainer) -> base_task.Logs:
        """Per example: the marginal loss terms over the k candidates (``full``) and over the null document alone
        (``null``), and the inputs that tell whether the masked span was retrieved (``span``)."""
        features, labels = inputs
        outputs = model(features, training=False)
        full = realm_loss.realm_marginal_loss(outputs["retrieval_logits"], outputs["mlm_logits"],
                                              labels["target_ids"], labels["target_weights"])
        null = realm_loss.realm_marginal_loss(outputs["retrieval_logits"][:, :1], outputs["mlm_logits"][:, :1],
                                              labels["target_ids"], labels["target_weights"])
        batch = {**features, **labels}
        column = labels["source_column"]  # [batch]: the source block's candidate, -1 where it is none
        source_logits = tf.gather(outputs["mlm_logits"], tf.maximum(column, 0), axis=1, batch_dims=1)  # [b, m, v]
        predicted = tf.argmax(source_logits, axis=-1, output_type=tf.int32)  # [batch, num_masked]
        weights = tf.cast(labels["target_weights"], tf.float32)  # [batch, num_masked]
        source_correct = tf.reduce_sum(tf.cast(tf.equal(predicted, labels["target_ids"]), tf.float32) * weights,
                                       axis=-1)  # [batch]
        return {"full": full, "null": null, "span": {k: batch[k] for k in self._SPAN_INPUTS},
                "source": {"column": column, "correct": source_correct}}

    def aggregate_logs(self, state: dict[str, float] | None, step_outputs: base_task.Logs) -> dict[str, float]:
        """Sums a batch's correct masked wordpieces, retrieval utility and log-likelihoods, overall and on the
        examples whose span some retrieved block holds."""
        sums = state or dict.fromkeys(self._SUMS, 0.0)
        full, null = step_outputs["full"], step_outputs["null"]
        found = span_in_candidates(step_outputs["span"])  # [batch, num_candidates - 1]
        in_some = found.any(axis=1)  # [batch]
        sums["top1"] += float(found[:, 0].sum()) if found.shape[1] else 0.0
        sums["any"] += float(in_some.sum())
        sums["correct_found"] += float(full["mlm_correct"].numpy()[in_some].sum())
        sums["correct_null_found"] += float(null["mlm_correct"].numpy()[in_some].sum())
        sums["count_found"] += float(full["mlm_count"].numpy()[in_some].sum())
        sums["correct"] += float(tf.reduce_sum(full["mlm_correct"]))
        sums["correct_null"] += float(tf.reduce_sum(null["mlm_correct"]))
        sums["count"] += float(tf.reduce_sum(full["mlm_count"]))
        sums["utility"] += float(tf.reduce_sum(full["retrieval_utility"]))
        sums["log_likelihood"] += float(tf.reduce_sum(full["log_marginal"]))
        sums["log_likelihood_null"] += float(tf.reduce_sum(null["log_marginal"]))
        sums["examples"] += int(full["loss"].shape[0])
        held = step_outputs["source"]["column"].numpy() >= 0  # [batch]
        sums["source_held"] += float(held.sum())
        sums["correct_source"] += float(step_outputs["source"]["correct"].numpy()[held].sum())
        sums["correct_source_held"] += float(full["mlm_correct"].numpy()[held].sum())
        sums["count_source"] += float(full["mlm_count"].numpy()[held].sum())
        return sums

    def reduce_aggregated_logs(self, state: dict[str, float] | None) -> dict[str, Any]:
        """The held-out scores of :meth:`evaluate` from the sums."""
        sums = state or dict.fromkeys(self._SUMS, 0.0)
        n, count, found = max(sums["examples"], 1), max(sums["count"], 1.0), max(sums["count_found"], 1.0)
        source = max(sums["count_source"], 1.0)
        return {"mlm_accuracy": sums["correct"] / count, "mlm_accuracy_null_only": sums["correct_null"] / count,
                "retrieval_utility": sums["utility"] / n, "log_likelihood": sums["log_likelihood"] / n,
                "log_likelihood_null_only": sums["log_likelihood_null"] / n, "span_recall_top1": sums["top1"] / n,
                "span_recall": sums["any"] / n, "num_examples": int(sums["examples"]),
                "mlm_accuracy_span_retrieved": sums["correct_found"] / found,
                "mlm_accuracy_null_only_span_retrieved": sums["correct_null_found"] / found,
                "source_in_candidates": sums["source_held"] / n,
                "mlm_accuracy_source_alone": sums["correct_source"] / source,
                "mlm_accuracy_source_held": sums["correct_source_held"] / source}


def span_in_candidates(batch: Mapping[str, tf.Tensor]) -> np.ndarray:
    """``bool[batch, num_candidates - 1]``: do the masked wordpieces (in order, contiguous) appear in the
    document part of the reader input of retrieved candidate 1, 2, ...? (Candidate 0, ∅, has none.)"""
    words = batch["reader_input_word_ids"].numpy()  # [batch, num_cand, reader_len]
    segment = batch["reader_input_type_ids"].numpy() * batch["reader_input_mask"].numpy()  # 1 on the document
    targets = batch["target_ids"].numpy()  # [batch, num_masked]
    weights = batch["target_weights"].numpy()  # [batch, num_masked]
    found = np.zeros([words.shape[0], words.shape[1] - 1], bool)
    for b in range(words.shape[0]):
        span = targets[b][weights[b] > 0]
        if not span.size:
            continue
        for j in range(1, words.shape[1]):
            doc = words[b, j][segment[b, j] == 1]
            windows = np.lib.stride_tricks.sliding_window_view(doc, span.size) if doc.size >= span.size else None
            found[b, j - 1] = windows is not None and bool((windows == span).all(axis=1).any())
    return found


def query_similarity(query_embedding: tf.Tensor) -> tf.Tensor:
    """``[batch]``: each query's mean cosine to the *other* queries of the batch (0 for a batch of one).

    Unrelated queries have near-orthogonal embeddings; a mean near 1 says the retriever has collapsed onto
    one direction and retrieves the same blocks for every query.
    """
    unit = tf.math.l2_normalize(query_embedding, axis=-1)  # [batch, dim]
    cosine = tf.matmul(unit, unit, transpose_b=True)  # [batch, batch]
    batch = tf.cast(tf.shape(unit)[0], cosine.dtype)
    others = tf.reduce_sum(cosine, axis=-1) - tf.linalg.diag_part(cosine)  # [batch]
    return others / tf.maximum(batch - 1.0, 1.0)


def heldout_predicate(fraction: float, heldout: bool) -> Callable[[Mapping[str, tf.Tensor]], tf.Tensor]:
    """``record -> bool``: the held-out examples are those whose source block hashes below ``fraction``."""
    buckets = 10000
    threshold = int(round(fraction * buckets))

    def predicate(record: Mapping[str, tf.Tensor]) -> tf.Tensor:
        bucket = tf.strings.to_hash_bucket_fast(record[example_schemas.SOURCE_UID], buckets)
        return tf.less(bucket, threshold) if heldout else tf.greater_equal(bucket, threshold)
    return predicate


def salient_predicate(fraction: float, heldout: bool = True) -> Callable[[Mapping[str, tf.Tensor]], tf.Tensor]:
    """Held-out (or, ``heldout=False``, training-split) examples whose mask is a salient span (not the
    random-masking fallback)."""
    split = heldout_predicate(fraction, heldout=heldout)
    return lambda r: tf.logical_and(split(r), tf.equal(r[example_schemas.MASKING], b"salient"))


def export_steps(cfg: config_lib.ExperimentConfig, start: int) -> range:
    """The steps after ``start`` at which a run exports its retriever for the index refresh (REALM §3.4): every
    ``refresh.export_every_steps`` once the retriever trains (while it is frozen its index is exact), and not at
    the run's last step (``pretrain.steps``), after which no refreshed index would be read. Empty when the run's
    retriever trains but its index is never refreshed, or when it does not train."""
    every = cfg.refresh.export_every_steps
    if every <= 0:
        return range(0)
    first = max(start, cfg.pretrain.freeze_retriever_steps) // every * every + every
    return range(first, cfg.pretrain.steps, every)


def pretrain(cfg: config_lib.ExperimentConfig, pretraining_pattern: str | None = None,
             evaluate: bool = True, eval_pattern: str | None = None,
             index_builder: index_refresher.IndexBuilder | None = None, train: bool = True) -> dict[str, Any]:
    """``realm-tf pretrain``: trains for ``pretrain.steps`` (resuming from ``pretrain.model_dir``).

    With ``train=False`` (``--eval-only``) it scores the held-out salient spans of the latest checkpoint of
    ``pretrain.model_dir`` and trains nothing; there must be one.

    Returns the last training logs, the held-out evaluation (``eval/...``), the global step, and the index
    versions the input pipeline used.
    """
    if not train and not tf.train.latest_checkpoint(os.path.join(cfg.pretrain.model_dir, "checkpoints")):
        raise errors.UserError(f"{cfg.pretrain.model_dir}: no checkpoint to evaluate (pretrain.model_dir names the "
                               f"run)")
    return experiment.run_experiment(RealmPretrainingTask(cfg, pretraining_pattern, evaluate or not train,
                                                          eval_pattern, index_builder), train=train)


def format_result(result: Mapping[str, Any]) -> str:
    """The lines ``realm-tf pretrain`` prints at the end."""
    train = result["train"]
    lines = [f"pretrain: step {result['step']}: " + ", ".join(f"{k}={v:.4g}" for k, v in train.items()),
             f"  index versions used (batches): {result['index_versions']}; "
             f"{result['excluded_source_blocks']} retrieved source blocks excluded, "
             f"{result.get('trivial_retrievals_kept', 0)} kept (pretrain.trivial_retrieval_rate_while_frozen)"]
    if "eval" in result:
        e, name = result["eval"], result.get("eval_name", "eval")
        spans = "training-split salient spans" if name.startswith("eval_train") else "held-out salient spans"
        kept = (", source block kept" if name.endswith("_source_kept") else
                ", source block forced in" if name.endswith("_source_forced") else "")
        lines.append(f"  {spans} ({e['num_examples']} examples{kept}): MLM accuracy "
                     f"{e['mlm_accuracy']:.4f} with retrieval vs {e['mlm_accuracy_null_only']:.4f} null document "
                     f"only; retrieval utility {e['retrieval_utility']:.4f}; masked span in the top-1 block "
                     f"{e['span_recall_top1']:.3f}, in any retrieved block {e['span_recall']:.3f}; on those "
                     f"{e['mlm_accuracy_span_retrieved']:.4f} vs {e['mlm_accuracy_null_only_span_retrieved']:.4f}")
        if kept:
            lines.append(f"  source block among the candidates for {e['source_in_candidates']:.3f} of them; on those, "
                         f"MLM accuracy reading it alone {e['mlm_accuracy_source_alone']:.4f}, marginal "
                         f"{e['mlm_accuracy_source_held']:.4f}")
    return "\n".join(lines)
