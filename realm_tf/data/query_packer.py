"""Cutting a knowledge-corpus block into pre-training queries x of consecutive whole sentences.

REALM pre-trains on queries x of up to 96 wordpieces (``[CLS] x [SEP]``, Guu et al., 2020, §4.1 and
Appendix A) taken from the same Wikipedia text as the knowledge corpus; the block a query came from is
remembered so that retrieving it can be excluded as trivial (§3.4, "Exclude trivial retrievals").
Consecutive sentences are packed greedily while they fit in ``max_length`` wordpieces; a sentence longer
than that on its own becomes one query truncated at a word boundary (the rest of that sentence is dropped
and the query is flagged ``truncated``, so the job can count it).
"""
from __future__ import annotations

from typing import Sequence

from realm_tf.data import tokenized_text


class QueryPacker:
    """Packs the sentences of a tokenized text into queries of at most ``max_length`` wordpieces.

    Args:
      max_length: wordpieces of a query without ``[CLS]``/``[SEP]`` (REALM: 96 - 2 = 94).
    """

    def __init__(self, max_length: int) -> None:
        if max_length < 1:
            raise ValueError(f"max_length={max_length} must be positive")
        self.max_length = max_length

    def pack(self, text: tokenized_text.TokenizedText,
             sentence_spans: Sequence[tuple[int, int]]) -> list[tuple[tokenized_text.TokenizedText, bool]]:
        """Returns the queries of ``text`` in order, each ``(query, truncated)``.

        Args:
          text: the tokenized block body.
          sentence_spans: its sentences as character spans (``SentenceSplitter().split(text.text)``).

        Returns:
          ``(query, truncated)`` pairs: ``query`` is ``text.slice(...)`` of whole consecutive sentences
          (its ``.text`` is the query text, offsets rebased onto it); ``truncated`` is True when the query is
          the head of one over-long sentence. Sentences without wordpieces are skipped.
        """
        queries: list[tuple[tokenized_text.TokenizedText, bool]] = []
        group_first = group_end = 0
        for first, end in text.sentence_ranges(sentence_spans):
            length = end - first
            if length == 0:
                continue
            if group_end > group_first and end - group_first <= self.max_length:
                group_end = end  # The sentence joins the current group.
                continue
            if group_end > group_first:
                queries.append((text.slice(group_first, group_end), False))
            if length <= self.max_length:
                group_first, group_end = first, end
            else:
                cut = text.cut_point(first, first + self.max_length)
                queries.append((text.slice(first, cut), True))
                group_first = group_end = end
        if group_end > group_first:
            queries.append((text.slice(group_first, group_end), False))
        return queries
