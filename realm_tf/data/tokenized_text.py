"""A text with its WordPiece ids and per-wordpiece *character* offsets, for span-level data preparation.

REALM's salient span masking (Guu et al., 2020, §3.4) finds spans as character ranges of the text (sentence
splitter, salient span annotator) but masks *wordpieces*. ``BertTokenizer.tokenize_with_offsets`` reports
UTF-8 **byte** offsets; this module converts them to character offsets once, so that every later step
(grouping sentences into queries, mapping a salient span onto the wordpieces it overlaps, removing a
sentence from an Inverse Cloze Task context) works in one coordinate system: Python string indices.

Unicode normalisation can make several wordpieces share one character range ("…" becomes ``. . .``, the
first two with an empty range); :meth:`TokenizedText.pieces_overlapping` treats an empty range as the
point at its start.
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Callable, Sequence

import tensorflow as tf

from realm_tf.layers import bert_tokenizer


@dataclasses.dataclass(frozen=True)
class TokenizedText:
    """``text`` and its wordpieces; piece ``i`` is ``text[starts[i]:ends[i]]`` (before normalisation).

    Attributes:
      text: the (sub)text the offsets refer to.
      ids: wordpiece ids, no special tokens.                     # int[num_pieces]
      starts: character offset of the first character of piece i.  # int[num_pieces]
      ends: character offset one past its last character.          # int[num_pieces]
      continuation: whether piece i is a ``##`` suffix piece.      # bool[num_pieces]
    """

    text: str
    ids: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    continuation: tuple[bool, ...]

    def __post_init__(self) -> None:
        n = len(self.ids)
        if not len(self.starts) == len(self.ends) == len(self.continuation) == n:
            raise ValueError("ids, starts, ends and continuation must have the same length")

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_batch(cls, tokenizer: bert_tokenizer.BertTokenizer, texts: Sequence[str],
                   continuation_table: Sequence[bool] | None = None) -> list["TokenizedText"]:
        """Tokenizes ``texts`` in one call of a ``BertTokenizer`` (eager) and converts offsets to characters.

        Args:
          tokenizer: a ``realm_tf.layers.bert_tokenizer.BertTokenizer``.
          texts: the texts to tokenize.
          continuation_table: ``bert_tokenizer.continuation_table(tokenizer.vocab)``, computed once by callers that
            tokenize many batches; computed here when None.
        """
        if not texts:
            return []
        table = continuation_table if continuation_table is not None else bert_tokenizer.continuation_table(
            tokenizer.vocab)
        tokenize = bert_tokenizer.traced_tokenize_with_offsets(tokenizer)
        ids, starts, ends = tokenize(tf.constant(list(texts)))  # each [batch, (pieces)]
        out = []
        for text, row_ids, row_starts, row_ends in zip(texts, ids.to_list(), starts.to_list(), ends.to_list()):
            to_char = byte_to_char(text)
            out.append(cls(
                text=text,
                ids=tuple(row_ids),
                starts=tuple(to_char(b) for b in row_starts) if to_char else tuple(row_starts),
                ends=tuple(to_char(b) for b in row_ends) if to_char else tuple(row_ends),
                continuation=tuple(bool(table[i]) for i in row_ids),
            ))
        return out

    def slice(self, first: int, end: int) -> "TokenizedText":
        """Pieces ``[first, end)`` as a new TokenizedText whose text runs from the first piece to the last.

        Offsets are rebased onto the new text. An empty slice has empty text.
        """
        if not 0 <= first <= end <= len(self):
            raise ValueError(f"slice [{first}, {end}) out of range for {len(self)} pieces")
        if first == end:
            return TokenizedText("", (), (), (), ())
        base = self.starts[first]
        stop = max(self.ends[first:end])
        return TokenizedText(
            text=self.text[base:stop],
            ids=self.ids[first:end],
            starts=tuple(s - base for s in self.starts[first:end]),
            ends=tuple(e - base for e in self.ends[first:end]),
            continuation=self.continuation[first:end],
        )

    def pieces_overlapping(self, start: int, end: int) -> range:
        """The pieces sharing at least one character with ``text[start:end]`` (a contiguous range)."""
        hits = [i for i in range(len(self))
                if self.starts[i] < end and max(self.ends[i], self.starts[i] + 1) > start]
        return range(hits[0], hits[-1] + 1) if hits else range(0)

    def sentence_ranges(self, sentence_spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Piece ranges ``[first, end)`` of each character span (e.g. the sentences of ``text``).

        A piece belongs to the span its first character falls in (spans sorted and disjoint; pieces before
        the first span go to it). Spans without pieces get an empty range at the right place, so the
        ranges tile ``[0, len(self))`` in order.
        """
        span_starts = [s for s, _ in sentence_spans]
        owner = [max(bisect.bisect_right(span_starts, s) - 1, 0) for s in self.starts]
        ranges = []
        position = 0
        for index in range(len(sentence_spans)):
            first = position
            while position < len(owner) and owner[position] == index:
                position += 1
            ranges.append((first, position))
        return ranges

    def word_start(self, i: int) -> bool:
        """Whether piece ``i`` starts a whitespace-delimited word (a gap, or nothing, precedes it)."""
        return i == 0 or self.starts[i] > self.ends[i - 1]

    def cut_point(self, start: int, limit: int) -> int:
        """Where to cut pieces ``[start, ...)`` so that at most ``limit - start`` remain, at a word boundary.

        The last whitespace word start in ``(start, limit]``; else the last non-``##`` piece there (inside
        "U.S.-based"); else ``limit`` (one word longer than the whole budget).
        """
        limit = min(limit, len(self))
        if limit >= len(self):
            return len(self)
        for boundary in (self.word_start, lambda i: not self.continuation[i]):
            for position in range(limit, start, -1):
                if boundary(position):
                    return position
        return limit

    def words(self) -> list[range]:
        """BERT whole words: a non-``##`` piece with the ``##`` pieces that follow it."""
        groups: list[range] = []
        first = 0
        for i in range(1, len(self) + 1):
            if i == len(self) or not self.continuation[i]:
                groups.append(range(first, i))
                first = i
        return groups if len(self) else []


def byte_to_char(text: str) -> Callable[[int], int] | None:
    """A function mapping UTF-8 byte offsets of ``text`` to character offsets (None when text is ASCII)."""
    if text.isascii():
        return None
    char_of_byte = []
    for index, ch in enumerate(text):
        char_of_byte.extend([index] * len(ch.encode("utf-8")))
    char_of_byte.append(len(text))

    def convert(offset: int) -> int:
        return char_of_byte[min(max(offset, 0), len(char_of_byte) - 1)]

    return convert
