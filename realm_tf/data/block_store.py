"""The knowledge corpus Z held in memory: each block's wordpieces, text and uid, addressed by block id.

REALM (Guu et al., 2020, §3.4) re-reads the top-k retrieved blocks of every query at every training step:
the MIPS index returns rows (= block ids), and the trainer needs those blocks' ``[CLS] title [SEP] body [SEP]``
wordpieces for Embed_doc and join_BERT(x, z), and their uid to exclude the query's own source block. Open-QA
(§4) needs the text too, to print the evidence. The blocks written by ``beam_jobs/preprocess_corpus`` are
loaded once into flat int32 arrays with row offsets (about 4 bytes a wordpiece: 13M blocks of REALM's
corpus would take ~10 GB; the bundled 11,567 take ~7 MB).
"""
from __future__ import annotations

import logging
import os
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from realm_tf import artifacts
from realm_tf import errors
from realm_tf.data import example_schemas

logger = logging.getLogger(__name__)


class BlockStoreError(errors.UserError, ValueError):
    """The block files are missing, unreadable or do not hold ids 0..N-1 exactly once."""


def _check_manifest(directory: str) -> None:
    """The blocks directory's manifest (the Beam job's marker, with every file's size and checksum) checked as
    every published artifact is on load: a damaged file is a BlockStoreError naming it. A directory without one
    (hand-made, or its manifest lost) is read unchecked, with a warning."""
    try:
        artifacts.read_marker(directory, artifacts.JOB_MANIFEST, "blocks directory")
    except FileNotFoundError:
        logger.warning("%s: no %s (not a complete output of realm-tf preprocess, or its manifest was lost): its "
                       "records are read unchecked", directory, artifacts.JOB_MANIFEST)
    except errors.UserError as e:
        raise BlockStoreError(str(e)) from e


class BlockStore:
    """Blocks by dense id: wordpieces (``title_ids``, ``body_ids``), ``uid``, ``title`` and ``text``.

    Build it with :meth:`load` (from block TFRecords) or directly from lists (tests).

    Args:
      title_ids: per block, its title wordpieces (block id = position).
      body_ids: per block, its body wordpieces.
      uids: per block, the uid (``example_schemas.block_uid``); duplicates share it.
      titles: per block, the title text (optional, for display).
      texts: per block, the body text (optional, for display).
      doc_ids: per block, the id of the document it was cut from (optional; Open-QA's gold passages).
      source: where the blocks came from (for messages).
    """

    def __init__(self, title_ids: Sequence[Sequence[int]], body_ids: Sequence[Sequence[int]],
                 uids: Sequence[str], titles: Sequence[str] | None = None, texts: Sequence[str] | None = None,
                 source: str = "<memory>", doc_ids: Sequence[str] | None = None) -> None:
        if not len(title_ids) == len(body_ids) == len(uids):
            raise ValueError(f"{source}: {len(title_ids)} titles, {len(body_ids)} bodies, {len(uids)} uids")
        self.source = source
        self._title_values, self._title_splits = flatten_ragged(title_ids)
        self._body_values, self._body_splits = flatten_ragged(body_ids)
        self.uids = np.asarray(list(uids), dtype=object)  # [num_blocks]
        self.titles = list(titles) if titles is not None else None
        self.texts = list(texts) if texts is not None else None
        self.doc_ids = list(doc_ids) if doc_ids is not None else None
        self._first_of_uid: dict[str, int] | None = None  # built on first use (first_block_of_uid)

    @classmethod
    def load(cls, pattern: str, batch_size: int = 4096) -> "BlockStore":
        """Reads every block of the TFRecords matching ``pattern`` (BlockStoreError if ids are not dense).

        The wordpieces go straight from each parsed batch into flat int32 arrays: no per-wordpiece Python
        object is made, so loading costs about what the store holds."""
        ids, uids, titles, texts, doc_ids = [], [], [], [], []
        title_parts: list[tuple[np.ndarray, np.ndarray]] = []
        body_parts: list[tuple[np.ndarray, np.ndarray]] = []
        for batch in read_batches(pattern, batch_size):
            ids.append(batch.block_ids)
            uids.extend(batch.uids)
            titles.extend(batch.titles)
            texts.extend(batch.texts)
            doc_ids.extend(batch.doc_ids)
            title_parts.append(batch.title_ids)
            body_parts.append(batch.body_ids)
        order = check_dense(np.concatenate(ids) if ids else np.zeros([0], np.int64), pattern)  # [num_blocks]
        store = cls([], [], [], source=pattern)
        store._title_values, store._title_splits = _reorder(title_parts, order)
        store._body_values, store._body_splits = _reorder(body_parts, order)
        store.uids = np.asarray([uids[i] for i in order], dtype=object)
        store.titles = [titles[i] for i in order]
        store.texts = [texts[i] for i in order]
        store.doc_ids = [doc_ids[i] for i in order]
        return store

    def blocks_of_documents(self) -> dict[str, list[int]]:
        """Document id → its block ids in order (needs ``doc_ids``)."""
        if self.doc_ids is None:
            raise ValueError(f"{self.source}: the block store has no document ids (load it with BlockStore.load)")
        out: dict[str, list[int]] = {}
        for block_id, doc_id in enumerate(self.doc_ids):
            out.setdefault(doc_id, []).append(block_id)
        return out

    def first_block_of_uid(self, uids: Sequence[str]) -> np.ndarray:
        """``int64 [len(uids)]``: for each uid, the first block that has it (duplicates share a uid), or -1 where
        none does. The lookup is built on the first call (the store's uids do not change after :meth:`load`)."""
        if self._first_of_uid is None:
            first: dict[str, int] = {}
            for block_id, uid in enumerate(self.uids.tolist()):
                first.setdefault(uid, block_id)
            self._first_of_uid = first
        return np.fromiter((self._first_of_uid.get(uid, -1) for uid in uids), np.int64, count=len(uids))

    def __len__(self) -> int:
        return len(self.uids)

    def title_ids(self, block_id: int) -> np.ndarray:
        """int32 wordpieces of block ``block_id``'s title."""
        return self._title_values[self._title_splits[block_id]:self._title_splits[block_id + 1]]

    def body_ids(self, block_id: int) -> np.ndarray:
        """int32 wordpieces of block ``block_id``'s body."""
        return self._body_values[self._body_splits[block_id]:self._body_splits[block_id + 1]]

    def check_ids(self, block_ids: np.ndarray) -> None:
        """IndexError naming the store when any id (other than the null document, < 0) is out of range."""
        bad = block_ids[(block_ids >= len(self))]
        if bad.size:
            raise IndexError(f"{self.source}: block ids {bad[:5].tolist()} out of range (store has {len(self)} "
                             f"blocks): the index was built from another corpus")


