"""Where Open-QA answers go wrong: every prediction in exactly one outcome.

An Open-QA answer (Guu et al., 2020, §4; Lee et al., 2019) fails in the retriever (no read block holds the
answer), in block choice (a read block holds it, the reader answered from another), or in the span (the right
block, the wrong words). Among the wrong span choices, three relations of the predicted string to a reference say
how it was wrong: too long (it contains a reference), too short (a reference contains it) and a partial overlap
(SQuAD token F1 > 0). Precedence, first match wins:

1. ``correct``: SQuAD exact match with a reference;
2. ``too_long``: a normalised reference occurs inside the normalised prediction, on token boundaries;
3. ``too_short``: the non-empty normalised prediction occurs inside a normalised reference;
4. ``partial_overlap``: the best SQuAD token F1 over the references is > 0;
5. ``answer_not_read``: no read block contains a reference (the retriever's miss);
6. ``right_block_wrong_span``: the block the answer was taken from contains a reference;
7. ``wrong_block``: another read block contains a reference, the reader chose a block that does not.

Outcomes 2-4 can come from any block: they say how close the words are, 5-7 where the reader looked.
The input is ``realm-tf evaluate``'s predictions: ``prediction``, ``answers``, ``predicted_block`` (the position
of the answer's block among the read ones) and ``read_blocks_with_answer`` (the positions that contain a
reference).
"""
from __future__ import annotations

import collections
import json
from typing import Any, Iterable, Mapping

from realm_tf import errors
from realm_tf.data import answer_normalization

OUTCOMES = ("correct", "too_long", "too_short", "partial_overlap", "answer_not_read", "right_block_wrong_span",
            "wrong_block")

DESCRIPTIONS = {
    "correct": "exact match",
    "too_long": "prediction contains the gold answer (too long)",
    "too_short": "gold answer contains the prediction (too short)",
    "partial_overlap": "partial overlap",
    "answer_not_read": "answer not in the read blocks",
    "right_block_wrong_span": "right block, wrong span",
    "wrong_block": "answer in another read block, wrong block chosen",
}

_REQUIRED = ("prediction", "answers", "predicted_block", "read_blocks_with_answer")


def outcome(prediction: Mapping[str, Any]) -> str:
    """The outcome (one of :data:`OUTCOMES`) of one prediction record."""
    predicted = answer_normalization.normalize_answer(prediction["prediction"])
    references = [answer_normalization.normalize_answer(a) for a in prediction["answers"]]
    references = [r for r in references if r]
    if any(predicted == r for r in references):
        return "correct"
    if predicted:
        if any(f" {r} " in f" {predicted} " for r in references):
            return "too_long"
        if any(f" {predicted} " in f" {r} " for r in references):
            return "too_short"
        if max((answer_normalization.f1_score(predicted, r) for r in references), default=0.0) > 0:
            return "partial_overlap"
    holding = set(prediction["read_blocks_with_answer"])
    if not holding:
        return "answer_not_read"
    if prediction["predicted_block"] in holding:
        return "right_block_wrong_span"
    return "wrong_block"


def count_outcomes(predictions: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """``{outcome: count}`` over every outcome of :data:`OUTCOMES` (zeros included)."""
    counts = collections.Counter(outcome(p) for p in predictions)
    return {name: counts.get(name, 0) for name in OUTCOMES}


def read_predictions(path: str) -> list[dict[str, Any]]:
    """The records of a predictions JSONL file; a malformed line is a UserError naming ``path:line``."""
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise errors.UserError(f"{path}:{number}: not valid JSON: {e.msg}") from e
                missing = [k for k in _REQUIRED if not isinstance(record, dict) or k not in record]
                if missing:
                    raise errors.UserError(f"{path}:{number}: a prediction needs {', '.join(missing)} "
                                           f"(write it with realm-tf evaluate)")
                records.append(record)
    except OSError as e:
        raise errors.UserError(f"{path}: cannot read predictions: {e.strerror or e}") from e
    return records


def format_table(counts: Mapping[str, int]) -> str:
    """The outcomes as a Markdown table: count and share of all questions."""
    total = sum(counts.values())
    lines = ["| outcome | questions | share of all |", "| --- | ---: | ---: |"]
    for name in OUTCOMES:
        share = counts.get(name, 0) / total if total else 0.0
        lines.append(f"| {DESCRIPTIONS[name]} | {counts.get(name, 0)} | {100 * share:.1f}% |")
    lines.append(f"| all | {total} | 100.0% |")
    return "\n".join(lines)
