"""Exact maximum inner product search: the ground truth every approximate index is measured against.

REALM (Guu et al., 2020, §3.4) retrieves ``top-k_z f(x, z)`` with f(x, z) = Embed_input(x)ᵀ Embed_doc(z).
This index computes that literally, a matrix product over the whole corpus followed by ``tf.math.top_k``,
processing the corpus in chunks of rows so that the ``[num_queries, chunk]`` score matrix stays bounded
(the full ``[num_queries, num_blocks]`` one would be 13M floats per query for REALM's Wikipedia). ORQA
(Lee et al., 2019) searched its 13M blocks exactly like this, on TPU.

Ties are broken towards the lower row number, deterministically (``tf.math.top_k`` keeps the lower index
first, and chunks are merged in row order).
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
import tensorflow as tf

from realm_tf.index import mips_index

_EMBEDDINGS = "embeddings.npy"
_META = "brute_force_index.json"


class BruteForceIndex(mips_index.MipsIndex):
    """Exact top-k by inner product, with TensorFlow matmul + top_k over row chunks.

    Args:
      chunk_size: corpus rows scored per matmul; memory is about ``num_queries * chunk_size`` floats.
    """

    kind = "brute_force"

    def __init__(self, chunk_size: int = 262144) -> None:
        super().__init__()
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = int(chunk_size)
        self._chunks: list[tf.Tensor] = []  # the only copy of the matrix the index keeps

    def build(self, embeddings: np.ndarray) -> None:
        """Keeps ``embeddings`` ([num_blocks, dim] float32) as TF constants, one per chunk of rows."""
        start = time.perf_counter()
        embeddings = mips_index.check_embeddings(embeddings)
        self._chunks = [tf.constant(embeddings[i:i + self.chunk_size])  # [chunk, dim]
                        for i in range(0, embeddings.shape[0], self.chunk_size)]
        self._set_shape(*embeddings.shape)
        self.build_seconds = time.perf_counter() - start

    def search_batched(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``k`` rows (int64 ``[B, k]``) and inner products (float32 ``[B, k]``) per query."""
        self._require_built()
        queries = mips_index.check_queries(queries, k, self)  # [B, dim]
        if queries.shape[0] == 0:
            return np.zeros([0, k], np.int64), np.zeros([0, k], np.float32)
        q = tf.constant(queries)
        best_scores: tf.Tensor | None = None  # [B, k] running best over the chunks seen so far
        best_rows: tf.Tensor | None = None  # [B, k]
        offset = 0
        for chunk in self._chunks:
            scores = tf.linalg.matmul(q, chunk, transpose_b=True)  # [B, chunk]
            top = tf.math.top_k(scores, k=min(k, int(chunk.shape[0])), sorted=True)
            rows = tf.cast(top.indices, tf.int64) + offset  # [B, min(k, chunk)]
            offset += int(chunk.shape[0])
            if best_scores is None:
                best_scores, best_rows = top.values, rows
                continue
            # Earlier chunks come first, so among equal scores the lower row keeps winning.
            cand_scores = tf.concat([best_scores, top.values], axis=1)  # [B, k + min(k, chunk)]
            cand_rows = tf.concat([best_rows, rows], axis=1)
            merged = tf.math.top_k(cand_scores, k=min(k, int(cand_scores.shape[1])), sorted=True)
            best_scores = merged.values  # [B, min(k, rows seen)]
            best_rows = tf.gather(cand_rows, merged.indices, batch_dims=1)  # [B, min(k, rows seen)]
        return best_rows.numpy().astype(np.int64), best_scores.numpy().astype(np.float32)

    @property
    def embeddings(self) -> np.ndarray:
        """A copy of the indexed matrix, float32 ``[num_blocks, dim]``."""
        self._require_built()
        return np.concatenate([chunk.numpy() for chunk in self._chunks], axis=0)

    def describe(self) -> dict:
        return {**super().describe(), "chunk_size": self.chunk_size}

    def save(self, directory: str) -> None:
        """Writes ``embeddings.npy`` (no pickles) and ``brute_force_index.json`` into ``directory``."""
        self._require_built()
        tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(os.path.join(directory, _EMBEDDINGS), "wb") as f:
            # A plain .npy written chunk by chunk, so saving needs no second copy of the matrix.
            np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                                                     "fortran_order": False, "shape": (self.num_blocks, self.dim)})
            for chunk in self._chunks:
                f.write(np.ascontiguousarray(chunk.numpy()).tobytes())
        with tf.io.gfile.GFile(os.path.join(directory, _META), "w") as f:
            f.write(json.dumps({"kind": self.kind, "chunk_size": self.chunk_size,
                                "num_blocks": self.num_blocks, "dim": self.dim}))

    @classmethod
    def load(cls, directory: str) -> "BruteForceIndex":
        """Reads an index written by :meth:`save`."""
        with tf.io.gfile.GFile(os.path.join(directory, _META), "r") as f:
            meta = json.loads(f.read())
        with tf.io.gfile.GFile(os.path.join(directory, _EMBEDDINGS), "rb") as f:
            embeddings = np.load(f, allow_pickle=False)
        if embeddings.shape != (meta["num_blocks"], meta["dim"]):
            raise ValueError(f"{directory}: {_EMBEDDINGS} has shape {embeddings.shape}, "
                             f"{_META} says ({meta['num_blocks']}, {meta['dim']})")
        index = cls(chunk_size=int(meta["chunk_size"]))
        index.build(embeddings)
        return index
