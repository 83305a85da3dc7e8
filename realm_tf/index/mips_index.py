"""The maximum-inner-product-search (MIPS) interface REALM's knowledge retriever searches.

REALM (Guu et al., 2020, §3.4) scores every block z of the corpus by f(x, z) = Embed_input(x)ᵀ Embed_doc(z)
and keeps the top-k; with millions of blocks this needs a MIPS index over the pre-computed Embed_doc(z)
matrix (ScaNN, Guo et al., 2020), rebuilt asynchronously as the document tower trains. Every index here
answers in the same currency: **row numbers into the embedding matrix it was built from**, which by
construction of the block files are the block ids.

Implementations: :mod:`realm_tf.index.brute_force_index` (exact, the ground truth) and
:mod:`realm_tf.index.scann_index` (approximate, what training uses).
"""
from __future__ import annotations

import abc
import contextlib
import os
import shutil
import tempfile
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from realm_tf import artifacts


class MipsIndex(abc.ABC):
    """An index over a ``[num_blocks, dim]`` float32 matrix answering top-k inner-product queries.

    Subclasses set :attr:`kind` (the string recorded in ``index.json`` and matched by the loader) and
    implement :meth:`build`, :meth:`search_batched`, :meth:`save` and :meth:`load`. Searching is read-only
    and safe from several threads at once once the index is built.
    """

    #: Short name of the implementation, recorded in a published index's ``index.json``.
    kind: str = ""

    def __init__(self) -> None:
        self._num_blocks: int | None = None
        self._dim: int | None = None
        self.build_seconds: float = 0.0  # wall time of the last build(), for index.json

    # ---- abstract API --------------------------------------------------------------------------------------

    @abc.abstractmethod
    def build(self, embeddings: np.ndarray) -> None:
        """Indexes ``embeddings`` (float32 ``[num_blocks, dim]``; row i is block i)."""

    @abc.abstractmethod
    def search_batched(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The top-``k`` rows by inner product for each query.

        Args:
          queries: float32 ``[num_queries, dim]`` (Embed_input(x) for each query x).
          k: neighbours per query; ``1 <= k <= num_blocks``.

        Returns:
          ``(rows, scores)``: int64 ``[num_queries, k]`` row numbers (= block ids) and float32
          ``[num_queries, k]`` inner products, each row sorted by decreasing score.
        """

    @abc.abstractmethod
    def save(self, directory: str) -> None:
        """Writes everything :meth:`load` needs into ``directory`` (created if missing)."""

    @classmethod
    @abc.abstractmethod
    def load(cls, directory: str) -> "MipsIndex":
        """Reads an index written by :meth:`save`."""

    # ---- shared -------------------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """Rows of the indexed matrix."""
        self._require_built()
        return int(self._num_blocks)  # type: ignore[arg-type]

    @property
    def dim(self) -> int:
        """Width of the indexed vectors (REALM: 128)."""
        self._require_built()
        return int(self._dim)  # type: ignore[arg-type]

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable facts about this index (kind, size, parameters), for ``index.json``."""
        return {"kind": self.kind, "num_blocks": self.num_blocks, "dim": self.dim,
                "build_seconds": round(self.build_seconds, 3)}

    def _require_built(self) -> None:
        if self._num_blocks is None:
            raise RuntimeError(f"{type(self).__name__}: build() or load() it before use")

    def _set_shape(self, num_blocks: int, dim: int) -> None:
        self._num_blocks, self._dim = int(num_blocks), int(dim)


def check_embeddings(embeddings: np.ndarray) -> np.ndarray:
    """Validates a block-embedding matrix and returns it as C-contiguous float32 ``[num_blocks, dim]``."""
    embeddings = np.asarray(embeddings)
    if embeddings.ndim != 2 or embeddings.shape[0] == 0 or embeddings.shape[1] == 0:
        raise ValueError(f"embeddings must be a non-empty [num_blocks, dim] matrix, got shape {embeddings.shape}")
    if not np.issubdtype(embeddings.dtype, np.floating):
        raise ValueError(f"embeddings must be floating point, got {embeddings.dtype}")
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)  # no copy of a float32 matrix (or memory map)
    step = 1 << 18  # rows checked at a time: no [num_blocks, dim] temporary (13M x 128 would be 1.7 GB)
    for first in range(0, embeddings.shape[0], step):
        finite = np.isfinite(embeddings[first:first + step]).all()
        artifacts.drop_mapped_pages(embeddings)  # a memory map's pages leave RSS chunk by chunk, not at the end
        if not finite:
            raise ValueError("embeddings contain NaN or Inf")
    return embeddings


def gather_rows(embeddings: np.ndarray, ids: np.ndarray, step: int = 1 << 13) -> np.ndarray:
    """``embeddings[ids]`` (float32 ``[len(ids), dim]``, a copy) gathered ``step`` rows at a time, the pages of a
    memory-mapped ``embeddings`` dropped after each: a sample spread over the whole file would otherwise leave
    most of it resident."""
    out = np.empty([len(ids), embeddings.shape[1]], np.float32)  # [len(ids), dim]
    for first in range(0, len(ids), step):
        out[first:first + step] = embeddings[ids[first:first + step]]
        artifacts.drop_mapped_pages(embeddings)
    return out


def check_queries(queries: np.ndarray, k: int, index: MipsIndex) -> np.ndarray:
    """Validates ``queries`` against a built index and ``k``; returns float32 ``[num_queries, dim]``."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if queries.ndim != 2 or queries.shape[1] != index.dim:
        raise ValueError(f"queries must be [num_queries, {index.dim}], got shape {queries.shape}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if k > index.num_blocks:
        raise ValueError(f"k={k} exceeds the number of indexed blocks ({index.num_blocks})")
    return queries


def copy_tree(src: str, dst: str) -> None:
    """Recursively copies ``src`` to ``dst`` with ``tf.io.gfile`` (local, gs://, ...)."""
    tf.io.gfile.makedirs(dst)
    for name in tf.io.gfile.listdir(src):
        name = name.rstrip("/")
        s, d = _join(src, name), _join(dst, name)
        if tf.io.gfile.isdir(s):
            copy_tree(s, d)
        else:
            tf.io.gfile.copy(s, d, overwrite=True)


@contextlib.contextmanager
def local_dir(directory: str, upload: bool) -> Iterator[str]:
    """``with local_dir(directory, upload) as local:`` gives a local directory standing in for ``directory``.

    Native savers/loaders (ScaNN's C++ serialiser) only see local disk. For a local ``directory`` this is
    the directory itself; for a remote one (gs://) it is a temporary directory that is copied up on a clean
    exit (``upload=True``) or filled from the remote one on entry (``upload=False``), then removed.
    """
    if artifacts.is_local(directory):
        path = artifacts.local_path(directory)
        if upload:
            os.makedirs(path, exist_ok=True)
        yield path
        return
    tmp = tempfile.mkdtemp(prefix="realm-index-")
    try:
        if not upload:
            copy_tree(directory, tmp)
        yield tmp
        if upload:
            copy_tree(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _join(a: str, b: str) -> str:
    return a.rstrip("/") + "/" + b
