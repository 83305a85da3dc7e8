"""SQuAD answer normalisation, shared by the answer-coverage benchmark and the Open-QA evaluator.

This is the normaliser of the official SQuAD v1.1 evaluation script, which REALM (Guu et al., 2020,
§4) and ORQA use for exact match on NaturalQuestions-Open, WebQuestions and CuratedTrec. The REALM
salient-span study (§3.4 "Salient span masking") is measured here against the same normalised answers.
It is kept byte-for-byte faithful to the official script: lower-case, drop ASCII punctuation
(``string.punctuation``; non-ASCII marks such as "–" or "’" are kept), drop the articles a/an/the as
whole words, and collapse whitespace.
"""
from __future__ import annotations

import re
import string

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (official SQuAD order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def f1_score(prediction: str, ground_truth: str) -> float:
    """SQuAD v1.1 token F1 (the official script): bag-of-tokens overlap of the normalised strings."""
    prediction_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(ground_truth).split()
    common: dict[str, int] = {}
    for token in prediction_tokens:
        common[token] = common.get(token, 0) + 1
    overlap = 0
    for token in truth_tokens:
        if common.get(token, 0) > 0:
            common[token] -= 1
            overlap += 1
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction_tokens)
    recall = overlap / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)
