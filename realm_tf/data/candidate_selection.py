"""Candidate documents for a batch of REALM pre-training queries (Guu et al., 2020, §3.4).

Two of REALM's pre-training strategies act here, between the MIPS search and the model:

* **Null document**: candidate 0 is always ∅ (block id ``NULL_BLOCK``), "a consistent sink when no retrieval is
  necessary"; the model reads it as an empty block.
* **Exclude trivial retrievals**: the block the masked sentence x was taken from would let the reader copy the
  answer, so every block with the query's source uid is dropped from its candidates, even when it ranks first.
  The paper's reason is the retriever ("learning to look for exact string matches"); a caller that trains the
  reader alone may keep the source block for chosen queries where the search ranked it (``keep_source``), or
  force it into their candidates (``force_blocks``), as a copying control.

The search itself is given as a function (e.g. ``IndexLoader.search_batched``), so the same code serves the
tf.data pipeline, tests with a brute-force index, and any other MIPS.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

NULL_BLOCK = -1

#: ``search(queries [batch, dim], k) -> (rows int [batch, k], scores [batch, k], version)``.
SearchFn = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray, int]]


class CandidateSelector:
    """Top-k candidates per query: the null document, then the best blocks not from the query's source.

    Args:
      search: the MIPS search (see ``SearchFn``).
      block_uids: uid of every block, indexed by block id (row of the index).
      num_candidates: k including the null document (REALM: 8).
      search_margin: extra neighbours fetched so that exclusions still leave k - 1 blocks; the search is
        repeated with a larger k when a query loses more than that.
    """

    def __init__(self, search: SearchFn, block_uids: Sequence[str], num_candidates: int, search_margin: int = 4):
        if num_candidates < 2:
            raise ValueError(f"num_candidates={num_candidates}: need the null document and at least one block")
        self._search = search
        self._uids = np.asarray(block_uids, dtype=object)
        self._num_candidates = num_candidates
        self._margin = search_margin

    def select(self, query_embeddings: np.ndarray, source_uids: Sequence[str],
               keep_source: Sequence[bool] | None = None,
               force_blocks: Sequence[int] | None = None) -> tuple[np.ndarray, int, int]:
        """Candidate block ids ``int64 [batch, num_candidates]`` (column 0 = ``NULL_BLOCK``).

        ``keep_source[i]`` true: query i keeps its source block where the search ranked it (default: excluded).
        ``force_blocks[i]`` >= 0: that block (the query's source) is candidate 1 of query i, ahead of the search's
        best blocks not from its source; -1: the search's alone.

        Returns ``(candidates, index_version, excluded)``: the version of the index that answered, and how
        many retrieved blocks were dropped as trivial (the query's own source).
        """
        keep = np.zeros([len(source_uids)], bool) if keep_source is None else np.asarray(keep_source, bool)
        if keep.shape != (len(source_uids),):
            raise ValueError(f"keep_source has {keep.size} entries for {len(source_uids)} queries")
        forced = np.full([len(source_uids)], -1, np.int64) if force_blocks is None else np.asarray(force_blocks,
                                                                                                   np.int64)
        if forced.shape != (len(source_uids),):
            raise ValueError(f"force_blocks has {forced.size} entries for {len(source_uids)} queries")
        if np.any(forced >= len(self._uids)):
            raise IndexError(f"force_blocks {forced[forced >= len(self._uids)][:5].tolist()}: the index has "
                             f"{len(self._uids)} blocks")
        keep = keep & (forced < 0)  # a forced source is not kept a second time where the search ranked it
        need = self._num_candidates - 1
        num_blocks = len(self._uids)
        k = min(need + self._margin, num_blocks)
        while True:
            rows, _, version = self._search(query_embeddings, k)  # [batch, k]
            candidates, excluded, short = self._filter(np.asarray(rows), source_uids, keep, need)
            if not short or k >= num_blocks:
                break
            k = min(2 * k, num_blocks)
        if short:
            raise ValueError(f"only {num_blocks} blocks in the index: not enough to give {need} candidates that "
                             f"are not the query's own source block")
        null = np.full([len(candidates), 1], NULL_BLOCK, np.int64)
        candidates = np.concatenate([null, candidates], axis=1)  # [batch, num_candidates]
        rows = np.flatnonzero(forced >= 0)
        candidates[rows, 2:] = candidates[rows, 1:-1]
        candidates[rows, 1] = forced[rows]
        return candidates, version, excluded

    def _filter(self, rows: np.ndarray, source_uids: Sequence[str], keep: np.ndarray,
                need: int) -> tuple[np.ndarray, int, bool]:
        out = np.zeros([len(rows), need], np.int64)
        excluded, short = 0, False
        for i, (row, source) in enumerate(zip(rows, source_uids)):
            kept = [r for r in row if r >= 0 and (keep[i] or self._uids[r] != source)]
            if not keep[i]:
                excluded += sum(1 for r in row if r >= 0 and self._uids[r] == source)
            if len(kept) < need:
                short = True
                continue
            out[i] = kept[:need]
        return out, excluded, short
