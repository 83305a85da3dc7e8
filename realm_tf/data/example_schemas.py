"""The one place where every TFRecord written by realm_tf is described.

REALM (Guu et al., 2020) reads three kinds of records:

* **blocks** of the knowledge corpus Z: ``[CLS] title [SEP] body [SEP]`` of at most 288 wordpieces (§4.1,
  "Knowledge corpus"), written by ``beam_jobs/preprocess_corpus``;
* **pre-training examples** x: a query of up to 96 wordpieces with one salient span masked (§3.4, "Salient
  span masking"), tagged with the uid of its source block for trivial-retrieval exclusion (§3.4, "Exclude
  trivial retrievals"), written by ``beam_jobs/generate_pretraining_data``;
* **ICT examples** (Lee et al., 2019): a sentence as pseudo-query and its block as positive context, with the
  sentence removed from the context with probability 0.9, written by ``beam_jobs/generate_ict_data``.

RETRO (Borgeaud et al., 2021) reads a fourth kind, the **chunks** of its retrieval database: m consecutive
wordpieces of a document and the r − m that follow them, written by ``beam_jobs/build_chunk_database``.

Token ids never include ``[CLS]``/``[SEP]``/padding: the trainer packs them with ``join_bert``. Positions in
``mask_positions`` index the query's own wordpieces (add 1 for the leading ``[CLS]``).
"""
from __future__ import annotations

import hashlib
from typing import Mapping, Sequence

import tensorflow as tf

# ---- blocks -----------------------------------------------------------------------------------------------
BLOCK_ID = "block_id"  # int64: dense, deterministic id, 0..num_blocks-1 (row of the embedding matrix)
UID = "uid"  # bytes: hex SHA1 of title + body text (block_uid); duplicates share it
DOC_ID = "doc_id"  # bytes: id of the source document (input's `id`, or a hash of its content)
BLOCK_INDEX = "block_index"  # int64: position of the block within its document (0, 1, ...)
TITLE = "title"  # bytes: UTF-8 title
TEXT = "text"  # bytes: UTF-8 body text of this block (an exact substring of the document body)
TITLE_IDS = "title_ids"  # int64[]: wordpieces of the title
BODY_IDS = "body_ids"  # int64[]: wordpieces of the body; len(title_ids) + len(body_ids) + 3 <= max length

# ---- pre-training examples --------------------------------------------------------------------------------
QUERY_TEXT = "query_text"  # bytes: the unmasked query text
QUERY_IDS = "query_ids"  # int64[]: wordpieces of x with the masked ones replaced by [MASK]
MASK_POSITIONS = "mask_positions"  # int64[]: indices into query_ids of the masked wordpieces
TARGET_IDS = "target_ids"  # int64[]: original wordpieces at mask_positions
SOURCE_UID = "source_uid"  # bytes: uid of the block the query was taken from
SOURCE_BLOCK_ID = "source_block_id"  # int64: block_id of that block
MASKING = "masking"  # bytes: b"salient" (one salient span) or b"random" (BERT-style fallback)
SPAN_LABEL = "span_label"  # bytes: label of the masked salient span (b"" for random masking)

# ---- RETRO chunks (Borgeaud et al., 2021, §2.3: the retrieval database) ----------------------------------
CHUNK_ID = "chunk_id"  # int64: dense, deterministic id, 0..num_chunks-1 (row of the key matrix)
CHUNK_INDEX = "chunk_index"  # int64: position of the chunk within its document's token stream (0, 1, ...)
TOKENS = "tokens"  # int64[<= m]: the chunk's wordpieces (only a document's last chunk is shorter than m)
CONTINUATION = "continuation"  # int64[<= r - m]: the wordpieces that follow it in the same document
# and DOC_ID (bytes): the document the chunk comes from (neighbours from the same document are excluded)

