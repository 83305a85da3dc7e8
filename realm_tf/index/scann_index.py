"""Approximate MIPS with ScaNN (Guo et al., 2020), the index REALM's trainer searches (Guu et al., 2020, §3.4).

The searcher is ScaNN's usual three stages over the Embed_doc(z) matrix:

1. a k-means **tree** partitions the blocks into ``num_leaves`` leaves; a query scores only the blocks of
   its ``num_leaves_to_search`` closest leaves;
2. those blocks are scored with **anisotropic asymmetric hashing** (``score_ah``: product quantisation
   with ``dimensions_per_block`` dimensions per sub-space, the quantisation loss weighted towards the
   component parallel to the datapoint above ``anisotropic_quantization_threshold``, Guo et al. §3);
3. the best ``reorder_num_neighbors`` candidates are **re-scored exactly** in float32 and the top k kept.

ORQA/REALM's settings for 13M Wikipedia blocks were 1000 leaves, 100 searched, AH with 2 dimensions per
block and threshold 0.2, plus exact re-ordering. The :class:`realm_tf.config.IndexConfig` fields mean the
same here; 0 means "scaled to the corpus" (see :func:`resolve_params`). Corpora below
``TREE_MIN_BLOCKS`` blocks get ScaNN's exact brute-force scorer instead, unless ``num_leaves`` is set: a full
scan of 100k x 128 is one small matmul per batch, while a scaled tree over real Embed_doc vectors (less
clustered than synthetic ones) lost recall: 0.885 recall@10 on the bundled 11.5k MiniLM blocks, which
cost 6 points of answer accuracy@5 (benchmarks/RESULTS.md).

:func:`load_tf_searcher` turns a directory written by :meth:`ScannIndex.save` into ScaNN's TensorFlow-op
searcher for in-graph search.
"""
from __future__ import annotations

import json
import math
import os
import time
import uuid
from typing import Any

import numpy as np
import tensorflow as tf
from scann.scann_ops.py import scann_ops
from scann.scann_ops.py import scann_ops_pybind

from realm_tf import config
from realm_tf.index import mips_index
from realm_tf.index import scann_tuning

#: Below this many blocks ScaNN runs its exact brute-force scorer (no tree, no hashing) unless
#: ``num_leaves`` is given explicitly.
TREE_MIN_BLOCKS = 100_000
#: Fewest leaves searched per query when ``num_leaves_to_search`` is scaled (ORQA/REALM: 100 of 1000).
MIN_LEAVES_TO_SEARCH = 16
#: Re-ordered candidates per final neighbour when ``reorder_num_neighbors`` is scaled.
REORDER_FACTOR = 10
#: Batches at least this large are searched with ScaNN's multi-threaded batch search.
PARALLEL_MIN_BATCH = 64

_META = "scann_index.json"


