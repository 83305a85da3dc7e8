"""The metrics of Open-QA: exact match, F1 and regex match of an answer (SQuAD, Rajpurkar et al. 2016; CuratedTREC's
patterns), and of retrieval, accuracy@k and gold-block recall@k.

Following ORQA/REALM (Lee et al., 2019; Guu et al., 2020, §4.4 "retrieval recall"), a retrieval is
correct at k when any of the top-k blocks contains a (normalised) answer string; with gold passages
available, gold recall@k is the fraction of questions whose top-k holds a block cut from a gold passage.
Containment is on SQuAD-normalised *tokens*, so "1973" does not match inside "19730".
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

from realm_tf.data import answer_normalization

DEFAULT_KS = (1, 5, 20, 100)


def normalized_answers(answers: Iterable[str]) -> list[str]:
    """Answers as `` token token `` strings (space-delimited on both sides), empty ones dropped."""
    out = []
    for answer in answers:
        norm = answer_normalization.normalize_answer(answer)
        if norm:
            out.append(f" {norm} ")
    return out


class AnswerMatcher:
    """Tells whether a block's text contains any answer, caching each block's normalised text."""

    def __init__(self, block_texts: Sequence[str]):
        self._texts = block_texts
        self._normalized: dict[int, str] = {}

    def normalized(self, row: int) -> str:
        if row not in self._normalized:
            self._normalized[row] = f" {answer_normalization.normalize_answer(self._texts[row])} "
        return self._normalized[row]

    def has_answer(self, row: int, answers: Sequence[str]) -> bool:
        """``answers`` as returned by :func:`normalized_answers`."""
        text = self.normalized(row)
        return any(a in text for a in answers)


def qa_metrics(retrieved: np.ndarray, matcher: AnswerMatcher, answers: Sequence[Sequence[str]],
                      block_doc_ids: Sequence[str] | None = None,
                      gold_doc_ids: Sequence[Sequence[str]] | None = None,
                      ks: Sequence[int] = DEFAULT_KS) -> dict[str, float]:
    """accuracy@k (and gold_recall@k when gold ids are given) over questions.

    Args:
      retrieved: ``int [num_questions, max_k]`` block rows, best first (``-1`` pads a short list).
      matcher: answer containment over the block texts.
      answers: per question, the raw answer strings.
      block_doc_ids: per block row, the id of the passage it was cut from.
      gold_doc_ids: per question, the ids of its gold passages.
    """
    num_questions = retrieved.shape[0]
    if num_questions == 0:
        raise ValueError("no questions to evaluate")
    hit_at = np.full(num_questions, np.inf)  # rank (1-based) of the first block with an answer
    gold_at = np.full(num_questions, np.inf)
    for q in range(num_questions):
        norm = normalized_answers(answers[q])
        gold = {str(g) for g in gold_doc_ids[q]} if gold_doc_ids is not None else set()
        for rank, row in enumerate(retrieved[q], 1):
            if row < 0:
                break
            if np.isinf(hit_at[q]) and norm and matcher.has_answer(int(row), norm):
                hit_at[q] = rank
            if np.isinf(gold_at[q]) and gold and block_doc_ids is not None and str(block_doc_ids[row]) in gold:
                gold_at[q] = rank
            if not np.isinf(hit_at[q]) and (not gold or not np.isinf(gold_at[q])):
                break
    metrics = {"num_questions": float(num_questions)}
    for k in ks:
        metrics[f"accuracy@{k}"] = float(np.mean(hit_at <= k))
        if gold_doc_ids is not None:
            metrics[f"gold_recall@{k}"] = float(np.mean(gold_at <= k))
    return metrics


#: NQ-open's longest answer: ORQA (Lee et al., 2019) built NQ-open from the Natural Questions short answers of at most
#: five NQ tokens, each a reference of its own, and left out the questions without one.
NQ_OPEN_ANSWER_TOKENS = 5


def short_answers(answers: Iterable[str], max_tokens: int = NQ_OPEN_ANSWER_TOKENS) -> list[str]:
    """The answers of at most ``max_tokens`` whitespace-separated tokens (Natural Questions' answer strings are its
    tokens joined by spaces, so this is ORQA's NQ-open filter on them)."""
    return [a for a in answers if 0 < len(a.split()) <= max_tokens]


def short_answer_scores(predictions: Sequence[dict], max_tokens: int = NQ_OPEN_ANSWER_TOKENS) -> dict[str, float]:
    """EM and F1 as NQ-open defines its questions: only the questions with an answer of at most ``max_tokens``
    tokens, each scored against those answers alone (``predictions``: records with ``prediction`` and
    ``answers``). Returns ``num_questions`` (0 when no question has one), ``exact_match``, ``f1``, ``max_tokens``."""
    kept = [(p["prediction"], short_answers(p["answers"], max_tokens)) for p in predictions]
    kept = [(prediction, answers) for prediction, answers in kept if answers]
    n = len(kept)
    return {"max_tokens": max_tokens, "num_questions": n,
            "exact_match": sum(exact_match(p, a) for p, a in kept) / n if n else 0.0,
            "f1": sum(f1(p, a) for p, a in kept) / n if n else 0.0}


def f1(prediction: str, answers: Iterable[str]) -> float:
    """SQuAD token F1, the best over the answers."""
    return max((answer_normalization.f1_score(prediction, a) for a in answers), default=0.0)


def exact_match(prediction: str, answers: Iterable[str]) -> bool:
    """SQuAD exact match: equal after ``normalize_answer``, against any answer. A reference that normalises to
    nothing (empty, or only punctuation and articles) is no answer: a prediction of "the" does not match it."""
    norm = answer_normalization.normalize_answer(prediction)
    references = (answer_normalization.normalize_answer(a) for a in answers)
    return any(norm == r for r in references if r)


def regex_match(prediction: str, patterns: Iterable[str]) -> bool:
    """CuratedTREC-style match: an answer is a regular expression matched at the start, case-insensitively
    (a pattern that is not a valid regex is matched literally)."""
    for pattern in patterns:
        try:
            compiled = re.compile(pattern, flags=re.IGNORECASE | re.UNICODE | re.MULTILINE)
        except re.error:
            compiled = re.compile(re.escape(pattern), flags=re.IGNORECASE)
        if compiled.match(prediction) is not None:
            return True
    return False
