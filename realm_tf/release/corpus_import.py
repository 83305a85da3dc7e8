"""ORQA's released corpus as our blocks and a published index version (Lee et al., 2019; REALM, Guu et al., 2020).

ORQA's ``preprocessing/preprocess_wiki_extractor.py`` wrote, for its 13,353,718 blocks of the 2018-12-20 English
Wikipedia (``gs://orqa-data/enwiki-20181220``), ``blocks.tfr`` (record i: block i's text, UTF-8, its sentences
joined by spaces), ``titles.tfr`` (record i: the title of block i's page) and ``examples.tfr`` (the same,
tokenized). ``predict/encode_blocks.py`` wrote Embed_doc of block i (``[CLS] title [SEP] text [SEP]``, 288
wordpieces) as row i of the float32 variable ``block_emb`` [num_blocks, 128] of ``<retriever module>/encoded/
encoded.ckpt`` (``utils/scann_utils.write_array_to_checkpoint``); the fine-tuned ORQA and REALM models search it.
Block i here is record i there.

* :func:`import_blocks` writes ``blocks_dir`` as ``realm-tf preprocess`` does (``blocks-SSSSS-of-NNNNN.tfrecord``,
  ``example_schemas.block_feature_spec``, ``manifest.json`` last, published atomically), tokenizing title and
  text with our tokenizer. A page's consecutive blocks share its title as ``doc_id``.
* :func:`import_block_embeddings` copies ``block_emb`` in row slices (memory-mapped from a local checkpoint's data
  file, :mod:`tensor_bundle`; ``RestoreV2`` with a slice spec elsewhere) into the memory-mapped ``embeddings.npy``
  of the new version, builds the index over that map (``index.kind``: ScaNN's
  tree + anisotropic hashing above ``scann_index.TREE_MIN_BLOCKS`` blocks) and publishes the version with the
  same file moved in: the 6.8 GB matrix of 13.35M blocks is never held twice (ScaNN keeps its own copy of the
  dataset, as for every index built here, for exact re-scoring).
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import example_schemas
from realm_tf.index import index_kinds
from realm_tf.index import index_publisher
from realm_tf.layers import bert_tokenizer
from realm_tf.release import checkpoint_import
from realm_tf.release import tensor_bundle

logger = logging.getLogger(__name__)

#: The variable of ``encoded.ckpt`` holding the block embeddings (``orqa_model.retrieve``).
BLOCK_EMB = "block_emb"
BLOCKS_PREFIX = "blocks"
#: Progress is logged every this many blocks.
LOG_EVERY_BLOCKS = 100_000
#: Rows of ``block_emb`` read at a time (32 MB at 128 floats a row).
ROWS_PER_READ = 65_536


class CorpusImportError(errors.UserError, ValueError):
    """The released files do not fit together (counts, widths) or cannot be read; the message names them."""


def _vocabulary(tokenizer: bert_tokenizer.BertTokenizer) -> dict[str, Any]:
    """The manifest's record of the vocabulary the blocks were tokenized with."""
    config = tokenizer.get_config()
    return {"vocab_file": config["vocab_file"], "vocab_hash": tokenizer.vocab_hash, "lower_case": config["lower_case"]}


def _name_shards(directory: str, shards: Sequence[str]) -> list[str]:
    """Renames the hidden shards written in ``directory`` to their final ``blocks-i-of-n.tfrecord`` names."""
    names = [f"{BLOCKS_PREFIX}-{i:05d}-of-{len(shards):05d}.tfrecord" for i in range(len(shards))]
    for shard, name in zip(shards, names):
        tf.io.gfile.rename(shard, os.path.join(directory, name))
    return names


