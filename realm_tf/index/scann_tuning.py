"""Search parameters of a built ScaNN index chosen from a target recall (``index.target_recall``).

REALM's retriever only needs the MIPS index to *select* candidates (Guu et al., 2020, §3.4): what matters is
how often the exact top-k reaches the model (recall) and what a search costs. ORQA/REALM fixed 100 of 1,000
leaves and exact re-ordering for 13M blocks; the right numbers depend on the corpus and on the embeddings, so
:class:`SearchTuner` measures them on the built index instead. With a sample of the indexed vectors as queries
(only the corpus exists at build time), it finds for each re-ordering depth the fewest leaves to search that
reach the target recall@k against the exact top-k, leaving each query's own row out of both (a sampled block
finds itself trivially, which a question never does: measured with itself in, recall reads higher than on
held-out queries), times each such pair, and keeps the fastest. Exact search
over the same vectors is timed on the same queries: ScaNN's brute-force scorer is kept instead when it is
faster (small corpora). Leaves (the tree itself) are not tuned: that would mean re-training the tree per candidate.

The searches are the index's own: ScaNN's multi-threaded batched search with per-call ``leaves_to_search``
and ``pre_reorder_num_neighbors`` overrides (Guo et al., 2020, ScaNN's search-time parameters).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np

from realm_tf import artifacts

#: With ``index.target_recall``, corpora of at least this many blocks get a tree to measure against brute force.
MIN_TREE_BLOCKS = 2000
#: Re-ordering depths tried, as multiples of k.
REORDER_MULTIPLES = (1, 2, 4, 8, 16, 32, 100)


def exact_neighbours(embeddings: np.ndarray, queries: np.ndarray, k: int, chunk: int = 16384) -> np.ndarray:
    """Rows of the exact top-``k`` inner products (int64 ``[num_queries, k]``, best first), ``chunk`` rows at a
    time: each chunk's own top k are merged into the running best, so memory is a few ``[num_queries, chunk]``
    arrays whatever the corpus (a million-row score matrix is never held)."""
    num_queries = queries.shape[0]
    best_scores = np.full([num_queries, k], -np.inf, np.float32)  # [Q, k]
    best_rows = np.zeros([num_queries, k], np.int64)  # [Q, k]
    for start in range(0, embeddings.shape[0], chunk):
        scores = queries @ np.asarray(embeddings[start:start + chunk]).T  # [Q, c]
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if scores.shape[1] > k else \
            np.broadcast_to(np.arange(scores.shape[1]), scores.shape)  # [Q, <=k] unordered
        merged_scores = np.concatenate([best_scores, np.take_along_axis(scores, top, axis=1)], axis=1)  # [Q, <=2k]
        merged_rows = np.concatenate([best_rows, top + start], axis=1)
        keep = np.argpartition(-merged_scores, k - 1, axis=1)[:, :k]  # [Q, k]
        best_scores = np.take_along_axis(merged_scores, keep, axis=1)
        best_rows = np.take_along_axis(merged_rows, keep, axis=1)
        artifacts.drop_mapped_pages(embeddings)  # a memory map's pages leave this process's RSS as the pass goes
    order = np.argsort(-best_scores, axis=1, kind="stable")
    return np.take_along_axis(best_rows, order, axis=1)


def leave_one_out(rows: np.ndarray, own: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` of each row of ``rows`` (``[Q, >= k]``, best first) that is not the query's own row
    ``own[q]``: the neighbours of an indexed vector asked as if it were a new query."""
    order = np.argsort(rows == own[:, None], axis=1, kind="stable")[:, :k]  # own rows moved last
    return np.take_along_axis(rows, order, axis=1)


def recall_at_k(rows: np.ndarray, exact_rows: np.ndarray) -> float:
    """Mean over queries of |approximate top-k ∩ exact top-k| / k."""
    k = exact_rows.shape[1]
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(rows, exact_rows)]))


