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
from scann.scann_ops.py import scann_builder
from scann.scann_ops.py import scann_ops
from scann.scann_ops.py import scann_ops_pybind

from realm_tf import artifacts
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
#: Tree-AH indexes of more than this many training samples' worth of blocks are built in slices
#: (:meth:`ScannIndex.build`).
SLICED_BUILD_FACTOR = 4
#: Blocks added to a sliced build at a time.
BUILD_SLICE = 65536
#: The searcher directory's map from ScaNN's datapoint positions to block ids (a sliced build's).
POSITIONS_NPY = "positions.npy"
#: With int8 re-ordering (``index.reorder_dtype``), ScaNN's best ``EXACT_RERANK_FACTOR`` x k are re-scored
#: exactly in float32 and the top k kept.
EXACT_RERANK_FACTOR = 4
#: ScaNN's searcher state, in the order of its ``tensors_to_scann`` op, with the file each is serialised to by
#: ``scann_ops_pybind`` (absent when the searcher has none) and its dtype (None: a serialised proto).
SEARCHER_FIELDS = (("dataset", "dataset.npy", tf.float32), ("scann_config", "scann_config.pb", None),
                   ("serialized_partitioner", "serialized_partitioner.pb", None),
                   ("datapoint_to_token", "datapoint_to_token.npy", tf.int32),
                   ("ah_codebook", "ah_codebook.pb", None), ("hashed_dataset", "hashed_dataset.npy", tf.uint8),
                   ("int8_dataset", "int8_dataset.npy", tf.int8),
                   ("int8_multipliers", "int8_multipliers.npy", tf.float32),
                   ("dp_norms", "dp_norms.npy", tf.float32))

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
            "reorder_num_neighbors": reorder, "reorder_dtype": index_config.reorder_dtype}


def _configure(builder: Any, params: dict[str, Any]) -> Any:
    """Applies resolved ``params`` to a ScaNN builder (pybind or TF op: they share ScannBuilder)."""
    if params["mode"] == "brute_force":
        return builder.score_brute_force()
    return (builder
            .tree(num_leaves=params["num_leaves"], num_leaves_to_search=params["num_leaves_to_search"],
                  training_sample_size=params["training_sample_size"])
            .score_ah(params["dimensions_per_block"],
                      anisotropic_quantization_threshold=params["anisotropic_quantization_threshold"])
            .reorder(params["reorder_num_neighbors"], quantize=_REORDER_TYPES[params.get("reorder_dtype", "float32")]))


_REORDER_TYPES = {"float32": scann_builder.ReorderType.FLOAT32, "int8": scann_builder.ReorderType.INT8}


def exact_rerank_depth(params: dict[str, Any], k: int, num_blocks: int) -> int:
    """Results asked of ScaNN for a top-``k`` search: ``EXACT_RERANK_FACTOR`` x k (at most ``num_blocks``) when its
    re-ordering is int8 and they are re-scored exactly, else k."""
    return min(num_blocks, EXACT_RERANK_FACTOR * k) if reorders_int8(params) else k


def reorders_int8(params: dict[str, Any]) -> bool:
    """Whether a searcher of resolved ``params`` re-orders with int8 vectors (its scores are approximate)."""
    return params.get("mode") == "tree_ah" and params.get("reorder_dtype") == "int8"


