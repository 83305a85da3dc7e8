"""A document's blocks of the REALM knowledge corpus: packing a tokenized document, and a block's tf.Example.

REALM's corpus is Wikipedia "greedily split into chunks of up to 288 BERT wordpieces" (Guu et al., 2020,
§4.1), each read as ``[CLS] title [SEP] body [SEP]``. :class:`realm_tf.data.block_packer.BlockPacker` decides
which wordpieces go to which block; :func:`pack_document` maps that layout back onto the document's text, so
that each block keeps the exact substring of the body it covers. ``beam_jobs/preprocess_corpus`` runs this per
document (no Beam here).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from realm_tf.data import block_packer
from realm_tf.data import corpus_reader
from realm_tf.data import example_schemas
from realm_tf.data import tokenized_text


@dataclasses.dataclass(frozen=True)
class Block:
    """One block of Z before it has its id; ``len(title_ids) + len(body_ids) + 3 <= max_block_length``."""

    uid: str  # example_schemas.block_uid(title, text)
    doc_id: str
    block_index: int  # position within the document
    title: str
    text: str  # exact substring of the document body
    title_ids: tuple[int, ...]  # int[<= max_title_length], the (truncated) title's wordpieces
    body_ids: tuple[int, ...]  # int[<= body budget]


@dataclasses.dataclass(frozen=True)
class PackedDocument:
    """A document's blocks, in order; ``content_hash`` orders documents for block ids."""

    content_hash: str
    source_lines: int  # input lines: the document and its merged duplicates
    blocks: tuple[Block, ...]


@dataclasses.dataclass(frozen=True)
class Sentence:
    """A tokenized sentence of a body: ``body[start:end]`` and its wordpieces."""

    start: int  # character offset in the body
    end: int
    ids: np.ndarray  # int32[num_pieces]
    byte_starts: np.ndarray  # int64[num_pieces]: UTF-8 byte offset of each piece in the sentence


def pack_document(doc: corpus_reader.Document, title_ids: np.ndarray, sentences: Sequence[Sentence],
                  packer: block_packer.BlockPacker, continuation: np.ndarray) -> list[Block]:
    """Packs a tokenized document into blocks (no Beam; the core of :class:`PackBlocks`).

    Block k covers the body from the first character of its first wordpiece to the first character of
    block k+1's (the body's start and end for the first and last block), whitespace trimmed; so the block
    texts, in order, are the body with only whitespace missing at the cuts, and characters without
    wordpieces (control characters) stay in the block before the cut. A cut inside a sentence uses the
    tokenizer's UTF-8 byte offsets; one character that normalises to several wordpieces ("…" -> ". . .")
    goes whole to the later block when a cut falls between its pieces.

    Args:
      doc: the document (its ``text`` is the body).
      title_ids: the title's wordpieces, ``int[num_title_pieces]`` (truncated here to the packer's limit).
      sentences: the body's sentences in order, tokenized.
      packer: the block packer (holds ``max_block_length``).
      continuation: ``bool[vocab_size]``, whether a vocabulary token is a ``##`` suffix piece.
    """
    word_starts = [~continuation[s.ids] for s in sentences]  # per sentence: bool[num_pieces]
    layout = packer.pack(len(title_ids), word_starts)
    kept_title = tuple(int(i) for i in title_ids[:packer.title_length(len(title_ids))])
    body = doc.text
    cuts = [0]
    for segments in layout[1:]:
        first = segments[0]
        sentence = sentences[first.sentence]
        cut = sentence.start
        if first.start > 0:
            byte_offset = int(sentence.byte_starts[first.start])
            to_char = tokenized_text.byte_to_char(body[sentence.start:sentence.end])
            cut += to_char(byte_offset) if to_char else byte_offset
        cuts.append(max(cut, cuts[-1]))
    cuts.append(len(body))
    blocks = []
    for index, segments in enumerate(layout):
        text = body[cuts[index]:cuts[index + 1]].strip()
        body_ids = tuple(np.concatenate([sentences[s.sentence].ids[s.start:s.end] for s in segments]).tolist())
        blocks.append(Block(uid=example_schemas.block_uid(doc.title, text), doc_id=doc.doc_id,
                            block_index=index, title=doc.title, text=text, title_ids=kept_title,
                            body_ids=body_ids))
    return blocks


def block_to_example(numbered: tuple[int, Block]) -> bytes:
    """``(block_id, Block)`` -> serialized tf.train.Example (``example_schemas.block_feature_spec``)."""
    block_id, block = numbered
    return example_schemas.to_example({
        example_schemas.BLOCK_ID: block_id,
        example_schemas.UID: block.uid,
        example_schemas.DOC_ID: block.doc_id,
        example_schemas.BLOCK_INDEX: block.block_index,
        example_schemas.TITLE: block.title,
        example_schemas.TEXT: block.text,
        example_schemas.TITLE_IDS: list(block.title_ids),
        example_schemas.BODY_IDS: list(block.body_ids),
    })
