"""The neighbours that condition RETRO's decoder, retrieved for every chunk of a sequence (Borgeaud et al., 2021,
§2.3: "retrieval is part of the input dataset pipeline").

A sequence of n tokens is split into n/m chunks; each chunk is keyed by the frozen BERT
(``models/chunk_key_embedder``), the chunk index returns its nearest database chunks, neighbours from the
sequence's own document are dropped in training, and the first k that remain are read from the chunk database
as [N, F] token values of r tokens (``data/chunk_store``). Chunk c's neighbours are computed from chunk c; the
decoder's chunked cross-attention applies the causal shift (tokens of chunk c + 1 attend them).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from realm_tf import config as config_lib
from realm_tf.data import chunk_store as chunk_store_lib
from realm_tf.index import mips_index
from realm_tf.models import chunk_key_embedder


@dataclasses.dataclass(frozen=True)
class Neighbours:
    """A sequence's neighbours: ``chunk_ids`` int64 ``[C, k]`` (-1: none), ``tokens`` int32 ``[C, k, r]`` and
    ``mask`` bool ``[C, k, r]`` (False on padding and missing neighbours)."""

    chunk_ids: np.ndarray
    tokens: np.ndarray
    mask: np.ndarray


class RetroNeighbourRetriever:
    """Retrieves k neighbours per chunk of a token sequence from the chunk database.

    Args:
      cfg: ``retro.chunk_length`` (m), ``retro.continuation_length`` (r − m), ``retro.num_neighbours`` (k).
      store: the chunk database (its row i is row i of the index).
      index: the MIPS index over the database keys (a built or loaded ``MipsIndex``).
      embedder: the frozen chunk-key BERT (the one that keyed the database).
      cls_id / sep_id: the vocabulary's [CLS] and [SEP].
      candidates: neighbours asked of the index per chunk before same-document exclusion (default 4k).
    """

    def __init__(self, cfg: config_lib.ExperimentConfig, store: chunk_store_lib.ChunkStore,
                 index: mips_index.MipsIndex,
                 embedder: chunk_key_embedder.ChunkKeyEmbedder, cls_id: int, sep_id: int,
                 candidates: int | None = None) -> None:
        self.chunk_length = cfg.retro.chunk_length
        self.value_length = cfg.retro.chunk_length + cfg.retro.continuation_length  # r
        self.k = cfg.retro.num_neighbours
        self.candidates = candidates or 4 * self.k
        self.store = store
        self.index = index
        self.embedder = embedder
        self.cls_id, self.sep_id = cls_id, sep_id

    def neighbours(self, tokens: np.ndarray, doc_id: str | None = None, exclude_own_document: bool = True,
                   pad_id: int = 0) -> Neighbours:
        """The neighbours of every whole chunk of ``tokens`` (int ``[n]``, n a multiple of m; a shorter tail is
        not a chunk). ``doc_id`` names the sequence's document; with ``exclude_own_document`` (training) its
        chunks are never neighbours."""
        tokens = np.asarray(tokens)
        num_chunks = tokens.size // self.chunk_length
        chunks = tokens[:num_chunks * self.chunk_length].reshape(num_chunks, self.chunk_length)  # [C, m]
        if num_chunks == 0:
            empty = np.zeros([0, self.k], np.int64)
            values, mask = self.store.values(empty, self.value_length, pad_id)
            return Neighbours(empty, values, mask)
        keys = self.embedder(chunk_key_embedder.pack_chunks(chunks.tolist(), self.cls_id, self.sep_id)).numpy()
        rows, _ = self.index.search_batched(keys, min(self.candidates, len(self.store)))  # [C, K'] best first
        own = self.store.document_of(doc_id) if (doc_id is not None and exclude_own_document) else -1
        chosen = chunk_store_lib.select_neighbours(rows, self.store.doc_index, own, self.k)  # [C, k]
        values, mask = self.store.values(chosen, self.value_length, pad_id)  # [C, k, r] each
        return Neighbours(chosen, values, mask)
