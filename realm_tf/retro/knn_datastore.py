"""kNN-LM's datastore (Khandelwal et al., 2020, §2): for every training token, the key f(c_i) (the decoder's
hidden state at the input of its final feed-forward block) and the value w_i (the token that follows).

kNN-LM searches keys by squared L2 distance. The MIPS index (ScaNN or exact) ranks by inner product, so keys are
stored augmented, k' = [k, −‖k‖²/2], and queries q' = [q, 1]:

    q'·k' = q·k − ‖k‖²/2 = (‖q‖² − ‖q − k‖²) / 2

which, for a fixed query, orders keys exactly as −‖q − k‖² does. The distances handed to p_kNN are recomputed
exactly from the stored keys for the K rows the index returns (an approximate index only chooses them).

A datastore is a published index version (``index_publisher``) over the augmented keys, with ``values.npy``
(int32 ``[num_tokens]``) beside it, written by ``beam_jobs/build_knn_datastore``.
"""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from realm_tf import errors
from realm_tf.index import index_kinds
from realm_tf.index import index_publisher
from realm_tf.index import mips_index

VALUES_NPY = "values.npy"


def augment_keys(keys: np.ndarray) -> np.ndarray:
    """float32 ``[N, d + 1]``: ``[k, −‖k‖²/2]`` for keys ``[N, d]``."""
    keys = np.asarray(keys, np.float32)
    return np.concatenate([keys, -0.5 * np.sum(np.square(keys, dtype=np.float64), axis=1,
                                                keepdims=True).astype(np.float32)], axis=1)


def augment_queries(queries: np.ndarray) -> np.ndarray:
    """float32 ``[q, d + 1]``: ``[q, 1]``."""
    queries = np.asarray(queries, np.float32)
    return np.concatenate([queries, np.ones([queries.shape[0], 1], np.float32)], axis=1)


class KnnDatastore:
    """A loaded datastore: :meth:`search` returns the K nearest training contexts' distances and next tokens.

    Args:
      index: the MIPS index over the augmented keys.
      keys: float32 ``[N, d + 1]``, the augmented keys (row i = datastore entry i).
      values: int32 ``[N]``, the next token of entry i.
      source: where it was loaded from (for messages).
    """

    def __init__(self, index: mips_index.MipsIndex, keys: np.ndarray, values: np.ndarray, source: str = "<memory>"):
        if not index.num_blocks == keys.shape[0] == values.shape[0]:
            raise ValueError(f"{source}: index of {index.num_blocks}, {keys.shape[0]} keys, {values.shape[0]} values")
        self.index, self.keys, self.values, self.source = index, keys, np.asarray(values, np.int32), source

    @classmethod
    def load(cls, datastore_dir: str, kind: str) -> "KnnDatastore":
        """The newest complete version under ``datastore_dir`` (``retro.knn_dir``)."""
        versions = index_publisher.complete_versions(datastore_dir)
        if not versions:
            raise errors.UserError(f"{datastore_dir}: no kNN-LM datastore (run `realm-tf build-knn-datastore`)")
        path = index_publisher.version_dir(datastore_dir, versions[-1])
        meta = index_publisher.read_index_json(path)
        if meta.get("kind") != kind:
            raise errors.UserError(f"{path}: a {meta.get('kind')!r} index, index.kind is {kind!r}")
        index = index_kinds.load_index(kind, path, meta["searcher"])
        with tf.io.gfile.GFile(os.path.join(path, VALUES_NPY), "rb") as f:
            values = np.load(f, allow_pickle=False)
        return cls(index, index_publisher.read_embeddings(path), values, source=path)

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """For queries ``[q, d]``: ``(squared L2 distances float32 [q, k], next tokens int32 [q, k])``, nearest
        first; a missing neighbour (fewer than k found) has distance +inf and token 0."""
        rows, _ = self.index.search_batched(augment_queries(queries), min(k, len(self)))  # [q, k]
        valid = rows >= 0
        safe = np.where(valid, rows, 0)
        keys = self.keys[safe][..., :-1]  # [q, k, d]
        distances = np.sum(np.square(keys - np.asarray(queries, np.float32)[:, None, :]), axis=-1)  # [q, k]
        distances = np.where(valid, distances, np.inf).astype(np.float32)
        order = np.argsort(distances, axis=1, kind="stable")
        return (np.take_along_axis(distances, order, 1),
                np.where(np.take_along_axis(valid, order, 1), self.values[np.take_along_axis(safe, order, 1)], 0))