def _leaf_grid(num_leaves: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... (about 1.5x apart) up to and including ``num_leaves``."""
    grid, value = set(), 1.0
    while value < num_leaves:
        grid.add(int(round(value)))
        value *= math.sqrt(2.0)
    grid.add(num_leaves)
    return sorted(grid)


class SearchTuner:
    """Chooses ``num_leaves_to_search`` and ``reorder_num_neighbors`` of a tree-AH ScaNN searcher.

    Args:
      target_recall: recall@k against the exact top-k to reach (e.g. 0.99).
      num_queries: indexed vectors sampled as queries.
      k: neighbours the recall is measured at.
      seed: the query sample's seed.
    """

    def __init__(self, target_recall: float, num_queries: int = 1000, k: int = 10, seed: int = 0) -> None:
        if not 0.0 < target_recall <= 1.0:
            raise ValueError(f"target_recall must be in (0, 1], got {target_recall}")
        self.target_recall = float(target_recall)
        self.num_queries = int(num_queries)
        self.k = int(k)
        self.seed = int(seed)

    def _fewest_leaves(self, recall: Callable[[int, int], float], grid: Sequence[int], depths: Sequence[int]) -> None:
        """For each re-ordering depth, the fewest leaves of ``grid`` whose recall reaches the target, found by
        bisection (recall grows with the leaves searched); ``recall(leaves, depth)`` measures and remembers."""
        reaches_target = False  # recall grows with the re-ordering depth: once every leaf reaches it, all deeper do
        for reorder in depths:
            if not reaches_target and recall(grid[-1], reorder) < self.target_recall:
                continue  # this depth cannot reach the target even searching every leaf
            reaches_target = True
            low, high = 0, len(grid) - 1
            while low < high:
                middle = (low + high) // 2
                if recall(grid[middle], reorder) >= self.target_recall:
                    high = middle
                else:
                    low = middle + 1

    def tune(self, searcher: Any, brute_force: Any, embeddings: np.ndarray, num_leaves: int) -> dict[str, Any]:
        """Measures ``searcher`` (tree + AH + re-ordering, a ``scann_ops_pybind`` searcher over ``embeddings``
        ``[num_blocks, dim]``) and ``brute_force(queries, k)`` (exact search); returns the choice:
        ``{"mode", "num_leaves_to_search", "reorder_num_neighbors", "recall", "qps", "brute_force_qps",
        "tried": [[leaves, reorder, recall, qps or None when not timed], ...], ...}``."""
        start = time.perf_counter()
        num_blocks = embeddings.shape[0]
        k = min(self.k, num_blocks)
        rng = np.random.default_rng(self.seed)
        sample = rng.choice(num_blocks, size=min(self.num_queries, num_blocks), replace=False)
        own = np.sort(sample)  # [Q]
        queries = np.ascontiguousarray(embeddings[own])  # [Q, dim]
        wanted = min(k + 1, num_blocks)  # one more than k: the query's own row is left out
        exact = leave_one_out(exact_neighbours(embeddings, queries, wanted), own, k)  # [Q, k]
        recalls: dict[tuple[int, int], float] = {}

        def recall(leaves: int, reorder: int) -> float:
            if (leaves, reorder) not in recalls:
                rows, _ = searcher.search_batched_parallel(queries, final_num_neighbors=wanted,
                                                           pre_reorder_num_neighbors=max(reorder, wanted),
                                                           leaves_to_search=leaves)
                recalls[(leaves, reorder)] = recall_at_k(leave_one_out(np.asarray(rows), own, k), exact)
            return recalls[(leaves, reorder)]

        self._fewest_leaves(recall, _leaf_grid(num_leaves),
                            sorted({min(num_blocks, max(k, m * k)) for m in REORDER_MULTIPLES}))
        # Only the settings that reached the target are timed (more leaves can be faster with a shallower
        # re-ordering, so each of them is a candidate); the fastest wins.
        measured: dict[tuple[int, int], tuple[float, float]] = {}
        for (leaves, reorder), value in recalls.items():
            qps = math.nan
            if value >= self.target_recall:
                qps = len(queries) / _seconds(lambda: searcher.search_batched_parallel(
                    queries, final_num_neighbors=k, pre_reorder_num_neighbors=reorder, leaves_to_search=leaves))
            measured[(leaves, reorder)] = (value, qps)
        best: tuple[float, int, int] | None = None  # (qps, leaves, reorder)
        for (leaves, reorder), (value, qps) in measured.items():
            if value >= self.target_recall and (best is None or qps > best[0]):
                best = (qps, leaves, reorder)
        brute_force(queries[:1], k)  # warm-up
        brute_force_qps = len(queries) / _seconds(lambda: brute_force(queries, k))
        tried = [[leaves, reorder, round(r, 4), None if math.isnan(q) else round(q, 1)]
                 for (leaves, reorder), (r, q) in sorted(measured.items())]
        result: dict[str, Any] = {"target_recall": self.target_recall, "recall_k": k, "num_queries": len(queries),
                                  "brute_force_qps": round(brute_force_qps, 1), "tried": tried}
        if best is None or brute_force_qps >= best[0]:
            result.update(mode="brute_force", recall=1.0, qps=round(brute_force_qps, 1),
                          reason="no leaves/re-ordering reached the target" if best is None
                          else "exact search is faster at this recall")
        else:
            qps, leaves, reorder = best
            result.update(mode="tree_ah", num_leaves_to_search=leaves, reorder_num_neighbors=reorder,
                          recall=measured[(leaves, reorder)][0], qps=round(qps, 1))
        result["seconds"] = round(time.perf_counter() - start, 2)
        return result


def _seconds(fn: Any, min_total: float = 0.2, min_runs: int = 2) -> float:
    """The fastest of repeated runs of ``fn`` (at least ``min_runs``, and until ``min_total`` seconds have
    passed): the least disturbed by other work on the machine."""
    best, total, runs = math.inf, 0.0, 0
    while runs < min_runs or total < min_total:
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        best, total, runs = min(best, elapsed), total + elapsed, runs + 1
    return max(best, 1e-9)
