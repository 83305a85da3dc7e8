"""Open-QA fine-tuning and evaluation of REALM (Guu et al., 2020, §4) in the ORQA setting (Lee et al., 2019).

Questions come from any JSONL file with ``question`` and ``answers`` (optional ``id`` and
``gold_passage_ids``). The model (:class:`realm_tf.models.open_qa_model.OpenQaModel`) retrieves the top
``reader_beam_size`` blocks from the fixed corpus embeddings in the graph and scores every span; the loss
(:func:`realm_tf.tasks.open_qa_loss.open_qa_marginal_loss`) is the retriever's marginal log-likelihood over
blocks that contain an answer plus the reader's over all answer spans, each skipped when nothing matches.
Answers are matched on wordpieces, in the graph, at word boundaries. Batches hold many questions (ORQA
trained with batch 1).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.core import base_task
from realm_tf.core import checkpoint_reading
from realm_tf.core import evaluation
from realm_tf.core import precision
from realm_tf.core import training_loop
from realm_tf.core import warm_start
from realm_tf.data import block_store as block_store_lib
from realm_tf.data import corpus_versions
from realm_tf.data import knowledge_corpus
from realm_tf.data import question_split
from realm_tf.data import questions
from realm_tf.export import open_qa_export
from realm_tf.index import index_publisher
from realm_tf.layers import bert_tokenizer
from realm_tf.models import answer_confidence
from realm_tf.models import knowledge_retriever
from realm_tf.models import open_qa_model
from realm_tf.models import span_reader
from realm_tf.tasks import answer_calibration
from realm_tf.tasks import answer_errors
from realm_tf.tasks import open_qa_loss
from realm_tf.tasks import qa_metrics
from realm_tf.tasks import reading_sets
from realm_tf.tasks import selective_qa

logger = logging.getLogger(__name__)

_QUESTION_PREFIX = "question_"


def split_questions(examples: Sequence[questions.QaExample], dev_fraction: float,
                    tune_fraction: float = 0.0) -> tuple[list[questions.QaExample], list[questions.QaExample]]:
    """(train, dev) by :func:`realm_tf.data.question_split.split_of` on the question id; the tune split (the
    next ``tune_fraction``) is in neither."""
    split = [question_split.split_of(e.id, dev_fraction, tune_fraction) for e in examples]
    return ([e for e, s in zip(examples, split) if s == "train"], [e for e, s in zip(examples, split) if s == "dev"])


def with_short_answers(examples: Sequence[questions.QaExample],
                       max_tokens: int) -> tuple[list[questions.QaExample], int]:
    """The questions with only their answers of at most ``max_tokens`` tokens, and how many had none and were
    left out: NQ-open's data (ORQA, Lee et al., 2019, keeps the Natural Questions short answers of at most five
    tokens; :func:`qa_metrics.short_answers`). ``max_tokens`` 0 keeps every question as it is."""
    if max_tokens <= 0:
        return list(examples), 0
    kept = [dataclasses.replace(e, answers=tuple(qa_metrics.short_answers(e.answers, max_tokens))) for e in examples]
    kept = [e for e in kept if e.answers]
    return kept, len(examples) - len(kept)


SPLITS = ("all", "train", "dev", "tune")


def select_split(examples: Sequence[questions.QaExample], split: str,
                 data: config_lib.DataConfig) -> list[questions.QaExample]:
    """The questions of ``split`` (one of :data:`SPLITS`) under ``data.qa_dev_fraction`` / ``qa_tune_fraction``."""
    if split not in SPLITS:
        raise errors.UserError(f"unknown split {split!r}: one of {', '.join(SPLITS)}")
    if split == "all":
        return list(examples)
    return [e for e in examples
            if question_split.split_of(e.id, data.qa_dev_fraction, data.qa_tune_fraction) == split]


def load_corpus(cfg: config_lib.ExperimentConfig, tokenizer: bert_tokenizer.BertTokenizer,
                index_dir: str | None = None
                ) -> tuple[knowledge_corpus.KnowledgeCorpus, block_store_lib.BlockStore, dict]:
    """The corpus from the newest complete index version's ``embeddings.npy`` and the blocks of the corpus version
    it was built over (``index.json``: ``corpus_version``), in graph variables."""
    path, meta = index_publisher.newest_version(index_dir or cfg.index.index_dir, tokenizer.vocab_hash)
    embeddings = index_publisher.read_embeddings(path)  # [num_blocks, dim]
    corpus = corpus_versions.version_dir(cfg.data.blocks_dir, index_publisher.corpus_version(meta))
    blocks = block_store_lib.BlockStore.load(os.path.join(corpus, corpus_versions.BLOCKS_GLOB))
    if len(blocks) != embeddings.shape[0]:
        raise errors.UserError(f"{path}: {embeddings.shape[0]} embeddings but {len(blocks)} blocks in "
                               f"{corpus}: the index was built from another corpus")
    return knowledge_corpus.KnowledgeCorpus(embeddings, blocks, tokenizer), blocks, meta


class OpenQaTask(base_task.Task):
    """The Open-QA model, input pipeline, loss, metrics and predictions from an experiment config (trainer
    section ``finetune``).

    Args:
      train_path: the {question, answers} JSONL trained on (its train split; needed to train, not to evaluate).
      retriever: ``dense``: ORQA's fine-tuning of retriever and reader together on the retriever's top
        ``model.reader_beam_size`` blocks; ``bm25``: the reader alone on BM25's top blocks (REALM's and ORQA's
        "BM25 + BERT" baseline, trained like the dense row).
    """

    trainer_section = "finetune"

    def __init__(self, cfg: config_lib.ExperimentConfig, train_path: str | None = None, retriever: str = "dense"):
        super().__init__(cfg)
        if retriever not in ("dense", "bm25"):
            raise errors.UserError(f"unknown retriever {retriever!r} for finetune: dense or bm25")
        self.train_path = train_path
        self.retriever = retriever
        self.blocks: block_store_lib.BlockStore | None = None
        self.corpus_meta: dict[str, Any] = {}
        self._training_set: tuple[list[questions.QaExample], np.ndarray | None, dict[str, Any]] | None = None

    @functools.cached_property
    def calibrator(self) -> answer_calibration.Calibrator:
        """The answers' confidence calibrator (``qa.confidence_calibrator``; unfitted: the span probability)."""
        return answer_calibration.configured(self.cfg.qa.confidence_calibrator)

    @functools.cached_property
    def continuation(self) -> np.ndarray:
        """``bool[vocab]``: the ``##`` continuation wordpieces (numpy: a constant of whichever graph reads it)."""
        return bert_tokenizer.continuation_table(self.tokenizer.vocab)

    @property
    def reader_only(self) -> bool:
        """Only the reader trains, on the blocks each example gives (no retriever term)."""
        return self.retriever == "bm25"

    # ---- model --------------------------------------------------------------------------------------------

    def load_corpus(self) -> knowledge_corpus.KnowledgeCorpus:
        """The corpus the trained model reads: the newest index version's embeddings and the blocks."""
        corpus, self.blocks, self.corpus_meta = load_corpus(self.cfg, self.tokenizer)
        return corpus

    def build_model(self, corpus: knowledge_corpus.KnowledgeCorpus | None = None) -> open_qa_model.OpenQaModel:
        """Retriever (``qa.retriever_checkpoint`` / ``model.retriever_checkpoint``) and reader
        (``qa.reader_checkpoint``: the pre-trained knowledge-augmented encoder) over ``corpus`` (default:
        :meth:`load_corpus`)."""
        m, qa = self.cfg.model, self.cfg.qa
        corpus = corpus if corpus is not None else self.load_corpus()
        retriever = knowledge_retriever.build_knowledge_retriever(m)
        retriever_source = qa.retriever_checkpoint or m.retriever_checkpoint
        if retriever_source:
            warm_start.restore_from_run(retriever_source, retriever=retriever)
        reader = span_reader.build_span_reader(m)
        if qa.reader_checkpoint:  # a train-reader / finetune run: the whole reader; REALM pre-training: its BERT
            warm_start.restore_from_run(qa.reader_checkpoint, reader=reader)
        return open_qa_model.OpenQaModel(retriever, reader, corpus, self.tokenizer, m.reader_beam_size,
                                         m.reader_seq_length, m.block_seq_length, qa.recompute_doc_embeddings,
                                         reader_block_title=m.reader_block_title,
                                         static_padding=self.cfg.data.static_padding, name="open_qa")

    # ---- data ---------------------------------------------------------------------------------------------

    def dataset(self, examples: Sequence[questions.QaExample], batch_size: int, repeat: bool = False,
                shuffle: bool = False, seed: int | None = None, drop_remainder: bool = False,
                block_ids: np.ndarray | None = None, block_windows: np.ndarray | None = None,
                mixture: Sequence[tuple[np.ndarray, float]] | None = None) -> tf.data.Dataset:
        """Batches of ``question_*`` ``int32[batch, q_len]``, ``answer_ids`` ``int32[batch, max_answers,
        max_span_width]`` (-1 padded; answers longer than a span can be are left out) and ``index``
        ``int32[batch]`` (position in ``examples``); with ``block_ids`` ``int[len(examples), k]`` (the blocks to
        read instead of searching: BM25's, or gold + negatives), also ``block_ids`` ``int32[batch, k]``; with
        ``block_windows`` ``int[len(examples), k, 2]`` (the part of each body read, ``OpenQaModel``), also
        ``block_windows`` ``int32[batch, k, 2]``.

        ``mixture`` (with ``repeat`` and ``shuffle``): groups of ``examples`` (their positions) and the probability
        of drawing the next question from each; every group is shuffled and repeated on its own."""
        if not examples:
            raise ValueError("no questions")
        _ = self.tokenizer  # its lookup tables made eagerly, not inside the traced map below
        width, max_answers = self.cfg.model.max_span_width, self.cfg.qa.max_answers
        answers = [list(e.answers[:max_answers]) or [""] for e in examples]
        _check_given_blocks(len(examples), block_ids, block_windows)

        def rows(positions: np.ndarray) -> tf.data.Dataset:
            columns = {"question": tf.constant([examples[i].question for i in positions]),
                       "answers": tf.ragged.constant([answers[i] for i in positions], dtype=tf.string),
                       "index": tf.constant(positions, dtype=tf.int32)}
            for key, given in (("block_ids", block_ids), ("block_windows", block_windows)):  # [n, k], [n, k, 2]
                if given is not None:
                    columns[key] = tf.constant(np.asarray(given, np.int32)[positions])
            return tf.data.Dataset.from_tensor_slices(columns)

        if mixture is not None:
            if not (repeat and shuffle):
                raise ValueError("a mixture of question groups is sampled from repeated, shuffled groups only")
            groups = [rows(np.asarray(positions)).repeat().shuffle(_shuffle_buffer(len(positions)),
                                                                   seed=None if seed is None else seed + g)
                      for g, (positions, _) in enumerate(mixture)]
            ds = tf.data.Dataset.sample_from_datasets(groups, weights=[float(w) for _, w in mixture], seed=seed)
        else:
            ds = rows(np.arange(len(examples)))
            if repeat:
                ds = ds.repeat()
            if shuffle:
                ds = ds.shuffle(_shuffle_buffer(len(examples)), seed=seed)
        ds = ds.ragged_batch(batch_size, drop_remainder=drop_remainder)

        def pack(batch: Mapping[str, Any]) -> dict[str, tf.Tensor]:
            packed = self.tokenizer.pack_single(self.tokenizer(batch["question"]), self.cfg.qa.question_seq_length,
                                                self.cfg.data.static_padding)
            flat = self.tokenizer(batch["answers"].flat_values)  # [num_answers, (len)]
            too_long = flat.row_lengths() > width
            flat = tf.ragged.boolean_mask(flat, ~too_long[:, None] & tf.ones_like(flat, tf.bool))
            dense = flat.to_tensor(-1, shape=[None, width])  # [num_answers, width]
            per_question = tf.RaggedTensor.from_row_splits(dense, batch["answers"].row_splits)  # [b, (a), width]
            answer_ids = per_question.to_tensor(-1, shape=[None, max_answers, width])  # [b, max_answers, width]
            out = {**{_QUESTION_PREFIX + k: v for k, v in packed.items()}, "answer_ids": answer_ids,
                   "index": batch["index"]}
            out.update({key: batch[key] for key in ("block_ids", "block_windows") if key in batch})  # [b, k(, 2)]
            return out

        return ds.map(pack, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    # ---- loss, metrics, predictions -----------------------------------------------------------------------

    def answer_span_mask(self, outputs: Mapping[str, tf.Tensor], answer_ids: tf.Tensor) -> tf.Tensor:
        """``bool[batch, k, num_spans]``: spans whose wordpieces are an answer, starting and ending at word
        boundaries (not inside a word split into ``##`` pieces)."""
        width = self.cfg.model.max_span_width
        ids = outputs["reader_input_word_ids"]  # [batch, k, len]
        length = tf.shape(ids)[2]
        padded = tf.pad(ids, [[0, 0], [0, 0], [0, width + 1]], constant_values=-2)  # [batch, k, len + w + 1]
        windows = tf.stack([padded[:, :, w:w + length] for w in range(width)], axis=-1)  # [batch, k, len, w]
        answers = answer_ids[:, None, None, :, :]  # [batch, 1, 1, answers, w]
        equal = tf.cast(tf.equal(windows[:, :, :, None, :], answers), tf.int32)  # [batch, k, len, answers, w]
        prefix = tf.math.cumprod(equal, axis=-1) > 0  # [batch, k, len, answers, w]: first w+1 pieces match
        answer_length = tf.reduce_sum(tf.cast(answer_ids >= 0, tf.int32), axis=-1)  # [batch, answers]
        exact = tf.equal(tf.range(1, width + 1)[None, None, None, None, :],
                         answer_length[:, None, None, :, None])  # [batch, 1, 1, answers, w]: width w+1 = length
        match = tf.reduce_any(prefix & exact & (answer_length > 0)[:, None, None, :, None], axis=3)  # [b, k, len, w]
        continuation = tf.gather(self.continuation, tf.maximum(padded, 0)) & (padded >= 0)  # [b, k, len + w + 1]
        starts_word = ~continuation[:, :, :length]  # [batch, k, len]
        next_is_piece = tf.stack([continuation[:, :, w + 1:w + 1 + length] for w in range(width)], -1)  # [b,k,len,w]
        match = match & starts_word[..., None] & ~next_is_piece  # [batch, k, len, w]
        shape = tf.shape(outputs["span_mask"])
        return tf.reshape(match, shape) & outputs["span_mask"]  # [batch, k, len * w]

    def build_losses(self, labels: Mapping[str, tf.Tensor],
                     outputs: Mapping[str, tf.Tensor]) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """ORQA's loss per question ``[batch]`` (the reader's term alone when :attr:`reader_only`) and its terms
        (:func:`realm_tf.tasks.open_qa_loss.open_qa_marginal_loss`, plus ``span_correct``: the predicted span is
        an answer)."""
        answer_mask = self.answer_span_mask(outputs, labels["answer_ids"])
        terms = open_qa_loss.open_qa_marginal_loss(outputs["retrieval_logits"], outputs["span_logits"],
                                                   outputs["span_mask"], answer_mask)
        correct = tf.gather_nd(answer_mask, tf.stack([terms["predicted_block"], terms["predicted_span"]], -1),
                               batch_dims=1)  # [batch]: the predicted span is an answer
        terms["span_correct"] = tf.cast(correct, tf.float32)
        return (terms["reader_loss"] if self.reader_only else terms["loss"]), terms

    def build_metrics(self, labels: Mapping[str, tf.Tensor], terms: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """``answer_in_beam``, ``span_accuracy`` and the two loss terms (the retriever's only when it trains)."""
        metrics = {"answer_in_beam": tf.reduce_mean(terms["has_answer_block"]),
                   "span_accuracy": tf.reduce_mean(terms["span_correct"])}
        if not self.reader_only:  # given blocks: no retriever term
            metrics["retriever_loss"] = tf.reduce_mean(terms["retriever_loss"])
            metrics["reader_loss"] = tf.reduce_mean(terms["reader_loss"])
        return metrics

    def prepare_inputs(self, inputs: tuple[base_task.Features, base_task.Labels],
                       model: open_qa_model.OpenQaModel) -> tuple[base_task.Features, base_task.Labels]:
        """The step's retrieval, before its update: the search and the corpus's ragged gathers
        (:meth:`OpenQaModel.gather_blocks`) have no XLA kernel, so they run here, uncompiled, with the live query
        tower (without dropout); the update (:meth:`call_model`, the loss, the gradients) then reads dense
        tensors and compiles, and computes Embed_input(x) again under its gradient tape."""
        features, labels = inputs
        gathered = model.gather_blocks(features, training=True, search_training=False)
        gathered.pop("query_embedding", None)  # computed outside the tape: no gradient would reach the tower
        return {**features, **gathered}, labels

    def call_model(self, model: open_qa_model.OpenQaModel, features: base_task.Features,
                   training: bool) -> Mapping[str, tf.Tensor]:
        """The forward pass; on features :meth:`prepare_inputs` gathered, only its dense part."""
        if "reader_input_word_ids" in features:
            return model.read(features, training=training)
        return model(features, training=training)

    def trainable_variables(self, model: open_qa_model.OpenQaModel, **options: Any) -> list[tf.Variable]:
        return list(model.reader.trainable_variables if self.reader_only else model.trainable_variables)

    def checkpoint_items(self, model: open_qa_model.OpenQaModel) -> dict[str, tf.Module]:
        return {"retriever": model.retriever, "reader": model.reader}

    # ---- the run ------------------------------------------------------------------------------------------

    def training_set(self) -> tuple[list[questions.QaExample], np.ndarray | None, dict[str, Any]]:
        """(questions, the blocks each reads ``[num_questions, k]`` or None to search, facts to print)."""
        if self._training_set is None:
            if not self.train_path:
                raise errors.UserError("finetune needs a question file to train on")
            train, dev = split_questions(questions.read_questions(self.train_path), self.cfg.data.qa_dev_fraction,
                                         self.cfg.data.qa_tune_fraction)
            train, long_answers = with_short_answers(train, self.cfg.qa.train_max_answer_tokens)
            if not train:
                raise errors.UserError(f"{self.train_path}: every question is in the dev or tune split "
                                       f"(data.qa_dev_fraction, data.qa_tune_fraction) or has no answer of at "
                                       f"most qa.train_max_answer_tokens={self.cfg.qa.train_max_answer_tokens} "
                                       f"tokens")
            block_ids = None
            if self.retriever == "bm25":
                from realm_tf.index import bm25_retriever  # pylint: disable=import-outside-toplevel

                blocks = self.blocks or block_store_lib.BlockStore.load(
                    corpus_versions.current_pattern(self.cfg.data.blocks_dir))
                block_ids, _ = bm25_retriever.Bm25Retriever(blocks.titles, blocks.texts).search(
                    [e.question for e in train], self.cfg.model.reader_beam_size)  # [num_train, k]
            self._training_set = (train, block_ids, {"num_train": len(train), "num_dev": len(dev),
                                                     "left_out_long_answers": long_answers})
        return self._training_set

    def build_inputs(self, input_context: tf.distribute.InputContext | None = None, seed: int | None = None,
                     **options: Any) -> tf.data.Dataset:
        """Shuffled, repeated batches ``(features, labels)`` of the training questions: features ``question_*``
        (and ``block_ids`` when the blocks are given), labels ``answer_ids`` and ``index``."""
        examples, block_ids, _ = self.training_set()
        batch_size = self.global_batch_size
        if input_context is not None:
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        dataset = self.dataset(examples, batch_size, repeat=True, shuffle=True, seed=seed, drop_remainder=True,
                               block_ids=block_ids, block_windows=self.block_windows(), mixture=self.mixture())
        return dataset.map(base_task.split_features(is_model_input))

    def mixture(self) -> list[tuple[np.ndarray, float]] | None:
        """Groups of training questions and the probability of drawing from each (``dataset``'s ``mixture``);
        None: one shuffled pool."""
        return None

    def block_windows(self) -> np.ndarray | None:
        """``int[num_questions, k, 2]``: the part of each given block's body that training reads (``dataset``'s
        ``block_windows``); None: whole blocks."""
        return None

    def initialize(self, model: open_qa_model.OpenQaModel, loop: training_loop.TrainingLoop) -> None:
        _, _, facts = self.training_set()
        if self.retriever == "dense" and not self.cfg.qa.recompute_doc_embeddings:
            check_index_matches(self, model)  # frozen Embed_doc: the index must come from it
        logger.info("finetune: %s training questions (%s in dev), %s blocks, corpus %s blocks from index version %s",
                    facts["num_train"], facts["num_dev"], self.retriever, self.corpus_meta.get("num_blocks"),
                    self.corpus_meta.get("version"))
        if facts["left_out_long_answers"]:
            logger.info("finetune: %d training questions left out, no answer of at most %d tokens "
                        "(qa.train_max_answer_tokens)", facts["left_out_long_answers"],
                        self.cfg.qa.train_max_answer_tokens)

    def finish(self, model: open_qa_model.OpenQaModel, loop: training_loop.TrainingLoop) -> dict[str, Any]:
        _, _, facts = self.training_set()
        return dict(facts)

    def decode(self, model: open_qa_model.OpenQaModel, outputs: Mapping[str, tf.Tensor],
               retrieval_weight: float | None = None, aggregate_spans: int | None = None,
               length_bias: float | None = None) -> dict[str, tf.Tensor]:
        """The best answer per question (:meth:`OpenQaModel.decode`), ranked by S_read(z, s) + b·|s| +
        w·S_retr(z, x) with w = ``retrieval_weight`` (default ``qa.retrieval_score_weight``) and b =
        ``length_bias`` (default ``qa.span_length_bias``), the probabilities of the best ``aggregate_spans``
        spans summed by answer text (default ``qa.answer_aggregation_spans``); ``evaluate``, the exported model
        and ``ask`` all decode there."""
        weight = self.cfg.qa.retrieval_score_weight if retrieval_weight is None else retrieval_weight
        spans = self.cfg.qa.answer_aggregation_spans if aggregate_spans is None else aggregate_spans
        bias = self.cfg.qa.span_length_bias if length_bias is None else length_bias
        return model.decode(outputs, weight, spans, bias)

    # ---- evaluation (realm_tf.core.evaluation: validation_step, aggregate_logs, reduce_aggregated_logs) ----

    def build_eval_inputs(self, examples: Sequence[questions.QaExample], blocks: block_store_lib.BlockStore,
                          given: np.ndarray | None = None, ranked: np.ndarray | None = None,
                          score_weights: Sequence[float] = (), aggregations: Sequence[int] = (),
                          length_biases: Sequence[float] = ()) -> tf.data.Dataset:
        """The batches of an evaluation over ``examples``, read from the model's own search or from ``given``
        blocks ``[num_questions, k]`` (``ranked`` ``[num_questions, max_k]``: their ranking, for accuracy@k); the
        answers are also decoded with each retrieval weight of ``score_weights``, each span aggregation of
        ``aggregations`` and each span length bias of ``length_biases``."""
        variants = [(f"w={w:g}", {"retrieval_weight": w}) for w in score_weights]
        variants += [(f"agg={n}", {"aggregate_spans": n}) for n in aggregations]
        variants += [(f"len={b:g}", {"length_bias": b}) for b in length_biases]
        self._evaluation = _Evaluation(list(examples), blocks, qa_metrics.AnswerMatcher(blocks.texts),
                                       variants, ranked, max(self.cfg.qa.eval_ks))
        return self.dataset(examples, self.global_batch_size, block_ids=given)

    def validation_step(self, inputs: Mapping[str, tf.Tensor], model: open_qa_model.OpenQaModel) -> dict[str, Any]:
        """Per question of a batch: the decoded answers (``decoded``: the default decoding, then each variant's),
        whether any read span is an answer (``oracle``), the blocks ranked (``top``) and read (``read``)."""
        outputs = model(model_inputs(inputs), training=False)
        variants = self._evaluation.variants
        decoded = [self.decode(model, outputs)] + [self.decode(model, outputs, **kw) for _, kw in variants]
        oracle = tf.reduce_any(self.answer_span_mask(outputs, inputs["answer_ids"]), axis=[1, 2])  # [batch]
        if "block_ids" in inputs:
            top = inputs["block_ids"]  # [batch, k]: ranked outside (BM25 / gold); replaced by the ranking
        else:
            question = {k[len(_QUESTION_PREFIX):]: v for k, v in inputs.items() if k.startswith(_QUESTION_PREFIX)}
            _, _, top = model.retrieve(question, self._evaluation.max_k)  # [batch, max_k]
        return {"index": inputs["index"], "decoded": decoded, "oracle": oracle, "top": top,
                "read": outputs["block_ids"]}

    def aggregate_logs(self, state: dict[str, Any] | None, step_outputs: Mapping[str, Any]) -> dict[str, Any]:
        """Scores each question of a batch and keeps its prediction record."""
        e = self._evaluation
        if state is None:
            state = {"predictions": [], "retrieved": [],
                     "totals": dict.fromkeys(["exact_match", "f1", "regex_match", "reader_oracle"]
                                             + [f"{m}@{name}" for name, _ in e.variants for m in ("exact_match", "f1")],
                                             0.0)}
        totals, decoded = state["totals"], step_outputs["decoded"]
        features = decoded[0]["features"].numpy()  # [batch, F]
        confidences = self.calibrator.confidence(features)  # [batch]: once per batch
        for i, index in enumerate(step_outputs["index"].numpy()):
            example = e.examples[index]
            answers = [d["answer"][i].numpy().decode("utf-8", "replace") for d in decoded]
            answer, oracle = answers[0], bool(step_outputs["oracle"][i])
            hit_em, hit_f1 = qa_metrics.exact_match(answer, example.answers), qa_metrics.f1(answer, example.answers)
            totals["exact_match"] += hit_em
            totals["f1"] += hit_f1
            totals["regex_match"] += qa_metrics.regex_match(answer, example.answers)
            totals["reader_oracle"] += oracle
            for (name, _), other in zip(e.variants, answers[1:]):
                totals[f"exact_match@{name}"] += qa_metrics.exact_match(other, example.answers)
                totals[f"f1@{name}"] += qa_metrics.f1(other, example.answers)
            state["retrieved"].append(e.ranked[index] if e.ranked is not None else step_outputs["top"][i].numpy())
            normalized = qa_metrics.normalized_answers(example.answers)
            read_rows = [int(r) for r in step_outputs["read"][i].numpy()]
            state["predictions"].append({
                "id": example.id, "question": example.question, "prediction": answer,
                "score": float(decoded[0]["score"][i]),
                "confidence": round(float(confidences[i]), 6),
                "features": {name: round(float(v), 5) for name, v in zip(answer_confidence.FEATURES, features[i])},
                "answers": list(example.answers), "exact_match": hit_em,
                "f1": round(hit_f1, 4), "reader_oracle": oracle, "block_id": int(decoded[0]["block_id"][i]),
                "predicted_block": int(decoded[0]["block"][i]), "retrieved_block_ids": read_rows,
                "retrieved_titles": [e.blocks.titles[r] for r in read_rows],
                "read_blocks_with_answer": [p for p, r in enumerate(read_rows)
                                            if normalized and e.matcher.has_answer(r, normalized)]})
        return state

    def reduce_aggregated_logs(self, state: dict[str, Any]) -> dict[str, Any]:
        """EM, F1, regex match and the reader oracle (means over the questions), retrieval accuracy@k, EM and F1
        on NQ-open's questions (``short_answers``: :func:`qa_metrics.short_answer_scores`), the count of each
        outcome of :mod:`realm_tf.tasks.answer_errors`, how well the answers' ``score`` ranks and calibrates them
        (``selective``: :func:`selective_qa.selective_metrics` against exact match), and the prediction records
        (``predictions``)."""
        predictions, retrieved = state["predictions"], state["retrieved"]
        n, width = len(predictions), max(len(r) for r in retrieved)
        padded = np.full([n, width], -1, np.int64)  # [num_questions, width]
        for q, rows in enumerate(retrieved):
            padded[q, :len(rows)] = rows
        metrics: dict[str, Any] = {k: v / n for k, v in state["totals"].items()}
        metrics.update({k: v for k, v in qa_metrics.qa_metrics(
            padded, self._evaluation.matcher, [p["answers"] for p in predictions], ks=self.cfg.qa.eval_ks).items()
            if k != "num_questions" and int(k.split("@")[1]) <= width})
        metrics["num_questions"] = n
        metrics["short_answers"] = qa_metrics.short_answer_scores(predictions)
        metrics["outcomes"] = answer_errors.count_outcomes(predictions)
        correct = [p["exact_match"] for p in predictions]
        metrics["selective"] = {"confidence": self.calibrator.kind if self.calibrator.calibrated else "score",
                                **selective_qa.selective_metrics([p["confidence"] for p in predictions], correct)}
        if self.calibrator.calibrated:  # the span probability's figures beside the calibrated ones
            metrics["selective_score"] = {"confidence": "score", **selective_qa.selective_metrics(
                [p["score"] for p in predictions], correct)}
        metrics["predictions"] = predictions
        return metrics


@dataclasses.dataclass(frozen=True)
class _Evaluation:
    """What an evaluation's steps and aggregation read besides the batches."""

    examples: list[questions.QaExample]
    blocks: block_store_lib.BlockStore
    matcher: qa_metrics.AnswerMatcher  # over the blocks' texts
    variants: list[tuple[str, dict[str, Any]]]  # (name, OpenQaTask.decode keyword arguments)
    ranked: np.ndarray | None  # [num_questions, max_k] blocks ranked outside the model, or None
    max_k: int


def _check_given_blocks(num_examples: int, block_ids: np.ndarray | None, block_windows: np.ndarray | None) -> None:
    """ValueError unless ``block_ids`` has a row per question and ``block_windows`` a window per given block."""
    if block_ids is not None and len(block_ids) != num_examples:
        raise ValueError(f"{len(block_ids)} rows of block_ids for {num_examples} questions")
    if block_windows is not None and (block_ids is None or np.shape(block_windows) != (*np.shape(block_ids), 2)):
        raise ValueError(f"block_windows of shape {np.shape(block_windows)} for block_ids of shape "
                         f"{np.shape(block_ids)}: one (start, count) per block read")


def _shuffle_buffer(num_examples: int) -> int:
    """A whole-set shuffle for up to 100k questions (a window of 100k beyond)."""
    return min(max(num_examples, 1), 100_000)


def is_model_input(key: str) -> bool:
    """Whether :class:`OpenQaModel` reads this batch entry: the packed question and, when given, ``block_ids``
    and ``block_windows``."""
    return key.startswith(_QUESTION_PREFIX) or key in ("block_ids", "block_windows")


def model_inputs(batch: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """The entries of a batch :class:`OpenQaModel` reads (:func:`is_model_input`)."""
    return {k: v for k, v in batch.items() if is_model_input(k)}


def check_index_matches(task: "OpenQaTask", model: open_qa_model.OpenQaModel, sample: int = 8,
                        index_rows: np.ndarray | None = None) -> float:
    """Re-embeds a few blocks with the model's Embed_doc and compares them with the index's rows (the corpus's,
    or ``index_rows`` ``[num_blocks, dim]`` for a corpus that holds none).

    The index is only valid for the document tower that built it; a query tower from other weights would
    search it blindly. Raises UserError when they differ (returns the largest difference otherwise).

    The index holds float32 embeddings. A model built for ``mixed_bfloat16`` training computes Embed_doc in
    bfloat16, about 1e-2 from float32 for MiniLM, which would hide a small change of weights; the comparison
    then runs on a float32 copy of the tower (built alone and uncompiled: it reads ``sample`` blocks once).
    """
    ids = tf.range(tf.minimum(sample, model.corpus.num_blocks))  # [sample]
    packed = task.tokenizer.join_bert(model.corpus.title_ids(ids), model.corpus.body_ids(ids),
                                      task.cfg.model.block_seq_length, pad_to_seq_length=False)
    retriever = model.retriever
    if retriever.doc_embedder.compute_dtype != "float32":
        with precision.policy_scope("float32"):
            retriever = knowledge_retriever.build_knowledge_retriever(
                dataclasses.replace(task.cfg.model, share_embedders=True, compiled_inference=False), restore=False)
        retriever.doc_embedder.set_weights(model.retriever.doc_embedder.get_weights())
    fresh = retriever.embed_blocks(packed, training=False)  # [sample, dim]
    stored = model.corpus.block_embeddings(ids) if index_rows is None else index_rows[:int(tf.size(ids))]
    diff = float(tf.reduce_max(tf.abs(fresh - stored)))
    if diff > 1e-3:
        raise errors.UserError(
            f"the index's block embeddings differ from this model's Embed_doc (max |diff| {diff:.3g}): the index "
            f"was built from other retriever weights. Start the retriever from the run that exported it "
            f"(qa.retriever_checkpoint / model.retriever_checkpoint), or rebuild the index from this model's "
            f"weights (realm-tf export-retriever, realm-tf embed-blocks)")
    return diff


def load_finetuned(task: OpenQaTask, model: open_qa_model.OpenQaModel, model_dir: str,
                   check_index: bool = True) -> str | None:
    """Loads the latest fine-tuning checkpoint of ``model_dir`` (retriever + whole reader) into ``model``.

    With ``check_index`` and frozen document embeddings, also runs :func:`check_index_matches`: the index must
    come from this Embed_doc. Returns the checkpoint, or None when there is none (the model stays as initialised,
    e.g. zero-shot).
    """
    checkpoint = checkpoint_reading.newest_complete(os.path.join(model_dir, "checkpoints"))
    if checkpoint is not None:
        checkpoint_reading.read(tf.train.Checkpoint(retriever=model.retriever, reader=model.reader),
                                checkpoint).expect_partial()
    if check_index and not task.cfg.qa.recompute_doc_embeddings:
        check_index_matches(task, model)
    return checkpoint


def finetune(cfg: config_lib.ExperimentConfig, train_path: str, retriever: str = "dense") -> dict[str, Any]:
    """``realm-tf finetune``: trains on the train split of ``train_path`` for ``finetune.steps``.

    The dev and tune splits (``data.qa_dev_fraction`` / ``qa_tune_fraction`` of the question ids) are never
    trained on; ``realm-tf evaluate --split dev`` scores them. Resumes from ``finetune.model_dir``. ``retriever``:
    see :class:`OpenQaTask`.
    """
    from realm_tf.core import experiment  # pylint: disable=import-outside-toplevel

    return experiment.run_experiment(OpenQaTask(cfg, train_path, retriever))


RETRIEVERS = ("dense", "bm25", "gold")


def evaluate(cfg: config_lib.ExperimentConfig, questions_path: str, split: str = "all", model_dir: str | None = None,
             index_dir: str | None = None, predictions_path: str | None = None, retriever: str = "dense",
             score_weights: Sequence[float] = (), aggregations: Sequence[int] = (),
             length_biases: Sequence[float] = (), metrics_path: str | None = None,
             target_precision: float | None = None) -> dict[str, Any]:
    """``realm-tf evaluate``: exact match, F1, regex match, retrieval accuracy@k, reader oracle, and the count of
    each outcome of :mod:`realm_tf.tasks.answer_errors` (``outcomes``); writes predictions.

    Args:
      split: one of :data:`SPLITS`: ``all`` questions of the file, or its ``dev`` / ``tune`` / ``train`` part.
      model_dir: fine-tuning (or ``train-reader``) run to load (default ``finetune.model_dir``; without a
        checkpoint the model is evaluated as initialised, e.g. zero-shot).
      retriever: ``dense``: the model's own retriever (MIPS over the index); ``bm25``: BM25's top blocks read by
        the same reader, without a retrieval prior (REALM's "BM25 + BERT" baseline); ``gold``: the gold block
        that holds the answer, read alone (the reader's reading comprehension; questions without one are
        counted and left out). Metrics, predictions and TensorBoard scalars of ``bm25`` / ``gold`` get a
        ``-bm25`` / ``_bm25`` (``gold``) suffix.
      score_weights: also report ``exact_match@w=W`` / ``f1@w=W`` with answers picked by S_read + W·S_retr.
      aggregations: also report ``exact_match@agg=N`` / ``f1@agg=N`` with the probabilities of the best N spans
        summed by answer text (``qa.answer_aggregation_spans``).
      length_biases: also report ``exact_match@len=B`` / ``f1@len=B`` with answers picked with a span length bias
        of B per wordpiece (``qa.span_length_bias``).
      metrics_path: also write the metrics (and the predictions' path) to this JSON file, atomically.
      target_precision: also evaluate the tune split, choose there the lowest confidence threshold whose answers
        reach this precision (:func:`selective_qa.threshold_for_precision`), and report what abstaining below
        it does on ``split`` (``abstention``).

    The answers' reliability diagram is written beside the predictions, named after them
    (``predictions-<split>.jsonl`` → ``reliability-<split>.png``).
    """
    _check_evaluation(retriever, target_precision)
    task = OpenQaTask(cfg)
    examples = select_split(questions.read_questions(questions_path), split, cfg.data)
    if not examples:
        raise errors.UserError(f"{questions_path}: no questions in split {split!r}")
    corpus, blocks, meta = _evaluation_corpus(cfg, task, retriever, index_dir)
    model = task.build_model(corpus)
    model_dir = model_dir or cfg.finetune.model_dir
    restored = load_finetuned(task, model, model_dir, check_index=retriever == "dense")
    examples, given, top_given, skipped = _blocks_given(cfg, retriever, examples, blocks)
    dataset = task.build_eval_inputs(examples, blocks, given, top_given, score_weights, aggregations, length_biases)
    metrics = evaluation.run_evaluation(task, model, dataset, total=len(examples), description=f"evaluate {retriever}",
                                        count=lambda batch: int(batch["index"].shape[0]))
    if skipped:
        metrics["skipped"] = skipped
    suffix = "" if retriever == "dense" else f"-{retriever}"
    predictions_path = predictions_path or os.path.join(model_dir, f"predictions-{split}{suffix}.jsonl")
    predictions = metrics.pop("predictions")
    evaluation.write_jsonl(predictions, predictions_path)
    reliability = _reliability_diagram(task.calibrator, predictions, _diagram_path(predictions_path), split)
    if target_precision is not None:
        metrics["abstention"] = _abstention(cfg, questions_path, model_dir, index_dir, retriever, target_precision,
                                            predictions)
    evaluation.write_scalars(metrics, os.path.join(model_dir, f"eval_{split}{suffix.replace('-', '_')}"),
                             int(restored.rsplit("-", 1)[1]) if restored else 0)
    metrics = {**metrics, "checkpoint": restored or "", "index_version": meta["version"], "retriever": retriever,
               "predictions": predictions_path, "reliability_diagram": reliability}
    if metrics_path:
        evaluation.write_metrics(metrics, metrics_path)
    return metrics


def _evaluation_corpus(cfg: config_lib.ExperimentConfig, task: OpenQaTask, retriever: str,
                       index_dir: str | None) -> tuple[knowledge_corpus.KnowledgeCorpus, Any, dict[str, Any]]:
    """``(corpus, blocks, index meta)`` of an evaluation: the newest index version's, or for ``gold`` the blocks
    alone (no index needed: the corpus embeddings are never searched)."""
    if retriever != "gold":
        return load_corpus(cfg, task.tokenizer, index_dir)
    blocks = block_store_lib.BlockStore.load(corpus_versions.current_pattern(cfg.data.blocks_dir))
    return knowledge_corpus.KnowledgeCorpus.without_index(blocks, task.tokenizer), blocks, {"version": None}


def _check_evaluation(retriever: str, target_precision: float | None) -> None:
    """A UserError for an unknown retriever or a target precision that is not a share."""
    if retriever not in RETRIEVERS:
        raise errors.UserError(f"unknown retriever {retriever!r}: one of {', '.join(RETRIEVERS)}")
    if target_precision is not None and not 0.0 < target_precision <= 1.0:
        raise errors.UserError(f"target precision {target_precision}: a share of right answers, in (0, 1]")


def _diagram_path(predictions_path: str) -> str:
    """The reliability diagram beside a predictions file, named after it: ``predictions-dev.jsonl`` →
    ``reliability-dev.png``, any other ``NAME.jsonl`` → ``NAME-reliability.png``."""
    directory, name = os.path.split(predictions_path)
    stem = name[:-len(".jsonl")] if name.endswith(".jsonl") else name
    diagram = "reliability" + stem[len("predictions"):] if stem.startswith("predictions") else stem + "-reliability"
    return os.path.join(directory or ".", diagram + ".png")


def _reliability_diagram(calibrator: answer_calibration.Calibrator, predictions: Sequence[Mapping[str, Any]],
                         path: str, split: str) -> str:
    """The reliability diagram of ``predictions``' confidence (and, when it is calibrated, of their span
    probability beside it) at ``path``."""
    correct = [p["exact_match"] for p in predictions]
    curves = {"span probability": ([p["score"] for p in predictions], correct)}
    if calibrator.calibrated:
        curves = {f"confidence ({calibrator.kind})": ([p["confidence"] for p in predictions], correct), **curves}
    return selective_qa.write_reliability_diagram(path, curves, f"{split}: {len(predictions)} questions")


def _abstention(cfg: config_lib.ExperimentConfig, questions_path: str, model_dir: str, index_dir: str | None,
                retriever: str, target_precision: float, predictions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The threshold chosen on the tune split for ``target_precision``, and what it does there and on
    ``predictions``."""
    suffix = "" if retriever == "dense" else f"-{retriever}"
    tune_path = os.path.join(model_dir, f"predictions-tune-for-threshold{suffix}.jsonl")
    tune = evaluate(cfg, questions_path, "tune", model_dir, index_dir, predictions_path=tune_path, retriever=retriever)
    tuned = answer_calibration.read_predictions(tune["predictions"])
    threshold = selective_qa.threshold_for_precision([p["confidence"] for p in tuned],
                                                     [p["exact_match"] for p in tuned], target_precision)
    return {"target_precision": target_precision,
            "tune": selective_qa.at_threshold([p["confidence"] for p in tuned], [p["exact_match"] for p in tuned],
                                              threshold),
            "evaluated": selective_qa.at_threshold([p["confidence"] for p in predictions],
                                                   [p["exact_match"] for p in predictions], threshold)}


def _blocks_given(cfg: config_lib.ExperimentConfig, retriever: str, examples: list[questions.QaExample],
                  blocks: block_store_lib.BlockStore) -> tuple[list[questions.QaExample], Any, Any, dict[str, int]]:
    """``(examples, blocks read, blocks ranked, skipped)`` of an evaluation whose blocks are not the model's own
    search: BM25's top blocks, or each question's gold block (questions without one skipped and counted);
    ``None`` for the dense retriever."""
    if retriever == "bm25":
        from realm_tf.index import bm25_retriever  # pylint: disable=import-outside-toplevel

        ranked, _ = bm25_retriever.Bm25Retriever(blocks.titles, blocks.texts).search(
            [e.question for e in examples], max(cfg.qa.eval_ks))  # [num_questions, max_k]
        return examples, ranked[:, :cfg.model.reader_beam_size], ranked, {}
    if retriever == "gold":
        reading = reading_sets.gold_only(examples, blocks)
        return reading.examples, reading.block_ids, reading.block_ids, reading.skipped
    return examples, None, None, {}


def export_for_serving(cfg: config_lib.ExperimentConfig, out: str | None = None, model_dir: str | None = None,
                       index_dir: str | None = None, base_path: str | None = None) -> str:
    """``realm-tf export``: the fine-tuned model over the newest index version (:func:`load_for_serving`) as the
    serving SavedModel ``out`` (``export/open_qa_export``), or as the next version under TF Serving's model
    ``base_path``, with the confidence calibrator of ``qa.confidence_calibrator`` in its graph; its blocks are
    read on demand from block records in its ``assets/``. The records are written
    beside ``out`` under a staging directory's name (removed by the next export to ``out`` if this process dies) and
    moved into the export. Returns the export's path."""
    if (out is None) == (base_path is None):
        raise errors.UserError("export: give one destination, out (one SavedModel) or base_path (its next version)")
    out = open_qa_export.check_destination(out or artifacts.next_version_dir(base_path, artifacts.OPEN_QA_EXPORT))
    records = os.path.join(os.path.dirname(out) or ".", artifacts.transient_name(artifacts.STAGING_PREFIX, out))
    try:
        task, model, info = load_for_serving(cfg, model_dir=model_dir, index_dir=index_dir, records_dir=records)
        calibrator = task.calibrator
        return open_qa_export.export_open_qa(
            cfg, model, out, info, calibration=calibrator.parameters if calibrator.calibrated else None,
            confidence=calibrator.record(cfg.qa.confidence_calibrator, info["corpus_version"]))
    finally:
        artifacts.remove_quietly(records)


def load_for_serving(cfg: config_lib.ExperimentConfig, model_dir: str | None = None, index_dir: str | None = None,
                     in_graph_scann: bool = True, records_dir: str | None = None
                     ) -> tuple[OpenQaTask, open_qa_model.OpenQaModel, dict[str, Any]]:
    """The fine-tuned Open-QA model (``finetune.model_dir``) over the newest index version, searching with
    ScaNN's TF op when that index is a ScaNN index (and ``in_graph_scann``); with ``records_dir`` its blocks are
    read on demand from block records written there (``open_qa_export.served_corpus``), else held in the
    graph."""
    task = OpenQaTask(cfg)
    if records_dir is not None:
        path, meta = index_publisher.newest_version(index_dir or cfg.index.index_dir, task.tokenizer.vocab_hash)
        pattern = corpus_versions.blocks_pattern(cfg.data.blocks_dir, index_publisher.corpus_version(meta))
        corpus = open_qa_export.served_corpus(records_dir, pattern, task.tokenizer, path, meta,
                                              in_graph_scann and meta.get("kind") == "scann")
    else:
        corpus, _, meta = load_corpus(cfg, task.tokenizer, index_dir)
        if in_graph_scann and meta.get("kind") == "scann":
            from realm_tf.index import in_graph_scann as scann_lib  # pylint: disable=import-outside-toplevel

            path = index_publisher.version_dir(index_dir or cfg.index.index_dir, meta["version"])
            corpus.use_searcher(scann_lib.InGraphScannSearcher(os.path.join(path, meta["searcher"])))
    model = task.build_model(corpus)
    model_dir = model_dir or cfg.finetune.model_dir
    checkpoint = load_finetuned(task, model, model_dir, check_index=corpus.embeddings is not None)
    if corpus.embeddings is None and not cfg.qa.recompute_doc_embeddings:
        check_index_matches(task, model, index_rows=index_publisher.map_embeddings(
            index_publisher.version_dir(index_dir or cfg.index.index_dir, meta["version"])))
    searcher = getattr(corpus, "searcher", None)
    return task, model, {"checkpoint": checkpoint or "", "index_version": meta["version"],
                         "searcher": "exact matmul" if searcher is None else "scann",
                         "corpus_storage": "records" if records_dir is not None else "graph",
                         "corpus_version": index_publisher.corpus_version(meta),
                         "export_step": index_publisher.export_step(meta)}
