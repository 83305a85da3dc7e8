"""Answer spans in a retrieved block, for Open-QA reader supervision (Lee et al., 2019, §4; Guu et al., 2020, §3.2).

ORQA and REALM fine-tune the reader on the spans of the top-k blocks whose text is an answer string:
p(y | z, x) sums over the spans ``s`` of block z with TEXT(s) = y. Like ORQA, answers are matched on
wordpieces: an answer occurs where its wordpiece ids are a contiguous subsequence of the block's, and it is
only a candidate if it is at most ``max_span_width`` wordpieces long (the reader never scores longer spans).

This module also owns the span enumeration shared with :class:`realm_tf.models.span_reader.SpanReader`:
span ``i`` of a sequence of ``seq_len`` wordpieces starts at ``i // max_span_width`` and is
``i % max_span_width + 1`` wordpieces long, so there are ``seq_len * max_span_width`` candidate spans
(see :func:`span_index` / :func:`span_bounds`; both work on Python ints, numpy arrays and TF tensors).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def num_spans(seq_len: int, max_span_width: int) -> int:
    """How many (start, width) candidates the reader enumerates over ``seq_len`` wordpieces."""
    return seq_len * max_span_width


def span_index(start: Any, end: Any, max_span_width: int) -> Any:
    """The enumeration index of the inclusive span ``[start, end]`` (requires ``end - start < max_span_width``)."""
    return start * max_span_width + (end - start)


def span_bounds(index: Any, max_span_width: int) -> tuple[Any, Any]:
    """``(start, end)`` (inclusive) of enumeration index ``index``; the inverse of :func:`span_index`.

    ``end`` may be ``>= seq_len`` for spans that run off the sequence: the reader masks those.
    """
    start = index // max_span_width
    return start, start + index % max_span_width


def find_answer_spans(block_ids: Sequence[int], answers_ids: Sequence[Sequence[int]], max_span_width: int,
                      is_continuation: Sequence[bool] | None = None) -> list[tuple[int, int]]:
    """Every occurrence of a tokenized answer in a block, as sorted, unique inclusive ``(start, end)`` pairs.

    Args:
      block_ids: the block's wordpiece ids.
      answers_ids: each answer's wordpiece ids (tokenized on its own); empty answers and answers longer than
        ``max_span_width`` wordpieces never match.
      max_span_width: the reader's longest span, in wordpieces.
      is_continuation: optional, one flag per entry of ``block_ids``: True for a ``##`` continuation piece.
        When given, a match must lie on word boundaries: it is rejected if it starts on a continuation piece
        or if the wordpiece right after it is one (the match would end inside a word: "Russell" in
        "Russell ##ville"). An answer tokenized on its own starts with a word-initial piece, so with exact id
        matching it can only start mid-word if its own first piece is a ``##`` piece; such a match is kept
        without ``is_continuation`` and rejected with it.

    Returns:
      ``[(start, end), ...]`` indices into ``block_ids``, sorted, without duplicates (answers that are equal
      or overlap may produce the same span once).
    """
    block = list(block_ids)
    if is_continuation is not None and len(is_continuation) != len(block):
        raise ValueError(f"is_continuation has {len(is_continuation)} flags for {len(block)} block wordpieces")
    spans: set[tuple[int, int]] = set()
    for answer in answers_ids:
        answer = list(answer)
        width = len(answer)
        if not 0 < width <= max_span_width:
            continue
        for start in range(len(block) - width + 1):
            if block[start:start + width] != answer:
                continue
            end = start + width - 1
            if is_continuation is not None and (
                    is_continuation[start] or (end + 1 < len(block) and is_continuation[end + 1])):
                continue
            spans.add((start, end))
    return sorted(spans)


def answer_span_mask(reader_word_ids: np.ndarray, reader_type_ids: np.ndarray,
                     answers_ids: Sequence[Sequence[int]], max_span_width: int,
                     is_continuation_table: np.ndarray | None = None) -> np.ndarray:
    """Marks the reader's candidate spans whose wordpieces are an answer, block by block.

    Args:
      reader_word_ids: ``int[k, seq_len]`` join_BERT(question, title [SEP] body) per block.
      reader_type_ids: ``int[k, seq_len]`` its segment ids; the block segment is the contiguous run of type id
        1, whose last wordpiece (the final [SEP]) is excluded, as in ``SpanReader``'s ``span_mask``.
      answers_ids: each answer's wordpiece ids.
      max_span_width: the reader's longest span, in wordpieces.
      is_continuation_table: optional ``bool[vocab_size]`` (``bert_tokenizer.continuation_table``); when given, matches
        inside a word are rejected (see :func:`find_answer_spans`).

    Returns:
      ``bool[k, seq_len * max_span_width]``, laid out like ``SpanReader``'s outputs (:func:`span_index`):
      True at the spans of every answer occurrence, always a subset of the reader's valid spans.
    """
    word_ids = np.asarray(reader_word_ids)  # [k, seq_len]
    type_ids = np.asarray(reader_type_ids)  # [k, seq_len]
    if word_ids.ndim != 2 or word_ids.shape != type_ids.shape:
        raise ValueError(f"expected word and type ids of one shape [k, seq_len], got {word_ids.shape} "
                         f"and {type_ids.shape}")
    k, seq_len = word_ids.shape
    mask = np.zeros([k, num_spans(seq_len, max_span_width)], dtype=bool)  # [k, num_spans]
    for row in range(k):
        segment = np.flatnonzero(type_ids[row] == 1)  # [segment_len] positions of "title [SEP] body [SEP]"
        if segment.size == 0:
            continue
        first, last = int(segment[0]), int(segment[-1])
        if last - first + 1 != segment.size:
            raise ValueError(f"row {row}: the type-id-1 segment is not contiguous")
        block = word_ids[row, first:last]  # [block_len] the final [SEP] (position `last`) is not part of it
        flags = None if is_continuation_table is None else np.asarray(is_continuation_table)[block]
        for start, end in find_answer_spans(block.tolist(), answers_ids, max_span_width, flags):
            mask[row, span_index(first + start, first + end, max_span_width)] = True
    return mask
