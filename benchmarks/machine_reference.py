"""The machine's reference rates that the benchmarks report their figures against (issue #20).

numpy's float32 matrix product is the physical reference: what this machine's cores do for dense work when
nothing else is in the way. A figure such as useful GFLOP/s is read as a share of this rate measured in the
same run, before and after, since the rate moves with the machine's load.

The rate is the one the machine's cores can reach: some machines here set ``OPENBLAS_CORETYPE`` (and
``OPENBLAS_L2_SIZE``) so that older OpenBLAS builds stay safe, which pins OpenBLAS to its Haswell (AVX2) kernel
even on AVX-512 cores that TensorFlow's oneDNN kernels do use: on an AVX-512 EPYC that reference read 118 GFLOP/s
against 215 for OpenBLAS's own choice (SkylakeX) at the same moment. So the product is timed in a child process
without those two variables, and :func:`sgemm_kernel` names the kernel it ran.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

#: Variables that pin OpenBLAS to an older kernel than the cores support; the reference runs without them.
PINNING_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def sgemm_gflops(size: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of the fastest of ``repeats`` float32 ``size × size`` products (after one warm-up), timed in a
    child process with OpenBLAS free to pick the cores' own kernel (:data:`PINNING_VARIABLES` unset)."""
    return float(_child_reference(size, repeats)["gflops"])


@functools.lru_cache(maxsize=None)
def sgemm_kernel() -> str:
    """The BLAS and kernel the reference runs on, e.g. ``openblas SkylakeX, 2 threads`` (asked once per
    process: the machine does not change between calls)."""
    return str(_child_reference(256, 1)["kernel"])


def _child_reference(size: int, repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PINNING_VARIABLES}
    code = (f"import json, sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import machine_reference as m; print(json.dumps({{'gflops': m.sgemm_here({size}, {repeats}), "
            f"'kernel': m.kernel_here()}}))")
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def kernel_here() -> str:
    """The BLAS numpy calls in this process and its kernel (threadpoolctl, when installed)."""
    try:
        import threadpoolctl  # pylint: disable=import-outside-toplevel
    except ImportError:
        return "unknown (threadpoolctl not installed)"
    blas = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i['internal_api']} {i.get('architecture', '?')}, {i['num_threads']} threads" for i in blas)


def best_seconds(call: Callable[[], Any], repeats: int, warmups: int = 1) -> float:
    """The fastest of ``repeats`` timed ``call()``s, after ``warmups`` untimed ones (tracing, caches, first-touch
    of memory). ``call`` must finish its work before it returns (read a TensorFlow result back to numpy)."""
    for _ in range(warmups):
        call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def sgemm_here(size: int = 2048, repeats: int = 5) -> float:
    """:func:`sgemm_gflops` measured in this process, under its environment."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
    return 2.0 * size ** 3 / best_seconds(lambda: a @ b, repeats) / 1e9


def bert_row_flops(lengths, layers: int, hidden: int, intermediate: int) -> np.ndarray:
    """FLOPs of a BERT forward pass per row of these lengths: ``L·(2n(4H² + 2HI) + 4n²H)`` for a row of n
    wordpieces (the Q, K, V, output and feed-forward matmuls at 2 FLOPs a parameter a token, and QKᵀ and the
    attention-weighted values; embeddings, LayerNorm, softmax and activations are not counted)."""
    n = np.asarray(lengths, np.float64)
    return layers * (2.0 * n * (4 * hidden ** 2 + 2 * hidden * intermediate) + 4.0 * n * n * hidden)


def bert_forward_flops(lengths, layers: int, hidden: int, intermediate: int) -> float:
    """FLOPs of a BERT forward pass over rows of these lengths (the sum of :func:`bert_row_flops`)."""
    return float(np.sum(bert_row_flops(lengths, layers, hidden, intermediate)))
