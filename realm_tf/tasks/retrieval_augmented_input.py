"""The trainer's tf.data input pipeline for REALM pre-training, with retrieval inside it (Guu et al., 2020, §3.4).

For every batch of salient-span-masked queries x the pipeline, running ahead of the trainer (prefetch):

1. asks the :class:`~realm_tf.index.index_loader.IndexLoader` for the newest published index version (it
   hot-swaps when the asynchronous index builder publishes one, or a corpus update does; no restart), with
   the blocks of the corpus version it was built over;
2. embeds the masked queries with **Embed_input of the export that built that index version** (the
   ``embed_query_ids`` signature of ``export_dir/<version>/``), so queries and blocks are in one embedding
   space;
3. searches the index, drops the query's own source block ("exclude trivial retrievals") and prepends the
   null document (:class:`~realm_tf.data.candidate_selection.CandidateSelector`);
4. gathers the k candidates' wordpieces from the :class:`~realm_tf.data.block_store.BlockStore` and packs
   ``[CLS] title [SEP] body [SEP]`` for Embed_doc and join_BERT(x, title [SEP] body) for the reader, in the
   graph with the same ``join_bert`` the exports use.

Each batch carries the index version it used and how old that version's export was when the batch was
retrieved, so the trainer can report the off-policy delay (steps and seconds between the Embed_doc that chose
the candidates and the current weights) without reading a clock inside its compiled step.

Elements (``static_padding`` pads to the configured lengths; otherwise to the batch's longest row):
  ``query_*`` ``int32[batch, query_len]``, ``candidates_*`` ``int32[batch, k, block_len]``,
  ``reader_*`` ``int32[batch, k, reader_len]``, ``masked_positions`` / ``target_ids`` ``int32[batch, masked]``,
  ``target_weights`` ``float32[batch, masked]``, ``candidate_ids`` ``int64[batch, k]`` (-1 = null document),
  ``source_column`` ``int32[batch]`` (the candidate that is the query's own source block, -1 where none is),
  ``index_version`` ``int64[batch]``, ``index_export_step`` ``int64[batch]`` (the step of the export that
  embedded its blocks), ``index_age_seconds`` ``float32[batch]`` (seconds from that export to this batch's
  retrieval, on the host's clock; the few prefetched batches' wait is not in it). No element is a string or
  float64, which an XLA device cannot hold.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import tensorflow as tf

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import block_store as block_store_lib
from realm_tf.data import candidate_selection
from realm_tf.data import example_schemas
from realm_tf.export import retriever_export
from realm_tf.index import index_loader as index_loader_lib
from realm_tf.index import index_publisher
from realm_tf.layers import bert_tokenizer

logger = logging.getLogger(__name__)

#: Retrieved batches buffered ahead of the trainer.
PREFETCH_BATCHES = 2

QueryEmbedFn = retriever_export.QueryEmbedFn


@dataclasses.dataclass
class PipelineStats:
    """What the pipeline did so far (read by the trainer for logging and by tests)."""

    batches: int = 0
    excluded_source_blocks: int = 0  # retrieved blocks dropped because they were the query's own source
    trivial_retrievals_kept: int = 0  # source blocks left among the candidates (``trivial_retrieval_rate``)
    sources_forced: int = 0  # queries whose source block was put among their candidates (``force_source``)
    retrieval_seconds: float = 0.0  # embedding queries + search + gathering, summed
    versions: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # batches per version


class RetrievalAugmentedInput:
    """Builds the retrieval-augmented pre-training dataset around an IndexLoader and a BlockStore.

    Args:
      cfg: the experiment config (model lengths, k, data batching).
      loader: serves the newest complete index version; refreshed between batches.
      blocks: the knowledge corpus the index rows point into; None: the blocks the loader serves with each
        version (an ``IndexLoader`` with a ``blocks_dir``), so that a corpus update is picked up too.
      tokenizer: packs ids (``join_bert``); only its special-token ids and packing are used.
      query_embedder_for: ``(version, index.json metadata) -> QueryEmbedFn``; default: load the
        ``embed_query_ids`` signature of the export recorded in index.json (cached per version).
    """

    def __init__(self, cfg: config_lib.ExperimentConfig, loader: index_loader_lib.IndexLoader,
                 blocks: block_store_lib.BlockStore | None, tokenizer: bert_tokenizer.BertTokenizer,
                 query_embedder_for: Callable[[int, Mapping[str, Any]], tuple[QueryEmbedFn, float]] | None = None):
        self.cfg = cfg
        self.loader = loader
        self.blocks = blocks
        self.tokenizer = tokenizer
        self.stats = PipelineStats()
        self._query_embedder_for = query_embedder_for or functools.partial(retriever_export.load_query_embedder,
                                                                           export_dir=cfg.refresh.export_dir)
        self._embedders: dict[int, tuple[QueryEmbedFn, float]] = {}
        self._lock = threading.Lock()
        served = self.loader.snapshot()
        if blocks is None and served.blocks is None:
            raise ValueError(f"{loader.index_dir}: no blocks given and the index loader has no blocks_dir")
        if blocks is not None and served.index.num_blocks != len(blocks):
            raise errors.UserError(f"{loader.index_dir}: index has {served.index.num_blocks} blocks but "
                                   f"{blocks.source} has {len(blocks)}: the index was built from another corpus")

    # ---- the dataset ------------------------------------------------------------------------------------

    def dataset(self, file_pattern: str, batch_size: int, input_context: tf.distribute.InputContext | None = None,
                repeat: bool = True, seed: int | None = None, shuffle: bool = True,
                split: Callable[[Mapping[str, tf.Tensor]], tf.Tensor] | None = None,
                trivial_retrieval_rate: float = 0.0, force_source: bool = False) -> tf.data.Dataset:
        """Retrieval-augmented batches of ``batch_size`` pre-training examples from ``file_pattern``.

        Args:
          input_context: under tf.distribute, shards the examples across input pipelines (workers).
          split: ``parsed record -> bool[]`` keeping only some examples (train / held-out).
          trivial_retrieval_rate: fraction of queries (drawn with ``seed``) that keep their own source block
            among the candidates; 0 excludes every trivial retrieval (REALM §3.4).
          force_source: those queries have their source block forced in as candidate 1, instead of kept where
            the search ranked it (a copying control: every one of them can read the masked span).
        """
        if not 0.0 <= trivial_retrieval_rate <= 1.0:
            raise ValueError(f"trivial_retrieval_rate={trivial_retrieval_rate}: must be in [0, 1]")
        files = sorted(tf.io.gfile.glob(file_pattern))
        if not files:
            raise FileNotFoundError(f"no pre-training records match {file_pattern!r} "
                                    f"(run `realm-tf generate-pretraining-data`)")
        spec = example_schemas.pretraining_feature_spec()
        keep = {k: spec[k] for k in (example_schemas.QUERY_IDS, example_schemas.MASK_POSITIONS,
                                     example_schemas.TARGET_IDS, example_schemas.SOURCE_UID,
                                     example_schemas.MASKING)}
        raw = tf.data.TFRecordDataset(files)
        if input_context is not None and input_context.num_input_pipelines > 1:
            raw = raw.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        raw = raw.map(lambda s: tf.io.parse_single_example(s, keep))
        if split is not None:
            raw = raw.filter(split)
        if repeat:
            raw = raw.repeat()
        if shuffle and self.cfg.data.shuffle_buffer > 1:
            raw = raw.shuffle(self.cfg.data.shuffle_buffer, seed=seed)
        raw = raw.ragged_batch(batch_size, drop_remainder=True).prefetch(2)

        k = self.cfg.model.num_candidates
        ragged = lambda: tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1, row_splits_dtype=tf.int64)
        signature = {
            "query_ids": ragged(), "mask_positions": ragged(), "target_ids": ragged(),
            "candidate_title_ids": ragged(), "candidate_body_ids": ragged(), "reader_doc_ids": ragged(),
            "candidate_ids": tf.TensorSpec([None, k], tf.int64),
            "source_column": tf.TensorSpec([None], tf.int32),
            "index_version": tf.TensorSpec([None], tf.int64),
            "index_export_step": tf.TensorSpec([None], tf.int64),
            "index_age_seconds": tf.TensorSpec([None], tf.float32),
        }
        dataset = tf.data.Dataset.from_generator(
            lambda: self._retrieve_batches(raw, trivial_retrieval_rate, force_source, np.random.default_rng(seed)),
            output_signature=signature)
        # A fixed, small prefetch: every buffered batch was retrieved with the index of its time, so a deep
        # (AUTOTUNE) buffer would add its length to the off-policy delay and hold back a refreshed index.
        return dataset.map(self.pack, num_parallel_calls=2).prefetch(PREFETCH_BATCHES)

    def _retrieve_batches(self, raw: tf.data.Dataset, trivial_retrieval_rate: float, force_source: bool,
                          rng: np.random.Generator) -> Iterator[dict[str, Any]]:
        for records in raw:
            keep = (rng.random(int(records[example_schemas.SOURCE_UID].shape[0])) < trivial_retrieval_rate
                    if trivial_retrieval_rate > 0 else None)
            yield self.retrieve(records, keep_source=keep, force_source=force_source)

    # ---- per batch --------------------------------------------------------------------------------------

    def retrieve(self, records: Mapping[str, tf.RaggedTensor], keep_source: np.ndarray | None = None,
                 force_source: bool = False) -> dict[str, Any]:
        """Candidates for one parsed batch (``query_ids``, ``mask_positions``, ``target_ids``, ``source_uid``).

        ``keep_source``: ``bool[batch]``, queries that keep their source block (default: none do), where the
        search ranked it, or (``force_source``) as candidate 1.
        """
        start = time.perf_counter()
        self.loader.refresh_in_background()  # a new version loads beside the batches, then swaps in
        served = self.loader.snapshot()  # one consistent version (index and blocks) for the whole batch
        version, index, metadata = served.version, served.index, served.metadata
        blocks = self.blocks if self.blocks is not None else served.blocks
        assert blocks is not None
        embed, exported_at = self._embedder(version, metadata)
        query_ids = tf.cast(records[example_schemas.QUERY_IDS], tf.int32)  # [batch, (len)]
        if int(tf.reduce_max(query_ids.row_lengths())) > self.cfg.model.query_seq_length - 2:
            raise errors.UserError(
                f"pre-training queries have up to {int(tf.reduce_max(query_ids.row_lengths()))} wordpieces but "
                f"model.query_seq_length={self.cfg.model.query_seq_length} leaves room for "
                f"{self.cfg.model.query_seq_length - 2}: regenerate the data with this config")
        packed = self.tokenizer.pack_single(query_ids, self.cfg.model.query_seq_length, pad_to_seq_length=False)
        query_embeddings = embed(packed)  # [batch, dim]

        def search(queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
            rows, scores = index.search_batched(queries, k)  # [batch, k] each
            return rows, scores, version

        selector = candidate_selection.CandidateSelector(search, blocks.uids, self.cfg.model.num_candidates)
        source_uids = [u.decode() for u in records[example_schemas.SOURCE_UID].numpy()]
        forced = _forced_sources(blocks, source_uids, keep_source) if force_source else None  # [batch]
        candidates, _, excluded = selector.select(query_embeddings, source_uids, keep_source,
                                                  forced)  # [batch, k]
        blocks.check_ids(candidates)
        trivial = 0 if keep_source is None else sum(
            int(np.sum(blocks.uids[row[row >= 0]] == uid))
            for row, uid, keep in zip(candidates, source_uids, keep_source) if keep)
        source_column = _source_columns(blocks, candidates, source_uids)  # [batch]
        titles, bodies, reader_docs = self._candidate_texts(blocks, candidates)
        batch = len(source_uids)
        with self._lock:
            self.stats.batches += 1
            self.stats.excluded_source_blocks += excluded
            self.stats.trivial_retrievals_kept += trivial
            self.stats.sources_forced += 0 if forced is None else int(np.sum(forced >= 0))
            self.stats.versions[version] += 1
            self.stats.retrieval_seconds += time.perf_counter() - start
        return {
            "query_ids": query_ids.with_row_splits_dtype(tf.int64),
            "mask_positions": tf.cast(records[example_schemas.MASK_POSITIONS],
                                      tf.int32).with_row_splits_dtype(tf.int64),
            "target_ids": tf.cast(records[example_schemas.TARGET_IDS], tf.int32).with_row_splits_dtype(tf.int64),
            "candidate_title_ids": _ragged(titles),  # [batch * k, (len)]
            "candidate_body_ids": _ragged(bodies),  # [batch * k, (len)]
            "reader_doc_ids": _ragged(reader_docs),  # [batch * k, (len)]
            "candidate_ids": candidates,  # [batch, k]
            "source_column": source_column,  # [batch]: the candidate that is the query's source block, or -1
            "index_version": np.full([batch], version, np.int64),
            "index_export_step": np.full([batch], index_publisher.export_step(metadata), np.int64),
            "index_age_seconds": np.full([batch], max(time.time() - exported_at, 0.0), np.float32),
        }

    def _candidate_texts(self, blocks: block_store_lib.BlockStore, candidates: np.ndarray
                         ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """The title, body and ``title [SEP] body`` wordpieces of each candidate of ``candidates`` ([batch, k]),
        flattened to batch * k; the null document has none."""
        titles, bodies, reader_docs = [], [], []
        sep = np.asarray([self.tokenizer.sep_id], np.int32)
        empty = np.zeros([0], np.int32)
        for block_id in candidates.reshape(-1).tolist():
            if block_id == candidate_selection.NULL_BLOCK:
                titles.append(empty), bodies.append(empty), reader_docs.append(empty)
                continue
            title, body = blocks.title_ids(block_id), blocks.body_ids(block_id)
            titles.append(title), bodies.append(body), reader_docs.append(np.concatenate([title, sep, body]))
        return titles, bodies, reader_docs

    def pack(self, raw: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Packs one retrieved batch into model inputs (see the module docstring for the shapes)."""
        m, static = self.cfg.model, self.cfg.data.static_padding
        k = m.num_candidates
        batch = tf.shape(raw["candidate_ids"])[0]
        query = self.tokenizer.pack_single(raw["query_ids"], m.query_seq_length, static)  # [batch, q_len]
        blocks = self.tokenizer.join_bert(raw["candidate_title_ids"], raw["candidate_body_ids"],
                                          m.block_seq_length, static)  # each [batch * k, block_len]
        repeated = tf.gather(raw["query_ids"], tf.repeat(tf.range(batch), k))  # [batch * k, (q_len)]
        reader = self.tokenizer.join_bert(repeated, raw["reader_doc_ids"], m.reader_seq_length, static)
        num_masked = max_predictions(self.cfg) if static else None
        positions = raw["mask_positions"] + 1  # [batch, (masked)]: after [CLS], same in query and reader
        block_len, reader_len = (m.block_seq_length, m.reader_seq_length) if static else (-1, -1)  # static for XLA
        out = {
            **{"query_" + key: v for key, v in query.items()},
            **{"candidates_" + key: tf.reshape(v, [batch, k, block_len]) for key, v in blocks.items()},
            **{"reader_" + key: tf.reshape(v, [batch, k, reader_len]) for key, v in reader.items()},
            "masked_positions": positions.to_tensor(0, shape=[None, num_masked]),  # [batch, masked]
            "target_ids": raw["target_ids"].to_tensor(0, shape=[None, num_masked]),  # [batch, masked]
            "target_weights": tf.ones_like(positions, tf.float32).to_tensor(0.0, shape=[None, num_masked]),
            "candidate_ids": raw["candidate_ids"],  # [batch, k]
            "source_column": raw["source_column"],  # [batch]
            "index_version": raw["index_version"],  # [batch]
            "index_export_step": raw["index_export_step"],  # [batch]
            "index_age_seconds": raw["index_age_seconds"],  # [batch]
        }
        return out

    # ---- query embedders per index version ----------------------------------------------------------------

    def _embedder(self, version: int, metadata: Mapping[str, Any]) -> tuple[QueryEmbedFn, float]:
        if version not in self._embedders:
            self._embedders = {version: self._query_embedder_for(version, metadata)}  # drop older versions
            logger.info("input pipeline: index version %d, query embedder from %s", version,
                         metadata.get("export_path"))
        return self._embedders[version]


