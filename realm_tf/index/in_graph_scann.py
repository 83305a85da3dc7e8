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
    """ScaNN's searcher tensors (``ScannState``) as variables of unknown shape: ScannState's variables keep the
    shape of the index they were built from, which a served graph would then require of every later index."""

    FIELDS = ("scann_config", "serialized_partitioner", "datapoint_to_token", "ah_codebook", "hashed_dataset",
              "int8_dataset", "int8_multipliers", "dp_norms", "dataset")

    def __init__(self, state: tf.Module) -> None:
        super().__init__(name="scann_state")
        for field in self.FIELDS:
            setattr(self, field, tf.Variable(getattr(state, field), shape=tf.TensorShape(None), trainable=False))


class InGraphScannSearcher(tf.Module):
    """The ScaNN searcher saved under ``directory`` (:meth:`ScannIndex.save`) as a savable TF module.

    Args:
      directory: a ScaNN searcher directory (an index version's ``searcher/``).
    """

    def __init__(self, directory: str) -> None:
        super().__init__(name="in_graph_scann")
        self.state = SearcherState(scann_index.load_tf_searcher(directory).serialize_to_module())
        self._shared_name = fresh_shared_name()
        # Search settings chosen at build time (index.target_recall) are per-call overrides, not in the
        # searcher's serialised config; an untuned searcher keeps its own (-1).
        meta = scann_index.read_meta(directory)
        self._num_blocks = int(meta["num_blocks"])
        self._params = meta["params"] if meta["params"].get("tuning") else None

    def _handle(self) -> tf.Tensor:
        s = self.state
        return scann_ops.tensors_to_scann(s.dataset, s.scann_config, s.serialized_partitioner, s.datapoint_to_token,
                                          s.ah_codebook, s.hashed_dataset, s.int8_dataset, s.int8_multipliers,
                                          s.dp_norms, shared_name=self._shared_name)

    def search(self, queries: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
        """``(scores float32[batch, k], block_ids int32[batch, k])`` for ``queries float32[batch, dim]``."""
        leaves, pre_reorder = -1, -1
        if self._params is not None:
            leaves, pre_reorder = scann_index.search_settings(self._params, k, self._num_blocks)
            leaves, pre_reorder = (-1 if leaves is None else leaves), (-1 if pre_reorder is None else pre_reorder)
        ids, scores = scann_ops.scann_search_batched(self._handle(), queries, k, pre_reorder, leaves, False)
        shape = [tf.shape(queries)[0], k]  # the op's outputs have no static rank
        return tf.reshape(scores, shape), tf.reshape(tf.cast(ids, tf.int32), shape)
