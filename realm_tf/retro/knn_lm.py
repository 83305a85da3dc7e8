"""kNN-LM (Khandelwal et al., 2020, "Generalization through Memorization: Nearest Neighbor Language Models")
and RETRO's chunk-overlap leakage measure (Borgeaud et al., 2021, §2.6).

kNN-LM, §2: the datastore maps each training context's representation f(c_i) to its next token w_i. For a test
context x the K nearest keys at distances d_1 .. d_K vote for their tokens (eq. 2), with a temperature T:

    p_kNN(y | x) ∝ Σ_{i : w_i = y} exp(−d_i / T)

and the model's distribution is interpolated with the LM's (eq. 3):

    p(y | x) = λ p_kNN(y | x) + (1 − λ) p_LM(y | x)

computed here in log space, ``log p = logaddexp(log λ + log p_kNN, log(1 − λ) + log p_LM)``, so that it stays
finite when p_LM underflows and exact when λ ∈ {0, 1} or a token was never retrieved (p_kNN = 0).

RETRO §2.6 measures how much of an evaluation chunk C was copied from its retrieved neighbours: with
LCS(C, N) the length of the longest common (contiguous) token substring, r(C) = max_N |LCS(C, N)| / |C| over the
chunk's neighbours (|C| = m, the chunk length, except for a document's shorter last chunk); chunks whose r(C)
exceeds a threshold α count as leaked.

The two distribution functions are TensorFlow ops (usable in a graph); the LCS is numpy.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf


def knn_distribution(distances: tf.Tensor, neighbour_tokens: tf.Tensor, vocab_size: int,
                     temperature: float = 1.0) -> tf.Tensor:
    """p_kNN (kNN-LM eq. 2): the softmax of −d / T over the K neighbours, summed per token.

    Args:
      distances: ``float[q, K]``, the distance of each query's K retrieved keys (kNN-LM: squared L2).
      neighbour_tokens: ``int[q, K]``, the target token stored with each key, in ``[0, vocab_size)``.
      vocab_size: V.
      temperature: T > 0.

    Returns:
      ``float[q, V]`` (the dtype of ``distances``): each row sums to 1 (K ≥ 1); tokens no neighbour holds get 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be positive")
    distances = tf.convert_to_tensor(distances)
    if not distances.dtype.is_floating:
        distances = tf.cast(distances, tf.float32)
    tokens = tf.cast(neighbour_tokens, tf.int64)  # [q, K]
    weights = tf.nn.softmax(-distances / tf.cast(temperature, distances.dtype), axis=-1)  # [q, K]
    num_queries = tf.shape(tokens, out_type=tf.int64)[0]
    rows = tf.range(num_queries)[:, None] * tf.cast(vocab_size, tf.int64)  # [q, 1]
    segments = rows + tokens  # [q, K]: flat index q * V + token
    flat = tf.math.unsorted_segment_sum(tf.reshape(weights, [-1]), tf.reshape(segments, [-1]),
                                        num_queries * vocab_size)  # [q * V]
    return tf.reshape(flat, [num_queries, vocab_size])  # [q, V]


def knn_target_probs(distances: tf.Tensor, neighbour_tokens: tf.Tensor, targets: tf.Tensor,
                     temperature: float = 1.0) -> tf.Tensor:
    """p_kNN(target) (kNN-LM eq. 2) for one target per query: :func:`knn_distribution` read at ``targets``
    without building the ``[q, V]`` distribution.

    Args: ``distances`` ``float[q, K]`` (+inf: no neighbour), ``neighbour_tokens`` ``int[q, K]``, ``targets``
    ``int[q]``, ``temperature`` T > 0. Returns ``float[q]``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be positive")
    distances = tf.convert_to_tensor(distances)
    if not distances.dtype.is_floating:
        distances = tf.cast(distances, tf.float32)
    weights = tf.nn.softmax(-distances / tf.cast(temperature, distances.dtype), axis=-1)  # [q, K]
    hit = tf.equal(tf.cast(neighbour_tokens, tf.int64), tf.cast(targets, tf.int64)[:, None])  # [q, K]
    return tf.reduce_sum(tf.where(hit, weights, tf.zeros_like(weights)), axis=-1)  # [q]


def interpolate_log_probs(lm_log_probs: tf.Tensor, knn_probs: tf.Tensor, lam: float | tf.Tensor) -> tf.Tensor:
    """log(λ p_kNN + (1 − λ) p_LM) (kNN-LM eq. 3), stably in log space.

    Args:
      lm_log_probs: ``float[q, V]``, log p_LM (e.g. a log-softmax).
      knn_probs: ``float[q, V]``, p_kNN from :func:`knn_distribution` (zeros allowed).
      lam: λ ∈ [0, 1] (kNN-LM: 0.25 on WIKITEXT-103); a scalar.

    Returns:
      ``float[q, V]`` in the dtype of ``lm_log_probs``; −inf only where both terms are 0. Wherever the result
      is finite so are the gradients, p_kNN = 0 included (the log of those entries is never taken).
    """
    if isinstance(lam, (int, float)) and not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam={lam} must be in [0, 1]")
    lm_log_probs = tf.convert_to_tensor(lm_log_probs)
    dtype = lm_log_probs.dtype
    knn_probs = tf.cast(knn_probs, dtype)  # [q, V]
    lam = tf.cast(lam, dtype)
    positive = knn_probs > 0  # [q, V]
    # where(..., log(where(...))): log(0) is never evaluated, so no inf * 0 = NaN in the gradient.
    log_knn = tf.where(positive, tf.math.log(tf.where(positive, knn_probs, tf.ones_like(knn_probs))),
                       tf.constant(-np.inf, dtype))  # [q, V]
    terms = tf.stack([tf.math.log(lam) + log_knn, tf.math.log1p(-lam) + lm_log_probs], axis=0)  # [2, q, V]
    return tf.reduce_logsumexp(terms, axis=0)  # [q, V]


def longest_common_substring(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest contiguous token run shared by ``a`` and ``b`` (RETRO §2.6), O(|a|·|b|).

    Dynamic programming over suffixes: ``run[i][j]`` = length of the common run ending at ``a[i - 1]`` and
    ``b[j - 1]`` = ``run[i - 1][j - 1] + 1`` if the tokens are equal, else 0; one row is kept, each computed
    with numpy over ``b``.
    """
    a = np.asarray(a, dtype=np.int64).reshape(-1)
    b = np.asarray(b, dtype=np.int64).reshape(-1)
    if a.size == 0 or b.size == 0:
        return 0
    run = np.zeros(b.size + 1, np.int64)  # run[j]: common run ending at the previous a token and b[j - 1]
    best = 0
    for token in a:
        following = np.zeros_like(run)
        following[1:] = np.where(b == token, run[:-1] + 1, 0)
        run = following
        best = max(best, int(run.max()))
    return best


def chunk_overlap_ratio(chunk: Sequence[int], neighbours: Sequence[Sequence[int]]) -> float:
    """r(C) = max over the neighbours N of |LCS(C, N)| / |C| (RETRO §2.6, where every chunk has m tokens); 0 with
    no neighbours or an empty chunk.

    A document's last chunk is usually shorter than m; dividing by m would count a verbatim copy of a 20-token
    last chunk as r = 20/64 instead of 1, so short chunks are measured against their own length."""
    if not len(chunk):
        return 0.0
    return max((longest_common_substring(chunk, n) for n in neighbours), default=0) / len(chunk)
