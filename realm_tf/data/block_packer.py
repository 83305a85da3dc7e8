"""Greedy packing of a document's sentences into REALM knowledge-corpus blocks.

REALM splits Wikipedia into "chunks of up to 288 BERT wordpieces" (Guu et al., 2020, §4.1), each read as
``[CLS] title [SEP] body [SEP]``. Sentences are packed greedily in order; a sentence that does not fit in
the space left starts the next block; a sentence longer than a whole block is cut at word boundaries
(at a wordpiece boundary only when one word alone is longer than a block). Nothing is dropped:
concatenating the bodies of a document's blocks gives back its wordpieces.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Segment:
    """Wordpieces ``[start, end)`` of sentence number ``sentence`` of the document."""

    sentence: int
    start: int
    end: int


class BlockPacker:
    """Packs sentences (as wordpiece counts) into blocks of at most ``max_block_length`` wordpieces.

    Args:
      max_block_length: the whole block including ``[CLS]``, ``[SEP]``, ``[SEP]`` (REALM: 288).
      max_title_length: titles longer than this are truncated so that every block keeps room for a body.
    """

    def __init__(self, max_block_length: int = 288, max_title_length: int = 64):
        if max_block_length < 8:
            raise ValueError(f"max_block_length={max_block_length} is too small for a block")
        self.max_block_length = max_block_length
        self.max_title_length = min(max_title_length, (max_block_length - 3) // 2)

    def title_length(self, title_length: int) -> int:
        """How many title wordpieces every block keeps."""
        return min(title_length, self.max_title_length)

    def body_budget(self, title_length: int) -> int:
        """Body wordpieces that fit in one block next to the (truncated) title."""
        return self.max_block_length - 3 - self.title_length(title_length)

    def pack(self, title_length: int, word_starts: Sequence[Sequence[bool]]) -> list[list[Segment]]:
        """Assigns every wordpiece of every sentence to exactly one block, in order.

        Args:
          title_length: number of wordpieces of the title.
          word_starts: per sentence, per wordpiece, whether it starts a word (is not a ``##`` piece).

        Returns:
          the blocks, each a list of :class:`Segment` whose total length is at most the body budget.
        """
        budget = self.body_budget(title_length)
        blocks: list[list[Segment]] = []
        current: list[Segment] = []
        used = 0
        for index, starts in enumerate(word_starts):
            length = len(starts)
            if length == 0:
                continue
            if used + length <= budget:
                current.append(Segment(index, 0, length))
                used += length
                continue
            if current:
                blocks.append(current)
                current, used = [], 0
            start = 0
            while length - start > budget:
                end = _cut_point(starts, start, start + budget)
                blocks.append([Segment(index, start, end)])
                start = end
            current.append(Segment(index, start, length))
            used = length - start
        if current:
            blocks.append(current)
        return blocks


def _cut_point(word_starts: Sequence[bool], start: int, limit: int) -> int:
    """The last word start in ``(start, limit]``, or ``limit`` when a single word fills the whole range."""
    for position in range(limit, start, -1):
        if position < len(word_starts) and word_starts[position]:
            return position
    return limit
