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