def _forced_sources(blocks: block_store_lib.BlockStore, source_uids: list[str],
                    keep_source: np.ndarray | None) -> np.ndarray | None:
    """``int64 [batch]``: the source block to force in for each query that keeps it, -1 for the others (None when
    none does); UserError when a kept query's source block is not in the corpus."""
    if keep_source is None:
        return None
    forced = np.where(keep_source, blocks.first_block_of_uid(source_uids), -1)  # [batch]
    missing = [uid for uid, keep, row in zip(source_uids, keep_source, forced) if keep and row < 0]
    if missing:
        raise errors.UserError(f"{blocks.source}: the source blocks of {len(missing)} queries (uid {missing[0]}) are "
                               f"not in the corpus: the pre-training data was made from other blocks")
    return forced


def _source_columns(blocks: block_store_lib.BlockStore, candidates: np.ndarray, source_uids: list[str]) -> np.ndarray:
    """``int32 [batch]``: the first candidate of each query (of ``candidates`` ``[batch, k]``) that is its source
    block, or -1 where none is."""
    columns = np.full([len(source_uids)], -1, np.int32)
    for i, (row, uid) in enumerate(zip(candidates, source_uids)):
        hits = [c for c in range(1, len(row)) if row[c] >= 0 and blocks.uids[row[c]] == uid]
        columns[i] = hits[0] if hits else -1
    return columns


def max_predictions(cfg: config_lib.ExperimentConfig) -> int:
    """Masked positions per example under static padding: a salient span or BERT's 15% of a query."""
    return max(cfg.model.max_span_width,
               int(np.ceil(cfg.data.mask_probability * (cfg.model.query_seq_length - 2))) + 1)


def _ragged(rows: list[np.ndarray]) -> tf.RaggedTensor:
    lengths = np.fromiter((len(r) for r in rows), np.int64, count=len(rows))
    values = np.concatenate(rows) if rows else np.zeros([0], np.int32)
    return tf.RaggedTensor.from_row_lengths(values.astype(np.int32), lengths)