def _earlier_import(final: str, blocks_path: str, titles_path: str | None, vocab_hash: str) -> dict[str, Any] | None:
    """The manifest of ``final`` when an earlier run imported the same files with the same vocabulary; None when
    ``final`` holds no complete blocks.

    Raises:
      CorpusImportError: ``final`` holds other blocks.
    """
    if not artifacts.is_complete(final, artifacts.JOB_MANIFEST):
        return None
    manifest = artifacts.read_marker(final, artifacts.JOB_MANIFEST, "blocks directory")
    same = (manifest.get("source_blocks"), manifest.get("source_titles"), manifest.get("vocab_hash"))
    if same == (blocks_path, titles_path, vocab_hash):
        logger.info("%s: already holds the blocks of %s; kept", final, blocks_path)
        return manifest
    raise CorpusImportError(f"{final}: already holds other blocks (of {manifest.get('source_blocks')}); choose "
                            "another directory or delete it")


def import_blocks(blocks_path: str, blocks_dir: str, tokenizer: bert_tokenizer.BertTokenizer,
                  max_block_length: int, titles_path: str | None = None, blocks_per_shard: int = 100_000,
                  batch_size: int = 1024) -> dict[str, Any]:
    """Writes ORQA's ``blocks.tfr`` (and ``titles.tfr``) as our blocks in ``blocks_dir``; returns the manifest.

    Args:
      blocks_path: ``blocks.tfr``: one UTF-8 block text a record (any ``tf.io.gfile`` path).
      blocks_dir: the blocks directory to publish; when it already holds the blocks of the same files and
        vocabulary (an earlier run), they are kept and their manifest returned; other blocks are an error.
      tokenizer: the model's tokenizer (its vocabulary is recorded in the manifest).
      max_block_length: ``data.max_block_length``; blocks longer than this with [CLS]/[SEP]s (ORQA keeps a
        sentence longer than the limit whole) are kept as they are and counted (``over_length_blocks``): the
        readers cut them when packing, as ORQA's ``pad_or_truncate_pair`` did.
      titles_path: ``titles.tfr``, one title a record, as many as blocks; None: the blocks have no title.
      blocks_per_shard: records per output shard.
      batch_size: blocks tokenized at a time.
    """
    start = time.time()
    tokenize = tf.function(lambda text: tokenizer(text), reduce_retracing=True)
    final = blocks_dir.rstrip("/")
    earlier = _earlier_import(final, blocks_path, titles_path, tokenizer.vocab_hash)
    if earlier is not None:
        return earlier
    count, over_length, shards = 0, 0, []
    doc_id, block_index = "", 0
    with artifacts.staged(final, artifacts.JOB_MANIFEST) as staging:
        writer = None
        for titles, texts in _records(blocks_path, titles_path, batch_size):
            title_ids = tokenize(tf.constant(titles, tf.string)).to_list()
            body_ids = tokenize(tf.constant(texts, tf.string)).to_list()
            for title, text, t_ids, b_ids in zip(titles, texts, title_ids, body_ids):
                if count % blocks_per_shard == 0:
                    if writer is not None:
                        writer.close()
                    shards.append(os.path.join(staging.path, f".{BLOCKS_PREFIX}-{len(shards):05d}"))
                    writer = tf.io.TFRecordWriter(shards[-1])
                this_doc = title if titles_path else f"orqa-block-{count}"
                block_index = block_index + 1 if this_doc == doc_id else 0
                doc_id = this_doc
                over_length += len(t_ids) + len(b_ids) + 3 > max_block_length
                writer.write(example_schemas.to_example({
                    example_schemas.BLOCK_ID: count, example_schemas.UID: example_schemas.block_uid(title, text),
                    example_schemas.DOC_ID: doc_id, example_schemas.BLOCK_INDEX: block_index,
                    example_schemas.TITLE: title, example_schemas.TEXT: text, example_schemas.TITLE_IDS: t_ids,
                    example_schemas.BODY_IDS: b_ids}))
                count += 1
            if count // LOG_EVERY_BLOCKS != (count - len(texts)) // LOG_EVERY_BLOCKS:
                logger.info("import_blocks: %d blocks (%.0f/s)", count, count / max(time.time() - start, 1e-9))
        if writer is not None:
            writer.close()
        if not count:
            raise CorpusImportError(f"{blocks_path}: no records")
        names = _name_shards(staging.path, shards)
        staging.metadata = {
            "job": "import_realm_corpus", "source_blocks": blocks_path, "source_titles": titles_path,
            "blocks": count, "block_shards": names, "over_length_blocks": int(over_length),
            **_vocabulary(tokenizer), "max_block_length": max_block_length,
            "schema": sorted(example_schemas.block_feature_spec()), "seconds": round(time.time() - start, 1),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return artifacts.read_marker(final, artifacts.JOB_MANIFEST, "blocks directory")  # with its files' checksums


def block_emb_shape(block_emb_path: str) -> tuple[str, tuple[int, int]]:
    """``(checkpoint prefix, (num_blocks, dim))`` of ``block_emb`` (read from the index, no data): check it before
    importing the blocks, which takes far longer."""
    prefix = checkpoint_import.checkpoint_prefix(block_emb_path)
    shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    if BLOCK_EMB not in shapes or len(shapes[BLOCK_EMB]) != 2:
        raise CorpusImportError(f"{prefix}: no [num_blocks, dim] variable '{BLOCK_EMB}' (has: {sorted(shapes)[:10]})")
    rows, dim = (int(d) for d in shapes[BLOCK_EMB])
    return prefix, (rows, dim)


def import_block_embeddings(block_emb_path: str, index_dir: str, index_config: config_lib.IndexConfig,
                            vocab_hash: str, num_blocks: int, dim: int,
                            rows_per_read: int = ROWS_PER_READ) -> dict[str, Any]:
    """Publishes ``block_emb`` of ``block_emb_path`` (``encoded.ckpt``) as the next version of ``index_dir``.

    Args:
      block_emb_path: the checkpoint holding ``block_emb`` float32 [num_blocks, dim] (prefix or directory).
      index_dir: the versioned index root (local or gs://; the memory map is written to local disk).
      index_config: ``index.*``: the kind and ScaNN's settings (scaled to the corpus where 0).
      vocab_hash: the vocabulary of the blocks (recorded, so loaders refuse another one).
      num_blocks, dim: what the matrix must be: the blocks imported, the model's projection size.

    Returns the version's ``index.json`` content, with ``read_seconds``.
    """
    prefix, shape = block_emb_shape(block_emb_path)
    if shape != (num_blocks, dim):
        raise CorpusImportError(f"{prefix}: '{BLOCK_EMB}' is {list(shape)}, expected [{num_blocks}, {dim}] "
                                f"({num_blocks} blocks imported, projection size {dim})")
    local_root = (artifacts.local_path(index_dir) if artifacts.is_local(index_dir)
                  else tempfile.mkdtemp(prefix="realm-import-"))
    os.makedirs(local_root, exist_ok=True)
    matrix_file = os.path.join(local_root, f".import-{uuid.uuid4().hex[:12]}.npy")
    try:
        start = time.time()
        matrix = np.lib.format.open_memmap(matrix_file, mode="w+", dtype=np.float32, shape=shape)  # [n, dim]
        read = _row_reader(prefix, shape)
        for first in range(0, shape[0], rows_per_read):
            matrix[first:first + rows_per_read] = read(first, rows_per_read)
            matrix.flush()
            artifacts.drop_mapped_pages(matrix)  # written: out of this process's RSS (13.35M rows would hold 6.8 GB)
        del matrix
        matrix = np.load(matrix_file, mmap_mode="r")  # [num_blocks, dim], read-only, paged from disk
        read_seconds = time.time() - start
        index = index_kinds.build_index(index_config.kind, index_config, matrix)
        version, path = index_publisher.publish_next(
            index_dir, matrix, index, {"vocab_hash": vocab_hash, "source": prefix,
                                       "read_seconds": round(read_seconds, 3)},
            index_config.keep_versions, embeddings_file=matrix_file)
    except (tf.errors.OpError, OSError) as e:
        raise CorpusImportError(f"{prefix}: cannot read '{BLOCK_EMB}' into {index_dir}: {e}") from e
    finally:
        if os.path.exists(matrix_file):
            os.unlink(matrix_file)
        if not artifacts.is_local(index_dir):
            os.rmdir(local_root)
    logger.info("published index version %d (%s) at %s", version, index.kind, path)
    return index_publisher.read_index_json(path)


# ----------------------------------------------------------------------------------------------------------
# Implementation.


def _records(blocks_path: str, titles_path: str | None, batch_size: int) -> Iterator[tuple[list[str], list[str]]]:
    """``(titles, texts)`` batches of the two record files, read in step and decoded (invalid UTF-8 replaced);
    CorpusImportError when their counts differ. Without ``titles_path`` every title is ""."""
    def batches(path: str) -> Iterator[list[str]]:
        for batch in tf.data.TFRecordDataset(path, buffer_size=16 << 20).batch(batch_size):
            yield [record.decode("utf-8", "replace") for record in batch.numpy().tolist()]

    texts = batches(blocks_path)
    titles = batches(titles_path) if titles_path else None
    seen = 0
    try:
        for text_list in texts:
            title_list = next(titles, []) if titles is not None else [""] * len(text_list)
            if len(title_list) != len(text_list):
                raise CorpusImportError(f"{titles_path} has {seen + len(title_list)} records where {blocks_path} "
                                        f"has at least {seen + len(text_list)}: one title a block is expected")
            seen += len(text_list)
            yield title_list, text_list
        if titles is not None and next(titles, None) is not None:
            raise CorpusImportError(f"{titles_path} has more records than the {seen} of {blocks_path}")
    except tf.errors.OpError as e:
        raise CorpusImportError(f"{blocks_path} / {titles_path}: cannot read the records: {e.message}") from e


def _row_reader(prefix: str, shape: tuple[int, int]) -> Callable[[int, int], np.ndarray]:
    """``read(first, count)``: rows of ``block_emb``, memory-mapped from a local checkpoint's data file
    (:mod:`tensor_bundle`), else (gs://, or a bundle that reader does not know) through ``RestoreV2``."""
    rows = _mapped_block_emb(prefix)
    if rows is None:
        return lambda first, count: _read_rows(prefix, shape, first, count)

    def read(first: int, count: int) -> np.ndarray:
        out = np.array(rows[first:first + count])  # [count, dim], read from the file
        artifacts.drop_mapped_pages(rows)
        return out

    return read


def _mapped_block_emb(prefix: str) -> np.ndarray | None:
    """``block_emb`` memory-mapped from the checkpoint's data shard; None (logged) where that cannot be done."""
    if not artifacts.is_local(prefix):
        return None
    try:
        return tensor_bundle.memory_map(artifacts.local_path(prefix), BLOCK_EMB)  # [num_blocks, dim]
    except (tensor_bundle.BundleFormatError, KeyError, OSError) as e:
        logger.warning("%s: reading %s through TensorFlow (%s)", prefix, BLOCK_EMB, e)
        return None


def _read_rows(prefix: str, shape: tuple[int, int], first: int, count: int) -> np.ndarray:
    """Rows ``first .. first + count - 1`` of ``block_emb`` ``float32[rows, dim]`` through ``RestoreV2`` with a slice
    spec ``"<rows> <dim> <first>,<count>:-"`` (TensorFlow reads the whole tensor for it, and keeps it)."""
    count = min(count, shape[0] - first)
    spec = f"{shape[0]} {shape[1]} {first},{count}:-"
    return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[BLOCK_EMB], shape_and_slices=[spec],
                                dtypes=[tf.float32])[0].numpy()