def resolve_params(num_blocks: int, dim: int, index_config: config.IndexConfig) -> dict[str, Any]:
    """The concrete ScaNN parameters for a corpus of ``num_blocks`` ``dim``-wide vectors.

    Zeros in ``index_config`` are scaled from ORQA/REALM's 13M-block settings:

    * ``num_leaves``: round(sqrt(num_blocks)) (1000 leaves ≈ sqrt(1M); the usual IVF rule), capped so that
      leaves average at least 50 blocks (ScaNN's ``min_partition_size``);
    * ``num_leaves_to_search``: num_leaves / 10 as in ORQA/REALM (100 of 1000), at least
      ``MIN_LEAVES_TO_SEARCH`` (small trees need a larger fraction for the same recall);
    * ``reorder_num_neighbors``: ``REORDER_FACTOR`` x num_neighbors (within ScaNN's suggested 4-10x).
    """
    if index_config.dimensions_per_block < 1 or index_config.dimensions_per_block > dim:
        raise ValueError(f"index.dimensions_per_block must be in [1, {dim}], "
                         f"got {index_config.dimensions_per_block}")
    num_neighbors = min(index_config.num_neighbors, num_blocks)
    # With a target recall the tuner decides between a tree and brute force by measuring both.
    tree_min_blocks = scann_tuning.MIN_TREE_BLOCKS if index_config.target_recall > 0 else TREE_MIN_BLOCKS
    if num_blocks < tree_min_blocks and not index_config.num_leaves:
        return {"mode": "brute_force", "num_neighbors": num_neighbors}
    num_leaves = index_config.num_leaves or min(round(math.sqrt(num_blocks)), num_blocks // 50)
    num_leaves = max(1, min(num_leaves, num_blocks))
    to_search = index_config.num_leaves_to_search or max(math.ceil(num_leaves / 10), MIN_LEAVES_TO_SEARCH)
    to_search = max(1, min(to_search, num_leaves))
    reorder = index_config.reorder_num_neighbors or REORDER_FACTOR * num_neighbors
    reorder = max(num_neighbors, min(reorder, num_blocks))
    return {"mode": "tree_ah", "num_neighbors": num_neighbors, "num_leaves": num_leaves,
            "num_leaves_to_search": to_search,
            "training_sample_size": min(index_config.training_sample_size, num_blocks),
            "dimensions_per_block": index_config.dimensions_per_block,
            "anisotropic_quantization_threshold": index_config.anisotropic_quantization_threshold,
            "reorder_num_neighbors": reorder}


def _configure(builder: Any, params: dict[str, Any]) -> Any:
    """Applies resolved ``params`` to a ScaNN builder (pybind or TF op: they share ScannBuilder)."""
    if params["mode"] == "brute_force":
        return builder.score_brute_force()
    return (builder
            .tree(num_leaves=params["num_leaves"], num_leaves_to_search=params["num_leaves_to_search"],
                  training_sample_size=params["training_sample_size"])
            .score_ah(params["dimensions_per_block"],
                      anisotropic_quantization_threshold=params["anisotropic_quantization_threshold"])
            .reorder(params["reorder_num_neighbors"]))


class ScannIndex(mips_index.MipsIndex):
    """A ScaNN searcher (``scann_ops_pybind``) over block embeddings, dot-product distance.

    Args:
      index_config: the experiment's ``index`` section; zeros are scaled to the corpus at :meth:`build`.
      training_threads: threads for k-means / AH training (0: all cores).
    """

    kind = "scann"

    def __init__(self, index_config: config.IndexConfig | None = None, training_threads: int = 0) -> None:
        super().__init__()
        self.index_config = index_config if index_config is not None else config.IndexConfig()
        self.training_threads = int(training_threads)
        self.params: dict[str, Any] = {}
        self._searcher: scann_ops_pybind.ScannSearcher | None = None

    def build(self, embeddings: np.ndarray) -> None:
        """Trains the tree and the quantiser on ``embeddings`` ([num_blocks, dim]) and indexes every row."""
        start = time.perf_counter()
        embeddings = mips_index.check_embeddings(embeddings)
        params = resolve_params(embeddings.shape[0], embeddings.shape[1], self.index_config)
        builder = scann_ops_pybind.builder(embeddings, params["num_neighbors"], "dot_product")
        builder = _configure(builder, params).set_n_training_threads(self.training_threads)
        self._searcher = builder.build()
        if self.index_config.target_recall > 0 and params["mode"] == "tree_ah":
            params = self._tune(embeddings, params)
        self.params = params
        self._set_shape(*embeddings.shape)
        self.build_seconds = time.perf_counter() - start

    def _tune(self, embeddings: np.ndarray, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with the search settings :class:`scann_tuning.SearchTuner` measured fastest at
        ``index.target_recall``; brute force (and its searcher) instead when that is faster."""
        exact = scann_ops_pybind.builder(embeddings, params["num_neighbors"], "dot_product").score_brute_force()
        exact = exact.set_n_training_threads(self.training_threads).build()
        tuner = scann_tuning.SearchTuner(self.index_config.target_recall, self.index_config.tuning_queries)
        tuning = tuner.tune(self._searcher, lambda q, k: exact.search_batched_parallel(q, final_num_neighbors=k),
                            embeddings, params["num_leaves"])
        if tuning["mode"] == "brute_force":
            self._searcher = exact
            return {"mode": "brute_force", "num_neighbors": params["num_neighbors"], "tuning": tuning}
        return {**params, "num_leaves_to_search": tuning["num_leaves_to_search"],
                "reorder_num_neighbors": tuning["reorder_num_neighbors"], "tuning": tuning}

    def search_batched(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Approximate top-``k`` rows (int64 ``[B, k]``) and inner products (float32 ``[B, k]``).

        Leaves searched and candidates re-ordered: :func:`search_settings`. Should the searched leaves hold
        fewer than ``k`` blocks, missing slots are row -1 with score -inf.
        """
        self._require_built()
        queries = mips_index.check_queries(queries, k, self)  # [B, dim]
        batch = queries.shape[0]
        if batch == 0:
            return np.zeros([0, k], np.int64), np.zeros([0, k], np.float32)
        leaves, pre_reorder = search_settings(self.params, k, self.num_blocks)
        search = (self._searcher.search_batched_parallel if batch >= PARALLEL_MIN_BATCH
                  else self._searcher.search_batched)
        rows, scores = search(queries, final_num_neighbors=k, pre_reorder_num_neighbors=pre_reorder,
                              leaves_to_search=leaves)
        rows = np.asarray(rows).astype(np.int64)  # [B, <=k]
        scores = np.asarray(scores, dtype=np.float32)  # [B, <=k]
        if rows.shape[1] < k:
            pad = k - rows.shape[1]
            rows = np.pad(rows, [(0, 0), (0, pad)], constant_values=-1)
            scores = np.pad(scores, [(0, 0), (0, pad)], constant_values=-np.inf)
        return rows, scores

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "params": dict(self.params)}

    def save(self, directory: str) -> None:
        """Serialises the searcher (asset paths relative, so the directory can be renamed) + parameters."""
        self._require_built()
        with mips_index.local_dir(directory, upload=True) as local:
            self._searcher.serialize(local, relative_path=True)
            with open(os.path.join(local, _META), "w", encoding="utf-8") as f:
                json.dump({"kind": self.kind, "num_blocks": self.num_blocks, "dim": self.dim,
                           "params": self.params, "build_seconds": self.build_seconds}, f)

    @classmethod
    def load(cls, directory: str) -> "ScannIndex":
        """Loads a searcher written by :meth:`save` (``scann_ops_pybind.load_searcher``)."""
        with mips_index.local_dir(directory, upload=False) as local:
            meta = read_meta(local)
            searcher = scann_ops_pybind.load_searcher(local, assets_backcompat_shim=False)
        index = cls()
        index._searcher = searcher
        index.params = meta["params"]
        index.build_seconds = float(meta.get("build_seconds", 0.0))
        index._set_shape(meta["num_blocks"], meta["dim"])
        if searcher.size() != index.num_blocks:
            raise ValueError(f"{directory}: searcher holds {searcher.size()} datapoints, "
                             f"{_META} says {index.num_blocks}")
        return index


def search_settings(params: dict[str, Any], k: int, num_blocks: int) -> tuple[int | None, int | None]:
    """``(leaves_to_search, pre_reorder_num_neighbors)`` of a top-``k`` search (None: the searcher's own).

    Re-ordered candidates are ``max(reorder_num_neighbors, 4k)`` (at most num_blocks), so a ``k`` larger than
    the configured ``num_neighbors`` keeps a sensible depth; a tuned index (``params["tuning"]``) re-orders
    its measured depth for up to the ``k`` it was measured at, and proportionally more for a larger ``k``.
    """
    if params["mode"] != "tree_ah":
        return None, None
    reorder = params["reorder_num_neighbors"]
    tuning = params.get("tuning")
    if tuning:
        depth = max(reorder, math.ceil(reorder * k / tuning["recall_k"]))
    else:
        depth = max(reorder, 4 * k)
    return params["num_leaves_to_search"], min(num_blocks, depth)


def read_meta(directory: str) -> dict[str, Any]:
    """What a :meth:`ScannIndex.save` directory records: ``num_blocks``, ``dim``, the resolved (and tuned)
    ``params``, ``build_seconds``."""
    with tf.io.gfile.GFile(os.path.join(directory, _META)) as f:
        return json.load(f)


def load_tf_searcher(directory: str) -> scann_ops.ScannSearcher:
    """ScaNN's TensorFlow-op searcher over a directory written by :meth:`ScannIndex.save`.

    scann 1.4.2 has no ``scann_ops.load_searcher``; its ``tensors_to_scann`` op, however, takes exactly the
    assets ``scann_ops_pybind`` serialises (the serialized ``ScannConfig``, partitioner and AH codebook
    protos, and the ``.npy`` arrays), so the same directory serves both. Absent assets are passed as the
    scalars ``scann_to_tensors`` itself produces for them, and every call gets its own ``shared_name`` (the
    op's default, empty, name aliases all searchers of a process to the first one). The returned searcher's
    ``search_batched`` runs as a TF op (also inside ``tf.function``) and returns int32 rows and float32
    scores. Its ``serialize_to_module()`` gives ScaNN's ``ScannState`` ``tf.Module``, which survives
    ``tf.saved_model.save``/``load``; its ``recreate_handle()`` rebuilds the searcher, so call it once per
    process, not per query.
    """
    with mips_index.local_dir(directory, upload=False) as local:

        def proto(name: str) -> tf.Tensor:
            path = os.path.join(local, name)
            if not os.path.exists(path):
                return tf.constant(b"")  # scalar: "absent", as scann_to_tensors emits
            with open(path, "rb") as f:
                return tf.constant([f.read()])  # [1]

        def array(name: str, dtype: tf.DType) -> tf.Tensor:
            path = os.path.join(local, name)
            if not os.path.exists(path):
                return tf.zeros([], dtype)  # scalar: "absent"
            return tf.constant(np.load(path, allow_pickle=False), dtype)

        handle = scann_ops.tensors_to_scann(
            array("dataset.npy", tf.float32),  # [num_blocks, dim]
            proto("scann_config.pb"),
            proto("serialized_partitioner.pb"),
            array("datapoint_to_token.npy", tf.int32),  # [num_blocks]
            proto("ah_codebook.pb"),
            array("hashed_dataset.npy", tf.uint8),  # [num_blocks, num_subspaces]
            array("int8_dataset.npy", tf.int8),
            array("int8_multipliers.npy", tf.float32),
            array("dp_norms.npy", tf.float32),
            # The op keeps its searcher in the resource manager under (container, shared_name); with the
            # default empty name every call would return the *first* searcher loaded in the process.
            shared_name=f"scann-{uuid.uuid4()}")
    return scann_ops.ScannSearcher(handle)