# ---- ICT examples -----------------------------------------------------------------------------------------
# QUERY_IDS (unmasked sentence), TITLE_IDS, BODY_IDS (the context), UID / BLOCK_ID of the block, and:
QUERY_REMOVED = "query_removed"  # int64: 1 when the sentence was removed from the context body


def block_uid(title: str, body: str) -> str:
    """REALM's block identity: SHA1 of title and body (the separator keeps ``("ab","c")`` != ``("a","bc")``)."""
    return hashlib.sha1(title.encode("utf-8") + b"\x1f" + body.encode("utf-8")).hexdigest()


def _bytes(values: Sequence[bytes]) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def _ints(values: Sequence[int]) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def to_example(features: Mapping[str, object]) -> bytes:
    """Serialises a dict of str / bytes / int / int-sequence values as a tf.train.Example."""
    out = {}
    for key, value in features.items():
        if isinstance(value, str):
            out[key] = _bytes([value.encode("utf-8")])
        elif isinstance(value, bytes):
            out[key] = _bytes([value])
        elif isinstance(value, int):
            out[key] = _ints([value])
        else:
            out[key] = _ints(value)  # a sequence of ints
    return tf.train.Example(features=tf.train.Features(feature=out)).SerializeToString(deterministic=True)


def chunk_feature_spec() -> dict[str, tf.io.FixedLenFeature | tf.io.RaggedFeature]:
    """Parsing spec of a RETRO chunk record."""
    return {
        CHUNK_ID: tf.io.FixedLenFeature([], tf.int64),
        DOC_ID: tf.io.FixedLenFeature([], tf.string),
        CHUNK_INDEX: tf.io.FixedLenFeature([], tf.int64),
        TOKENS: tf.io.RaggedFeature(tf.int64),
        CONTINUATION: tf.io.RaggedFeature(tf.int64),
    }


def block_feature_spec() -> dict[str, tf.io.FixedLenFeature | tf.io.RaggedFeature]:
    """Parsing spec of a block record."""
    return {
        BLOCK_ID: tf.io.FixedLenFeature([], tf.int64),
        UID: tf.io.FixedLenFeature([], tf.string),
        DOC_ID: tf.io.FixedLenFeature([], tf.string),
        BLOCK_INDEX: tf.io.FixedLenFeature([], tf.int64),
        TITLE: tf.io.FixedLenFeature([], tf.string),
        TEXT: tf.io.FixedLenFeature([], tf.string),
        TITLE_IDS: tf.io.RaggedFeature(tf.int64),
        BODY_IDS: tf.io.RaggedFeature(tf.int64),
    }


def pretraining_feature_spec() -> dict[str, tf.io.FixedLenFeature | tf.io.RaggedFeature]:
    """Parsing spec of a salient-span pre-training example."""
    return {
        QUERY_TEXT: tf.io.FixedLenFeature([], tf.string),
        QUERY_IDS: tf.io.RaggedFeature(tf.int64),
        MASK_POSITIONS: tf.io.RaggedFeature(tf.int64),
        TARGET_IDS: tf.io.RaggedFeature(tf.int64),
        SOURCE_UID: tf.io.FixedLenFeature([], tf.string),
        SOURCE_BLOCK_ID: tf.io.FixedLenFeature([], tf.int64),
        MASKING: tf.io.FixedLenFeature([], tf.string),
        SPAN_LABEL: tf.io.FixedLenFeature([], tf.string, default_value=b""),
    }


def ict_feature_spec() -> dict[str, tf.io.FixedLenFeature | tf.io.RaggedFeature]:
    """Parsing spec of an Inverse Cloze Task example."""
    return {
        QUERY_IDS: tf.io.RaggedFeature(tf.int64),
        TITLE_IDS: tf.io.RaggedFeature(tf.int64),
        BODY_IDS: tf.io.RaggedFeature(tf.int64),
        UID: tf.io.FixedLenFeature([], tf.string),
        BLOCK_ID: tf.io.FixedLenFeature([], tf.int64),
        QUERY_REMOVED: tf.io.FixedLenFeature([], tf.int64),
    }
