"""The MIPS index implementations by ``index.kind``: the one table that builds (index builder) and loads
(the trainer's :class:`realm_tf.index.index_loader.IndexLoader`, serving) an index (REALM, Guu et al., 2020,
§3.4: the MIPS index only selects candidates; exact or approximate search are both valid choices)."""
from __future__ import annotations

import os

import numpy as np

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.index import brute_force_index
from realm_tf.index import index_publisher
from realm_tf.index import mips_index
from realm_tf.index import scann_index

#: ``kind`` (``index.kind``, recorded in index.json) → the MipsIndex class that builds and loads it.
INDEX_KINDS: dict[str, type[mips_index.MipsIndex]] = {
    scann_index.ScannIndex.kind: scann_index.ScannIndex,
    brute_force_index.BruteForceIndex.kind: brute_force_index.BruteForceIndex,
}


def index_class(kind: str) -> type[mips_index.MipsIndex]:
    """The MipsIndex class of ``kind`` (UserError listing the known kinds otherwise)."""
    if kind not in INDEX_KINDS:
        raise errors.UserError(f"unknown index kind {kind!r}; known: {sorted(INDEX_KINDS)}")
    return INDEX_KINDS[kind]


def load_index(kind: str, version_dir: str, searcher: str) -> mips_index.MipsIndex:
    """The ``kind`` index saved under ``version_dir/searcher`` (a published version's ``index.json`` names the
    subdirectory); an int8-re-ordered ScaNN index gets the version's embeddings, memory-mapped, to re-score
    with (:func:`scann_index.rerank_exactly`)."""
    directory = os.path.join(version_dir, searcher)
    if kind == scann_index.ScannIndex.kind and scann_index.reorders_int8(scann_index.read_meta(directory)["params"]):
        return scann_index.ScannIndex.load(directory, embeddings=index_publisher.map_embeddings(version_dir))
    return index_class(kind).load(directory)


def build_index(kind: str, index_config: config_lib.IndexConfig, embeddings: np.ndarray) -> mips_index.MipsIndex:
    """The ``kind`` index built over ``embeddings`` (``float32[num_blocks, dim]``, row i = block i)."""
    cls = index_class(kind)
    index = cls(index_config) if cls is scann_index.ScannIndex else cls()
    index.build(embeddings)
    return index
