"""The machine's reference rates that the benchmarks report their figures against (issue #20).

numpy's float32 matrix product is the physical reference: what this machine's cores do for dense work when
nothing else is in the way. A figure such as useful GFLOP/s is read as a share of this rate measured in the
same run, before and after, since the rate moves with the machine's load.
"""
from __future__ import annotations

import time

import numpy as np


def sgemm_gflops(size: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of the fastest of ``repeats`` float32 ``size × size`` products (after one warm-up)."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
    a @ b  # warm-up  # pylint: disable=pointless-statement
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b  # pylint: disable=pointless-statement
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 / best / 1e9


def bert_row_flops(lengths, layers: int, hidden: int, intermediate: int) -> np.ndarray:
    """FLOPs of a BERT forward pass per row of these lengths: ``L·(2n(4H² + 2HI) + 4n²H)`` for a row of n
    wordpieces (the Q, K, V, output and feed-forward matmuls at 2 FLOPs a parameter a token, and QKᵀ and the
    attention-weighted values; embeddings, LayerNorm, softmax and activations are not counted)."""
    n = np.asarray(lengths, np.float64)
    return layers * (2.0 * n * (4 * hidden ** 2 + 2 * hidden * intermediate) + 4.0 * n * n * hidden)


def bert_forward_flops(lengths, layers: int, hidden: int, intermediate: int) -> float:
    """FLOPs of a BERT forward pass over rows of these lengths (the sum of :func:`bert_row_flops`)."""
    return float(np.sum(bert_row_flops(lengths, layers, hidden, intermediate)))
