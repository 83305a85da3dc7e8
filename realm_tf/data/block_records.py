"""The knowledge corpus Z on disk, read on demand: a served graph holds where each block is, not the blocks.

REALM's Open-QA model (Guu et al., 2020, §3.2, §4) reads the k retrieved blocks of a question out of 13,353,718
Wikipedia blocks. ORQA and REALM kept those blocks out of the model, in ``blocks.tfr``, and their served graph
(Lee et al., 2019, §9) looked them up by id. Here each block is one record (a ``tf.train.Example``: its title
and body text, their wordpieces and each wordpiece's UTF-8 byte span) in shard files of ``blocks_per_shard``
blocks; the graph keeps, per block, the record's byte offset in its shard and its length (12 bytes a block), and
reads the records of the blocks it was asked for with ``tf.io.read_file`` + ``tf.strings.substr``: a question
costs k shard reads, the corpus costs disk, not memory.

:func:`write_records` writes the shards from a :class:`~realm_tf.data.block_store.BlockStore` a slice at a time.
:class:`BlockRecords` is the in-graph reader: a ``tf.Module`` whose first shard is a SavedModel asset (the
others sit beside it in ``assets/``), so a SavedModel that carries it loads from any directory.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from realm_tf.data import block_store as block_store_lib
from realm_tf.data import knowledge_corpus
from realm_tf.layers import bert_tokenizer

#: The shard files: ``<directory>/block_records-<shard, 6 digits>``.
SHARD_PREFIX = "block_records-"
SHARD_DIGITS = 6
#: Blocks a shard: a question's k reads each copy one shard (about 1 MB of 288-wordpiece blocks).
DEFAULT_BLOCKS_PER_SHARD = 256
#: Blocks tokenized (for the byte offsets) and serialized at a time.
SLICE = 1024

_RAGGED = ("title_ids", "body_ids", "title_starts", "title_ends", "body_starts", "body_ends")
FEATURES = {"title": tf.io.FixedLenFeature([], tf.string), "text": tf.io.FixedLenFeature([], tf.string),
            **{name: tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64) for name in _RAGGED}}


def shard_path(directory: str, shard: int) -> str:
    """The path of shard number ``shard`` under ``directory``."""
    return os.path.join(directory, f"{SHARD_PREFIX}{shard:0{SHARD_DIGITS}d}")


def _example(title: str, text: str, columns: dict[str, Any]) -> bytes:
    ints = lambda values: tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    feature = {"title": tf.train.Feature(bytes_list=tf.train.BytesList(value=[title.encode("utf-8")])),
               "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode("utf-8")])),
               **{name: ints(np.asarray(values, np.int64)) for name, values in columns.items()}}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_records(blocks: block_store_lib.BlockStore, tokenizer: bert_tokenizer.BertTokenizer, directory: str,
                  blocks_per_shard: int = DEFAULT_BLOCKS_PER_SHARD) -> tuple[np.ndarray, np.ndarray]:
    """Writes every block of ``blocks`` as a record in shards under ``directory`` (created).

    Returns ``(starts int64[num_blocks], lengths int64[num_blocks])``: each record's byte offset in its shard
    (block i is in shard ``i // blocks_per_shard``) and its size. The byte spans of the wordpieces are those of
    :class:`~realm_tf.data.knowledge_corpus.KnowledgeCorpus` (the stored wordpieces aligned with the text).
    """
    if blocks.titles is None or blocks.texts is None:
        raise ValueError(f"{blocks.source}: the block store has no text (load it with BlockStore.load)")
    if blocks_per_shard < 1:
        raise ValueError(f"blocks_per_shard must be >= 1, got {blocks_per_shard}")
    os.makedirs(directory, exist_ok=True)
    n = len(blocks)
    starts, lengths = np.zeros([n], np.int64), np.zeros([n], np.int64)
    out, offset = None, 0
    try:
        for first in range(0, n, SLICE):
            ids = range(first, min(first + SLICE, n))
            titles, texts = [blocks.titles[i] for i in ids], [blocks.texts[i] for i in ids]
            title_ids, body_ids = [blocks.title_ids(i) for i in ids], [blocks.body_ids(i) for i in ids]
            title_starts, title_ends = knowledge_corpus.byte_offsets(tokenizer, titles, title_ids)
            body_starts, body_ends = knowledge_corpus.byte_offsets(tokenizer, texts, body_ids)
            for j, i in enumerate(ids):
                if i % blocks_per_shard == 0:
                    if out is not None:
                        out.close()
                    out, offset = open(shard_path(directory, i // blocks_per_shard), "wb"), 0  # noqa: SIM115
                record = _example(titles[j], texts[j], {
                    "title_ids": title_ids[j], "body_ids": body_ids[j], "title_starts": title_starts[j],
                    "title_ends": title_ends[j], "body_starts": body_starts[j], "body_ends": body_ends[j]})
                out.write(record)
                starts[i], lengths[i], offset = offset, len(record), offset + len(record)
    finally:
        if out is not None:
            out.close()
    return starts, lengths


class BlockRecords(tf.Module):
    """Reads blocks' records from the shards of :func:`write_records`, inside the graph.

    Args:
      directory: the shards' directory (shard 0 becomes a SavedModel asset; a SavedModel that tracks this module
        needs the other shards copied beside it, into its ``assets/``: :meth:`copy_shards`).
      starts, lengths: from :func:`write_records`.
      blocks_per_shard: as written.
    """

    def __init__(self, directory: str, starts: np.ndarray, lengths: np.ndarray,
                 blocks_per_shard: int = DEFAULT_BLOCKS_PER_SHARD, name: str = "block_records") -> None:
        super().__init__(name=name)
        if len(starts) != len(lengths):
            raise ValueError(f"{len(starts)} starts but {len(lengths)} lengths")
        self.directory = directory
        self.first_shard = tf.saved_model.Asset(shard_path(directory, 0))
        var = lambda value, dtype, shape: tf.Variable(value, dtype=dtype, trainable=False, shape=shape)
        self.starts = var(np.asarray(starts, np.int64), tf.int64, [None])  # [num_blocks] bytes
        self.lengths = var(np.asarray(lengths, np.int64), tf.int64, [None])  # [num_blocks] bytes
        self.blocks_per_shard = var(blocks_per_shard, tf.int64, [])

    @property
    def num_blocks(self) -> tf.Tensor:
        return tf.shape(self.starts)[0]

    def num_shards(self) -> int:
        return -(-int(self.num_blocks) // int(self.blocks_per_shard.numpy()))

    def copy_shards(self, assets_dir: str, move: bool = False) -> None:
        """Copies (or, ``move``, renames) shards 1.. beside shard 0 in a SavedModel's ``assets/``
        (``tf.saved_model.save`` copied shard 0, the asset)."""
        for shard in range(1, self.num_shards()):
            source, target = shard_path(self.directory, shard), shard_path(assets_dir, shard)
            try:
                if move:
                    tf.io.gfile.rename(source, target, overwrite=True)
                    continue
            except tf.errors.OpError:  # another file system: copied instead
                pass
            tf.io.gfile.copy(source, target, overwrite=True)

    def read(self, block_ids: tf.Tensor) -> dict[str, Any]:
        """The records of ``block_ids int[n]``: ``title`` / ``text`` ``string[n]``, the wordpieces ``title_ids`` /
        ``body_ids`` ``int32[n, (len)]`` and their byte spans ``title_starts`` ... ``body_ends``
        ``int64[n, (len)]``."""
        ids = tf.cast(tf.reshape(block_ids, [-1]), tf.int64)  # [n]
        directory = tf.strings.regex_replace(self.first_shard.asset_path, "[^/]*$", "")
        shards = tf.strings.as_string(ids // self.blocks_per_shard, width=SHARD_DIGITS, fill="0")  # [n]
        paths = tf.strings.join([directory, SHARD_PREFIX, shards])  # [n]
        starts, lengths = tf.gather(self.starts, ids), tf.gather(self.lengths, ids)  # [n], [n]
        records = tf.map_fn(lambda a: tf.strings.substr(tf.io.read_file(a[0]), a[1], a[2]), (paths, starts, lengths),
                            fn_output_signature=tf.TensorSpec([], tf.string))  # [n]
        parsed = tf.io.parse_example(records, FEATURES)
        for name in ("title_ids", "body_ids"):
            parsed[name] = tf.cast(parsed[name], tf.int32)
        return parsed


class RecordCorpus(knowledge_corpus.SearchableCorpus):
    """The knowledge corpus of a served model: Embed_doc(z) and search in memory, the blocks read on demand.

    The same interface as :class:`~realm_tf.data.knowledge_corpus.KnowledgeCorpus` (``title_ids``, ``body_ids``,
    ``title_text``, ``body_text``, ``span_text``, ``search``), so the Open-QA model reads either.

    Args:
      embeddings: ``float32[num_blocks, dim]`` Embed_doc of block i in row i.
      records: the blocks, as :func:`write_records` wrote them.
    """

    def __init__(self, embeddings: np.ndarray, records: BlockRecords, name: str = "knowledge_corpus") -> None:
        super().__init__(embeddings, int(records.num_blocks), records.directory, name=name)
        self.records = records

    def title_text(self, block_ids: tf.Tensor) -> tf.Tensor:
        """Titles ``string[...]`` of ``block_ids int[...]``."""
        return tf.reshape(self.records.read(block_ids)["title"], tf.shape(block_ids))

    def body_text(self, block_ids: tf.Tensor) -> tf.Tensor:
        """Body texts ``string[...]`` of ``block_ids int[...]``."""
        return tf.reshape(self.records.read(block_ids)["text"], tf.shape(block_ids))

    def title_ids(self, block_ids: tf.Tensor) -> tf.RaggedTensor:
        """Title wordpieces ``int32[n, (len)]`` of ``block_ids int[n]``."""
        return self.records.read(block_ids)["title_ids"]

    def wordpieces(self, block_ids: tf.Tensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
        """``(title_ids, body_ids)`` of ``block_ids int[n]``, each ``int32[n, (len)]``: one read of the records."""
        read = self.records.read(block_ids)
        return read["title_ids"], read["body_ids"]

    def title_and_text(self, block_ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(titles, body texts)`` ``string[...]`` of ``block_ids int[...]``: one read of the records."""
        read = self.records.read(block_ids)
        return tf.reshape(read["title"], tf.shape(block_ids)), tf.reshape(read["text"], tf.shape(block_ids))

    def body_ids(self, block_ids: tf.Tensor) -> tf.RaggedTensor:
        """Body wordpieces ``int32[n, (len)]`` of ``block_ids int[n]``."""
        return self.records.read(block_ids)["body_ids"]

    def span_text(self, block_ids: tf.Tensor, in_title: tf.Tensor, first: tf.Tensor, last: tf.Tensor) -> tf.Tensor:
        """The original text of wordpieces ``first..last`` of each block's title (``in_title``) or body.

        All arguments ``[n]``; returns ``string[n]``. A piece index past the block's last piece takes the last.
        """
        read = self.records.read(block_ids)
        first, last = tf.cast(first, tf.int64), tf.cast(last, tf.int64)  # [n]

        def at(offsets: tf.RaggedTensor, index: tf.Tensor) -> tf.Tensor:  # offsets[i, index[i]], clipped to the row
            count = tf.cast(offsets.row_lengths(), tf.int64)  # [n]
            index = tf.clip_by_value(index, 0, tf.maximum(count - 1, 0))  # [n]
            flat = tf.concat([offsets.values, tf.zeros([1], tf.int64)], 0)  # an empty row reads the trailing 0
            position = tf.cast(offsets.row_starts(), tf.int64) + index  # [n]
            return tf.gather(flat, tf.where(count > 0, position, tf.size(offsets.values, tf.int64)))
        starts = tf.where(in_title, at(read["title_starts"], first), at(read["body_starts"], first))  # [n] bytes
        ends = tf.where(in_title, at(read["title_ends"], last), at(read["body_ends"], last))  # [n] bytes
        text = tf.where(in_title, read["title"], read["text"])  # [n]
        size = tf.cast(tf.strings.length(text), tf.int64)  # [n] bytes
        starts = tf.clip_by_value(starts, 0, size)  # [n]
        return tf.strings.substr(text, starts, tf.clip_by_value(ends - starts, 0, size - starts))
