"""The reader warm start: extractive reading on gold blocks before Open-QA fine-tuning.

REALM (Guu et al., 2020, §4) and ORQA (Lee et al., 2019, §5) fine-tune a reader whose BERT has already learned
to read: BERT-base, or REALM's knowledge-augmented encoder after 200k steps of pre-training. A small sentence
embedder imported as the reader (all-MiniLM-L6-v2 here) has never extracted a span, and Open-QA fine-tuning
reads k = 5 blocks per question, so teaching it to read there costs five block readings per question. This
stage teaches it first, on reading-comprehension pairs: each question's **gold block** (a block of a gold
passage that contains an answer) read next to ``qa.reader_negatives`` **negative blocks** (BM25's best-ranked
blocks that hold no answer), with ORQA's reader loss over all spans of all of them (no retrieval score), so the
reader learns to prefer the block that answers as well as the span within it:

    L = −log Σ_{(z, s): TEXT(s) = answer} exp S_read(z, s) + log Σ_{(z, s)} exp S_read(z, s)

The checkpoint holds the whole span reader (BERT and span MLP); ``qa.reader_checkpoint`` starts Open-QA
fine-tuning from it. The dev and tune splits of every question file are never read here.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.core import experiment
from realm_tf.core import training_loop
from realm_tf.data import block_store as block_store_lib
from realm_tf.data import corpus_versions
from realm_tf.data import knowledge_corpus
from realm_tf.data import questions
from realm_tf.models import open_qa_model
from realm_tf.tasks import open_qa
from realm_tf.tasks import reading_sets
from realm_tf.tasks import reading_windows

logger = logging.getLogger(__name__)

def read_training_questions(cfg: config_lib.ExperimentConfig,
                            paths: Sequence[str]) -> list[questions.QaExample]:
    """The train split (neither dev nor tune) of every question file, with only the answers of at most
    ``qa.train_max_answer_tokens`` tokens when it is set (:func:`open_qa.with_short_answers`)."""
    examples: list[questions.QaExample] = []
    for path in paths:
        train, _ = open_qa.split_questions(questions.read_questions(path), cfg.data.qa_dev_fraction,
                                           cfg.data.qa_tune_fraction)
        train, left_out = open_qa.with_short_answers(train, cfg.qa.train_max_answer_tokens)
        if left_out:
            logger.info("train-reader: %s: %d training questions left out, no answer of at most %d tokens", path,
                        left_out, cfg.qa.train_max_answer_tokens)
        examples += train
    return examples


class ReaderWarmStartTask(open_qa.OpenQaTask):
    """The span reader alone on gold + negative blocks (trainer section ``reader``).

    Args:
      question_paths: {question, answers, gold_passage_ids} JSONL files (default ``qa.reader_questions``).
    """

    trainer_section = "reader"
    best_metric = ("exact_match", "max")  # train-and-eval (reader.eval_every_steps): gold-block exact match

    def __init__(self, cfg: config_lib.ExperimentConfig, question_paths: Sequence[str] = ()):
        super().__init__(cfg)
        self.question_paths = list(question_paths) or list(cfg.qa.reader_questions)
        self.sources = np.zeros([0], np.int64)  # [num_questions]: the file of each training question
        self._windows: np.ndarray | None = None  # [num_questions, 1 + negatives, 2]
        if not self.question_paths:
            raise errors.UserError("train-reader needs question files (--questions or qa.reader_questions)")

    @property
    def reader_only(self) -> bool:
        return True

    def block_store(self) -> block_store_lib.BlockStore:
        """The current corpus version's blocks, read once."""
        if self.blocks is None:
            self.blocks = block_store_lib.BlockStore.load(corpus_versions.current_pattern(self.cfg.data.blocks_dir))
        return self.blocks

    def load_corpus(self) -> knowledge_corpus.KnowledgeCorpus:
        """The blocks without an index: the reader reads the blocks it is given, nothing is searched."""
        return knowledge_corpus.KnowledgeCorpus.without_index(self.block_store(), self.tokenizer)

    def checkpoint_items(self, model: open_qa_model.OpenQaModel) -> dict[str, tf.Module]:
        return {"reader": model.reader}

    def training_set(self) -> tuple[list[questions.QaExample], np.ndarray | None, dict[str, Any]]:
        if self._training_set is None:
            blocks = self.block_store()
            examples, source_of = [], {}
            for number, path in enumerate(self.question_paths):
                from_file = read_training_questions(self.cfg, [path])
                source_of.update((id(e), number) for e in from_file)
                examples += from_file
            reading = reading_sets.gold_and_negatives(examples, blocks, self.cfg.qa.reader_negatives,
                                                      seed=self.cfg.reader.seed)
            self.sources = np.array([source_of[id(e)] for e in reading.examples], np.int64)  # [num_questions]
            self._training_set = (reading.examples, reading.block_ids,
                                  {"num_questions": len(reading.examples), "skipped": reading.skipped,
                                   "questions_per_file": np.bincount(self.sources, minlength=len(
                                       self.question_paths)).tolist()})
        return self._training_set

    def block_windows(self) -> np.ndarray | None:
        """``int64[num_questions, 1 + negatives, 2]``: the body window each training block is read through
        (``qa.reader_window`` wordpieces, :mod:`realm_tf.tasks.reading_windows`), or None (0: whole blocks)."""
        length = self.cfg.qa.reader_window
        if length <= 0:
            return None
        if self._windows is None:
            examples, block_ids, _ = self.training_set()
            blocks, width = self.block_store(), self.cfg.model.max_span_width
            answers = [list(e.answers[:self.cfg.qa.max_answers]) for e in examples]
            flat = [a for row in answers for a in row]
            pieces = self.tokenizer(tf.constant(flat or [""])).to_list() if flat else []  # [num_answers, (len)]
            per_question, at = [], 0
            for row in answers:
                per_question.append([np.asarray(p, np.int32) for p in pieces[at:at + len(row)] if len(p) <= width])
                at += len(row)
            self._windows, counts = reading_windows.choose_windows(block_ids, blocks.body_ids, per_question, length,
                                                                   seed=self.cfg.reader.seed)
            logger.info("train-reader: each block read through a window of %d body wordpieces: %s", length, counts)
        return self._windows

    def file_shares(self) -> np.ndarray:
        """``float[len(question_paths)]``: the probability that the next question comes from each file, ∝ n_i^T
        (``qa.reader_source_temperature``; T = 1: each file's share of the pool, a file without questions 0)."""
        temperature = self.cfg.qa.reader_source_temperature
        if not temperature > 0:
            raise errors.UserError(f"qa.reader_source_temperature={temperature} must be > 0")
        weights = np.asarray(self.training_set()[2]["questions_per_file"], np.float64) ** temperature
        return weights / weights.sum()

    def mixture(self) -> list[tuple[np.ndarray, float]] | None:
        """The question files as groups drawn by :meth:`file_shares` in ``build_inputs``, or None for one shuffled
        pool (T = 1, or a single file with questions)."""
        shares = self.file_shares()
        if self.cfg.qa.reader_source_temperature == 1.0 or np.count_nonzero(shares) < 2:
            return None
        return [(np.flatnonzero(self.sources == i), share) for i, share in enumerate(shares) if share > 0]

    def eval_inputs(self) -> tf.data.Dataset | None:
        """Train-and-eval: the tune split of ``qa.reader_eval_questions`` (none when unset), each question read on
        its gold block alone (reading comprehension, as ``realm-tf evaluate --retriever gold``), the first
        ``reader.eval_examples`` of them."""
        path = self.cfg.qa.reader_eval_questions
        if not path:
            return None
        blocks = self.block_store()
        reading = reading_sets.gold_only(open_qa.select_split(questions.read_questions(path), "tune", self.cfg.data),
                                         blocks)
        if not reading.examples:
            raise errors.UserError(f"qa.reader_eval_questions={path}: no tune question has a gold block in "
                                   f"{self.cfg.data.blocks_dir}")
        n = min(len(reading.examples), self.cfg.reader.eval_examples)
        logger.info("train-reader: scoring %d tune questions of %s on their gold blocks every %d steps", n, path,
                    self.cfg.reader.eval_every_steps)
        return self.build_eval_inputs(reading.examples[:n], blocks, reading.block_ids[:n], reading.block_ids[:n])

    def initialize(self, model: open_qa_model.OpenQaModel, loop: training_loop.TrainingLoop) -> None:
        _, _, facts = self.training_set()
        logger.info("train-reader: %d questions from %d file(s), each read with its gold block and %d negatives; "
                    "skipped: %s", facts["num_questions"], len(self.question_paths), self.cfg.qa.reader_negatives,
                    facts["skipped"])
        for path, count, share in zip(self.question_paths, facts["questions_per_file"], self.file_shares()):
            logger.info("train-reader: %s: %d questions, drawn with probability %.3f", path, count, share)


def train_reader(cfg: config_lib.ExperimentConfig, question_paths: Sequence[str] = ()) -> dict[str, Any]:
    """``realm-tf train-reader``: trains the span reader on gold + negative blocks for ``reader.steps``
    resumes from ``reader.model_dir``."""
    return experiment.run_experiment(ReaderWarmStartTask(cfg, question_paths))
