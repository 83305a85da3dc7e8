"""The chunks of RETRO's retrieval database, cut from the documents of the REALM knowledge corpus.

RETRO (Borgeaud et al., 2021, §2.3) splits every document of its database into chunks of m = 64 tokens; a
chunk's key is the frozen BERT embedding of the chunk, its value the chunk followed by its continuation in the
document, r = 128 tokens in all. Here a document's token stream is its body wordpieces: the concatenation of
its blocks' ``body_ids`` in ``block_index`` order, which is exactly the document's wordpieces (the block packer
drops none, ``realm_tf/data/block_packer.py``). Nothing here uses Beam; ``beam_jobs/build_chunk_database`` runs
it per document.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Iterable, Sequence

from realm_tf.data import example_schemas


class DuplicateBlockIndexError(ValueError):
    """Two blocks of one document claim the same position: the document's token stream is ambiguous."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Chunk ``chunk_index`` of document ``doc_id``: ``tokens`` (m, fewer only at the document's end) and the
    ``continuation`` tokens that follow it in the document (up to r − m)."""

    doc_id: str
    chunk_index: int
    tokens: tuple[int, ...]  # int[<= m]
    continuation: tuple[int, ...]  # int[<= r - m]


@dataclasses.dataclass(frozen=True)
class ChunkedDocument:
    """A document's chunks, in order; ``doc_key`` (SHA1 of the doc id) orders documents for chunk ids."""

    doc_key: str
    num_tokens: int
    chunks: tuple[Chunk, ...]


def document_tokens(blocks: Iterable[tuple[int, Sequence[int]]]) -> list[int]:
    """A document's token stream from its blocks' ``(block_index, body_ids)``, in any order.

    Raises:
      DuplicateBlockIndexError: two blocks with the same ``block_index``.
    """
    ordered = sorted(blocks, key=lambda b: b[0])
    indices = [index for index, _ in ordered]
    if len(set(indices)) != len(indices):
        raise DuplicateBlockIndexError(f"block_index values {indices}")
    return [int(t) for _, ids in ordered for t in ids]


def chunk_document(doc_id: str, tokens: Sequence[int], chunk_length: int,
                   continuation_length: int) -> ChunkedDocument:
    """Cuts a token stream into consecutive chunks of ``chunk_length`` (the last one may be shorter), each with
    the next ``continuation_length`` tokens of the same document. Every token is in exactly one chunk."""
    if chunk_length < 1 or continuation_length < 0:
        raise ValueError(f"chunk_length={chunk_length}, continuation_length={continuation_length}")
    tokens = tuple(int(t) for t in tokens)
    chunks = tuple(
        Chunk(doc_id=doc_id, chunk_index=i // chunk_length, tokens=tokens[i:i + chunk_length],
              continuation=tokens[i + chunk_length:i + chunk_length + continuation_length])
        for i in range(0, len(tokens), chunk_length))
    return ChunkedDocument(doc_key(doc_id), len(tokens), chunks)


def doc_key(doc_id: str) -> str:
    """The SHA1 hex of a document id: the order of documents in the chunk ids."""
    return hashlib.sha1(doc_id.encode("utf-8")).hexdigest()


def chunk_to_example(numbered: tuple[int, Chunk]) -> bytes:
    """``(chunk_id, Chunk)`` -> serialized tf.train.Example (``example_schemas.chunk_feature_spec``)."""
    chunk_id, chunk = numbered
    return example_schemas.to_example({
        example_schemas.CHUNK_ID: chunk_id,
        example_schemas.DOC_ID: chunk.doc_id,
        example_schemas.CHUNK_INDEX: chunk.chunk_index,
        example_schemas.TOKENS: list(chunk.tokens),
        example_schemas.CONTINUATION: list(chunk.continuation),
    })
