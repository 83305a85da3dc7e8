"""Which blocks the reader reads when they are not retrieved: gold blocks and hard negatives.

The reader warm start (:mod:`realm_tf.tasks.reader_warm_start`) reads each question's gold block (a block of a
gold passage that contains an answer, ORQA's "gold context", Lee et al., 2019, §9) next to negatives, and
``realm-tf evaluate --retriever gold`` measures the reader on gold blocks alone (reading comprehension, no
retrieval).
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

import numpy as np

from realm_tf import errors
from realm_tf.data import block_store as block_store_lib
from realm_tf.tasks import qa_metrics


class Question(Protocol):
    """What is read of a question (``questions.QaExample`` has it)."""

    question: str
    answers: tuple[str, ...]
    id: str
    gold_passage_ids: tuple[str, ...]


# BM25 candidates searched per question for negatives (those holding an answer or from a gold passage are
# skipped); random blocks without an answer fill in when these run out.
_NEGATIVE_POOL = 32


@dataclasses.dataclass(frozen=True)
class ReadingSet:
    """Questions with the blocks to read for each: ``block_ids`` ``int64[len(examples), k]``, the gold block
    first. ``skipped`` counts the questions left out, by reason (none is dropped silently)."""

    examples: list[Question]
    block_ids: np.ndarray
    skipped: dict[str, int]


def answer_blocks(examples: Sequence[Question], blocks: block_store_lib.BlockStore,
                  by_document: dict[str, list[int]] | None = None,
                  matcher: qa_metrics.AnswerMatcher | None = None) -> list[list[int]]:
    """Per question, the blocks of its gold passages whose text contains a (SQuAD-normalised) answer
    (``by_document`` / ``matcher``: the store's document index and answer matcher, when already built)."""
    by_document = blocks.blocks_of_documents() if by_document is None else by_document
    matcher = qa_metrics.AnswerMatcher(blocks.texts) if matcher is None else matcher
    out = []
    for example in examples:
        answers = qa_metrics.normalized_answers(example.answers)
        gold = [b for doc in example.gold_passage_ids for b in by_document.get(str(doc), [])]
        out.append([b for b in gold if answers and matcher.has_answer(b, answers)])
    return out


def gold_and_negatives(examples: Sequence[Question], blocks: block_store_lib.BlockStore,
                       num_negatives: int, seed: int = 0) -> ReadingSet:
    """Each question's first gold block holding an answer, then ``num_negatives`` blocks without one.

    Negatives are the BM25 top blocks (title + text) that contain no answer and are not from a gold passage:
    hard negatives, as a retriever would hand them to the reader.
    """
    if num_negatives < 0:
        raise ValueError(f"num_negatives={num_negatives} must be >= 0")
    by_document = blocks.blocks_of_documents()
    matcher = qa_metrics.AnswerMatcher(blocks.texts)  # caches each block's normalised text for both uses
    positives = answer_blocks(examples, blocks, by_document, matcher)
    skipped = {"no_gold_passage": 0, "no_answer_in_gold_blocks": 0}
    kept = []
    for example, found in zip(examples, positives):
        if not example.gold_passage_ids:
            skipped["no_gold_passage"] += 1
        elif not found:
            skipped["no_answer_in_gold_blocks"] += 1
        else:
            kept.append((example, found[0]))
    if not kept:
        raise errors.UserError("no question has a gold block holding its answer (needs gold_passage_ids that "
                               "name passages of the corpus in data.blocks_dir)")
    rows = np.zeros([len(kept), 1 + num_negatives], np.int64)
    rows[:, 0] = [gold for _, gold in kept]
    if num_negatives:
        from realm_tf.index import bm25_retriever  # pylint: disable=import-outside-toplevel

        ranked, _ = bm25_retriever.Bm25Retriever(blocks.titles, blocks.texts).search(
            [e.question for e, _ in kept], min(_NEGATIVE_POOL + num_negatives, len(blocks)))
        rng = np.random.default_rng(seed)
        for q, (example, _) in enumerate(kept):
            answers = qa_metrics.normalized_answers(example.answers)
            excluded = {b for doc in example.gold_passage_ids for b in by_document.get(str(doc), [])}
            negatives = [int(b) for b in ranked[q] if b not in excluded and not matcher.has_answer(int(b), answers)]
            tries = 0
            while len(negatives) < num_negatives and tries < 100 * num_negatives:
                tries += 1
                b = int(rng.integers(len(blocks)))
                if b not in excluded and b not in negatives and not matcher.has_answer(b, answers):
                    negatives.append(b)
            if len(negatives) < num_negatives:
                raise errors.UserError(f"{blocks.source}: too few blocks without the answer of question "
                                       f"{example.id!r} for {num_negatives} negatives")
            rows[q, 1:] = negatives[:num_negatives]
    return ReadingSet([e for e, _ in kept], rows, skipped)


def gold_only(examples: Sequence[Question], blocks: block_store_lib.BlockStore) -> ReadingSet:
    """Each question with its first gold block holding an answer alone (``block_ids`` ``[n, 1]``): the reader
    measured on reading comprehension, without retrieval."""
    return gold_and_negatives(examples, blocks, 0)
