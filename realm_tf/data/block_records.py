"""The knowledge corpus Z on disk, read on demand: a served graph holds where each block is, not the blocks.

REALM's Open-QA model (Guu et al., 2020, §3.2, §4) reads the k retrieved blocks of a question out of 13,353,718
Wikipedia blocks. ORQA and REALM kept those blocks out of the model, in ``blocks.tfr``, and their served graph
(Lee et al., 2019, §9) looked them up by id. Here each block is one record (a ``tf.train.Example``: its title
and body text, their wordpieces and each wordpiece's UTF-8 byte span) in shard files of ``blocks_per_shard``
blocks; the graph keeps, per block, its record's shard, byte offset and length (20 bytes a block), and
reads the records of the blocks it was asked for with ``tf.io.read_file`` + ``tf.strings.substr``: a question
costs k shard reads, the corpus costs disk, not memory.

:class:`RecordWriter` writes the shards a slice at a time, from a :class:`~realm_tf.data.block_store.BlockStore`
(:func:`write_records`) or streamed from the block TFRecords (:func:`stream_records`, never holding the corpus).
:class:`BlockRecords` is the in-graph reader: a ``tf.Module`` whose first shard is a SavedModel asset (the
others sit beside it in ``assets/``), so a SavedModel that carries it loads from any directory.
:class:`EmbeddingRows` does the same for rows of Embed_doc (raw float32 shards), which a ScaNN searcher that
re-orders in int8 (Guo et al., 2020) re-scores its short list with: the served graph then holds ScaNN's
compressed state, not the float matrix (:class:`RecordCorpus`).
"""
from __future__ import annotations

import os
import sys
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tqdm

from realm_tf import artifacts
from realm_tf.data import block_store as block_store_lib
from realm_tf.data import knowledge_corpus
from realm_tf.layers import bert_tokenizer

#: The shard files: ``<directory>/block_records-<shard, 6 digits>``.
SHARD_PREFIX = "block_records-"
#: Embed_doc row shards: ``<directory>/block_embeddings-<shard, 6 digits>``.
EMBEDDING_PREFIX = "block_embeddings-"
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


class RecordIndex(NamedTuple):
    """Where each block's record is: block i is ``lengths[i]`` bytes at ``starts[i]`` of shard ``shards[i]``
    (each ``[num_blocks]``)."""
    shards: np.ndarray  # int32
    starts: np.ndarray  # int64
    lengths: np.ndarray  # int64


