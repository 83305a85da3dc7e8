"""Open-QA questions: ``{question, answers[, id, gold_passage_ids]}`` JSON lines (Natural Questions, SQuAD, or any
file in that shape), read with errors that name the file and the line."""
from __future__ import annotations

import dataclasses
import gzip

from realm_tf import errors
from realm_tf.data import document_files


@dataclasses.dataclass(frozen=True)
class QaExample:
    """One question with its answers (and where it came from, for error messages and predictions)."""

    question: str
    answers: tuple[str, ...]
    id: str
    gold_passage_ids: tuple[str, ...] = ()


def read_questions(path: str) -> list[QaExample]:
    """Reads ``{question, answers[, id, gold_passage_ids]}`` lines (``.gz`` too); errors name file and line."""
    opener = gzip.open if path.endswith(".gz") else open
    examples = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for where, row in document_files.json_rows(path, f):
                question, answers = row.get("question") if isinstance(row, dict) else None, None
                if isinstance(row, dict):
                    answers = row.get("answers", row.get("answer"))
                if isinstance(answers, str):
                    answers = [answers]
                if not isinstance(question, str) or not question.strip():
                    raise errors.UserError(f"{where}: needs a non-empty string 'question'")
                if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
                    raise errors.UserError(f"{where}: needs 'answers', a list of strings")
                gold = row.get("gold_passage_ids") or ()
                line = where.rsplit(":", 1)[1]
                examples.append(QaExample(question.strip(), tuple(answers), str(row.get("id", f"line{line}")),
                                          tuple(str(g) for g in gold)))
    except OSError as e:
        raise errors.UserError(f"{path}: cannot read questions: {e.strerror or e}") from e
    if not examples:
        raise errors.UserError(f"{path}: no questions")
    return examples
