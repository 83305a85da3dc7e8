"""RETRO's chunk database in memory: what a retrieved neighbour contributes to the decoder (Borgeaud et al.,
2021, §2.3: "values store raw chunks of text tokens", the chunk N followed by its continuation F, r tokens).

Loaded from the chunk records of ``beam_jobs/build_chunk_database`` (row i = chunk id i, the row of the key
matrix its index was built on), as flat int32 arrays with row splits, plus each chunk's document (an ordinal
per distinct ``doc_id``) for excluding a training sequence's own document from its neighbours.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from realm_tf import errors
from realm_tf.data import block_store
from realm_tf.data import example_schemas


class ChunkStoreError(errors.UserError, ValueError):
    """The chunk records cannot be read, or their ids are not 0..N-1 exactly once."""


class ChunkStore:
    """The chunk database: per chunk id, its tokens, its continuation and its document.

    Args:
      tokens: per chunk, its m (or fewer) tokens.
      continuations: per chunk, the tokens after it in its document.
      doc_ids: per chunk, its document id.
      source: where the chunks came from (for messages).
    """

    def __init__(self, tokens: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                 doc_ids: Sequence[str], source: str = "<memory>") -> None:
        if not len(tokens) == len(continuations) == len(doc_ids):
            raise ValueError(f"{source}: {len(tokens)} chunks, {len(continuations)} continuations, "
                             f"{len(doc_ids)} doc ids")
        self.source = source
        self._tokens, self._token_splits = block_store.flatten_ragged(tokens)
        self._continuations, self._continuation_splits = block_store.flatten_ragged(continuations)
        self.doc_ids = list(doc_ids)
        ordinal: dict[str, int] = {}
        self.doc_index = np.fromiter((ordinal.setdefault(d, len(ordinal)) for d in self.doc_ids), np.int64,
                                     count=len(self.doc_ids))  # [num_chunks]: document ordinal per chunk
        self._doc_ordinal = ordinal

    @classmethod
    def load(cls, pattern: str) -> "ChunkStore":
        """Every chunk of the TFRecords matching ``pattern`` (ChunkStoreError unless ids are 0..N-1 once)."""
        files = sorted(tf.io.gfile.glob(pattern))
        if not files:
            raise ChunkStoreError(f"{pattern}: no chunk TFRecords match (run `realm-tf build-chunk-database`)")
        spec = example_schemas.chunk_feature_spec()
        rows: dict[int, tuple] = {}
        duplicates: list[int] = []
        dataset = tf.data.TFRecordDataset(files).batch(4096).map(lambda s: tf.io.parse_example(s, spec))
        try:
            for parsed in dataset:
                ids = parsed[example_schemas.CHUNK_ID].numpy().tolist()
                tokens = parsed[example_schemas.TOKENS].to_list()
                continuations = parsed[example_schemas.CONTINUATION].to_list()
                doc_ids = parsed[example_schemas.DOC_ID].numpy()
                for i, chunk_id in enumerate(ids):
                    if chunk_id in rows:
                        duplicates.append(chunk_id)
                    rows[chunk_id] = (tokens[i], continuations[i], doc_ids[i].decode("utf-8"))
        except tf.errors.OpError as e:
            raise ChunkStoreError(f"{pattern}: cannot read chunk records: {e.message}") from e
        missing = [i for i in range(len(rows)) if i not in rows][:10]
        if duplicates or missing:
            raise ChunkStoreError(f"{pattern}: chunk ids must be 0..N-1 exactly once; duplicated: "
                                  f"{sorted(set(duplicates))[:10]}, missing: {missing}")
        ordered = [rows[i] for i in range(len(rows))]
        return cls([r[0] for r in ordered], [r[1] for r in ordered], [r[2] for r in ordered], source=pattern)

    def __len__(self) -> int:
        return len(self.doc_ids)

    def extended(self, tokens: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                 doc_ids: Sequence[str]) -> "ChunkStore":
        """A store of this database's chunks followed by new ones (ids ``len(self)``, ``len(self) + 1``, ...)."""
        old = range(len(self))
        return ChunkStore([self.tokens(c) for c in old] + list(tokens),
                          [self.continuation(c) for c in old] + list(continuations),
                          self.doc_ids + list(doc_ids), source=f"{self.source} + {len(doc_ids)} new chunks")

    def document_of(self, doc_id: str) -> int:
        """The ordinal of ``doc_id`` in :attr:`doc_index`, or -1 for a document the database does not hold."""
        return self._doc_ordinal.get(doc_id, -1)

    def tokens(self, chunk_id: int) -> np.ndarray:
        """int32 tokens of chunk ``chunk_id``."""
        return self._tokens[self._token_splits[chunk_id]:self._token_splits[chunk_id + 1]]

    def continuation(self, chunk_id: int) -> np.ndarray:
        """int32 tokens that follow chunk ``chunk_id`` in its document."""
        return self._continuations[self._continuation_splits[chunk_id]:self._continuation_splits[chunk_id + 1]]

    def values(self, chunk_ids: np.ndarray, length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The neighbours' values [N, F] for ``chunk_ids`` (any shape; -1 = no neighbour): ``(int32 tokens,
        bool mask)``, each of shape ``chunk_ids.shape + [length]``, the chunk then its continuation, cut or
        padded (``pad_id``, mask False) to ``length`` (RETRO's r)."""
        flat = np.asarray(chunk_ids, np.int64).reshape(-1)  # [n]
        if flat.size and flat.max(initial=-1) >= len(self):
            raise IndexError(f"{self.source}: chunk ids up to {int(flat.max())} but the store holds {len(self)}: "
                             "the index was built from another chunk database")
        tokens = np.full([flat.size, length], pad_id, np.int32)  # [n, length]
        mask = np.zeros([flat.size, length], bool)  # [n, length]
        for row, chunk_id in enumerate(flat.tolist()):
            if chunk_id < 0:
                continue
            value = np.concatenate([self.tokens(chunk_id), self.continuation(chunk_id)])[:length]
            tokens[row, :value.size] = value
            mask[row, :value.size] = True
        shape = tuple(np.shape(chunk_ids)) + (length,)
        return tokens.reshape(shape), mask.reshape(shape)


def select_neighbours(candidates: np.ndarray, doc_index: np.ndarray, own_document: np.ndarray | int,
                      k: int, allowed: np.ndarray | None = None) -> np.ndarray:
    """The first ``k`` candidates of each query chunk that do not come from the query's own document.

    RETRO filters out, in training, neighbours that come from the training sequence's own document (else the
    model would learn to copy the continuation it is asked to predict). Args: ``candidates`` int64 ``[C, K']``
    chunk ids, best first (-1 for none); ``doc_index`` the database's document ordinal per chunk
    (``ChunkStore.doc_index``); ``own_document`` the ordinal per query chunk ``[C]`` (or one for all; -1 excludes
    nothing); ``allowed`` bool ``[num_chunks]``, the chunks the database may return (None: all; RETRO's
    evaluation keeps the held-out documents out of the database). Returns int64
    ``[C, k]``, -1 where fewer than ``k`` candidates remain.
    """
    candidates = np.asarray(candidates, np.int64)  # [C, K']
    own = np.broadcast_to(np.asarray(own_document, np.int64), candidates.shape[:1])  # [C]
    valid = candidates >= 0  # [C, K']
    docs = np.where(valid, np.asarray(doc_index)[np.where(valid, candidates, 0)], -2)  # [C, K']
    keep = valid & ((own[:, None] < 0) | (docs != own[:, None]))  # [C, K']
    if allowed is not None:
        keep &= np.asarray(allowed, bool)[np.where(valid, candidates, 0)]  # [C, K']
    out = np.full([candidates.shape[0], k], -1, np.int64)  # [C, k]
    for row in range(candidates.shape[0]):
        chosen = candidates[row][keep[row]][:k]
        out[row, :chosen.size] = chosen
    return out