class RecordWriter:
    """Writes block records in the order they are given, ``blocks_per_shard`` a shard, into ``directory``
    (created), and remembers where each block id went. Blocks may come in any order; :meth:`index` checks that
    ids 0..N-1 each came once. Memory: one slice of blocks plus 20 bytes a block.

    Args:
      tokenizer: aligns the stored wordpieces with the text (``knowledge_corpus.byte_offsets``).
    """

    def __init__(self, directory: str, tokenizer: bert_tokenizer.BertTokenizer,
                 blocks_per_shard: int = DEFAULT_BLOCKS_PER_SHARD) -> None:
        if blocks_per_shard < 1:
            raise ValueError(f"blocks_per_shard must be >= 1, got {blocks_per_shard}")
        os.makedirs(directory, exist_ok=True)
        self.directory, self.tokenizer, self.blocks_per_shard = directory, tokenizer, blocks_per_shard
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (ids, starts, lengths) per add
        self._written, self._offset = 0, 0
        self._out: Any = None

    def add(self, block_ids: np.ndarray, titles: list[str], texts: list[str], title_ids: list[np.ndarray],
            body_ids: list[np.ndarray]) -> None:
        """Writes the records of ``block_ids int[n]`` (their titles, texts and wordpieces, n of each)."""
        title_starts, title_ends = knowledge_corpus.byte_offsets(self.tokenizer, titles, title_ids)
        body_starts, body_ends = knowledge_corpus.byte_offsets(self.tokenizer, texts, body_ids)
        n = len(block_ids)
        starts, lengths = np.zeros([n], np.int64), np.zeros([n], np.int64)
        for j in range(n):
            if self._written % self.blocks_per_shard == 0:
                self.close()
                path = shard_path(self.directory, self._written // self.blocks_per_shard)
                self._out, self._offset = open(path, "wb"), 0  # noqa: SIM115
            record = _example(titles[j], texts[j], {
                "title_ids": title_ids[j], "body_ids": body_ids[j], "title_starts": title_starts[j],
                "title_ends": title_ends[j], "body_starts": body_starts[j], "body_ends": body_ends[j]})
            self._out.write(record)
            starts[j], lengths[j] = self._offset, len(record)
            self._offset += len(record)
            self._written += 1
        self._parts.append((np.asarray(block_ids, np.int64), starts, lengths))

    def close(self) -> None:
        """Closes the shard being written (:meth:`index` does too)."""
        if self._out is not None:
            self._out.close()
            self._out = None

    def index(self, source: str) -> RecordIndex:
        """Closes the last shard; the :class:`RecordIndex` by block id (BlockStoreError naming ``source`` unless
        the ids given were 0..N-1 exactly once)."""
        self.close()
        column = lambda c: np.concatenate([p[c] for p in self._parts]) if self._parts else np.zeros([0], np.int64)
        order = block_store_lib.check_dense(column(0), source)  # [num_blocks]: where block i was written
        shards = (order // self.blocks_per_shard).astype(np.int32)
        return RecordIndex(shards, column(1)[order], column(2)[order])


def write_records(blocks: block_store_lib.BlockStore, tokenizer: bert_tokenizer.BertTokenizer, directory: str,
                  blocks_per_shard: int = DEFAULT_BLOCKS_PER_SHARD) -> RecordIndex:
    """Writes every block of ``blocks`` as a record in shards under ``directory`` (created), in id order. The
    byte spans of the wordpieces are those of :class:`~realm_tf.data.knowledge_corpus.KnowledgeCorpus` (the
    stored wordpieces aligned with the text)."""
    if blocks.titles is None or blocks.texts is None:
        raise ValueError(f"{blocks.source}: the block store has no text (load it with BlockStore.load)")
    writer = RecordWriter(directory, tokenizer, blocks_per_shard)
    try:
        for first in range(0, len(blocks), SLICE):
            ids = np.arange(first, min(first + SLICE, len(blocks)))
            writer.add(ids, [blocks.titles[i] for i in ids], [blocks.texts[i] for i in ids],
                       [blocks.title_ids(i) for i in ids], [blocks.body_ids(i) for i in ids])
    finally:
        writer.close()
    return writer.index(blocks.source)


def stream_records(pattern: str, tokenizer: bert_tokenizer.BertTokenizer, directory: str,
                   blocks_per_shard: int = DEFAULT_BLOCKS_PER_SHARD) -> RecordIndex:
    """:func:`write_records` straight from the block TFRecords matching ``pattern`` (``block_store.read_batches``),
    in file order, never holding the corpus: REALM's 13M blocks cost 20 bytes each in memory here."""
    writer = RecordWriter(directory, tokenizer, blocks_per_shard)
    progress = tqdm.tqdm(desc="block records", unit=" blocks", file=sys.stderr, mininterval=5.0)
    try:
        for batch in block_store_lib.read_batches(pattern, SLICE):
            pieces = [batch.pieces(i) for i in range(len(batch.block_ids))]
            writer.add(batch.block_ids, batch.titles, batch.texts, [t for t, _ in pieces], [b for _, b in pieces])
            progress.update(len(batch.block_ids))
    finally:
        writer.close()
        progress.close()
    return writer.index(pattern)


class BlockRecords(tf.Module):
    """Reads blocks' records from the shards of :func:`write_records`, inside the graph.

    Args:
      directory: the shards' directory (shard 0 becomes a SavedModel asset; a SavedModel that tracks this module
        needs the other shards copied beside it, into its ``assets/``: :meth:`copy_shards`).
      index: where :class:`RecordWriter` put each block.
    """

    def __init__(self, directory: str, index: RecordIndex, name: str = "block_records") -> None:
        super().__init__(name=name)
        if not len(index.shards) == len(index.starts) == len(index.lengths):
            raise ValueError(f"record index of {len(index.shards)} shards, {len(index.starts)} starts and "
                             f"{len(index.lengths)} lengths")
        self.directory = directory
        self.first_shard = tf.saved_model.Asset(shard_path(directory, 0))
        var = lambda value, dtype: tf.Variable(np.asarray(value), dtype=dtype, trainable=False, shape=[None])
        self.shards = var(index.shards, tf.int32)  # [num_blocks]
        self.starts = var(index.starts, tf.int64)  # [num_blocks] bytes
        self.lengths = var(index.lengths, tf.int64)  # [num_blocks] bytes

    @property
    def num_blocks(self) -> tf.Tensor:
        return tf.shape(self.starts)[0]

    def num_shards(self) -> int:
        return int(tf.reduce_max(self.shards)) + 1 if int(self.num_blocks) else 0

    def copy_shards(self, assets_dir: str, move: bool = False) -> None:
        """Copies (or, ``move``, renames) shards 1.. beside shard 0 in a SavedModel's ``assets/``
        (``tf.saved_model.save`` copied shard 0, the asset)."""
        _copy_files([(shard_path(self.directory, s), shard_path(assets_dir, s)) for s in range(1, self.num_shards())],
                    move)

    def read(self, block_ids: tf.Tensor) -> dict[str, Any]:
        """The records of ``block_ids int[n]``: ``title`` / ``text`` ``string[n]``, the wordpieces ``title_ids`` /
        ``body_ids`` ``int32[n, (len)]`` and their byte spans ``title_starts`` ... ``body_ends``
        ``int64[n, (len)]``."""
        ids = tf.cast(tf.reshape(block_ids, [-1]), tf.int64)  # [n]
        records = read_ranges(self.first_shard, SHARD_PREFIX, tf.gather(self.shards, ids), tf.gather(self.starts, ids),
                              tf.gather(self.lengths, ids))  # [n]
        parsed = tf.io.parse_example(records, FEATURES)
        for name in ("title_ids", "body_ids"):
            parsed[name] = tf.cast(parsed[name], tf.int32)
        return parsed


def write_embedding_rows(embeddings: np.ndarray, directory: str,
                         rows_per_shard: int = DEFAULT_BLOCKS_PER_SHARD) -> None:
    """Writes Embed_doc ``float32[num_blocks, dim]`` (e.g. memory-mapped) as raw little-endian rows,
    ``rows_per_shard`` rows a shard file, under ``directory`` (created), a shard at a time."""
    os.makedirs(directory, exist_ok=True)
    for shard, first in enumerate(range(0, embeddings.shape[0], rows_per_shard)):
        rows = np.ascontiguousarray(embeddings[first:first + rows_per_shard], dtype="<f4")  # [<=rows, dim]
        with open(embedding_shard_path(directory, shard), "wb") as f:
            f.write(rows.tobytes())
        if shard % 256 == 255:
            artifacts.drop_mapped_pages(embeddings)
    artifacts.drop_mapped_pages(embeddings)


def embedding_shard_path(directory: str, shard: int) -> str:
    """The path of Embed_doc shard number ``shard`` under ``directory``."""
    return os.path.join(directory, f"{EMBEDDING_PREFIX}{shard:0{SHARD_DIGITS}d}")


class EmbeddingRows(tf.Module):
    """Rows of Embed_doc read on demand from the shards of :func:`write_embedding_rows`, inside the graph: what an
    int8-re-ordered ScaNN searcher's short list is re-scored with, without the float matrix in memory.

    Args:
      directory: the shards' directory (shard 0 becomes a SavedModel asset, the others are copied beside it:
        :meth:`copy_shards`).
      num_blocks, dim: the matrix's shape.
    """

    def __init__(self, directory: str, num_blocks: int, dim: int, rows_per_shard: int = DEFAULT_BLOCKS_PER_SHARD,
                 name: str = "embedding_rows") -> None:
        super().__init__(name=name)
        self.directory, self.dim, self.rows_per_shard = directory, int(dim), int(rows_per_shard)
        self.first_shard = tf.saved_model.Asset(embedding_shard_path(directory, 0))
        self.num_rows = tf.Variable(num_blocks, dtype=tf.int64, trainable=False)

    def copy_shards(self, assets_dir: str, move: bool = False) -> None:
        """As :meth:`BlockRecords.copy_shards`."""
        shards = -(-int(self.num_rows) // self.rows_per_shard)
        _copy_files([(embedding_shard_path(self.directory, s), embedding_shard_path(assets_dir, s))
                     for s in range(1, shards)], move)

    def read(self, block_ids: tf.Tensor) -> tf.Tensor:
        """``float32[..., dim]``: the rows of ``block_ids int[...]``."""
        ids = tf.cast(tf.reshape(block_ids, [-1]), tf.int64)  # [n]
        row_bytes = tf.constant(self.dim * 4, tf.int64)
        rows = read_ranges(self.first_shard, EMBEDDING_PREFIX, ids // self.rows_per_shard,
                           (ids % self.rows_per_shard) * row_bytes, tf.fill(tf.shape(ids), row_bytes))  # [n]
        values = tf.io.decode_raw(rows, tf.float32, little_endian=True)  # [n, dim]
        return tf.reshape(values, tf.concat([tf.shape(block_ids), [self.dim]], 0))


def read_ranges(first_shard: tf.saved_model.Asset, prefix: str, shards: tf.Tensor, starts: tf.Tensor,
                lengths: tf.Tensor) -> tf.Tensor:
    """``string[n]``: ``lengths[i]`` bytes at ``starts[i]`` of shard ``shards[i]`` (``<prefix><shard>`` beside the
    asset ``first_shard``), each a ``tf.io.read_file`` + ``substr``; all arguments ``[n]``."""
    directory = tf.strings.regex_replace(first_shard.asset_path, "[^/]*$", "")
    names = tf.strings.as_string(shards, width=SHARD_DIGITS, fill="0")  # [n]
    paths = tf.strings.join([directory, prefix, names])  # [n]
    return tf.map_fn(lambda a: tf.strings.substr(tf.io.read_file(a[0]), a[1], a[2]), (paths, starts, lengths),
                     fn_output_signature=tf.TensorSpec([], tf.string))  # [n]


def _copy_files(pairs: list[tuple[str, str]], move: bool) -> None:
    """Copies (or, ``move``, renames) each (source, target)."""
    for source, target in pairs:
        try:
            if move:
                tf.io.gfile.rename(source, target, overwrite=True)
                continue
        except tf.errors.OpError:  # another file system: copied instead
            pass
        tf.io.gfile.copy(source, target, overwrite=True)


class RecordCorpus(knowledge_corpus.SearchableCorpus):
    """The knowledge corpus of a served model: the blocks read on demand, and search.

    The same interface as :class:`~realm_tf.data.knowledge_corpus.KnowledgeCorpus` (``title_ids``, ``body_ids``,
    ``title_text``, ``body_text``, ``span_text``, ``search``), so the Open-QA model reads either. Searched by
    ScaNN (``searcher``), it holds no float matrix: ScaNN's state is what stays in memory, and an int8-re-ordered
    searcher's short list is re-scored with rows read from disk (``rows``).

    Args:
      records: the blocks, as :class:`RecordWriter` wrote them.
      embeddings: ``float32[num_blocks, dim]``, held in memory for exact search (no ``searcher``).
      searcher: e.g. ``index/in_graph_scann.InGraphScannSearcher``.
      rows: Embed_doc read on demand (needed by a searcher without exact scores).
    """

    def __init__(self, records: BlockRecords, embeddings: np.ndarray | None = None, searcher: Any = None,
                 rows: EmbeddingRows | None = None, name: str = "knowledge_corpus") -> None:
        super().__init__(embeddings, int(records.num_blocks), records.directory, name=name, searcher=searcher)
        if searcher is not None and not getattr(searcher, "exact_scores", True) and rows is None:
            raise ValueError(f"{records.directory}: the searcher's scores are approximate: give the corpus the "
                             f"embedding rows to re-score with")
        self.records = records
        self.rows = rows

    @property
    def num_blocks(self) -> tf.Tensor:
        return self.records.num_blocks

    def block_embeddings(self, block_ids: tf.Tensor) -> tf.Tensor:
        """Rows of Embed_doc ``[..., dim]`` for ``block_ids [...]``: from memory, or read from disk."""
        if self.embeddings is not None:
            return tf.gather(self.embeddings, block_ids)
        if self.rows is None:
            raise ValueError(f"{self.records.directory}: this corpus keeps no Embed_doc rows (its searcher scores)")
        return self.rows.read(block_ids)

    def copy_shards(self, assets_dir: str, move: bool = False) -> None:
        """Copies (or moves) the record and row shards beside their first ones in a SavedModel's ``assets/``."""
        self.records.copy_shards(assets_dir, move)
        if self.rows is not None:
            self.rows.copy_shards(assets_dir, move)

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