def rerank_exactly(queries: np.ndarray, rows: np.ndarray, embeddings: np.ndarray,
                   k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` of candidate ``rows`` (int64 ``[B, depth]``, -1 for none) by exact inner product with
    ``queries`` ``[B, dim]`` over ``embeddings`` rows: ``(rows int64 [B, k], scores float32 [B, k])``."""
    valid = rows >= 0  # [B, depth]
    vectors = np.asarray(embeddings[np.where(valid, rows, 0).reshape(-1)], np.float32)  # [B * depth, dim]
    scores = np.einsum("bd,bkd->bk", queries, vectors.reshape(rows.shape + (-1,)))  # [B, depth]
    scores = np.where(valid, scores, -np.inf).astype(np.float32)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # [B, k]
    return np.take_along_axis(rows, order, axis=1), np.take_along_axis(scores, order, axis=1)


class _BlockIdSearcher:
    """A ``scann_ops_pybind`` searcher seen as :class:`scann_tuning.SearchTuner` measures it: its datapoint
    positions mapped to block ids (``positions``, a sliced build's; None: the same), and, when it re-orders in
    int8, its results re-scored exactly (:func:`rerank_exactly`)."""

    def __init__(self, searcher: Any, embeddings: np.ndarray, params: dict[str, Any],
                 positions: np.ndarray | None) -> None:
        self._searcher, self._embeddings, self._params, self._positions = searcher, embeddings, params, positions

    def search_batched_parallel(self, queries: np.ndarray, final_num_neighbors: int, pre_reorder_num_neighbors: int,
                                leaves_to_search: int) -> tuple[np.ndarray, np.ndarray]:
        depth = exact_rerank_depth(self._params, final_num_neighbors, self._embeddings.shape[0])
        rows, scores = self._searcher.search_batched_parallel(
            queries, final_num_neighbors=depth, pre_reorder_num_neighbors=max(pre_reorder_num_neighbors, depth),
            leaves_to_search=leaves_to_search)
        rows, scores = block_results(rows, scores, self._positions)
        if not reorders_int8(self._params):
            return rows, scores
        reranked = rerank_exactly(queries, rows, self._embeddings, final_num_neighbors)
        artifacts.drop_mapped_pages(self._embeddings)  # the tuner's many searches would map most of the rows
        return reranked


def block_results(rows: Any, scores: Any, positions: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """ScaNN's results as block ids: ``(rows int64 [B, k], scores float32 [B, k])`` with -1 / -inf where a query
    has no result. ScaNN pads a query whose searched leaves hold fewer than k datapoints with datapoint 0 and a NaN
    score; ``positions`` (a sliced build's datapoint -> block id, None: the same) maps the others."""
    rows, scores = np.array(rows, np.int64), np.array(scores, np.float32)  # [B, k] each, copies
    missing = np.isnan(scores)
    rows[missing], scores[missing] = -1, -np.inf
    if positions is not None:
        rows = np.where(rows >= 0, positions[np.maximum(rows, 0)], -1)
    return rows, scores


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
        self._exact_rows: np.ndarray | None = None  # float32 [num_blocks, dim], for int8 re-ordering
        self._positions: np.ndarray | None = None  # int32 [num_blocks]: block id of ScaNN's datapoint i

    def build(self, embeddings: np.ndarray) -> None:
        """Trains the tree and the quantiser on ``embeddings`` ([num_blocks, dim]) and indexes every row.

        A tree-AH index of more than ``SLICED_BUILD_FACTOR`` training samples' worth of blocks is built in
        slices: ScaNN trains its tree and quantisers on ``training_sample_size`` blocks drawn at random (as it
        would sample them itself) and indexes them, then the other blocks are added ``BUILD_SLICE`` at a time
        (ScaNN's ``upsert``). Its datapoints are then not in block order: ``positions`` maps them back. ScaNN's
        one-shot build holds a float copy of the whole matrix and its working sets for every block at once; the
        sliced one holds what the searcher keeps, plus one slice.
        """
        start = time.perf_counter()
        embeddings = mips_index.check_embeddings(embeddings)
        params = resolve_params(embeddings.shape[0], embeddings.shape[1], self.index_config)
        if params["mode"] == "tree_ah" and embeddings.shape[0] > SLICED_BUILD_FACTOR * params["training_sample_size"]:
            self._searcher, self._positions = self._build_in_slices(embeddings, params)
        else:
            builder = scann_ops_pybind.builder(embeddings, params["num_neighbors"], "dot_product")
            self._searcher = _configure(builder, params).set_n_training_threads(self.training_threads).build()
        if reorders_int8(params):
            self._exact_rows = embeddings
        if self.index_config.target_recall > 0 and params["mode"] == "tree_ah":
            params = self._tune(embeddings, params)
        self.params = params
        self._set_shape(*embeddings.shape)
        self.build_seconds = time.perf_counter() - start

    def _build_in_slices(self, embeddings: np.ndarray,
                         params: dict[str, Any]) -> tuple[scann_ops_pybind.ScannSearcher, np.ndarray]:
        """The sliced build of :meth:`build`: ``(searcher, positions int32 [num_blocks])``."""
        num_blocks = embeddings.shape[0]
        sample = np.sort(np.random.default_rng(0).choice(num_blocks, params["training_sample_size"], replace=False))
        builder = scann_ops_pybind.builder(mips_index.gather_rows(embeddings, sample), params["num_neighbors"],
                                           "dot_product")
        searcher = _configure(builder, params).set_n_training_threads(self.training_threads).build()
        searcher.reserve(num_blocks)  # ScaNN's arrays sized once, not grown (and copied) slice after slice
        rest = np.setdiff1d(np.arange(num_blocks), sample)  # [num_blocks - sample], ascending
        for first in range(0, len(rest), BUILD_SLICE):
            ids = rest[first:first + BUILD_SLICE]
            searcher.searcher.upsert([None] * len(ids), np.ascontiguousarray(embeddings[ids]), 256)
            artifacts.drop_mapped_pages(embeddings)
        return searcher, np.concatenate([sample, rest]).astype(np.int32)

    def _tune(self, embeddings: np.ndarray, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with the search settings :class:`scann_tuning.SearchTuner` measured fastest at
        ``index.target_recall``; brute force (and its searcher) instead when that is faster. Exact search is
        timed as blocked numpy matmuls over ``embeddings`` (``scann_tuning.exact_neighbours``), so no second
        float copy of the matrix is made unless brute force wins."""
        tuner = scann_tuning.SearchTuner(self.index_config.target_recall, self.index_config.tuning_queries)
        measured = _BlockIdSearcher(self._searcher, embeddings, params, self._positions)
        tuning = tuner.tune(measured, lambda q, k: scann_tuning.exact_neighbours(embeddings, q, k),
                            embeddings, params["num_leaves"])
        if tuning["mode"] == "brute_force":
            self._searcher = None  # freed before the exact searcher copies the matrix
            exact = scann_ops_pybind.builder(embeddings, params["num_neighbors"], "dot_product").score_brute_force()
            self._searcher, self._exact_rows = exact.set_n_training_threads(self.training_threads).build(), None
            self._positions = None
            return {"mode": "brute_force", "num_neighbors": params["num_neighbors"], "tuning": tuning}
        return {**params, "num_leaves_to_search": tuning["num_leaves_to_search"],
                "reorder_num_neighbors": tuning["reorder_num_neighbors"], "tuning": tuning}

    def search_batched(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Approximate top-``k`` rows (int64 ``[B, k]``) and inner products (float32 ``[B, k]``).

        Leaves searched and candidates re-ordered: :func:`search_settings`; with int8 re-ordering, ScaNN's best
        :func:`exact_rerank_depth` are re-scored exactly (:func:`rerank_exactly`). Should the searched leaves
        hold fewer than ``k`` blocks, missing slots are row -1 with score -inf.
        """
        self._require_built()
        queries = mips_index.check_queries(queries, k, self)  # [B, dim]
        batch = queries.shape[0]
        if batch == 0:
            return np.zeros([0, k], np.int64), np.zeros([0, k], np.float32)
        depth = exact_rerank_depth(self.params, k, self.num_blocks)
        leaves, pre_reorder = search_settings(self.params, k, self.num_blocks, depth)
        search = (self._searcher.search_batched_parallel if batch >= PARALLEL_MIN_BATCH
                  else self._searcher.search_batched)
        rows, scores = search(queries, final_num_neighbors=depth, pre_reorder_num_neighbors=pre_reorder,
                              leaves_to_search=leaves)
        rows, scores = block_results(rows, scores, self._positions)  # [B, <=depth] each
        if reorders_int8(self.params):
            if self._exact_rows is None:
                raise ValueError("an int8-re-ordered ScaNN index re-scores with the float rows: load it with "
                                 "ScannIndex.load(directory, embeddings=...)")
            rows, scores = rerank_exactly(queries, rows, self._exact_rows, k)
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
            if self._positions is not None:
                np.save(os.path.join(local, POSITIONS_NPY), self._positions)
            with open(os.path.join(local, _META), "w", encoding="utf-8") as f:
                json.dump({"kind": self.kind, "num_blocks": self.num_blocks, "dim": self.dim,
                           "params": self.params, "build_seconds": self.build_seconds}, f)

    @classmethod
    def load(cls, directory: str, embeddings: np.ndarray | None = None) -> "ScannIndex":
        """Loads a searcher written by :meth:`save` (``scann_ops_pybind.load_searcher``); ``embeddings``
        ``[num_blocks, dim]`` (e.g. memory-mapped) are the float rows an int8-re-ordered index re-scores with."""
        with mips_index.local_dir(directory, upload=False) as local:
            meta = read_meta(local)
            searcher = scann_ops_pybind.load_searcher(local, assets_backcompat_shim=False)
        index = cls()
        index._searcher = searcher
        index.params = meta["params"]
        index.build_seconds = float(meta.get("build_seconds", 0.0))
        index._set_shape(meta["num_blocks"], meta["dim"])
        index._exact_rows = embeddings
        index._positions = read_positions(directory)
        if searcher.size() != index.num_blocks:
            raise ValueError(f"{directory}: searcher holds {searcher.size()} datapoints, "
                             f"{_META} says {index.num_blocks}")
        return index


def search_settings(params: dict[str, Any], k: int, num_blocks: int,
                    results: int | None = None) -> tuple[int | None, int | None]:
    """``(leaves_to_search, pre_reorder_num_neighbors)`` of a top-``k`` search that asks ScaNN for ``results``
    (default k) neighbours (None: the searcher's own).

    Re-ordered candidates are ``max(reorder_num_neighbors, 4k)`` (at most num_blocks), so a ``k`` larger than
    the configured ``num_neighbors`` keeps a sensible depth; a tuned index (``params["tuning"]``) re-orders
    its measured depth for up to the ``k`` it was measured at, and proportionally more for a larger ``k``.
    Never fewer than the ``results`` asked for.
    """
    if params["mode"] != "tree_ah":
        return None, None
    reorder = params["reorder_num_neighbors"]
    tuning = params.get("tuning")
    if tuning:
        depth = max(reorder, math.ceil(reorder * k / tuning["recall_k"]))
    else:
        depth = max(reorder, 4 * k)
    return params["num_leaves_to_search"], max(min(num_blocks, depth), results or k)


def read_positions(directory: str) -> np.ndarray | None:
    """A sliced build's ``positions`` (int32 [num_blocks], block id of ScaNN's datapoint i), None when the
    datapoints are in block order."""
    path = os.path.join(directory, POSITIONS_NPY)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:
        return np.load(f, allow_pickle=False)


def read_meta(directory: str) -> dict[str, Any]:
    """What a :meth:`ScannIndex.save` directory records: ``num_blocks``, ``dim``, the resolved (and tuned)
    ``params``, ``build_seconds``."""
    with tf.io.gfile.GFile(os.path.join(directory, _META)) as f:
        return json.load(f)


def searcher_tensors(directory: str) -> dict[str, np.ndarray]:
    """ScaNN's searcher state under ``directory`` (written by :meth:`ScannIndex.save`), by
    :data:`SEARCHER_FIELDS` name, as its ``tensors_to_scann`` op takes it: the serialised protos as ``[1]`` byte
    strings, the arrays memory-mapped from their ``.npy`` files, and what the searcher lacks as a scalar
    ("absent", as ``scann_to_tensors`` emits it)."""
    with mips_index.local_dir(directory, upload=False) as local:
        out: dict[str, np.ndarray] = {}
        for name, file, dtype in SEARCHER_FIELDS:
            path = os.path.join(local, file)
            if dtype is None:
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        out[name] = np.array([f.read()], dtype=object)  # [1]
                else:
                    out[name] = np.array(b"", dtype=object)
            elif os.path.exists(path):
                out[name] = np.load(path, mmap_mode="r" if artifacts.is_local(directory) else None,
                                    allow_pickle=False)
            else:
                out[name] = np.zeros([], dtype.as_numpy_dtype)
        return out


def load_tf_searcher(directory: str) -> scann_ops.ScannSearcher:
    """ScaNN's TensorFlow-op searcher over a directory written by :meth:`ScannIndex.save`.

    scann 1.4.2 has no ``scann_ops.load_searcher``; its ``tensors_to_scann`` op, however, takes exactly the
    assets ``scann_ops_pybind`` serialises (:func:`searcher_tensors`), so the same directory serves both. Every
    call gets its own ``shared_name`` (the op's default, empty, name aliases all searchers of a process to the
    first one). The returned searcher's ``search_batched`` runs as a TF op (also inside ``tf.function``) and
    returns int32 rows and float32 scores; the rows are ScaNN's datapoint positions, which a sliced build's
    :func:`read_positions` maps to block ids (``in_graph_scann.InGraphScannSearcher`` does).
    """
    state = searcher_tensors(directory)
    tensors = [tf.constant(state[name], dtype or tf.string) for name, _, dtype in SEARCHER_FIELDS]
    # The op keeps its searcher in the resource manager under (container, shared_name); with the default empty
    # name every call would return the *first* searcher loaded in the process.
    return scann_ops.ScannSearcher(scann_ops.tensors_to_scann(*tensors, shared_name=f"scann-{uuid.uuid4()}"))
