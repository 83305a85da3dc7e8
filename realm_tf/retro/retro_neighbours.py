"""The neighbours that condition RETRO's decoder, retrieved for every chunk of a sequence (Borgeaud et al., 2021,
§2.3: "retrieval is part of the input dataset pipeline").

A sequence of n tokens is split into n/m chunks; each chunk is keyed by the frozen BERT
(``retro/chunk_key_embedder``), the chunk index returns its nearest database chunks, neighbours from the
sequence's own document are dropped in training, and the first k that remain are read from the chunk database
as [N, F] token values of r tokens (``retro/chunk_store``). Chunk c's neighbours are computed from chunk c; the
decoder's chunked cross-attention applies the causal shift (tokens of chunk c + 1 attend them).

A database may also be restricted to some of its chunks (``allowed``): RETRO's evaluation protocol searches a
database of the training documents only, so that no held-out text is retrieved (§4, "no leakage").

Training and evaluation sequences are cut from the database's own documents at chunk boundaries, so each of
their chunks *is* a database chunk, whose key the index version already stores: :meth:`neighbours_of_chunks`
searches with those keys and embeds nothing (the frozen BERT's key of the same tokens is the same vector).
:meth:`neighbours` embeds new text (generation, prompts).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from realm_tf import config as config_lib
from realm_tf.index import mips_index
from realm_tf.retro import chunk_key_embedder
from realm_tf.retro import chunk_store as chunk_store_lib


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
      store: the chunk database (its row i is row i of the index; rows past the index's, e.g. held-out
        documents being scored, are never returned).
      index: the MIPS index over the database keys (a built or loaded ``MipsIndex``).
      embedder: the frozen chunk-key BERT (the one that keyed the database).
      cls_id / sep_id: the vocabulary's [CLS] and [SEP].
      keys: float32 ``[num_chunks, hidden]``, the key matrix the index was built on (for
        :meth:`neighbours_of_chunks`); None if only new text is searched.
      candidates: neighbours asked of the index per chunk before exclusion (default 4k; more are asked for the
        chunks where fewer than wanted remain).
    """

    def __init__(self, cfg: config_lib.ExperimentConfig, store: chunk_store_lib.ChunkStore,
                 index: mips_index.MipsIndex,
                 embedder: chunk_key_embedder.ChunkKeyEmbedder, cls_id: int, sep_id: int,
                 keys: np.ndarray | None = None, candidates: int | None = None) -> None:
        if keys is not None and keys.shape[0] != len(store):
            raise ValueError(f"{keys.shape[0]} keys for a database of {len(store)} chunks")
        self.chunk_length = cfg.retro.chunk_length
        self.value_length = cfg.retro.chunk_length + cfg.retro.continuation_length  # r
        self.k = cfg.retro.num_neighbours
        self.candidates = candidates or 4 * self.k
        self.store = store
        self.index = index
        self.embedder = embedder
        self.keys = keys
        self.cls_id, self.sep_id = cls_id, sep_id

    def neighbours(self, tokens: np.ndarray, doc_id: str | None = None, exclude_own_document: bool = True,
                   pad_id: int = 0, allowed: np.ndarray | None = None) -> Neighbours:
        """The neighbours of every whole chunk of ``tokens`` (int ``[n]``, n a multiple of m; a shorter tail is
        not a chunk), embedded with the frozen BERT. ``doc_id`` names the sequence's document; with
        ``exclude_own_document`` (training) its chunks are never neighbours; ``allowed`` (bool ``[num_chunks]``)
        restricts the database."""
        tokens = np.asarray(tokens)
        num_chunks = tokens.size // self.chunk_length
        chunks = tokens[:num_chunks * self.chunk_length].reshape(num_chunks, self.chunk_length)  # [C, m]
        own = self.store.document_of(doc_id) if (doc_id is not None and exclude_own_document) else -1
        chosen = self.nearest(self.embed(chunks), own, self.k, allowed)  # [C, k]
        return self.read(chosen, pad_id)

    def neighbours_of_chunks(self, chunk_ids: np.ndarray, exclude_own_document: bool = True, pad_id: int = 0,
                             allowed: np.ndarray | None = None, count: int | None = None) -> Neighbours:
        """The neighbours of database chunks ``chunk_ids`` (int ``[C]``), searched with their stored keys; with
        ``exclude_own_document`` none comes from the document of the chunk asked about. ``count`` neighbours
        (default k)."""
        if self.keys is None:
            raise ValueError("neighbours_of_chunks needs the database's key matrix (keys=)")
        chunk_ids = np.asarray(chunk_ids, np.int64).reshape(-1)  # [C]
        own = self.store.doc_index[chunk_ids] if exclude_own_document else -1
        chosen = self.nearest(self.keys[chunk_ids], own, count or self.k, allowed)  # [C, count]
        return self.read(chosen, pad_id)

    def embed(self, chunks: np.ndarray) -> np.ndarray:
        """float32 ``[C, hidden]`` keys of token chunks ``[C, m]`` (the frozen BERT, as the database was keyed)."""
        if len(chunks) == 0:
            return np.zeros([0, self.index.dim], np.float32)
        return self.embedder(chunk_key_embedder.pack_chunks(np.asarray(chunks).tolist(), self.cls_id,
                                                            self.sep_id)).numpy()

    def nearest(self, keys: np.ndarray, own_document: np.ndarray | int, count: int,
                allowed: np.ndarray | None = None) -> np.ndarray:
        """int64 ``[C, count]``: the nearest database chunks to ``keys`` ``[C, hidden]``, best first, outside
        ``own_document`` (an ordinal per key, or one; -1 excludes nothing) and inside ``allowed``; -1 where the
        database has fewer. Chunks short of ``count`` after exclusion are searched again, deeper."""
        own = np.broadcast_to(np.asarray(own_document, np.int64), [len(keys)])  # [C]
        chosen = np.full([len(keys), count], -1, np.int64)  # [C, count]
        todo = np.arange(len(keys))
        ask = max(self.candidates, count + 2)
        searchable = self.index.num_blocks  # the store may also hold chunks that are not in the index
        while todo.size:
            ask = min(ask, searchable)
            rows, _ = self.index.search_batched(keys[todo], ask)  # [T, ask] best first
            found = chunk_store_lib.select_neighbours(rows, self.store.doc_index, own[todo], count, allowed)
            chosen[todo] = found
            short = (found < 0).any(axis=1)
            if ask >= searchable or not short.any():
                break
            todo, ask = todo[short], ask * 4
        return chosen

    def read(self, chosen: np.ndarray, pad_id: int = 0) -> Neighbours:
        """The values ([N, F], r tokens) of the chunks ``chosen`` ``[C, k]``."""
        values, mask = self.store.values(chosen, self.value_length, pad_id)  # [C, k, r] each
        return Neighbours(chosen, values, mask)
