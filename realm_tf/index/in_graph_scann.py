"""ScaNN as a TensorFlow resource that survives ``tf.saved_model.save``: MIPS inside a served graph.

REALM's Open-QA model (Guu et al., 2020, §4) retrieves from millions of blocks per question; served with
TF Serving, the search has to be part of the SavedModel. ScaNN's TF op searcher lives in a resource handle
that ``tf.saved_model`` cannot serialise by itself. :class:`InGraphScannSearcher` is a
``TrackableResource`` whose creator function rebuilds the handle from the searcher's assets (kept as
variables by ScaNN's own ``ScannState``) each time the SavedModel is loaded, so the serving signature calls
``scann_search_batched`` directly. A server (or any process) loading it must have ScaNN's custom ops
registered: ``import scann`` (Python), or TF Serving built/linked with ScaNN's op library.
"""
from __future__ import annotations

import uuid

import numpy as np
import tensorflow as tf
from scann.scann_ops.py import scann_ops

from realm_tf.index import scann_index

#: Every searcher resource of a served graph has its own name (a process may serve two versions at once);
#: a copied graph gets a new one (:func:`realm_tf.export.open_qa_export.publish_corpus_update`).
SHARED_NAME_PREFIX = "realm-scann-"


def fresh_shared_name() -> str:
    """A new name for a searcher resource: ``SHARED_NAME_PREFIX`` + a UUID (always the same length)."""
    return f"{SHARED_NAME_PREFIX}{uuid.uuid4()}"


class SearcherState(tf.Module):
    """ScaNN's searcher state (``scann_index.SEARCHER_FIELDS``) as variables of unknown shape, read straight from a
    searcher directory: ScaNN's own ``ScannState`` needs a built searcher to serialise (a second copy of every
    array) and keeps the shapes of the index it came from, which a served graph would then require of every
    later index."""

    def __init__(self, directory: str) -> None:
        super().__init__(name="scann_state")
        for name, tensor in scann_index.searcher_tensors(directory).items():
            dtype = dict((n, d) for n, _, d in scann_index.SEARCHER_FIELDS)[name] or tf.string
            setattr(self, name, tf.Variable(tensor, dtype=dtype, shape=tf.TensorShape(None), trainable=False))


class InGraphScannSearcher(tf.Module):
    """The ScaNN searcher saved under ``directory`` (:meth:`ScannIndex.save`) as a savable TF module.

    ``exact_scores``: whether the scores it returns are exact inner products (float re-ordering, or brute
    force); an int8-re-ordered searcher's are not, and its caller re-scores the best :meth:`depth` exactly.

    Args:
      directory: a ScaNN searcher directory (an index version's ``searcher/``).
    """

    def __init__(self, directory: str) -> None:
        super().__init__(name="in_graph_scann")
        self.state = SearcherState(directory)
        self._shared_name = fresh_shared_name()
        # Search settings (the tuned ones of index.target_recall, and a re-ordering depth of at least the results
        # asked for) are per-call overrides, as in ScannIndex.search_batched: scann_index.search_settings.
        meta = scann_index.read_meta(directory)
        self._num_blocks = int(meta["num_blocks"])
        self._params = meta["params"]
        positions = scann_index.read_positions(directory)  # a sliced build's datapoint -> block id
        positions = np.arange(self._num_blocks, dtype=np.int32) if positions is None else positions
        self.positions = tf.Variable(positions, dtype=tf.int32, shape=[None], trainable=False)  # [num_blocks]
        self.exact_scores = not scann_index.reorders_int8(meta["params"])

    def depth(self, k: int) -> int:
        """Results to ask of :meth:`search` for a top-``k`` after exact re-scoring
        (``scann_index.exact_rerank_depth``)."""
        return scann_index.exact_rerank_depth(self._params, k, self._num_blocks)

    def _handle(self) -> tf.Tensor:
        s = self.state
        return scann_ops.tensors_to_scann(*(getattr(s, name) for name, _, _ in scann_index.SEARCHER_FIELDS),
                                          shared_name=self._shared_name)

    def search(self, queries: tf.Tensor, k: int, depth: int | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """``(scores float32[batch, n], block_ids int32[batch, n])`` for ``queries float32[batch, dim]``: the top
        ``n = depth or k``, searched with the settings of a top-``k`` search (``scann_index.search_settings``; a
        re-ordering depth of at least n), as ``ScannIndex.search_batched`` searches.

        Where the searched leaves hold fewer than n blocks (ScaNN pads them with datapoint 0 and a NaN score), the
        missing slots repeat the query's best block with score -inf: a valid id to gather, and no weight in a
        softmax over the scores."""
        n = depth or k
        leaves, pre_reorder = scann_index.search_settings(self._params, k, self._num_blocks, n)
        leaves = -1 if leaves is None else leaves
        pre_reorder = -1 if pre_reorder is None else pre_reorder
        rows, scores = scann_ops.scann_search_batched(self._handle(), queries, n, pre_reorder, leaves, False)
        rows = tf.ensure_shape(rows, [None, None])  # [batch, <=n]: the op's outputs have no static shape
        scores = tf.ensure_shape(scores, [None, None])  # [batch, <=n]
        short = n - tf.shape(rows)[1]  # every query's list is as long as the longest one's
        rows = tf.pad(rows, [[0, 0], [0, short]])  # [batch, n]
        scores = tf.pad(scores, [[0, 0], [0, short]], constant_values=np.nan)  # [batch, n]
        found = tf.logical_not(tf.math.is_nan(scores))  # [batch, n]
        block_ids = tf.gather(self.positions, tf.cast(rows, tf.int32))  # [batch, n]
        block_ids = tf.where(found, block_ids, block_ids[:, :1])
        scores = tf.where(found, scores, tf.constant(-np.inf, scores.dtype))
        return tf.ensure_shape(scores, [None, n]), tf.ensure_shape(block_ids, [None, n])
