"""Documents to score, from a file a user brings: JSONL (``{"text"[, "id", "title"]}`` per line, ``.gz`` too) or
plain text (documents separated by blank lines). Language models are measured on held-out documents (RETRO,
Borgeaud et al., 2021, §4; kNN-LM, Khandelwal et al., 2020, §3); these are held out by definition.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
from typing import Any, Iterable, Iterator

from realm_tf import errors


@dataclasses.dataclass(frozen=True)
class Document:
    """One document: ``id`` (the file's, or ``<file>:<first line>``), ``title`` (may be empty) and ``text``."""

    id: str
    title: str
    text: str


def read_documents(path: str) -> list[Document]:
    """Every document of ``path``; a malformed line is a UserError naming ``path:line``, an empty file one too."""
    opener = gzip.open if path.endswith(".gz") else open
    jsonl = path.removesuffix(".gz").endswith((".jsonl", ".json"))
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            documents = _from_jsonl(path, f) if jsonl else _from_text(path, f)
    except UnicodeDecodeError as e:
        raise errors.UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise errors.UserError(f"{path}: cannot read documents: {e.strerror or e}") from e
    if not documents:
        raise errors.UserError(f"{path}: no documents")
    return documents


def json_rows(path: str, lines: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """``(where, parsed value)`` of each non-blank line of a JSONL file (``where``: ``path:line``); a line that is
    not JSON is a UserError naming it."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise errors.UserError(f"{where}: not valid JSON: {e.msg}") from e


def _from_jsonl(path: str, lines: Iterable[str]) -> list[Document]:
    documents = []
    for where, row in json_rows(path, lines):
        text = row.get("text") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise errors.UserError(f"{where}: needs a non-empty string 'text'")
        title = row.get("title", "")
        if not isinstance(title, str):
            raise errors.UserError(f"{where}: 'title' must be a string")
        documents.append(Document(str(row.get("id", where)), title, text))
    return documents


def _from_text(path: str, lines: Iterable[str]) -> list[Document]:
    documents, paragraph, first = [], [], 0
    for number, line in enumerate(list(lines) + [""], 1):
        if line.strip():
            first = first or number
            paragraph.append(line.strip())
        elif paragraph:
            documents.append(Document(f"{path}:{first}", "", " ".join(paragraph)))
            paragraph, first = [], 0
    return documents
