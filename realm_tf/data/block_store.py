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
from typing import Sequence

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

    @classmethod
    def load(cls, pattern: str, batch_size: int = 4096) -> "BlockStore":
        """Reads every block of the TFRecords matching ``pattern`` (BlockStoreError if ids are not dense)."""
        files = sorted(tf.io.gfile.glob(pattern))
        if not files:
            raise BlockStoreError(f"{pattern}: no block TFRecords match (run `realm-tf preprocess` first)")
        _check_manifest(os.path.dirname(files[0]))
        spec = example_schemas.block_feature_spec()
        keep = {k: spec[k] for k in (example_schemas.BLOCK_ID, example_schemas.UID, example_schemas.TITLE,
                                     example_schemas.TEXT, example_schemas.TITLE_IDS, example_schemas.BODY_IDS,
                                     example_schemas.DOC_ID)}
        rows: dict[int, tuple] = {}
        duplicates: list[int] = []
        dataset = tf.data.TFRecordDataset(files).batch(batch_size).map(lambda s: tf.io.parse_example(s, keep))
        try:
            for parsed in dataset:
                ids = parsed[example_schemas.BLOCK_ID].numpy()
                titles = parsed[example_schemas.TITLE_IDS].to_list()
                bodies = parsed[example_schemas.BODY_IDS].to_list()
                uids = parsed[example_schemas.UID].numpy()
                title_text = parsed[example_schemas.TITLE].numpy()
                body_text = parsed[example_schemas.TEXT].numpy()
                doc_ids = parsed[example_schemas.DOC_ID].numpy()
                for i, block_id in enumerate(ids.tolist()):
                    if block_id in rows:
                        duplicates.append(block_id)
                    rows[block_id] = (titles[i], bodies[i], uids[i].decode(), title_text[i].decode("utf-8"),
                                      body_text[i].decode("utf-8"), doc_ids[i].decode("utf-8"))
        except tf.errors.OpError as e:
            raise BlockStoreError(f"{pattern}: cannot read block records: {e.message}") from e
        num_blocks = len(rows)
        missing = [i for i in range(num_blocks) if i not in rows][:10]
        if duplicates or missing:
            raise BlockStoreError(f"{pattern}: block ids must be 0..N-1 exactly once; duplicated: "
                                  f"{sorted(set(duplicates))[:10]}, missing: {missing}")
        ordered = [rows[i] for i in range(num_blocks)]
        return cls([r[0] for r in ordered], [r[1] for r in ordered], [r[2] for r in ordered],
                   [r[3] for r in ordered], [r[4] for r in ordered], source=pattern,
                   doc_ids=[r[5] for r in ordered])

    def blocks_of_documents(self) -> dict[str, list[int]]:
        """Document id → its block ids in order (needs ``doc_ids``)."""
        if self.doc_ids is None:
            raise ValueError(f"{self.source}: the block store has no document ids (load it with BlockStore.load)")
        out: dict[str, list[int]] = {}
        for block_id, doc_id in enumerate(self.doc_ids):
            out.setdefault(doc_id, []).append(block_id)
        return out

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


def flatten_ragged(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged int rows → (int32 values, int64 row splits)."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    splits = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=splits[1:])
    values = np.fromiter((t for r in rows for t in r), dtype=np.int32, count=int(splits[-1]))
    return values, splits