class BlockBatch(NamedTuple):
    """A batch of parsed block records, in file order: ``block_ids int64[n]``, ``uids``/``titles``/``texts``/
    ``doc_ids`` (n strings each), and the wordpieces as ``(int32 values, int64 row splits [n + 1])``."""
    block_ids: np.ndarray
    uids: list[str]
    titles: list[str]
    texts: list[str]
    doc_ids: list[str]
    title_ids: tuple[np.ndarray, np.ndarray]
    body_ids: tuple[np.ndarray, np.ndarray]

    def pieces(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(title_ids, body_ids)`` of the batch's ``i``-th block (views, not copies)."""
        (tv, ts), (bv, bs) = self.title_ids, self.body_ids
        return tv[ts[i]:ts[i + 1]], bv[bs[i]:bs[i + 1]]


def read_batches(pattern: str, batch_size: int = 4096) -> Iterator[BlockBatch]:
    """Streams the block records of the TFRecords matching ``pattern`` (files in name order), ``batch_size`` at
    a time; the manifest is checked first (:func:`_check_manifest`). Memory: one batch."""
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise BlockStoreError(f"{pattern}: no block TFRecords match (run `realm-tf preprocess` first)")
    _check_manifest(os.path.dirname(files[0]))
    spec = example_schemas.block_feature_spec()
    keep = {k: spec[k] for k in (example_schemas.BLOCK_ID, example_schemas.UID, example_schemas.TITLE,
                                 example_schemas.TEXT, example_schemas.TITLE_IDS, example_schemas.BODY_IDS,
                                 example_schemas.DOC_ID)}
    dataset = tf.data.TFRecordDataset(files).batch(batch_size).map(lambda s: tf.io.parse_example(s, keep))
    strings = lambda values: [v.decode("utf-8") for v in values.numpy().tolist()]
    ragged = lambda r: (r.values.numpy().astype(np.int32), r.row_splits.numpy().astype(np.int64))
    try:
        for parsed in dataset:
            yield BlockBatch(parsed[example_schemas.BLOCK_ID].numpy(), strings(parsed[example_schemas.UID]),
                             strings(parsed[example_schemas.TITLE]), strings(parsed[example_schemas.TEXT]),
                             strings(parsed[example_schemas.DOC_ID]), ragged(parsed[example_schemas.TITLE_IDS]),
                             ragged(parsed[example_schemas.BODY_IDS]))
    except tf.errors.OpError as e:
        raise BlockStoreError(f"{pattern}: cannot read block records: {e.message}") from e


def check_dense(block_ids: np.ndarray, source: str) -> np.ndarray:
    """The order that sorts ``block_ids`` (int64 [n], as read); BlockStoreError naming ``source`` unless they are
    0..n-1 exactly once."""
    n = len(block_ids)
    counts = np.bincount(block_ids[(block_ids >= 0) & (block_ids < n)], minlength=n) if n else np.zeros([0])
    if n and (counts.sum() != n or counts.max() != 1):
        duplicated = np.flatnonzero(counts > 1)[:10].tolist()
        missing = np.flatnonzero(counts == 0)[:10].tolist()
        raise BlockStoreError(f"{source}: block ids must be 0..N-1 exactly once; duplicated: {duplicated}, "
                              f"missing: {missing}")
    return np.argsort(block_ids, kind="stable")


def _reorder(parts: list[tuple[np.ndarray, np.ndarray]], order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ragged rows of ``parts`` (batches of (values, splits), concatenated) in ``order``: (int32 values, int64
    splits)."""
    if not parts:
        return np.zeros([0], np.int32), np.zeros([1], np.int64)
    lengths = np.concatenate([np.diff(splits) for _, splits in parts])  # [n] in file order
    starts = np.concatenate([splits[:-1] + offset for (_, splits), offset in
                             zip(parts, np.cumsum([0] + [len(v) for v, _ in parts[:-1]]))])  # [n]
    values = np.concatenate([v for v, _ in parts]).astype(np.int32)
    new_lengths = lengths[order]  # [n]
    splits = np.zeros([len(order) + 1], np.int64)
    np.cumsum(new_lengths, out=splits[1:])
    if np.array_equal(order, np.arange(len(order))):  # the files held the blocks in id order
        return values, splits
    # Output position j of row r comes from starts[order[r]] + (j - splits[r]).
    source = np.repeat(starts[order] - splits[:-1], new_lengths) + np.arange(splits[-1])
    return values[source], splits


def flatten_ragged(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged int rows → (int32 values, int64 row splits)."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    splits = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=splits[1:])
    values = np.fromiter((t for r in rows for t in r), dtype=np.int32, count=int(splits[-1]))
    return values, splits
