"""Beam job: re-embed every knowledge-corpus block with a retriever export and publish a new MIPS index.

This is the index builder of REALM's asynchronous refresh (Guu et al., 2020, §3.4 "Asynchronous MIPS
refreshes"): the trainer periodically exports its current Embed_doc (``realm_tf/export/retriever_export``,
``<export_dir>/<step>/``), this job embeds every block z of the corpus with it, builds a MIPS index over
the ``[num_blocks, dim]`` matrix of Embed_doc(z) and publishes it as ``<index_dir>/<step>/``, which the
trainer's :class:`realm_tf.index.index_loader.IndexLoader` swaps to without pausing.

Pipeline (any Beam runner: every flag the job does not define is a standard Beam pipeline option)::

  ReadBlocks          block TFRecords (``example_schemas.block_feature_spec``, from preprocess_corpus)
  EmbedBlocks
    ParseBlocks       record -> (block_id, BlockInput(title, text, wordpieces)) | unparseable -> failures
    BatchByLength     (--batching length) sort each bundle by wordpiece length, cut batches of
                      min..max_batch_size: the export pads each batch to its longest block, so similar
                      lengths together waste less compute; (--batching arrival) RunInference's BatchElements
    SpreadBatches     (--batching length) Reshuffle: a bundle's batches are spread over the workers (a read
                      of one file is one bundle, and without it one worker would embed every batch)
    RunInference      KeyedModelHandler(BlockEmbeddingModelHandler): the SavedModel is loaded once per
                      worker by Beam (with --intra-op-threads TensorFlow threads per op), its
                      ``embed_block(title, text)`` signature is called per batch, the
                      block ids stay attached as keys; a failing batch is retried block by block, and a
                      block that still fails (or gives a non-finite vector) goes to ``failures``
    SplitOutcomes     (block_id, vector) -> embeddings | (block_id, error) -> failures; counters, progress
  WriteEmbeddings     <embeddings_dir>/embeddings-SSSSS-of-NNNNN.tfrecord  (tf.train.Example block_id,
                      embedding: float32[dim])
  WriteFailures       <embeddings_dir>/failures-SSSSS-of-NNNNN.jsonl  ({"block_id", "error"})

After the pipeline has finished, the **launching process** reads the shards back (``tf.data``, so gs://
works as well as local disk; :mod:`realm_tf.index.embedding_matrix`), orders the vectors by block_id into one matrix and
checks that every id 0..N-1 is present exactly once (N from the blocks' ``manifest.json`` when there is
one, else the largest id + 1). Any missing, duplicated or out-of-range id, or any failed block, refuses the
publish with :class:`realm_tf.index.embedding_matrix.IncompleteEmbeddingsError` naming the ids (the shards are kept for
inspection). Otherwise it builds the index (``index.kind``: ScaNN or brute force, with the config's ScaNN parameters) on
the whole matrix, in the same process, and publishes it with
:func:`realm_tf.index.index_publisher.publish` (staging + rename, ``index.json`` last), version = the
export's step, with the export step/path, vocabulary hash, counts and timings in ``index.json``. By default
the blocks are those of the current corpus version (``realm_tf/data/corpus_versions``: the newest
``realm-tf update-corpus`` on top of ``preprocess``'s output), recorded as ``corpus_version``; after a corpus
update took the export's step as its version number, the index gets the next one
(``index_publisher.version_for_export``).

Usage::

    python -m beam_jobs.embed_blocks --config configs/minilm.yaml --export runs/minilm/export/200
    realm-tf embed-blocks --config configs/minilm.yaml -- --runner=DataflowRunner --project=P ...
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)

# isort: split
import apache_beam as beam
import numpy as np
from apache_beam.io import filesystems
from apache_beam.ml.inference import base as inference_base
from apache_beam.options import pipeline_options

from beam_jobs import job_flags
from beam_jobs import job_support
from beam_jobs import vector_job
from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import corpus_versions
from realm_tf.data import example_schemas
from realm_tf.index import index_kinds
from realm_tf.index import index_publisher
from realm_tf.index import index_refresher
from realm_tf.layers import bert_tokenizer

logger = logging.getLogger(__name__)

NAMESPACE = "realm_tf.embed_blocks"
EMBEDDINGS_PREFIX = "embeddings"
FAILURES_PREFIX = "failures"

# Counter names (also the keys of the returned summary's "counts").
BLOCKS_READ = "blocks_read"
BLOCKS_UNPARSEABLE = "blocks_unparseable"
BLOCKS_EMBEDDED = "blocks_embedded"
BLOCKS_FAILED = "blocks_failed"
BATCHES = "batches"
WORDPIECES = "wordpieces"  # real wordpieces of the embedded blocks ([CLS]/[SEP] included)
PADDED_WORDPIECES = "padded_wordpieces"  # batch size x longest block, summed over batches

_FAILURES = "failures"  # tagged output
SIGNATURES = ("auto", "text", "ids")  # what embeds the blocks (BlockEmbeddingModelHandler)


class BlockInput(NamedTuple):
    """One block as the ``embed_block`` signature takes it, plus its packed length (for batching).

    Attributes:
      title: UTF-8 title.
      text: UTF-8 body text.
      wordpieces: ``len([CLS] title [SEP] body [SEP])`` after REALM's truncation to block_seq_length,
        from the record's title_ids / body_ids (the export re-tokenizes the text with the same vocabulary).
      title_ids / body_ids: the record's wordpieces, which the ``embed_block_ids`` signature reads packed.
    """

    title: bytes
    text: bytes
    wordpieces: int
    title_ids: Sequence[int] = ()
    body_ids: Sequence[int] = ()


class BlockEmbeddingModelHandler(vector_job.FallbackModelHandler[BlockInput]):
    """Beam ModelHandler for the ``embed_block`` signature of a retriever export (Embed_doc, REALM §3.2).

    ``load_model`` runs once per worker (RunInference shares the model between the DoFn instances of a
    process); ``run_inference`` embeds one batch with a single signature call, each block's outcome a
    :class:`vector_job.Outcome` (``value`` float32[dim]). A batch that raises is retried one block at a time, so
    one bad block costs one outcome with an ``error`` rather than the batch or the job.

    Args:
      export_path: ``<export_dir>/<step>`` written by ``retriever_export.export_retriever`` (local or gs://).
      min_batch_size / max_batch_size: RunInference's BatchElements bounds (``--batching arrival``).
      intra_op_threads: threads TensorFlow gives one op in the worker's process (0: its default, one per
        core). Workers that share a machine each take their share of its cores: two processes of one thread
        embed faster on two cores than one process of two, since a thread then runs a whole matmul, not half.
        TensorFlow takes the setting only before its runtime starts; where it has already started in the
        process (an in-process runner after TensorFlow ran, a refresh on the trainer's thread), the load says so
        in the log and keeps the process's threads.
      signature: ``"text"``: ``embed_block`` (strings, tokenized in the graph, each batch padded to its longest
        block: the least work on a CPU); ``"ids"``: ``embed_block_ids`` (the records' wordpieces packed on the
        host to the export's static block length: no string op in the graph, one shape, for a GPU or TPU);
        ``"auto"``: ids where the worker sees a GPU (TensorFlow then places the model there), else text.
    """

    namespace = NAMESPACE

    def __init__(self, export_path: str, min_batch_size: int = 1, max_batch_size: int = 32,
                 intra_op_threads: int = 0, signature: str = "auto") -> None:
        super().__init__(min_batch_size=min_batch_size, max_batch_size=max_batch_size)
        if signature not in SIGNATURES:
            raise errors.UserError(f"unknown block signature {signature!r}: one of {', '.join(SIGNATURES)}")
        self._export_path = export_path
        self._intra_op_threads = intra_op_threads
        self._signature = signature
        self._packing: tuple[int, dict[str, int]] | None = None  # (block length, special ids) with "ids"

    def load_model(self) -> Any:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        import tensorflow_text  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import  (tokenizer ops)

        threads = tf.config.threading.get_intra_op_parallelism_threads()  # 0: TensorFlow's default
        if self._intra_op_threads and self._intra_op_threads != threads:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(self._intra_op_threads)
            except RuntimeError:  # the runtime has started in this process: its pool is fixed
                logger.info("embed_blocks: TensorFlow already runs in process %d; --intra-op-threads=%d is not "
                            "applied", os.getpid(), self._intra_op_threads)
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:  # the worker's model takes the memory it needs, not the whole device
            try:
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError:  # the runtime has started in this process
                pass
        model = tf.saved_model.load(self._export_path)  # keep the object: it owns the variables
        self._packing = self._choose_packing(model, bool(gpus))
        logger.info("embed_blocks: process %d loaded %s (intra-op threads: %s; %s; signature %s)", os.getpid(),
                    self._export_path, tf.config.threading.get_intra_op_parallelism_threads() or "TensorFlow's default",
                    f"{len(gpus)} GPU(s)" if gpus else "no GPU", "embed_block_ids" if self._packing else "embed_block")
        return model

    def _choose_packing(self, model: Any, gpu: bool) -> tuple[int, dict[str, int]] | None:
        """``(block length, special ids)`` when blocks go to ``embed_block_ids``, None for ``embed_block``."""
        if self._signature == "text" or (self._signature == "auto" and not gpu):
            return None
        export = artifacts.read_marker(self._export_path, artifacts.RETRIEVER_EXPORT, "retriever export")
        if "embed_block_ids" not in model.signatures or "special_ids" not in export:
            if self._signature == "ids":
                raise errors.UserError(f"{self._export_path}: no embed_block_ids signature (an export of an earlier "
                                       f"version): export the retriever again, or embed its text")
            logger.info("embed_blocks: %s has no embed_block_ids signature: embedding the text", self._export_path)
            return None
        return int(export["block_seq_length"]), dict(export["special_ids"])

    def run_inference(self, batch: Sequence[BlockInput], model: Any,
                      inference_args: dict[str, Any] | None = None) -> Iterable[vector_job.Outcome]:
        job_support.count(NAMESPACE, BATCHES)
        job_support.count(NAMESPACE, WORDPIECES, sum(b.wordpieces for b in batch))
        job_support.count(NAMESPACE, PADDED_WORDPIECES, len(batch) * max((b.wordpieces for b in batch), default=0))
        return super().run_inference(batch, model, inference_args)

    def infer(self, model: Any, batch: Sequence[BlockInput]) -> list[vector_job.Outcome]:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        if self._packing is not None:
            length, special = self._packing
            packed = [bert_tokenizer.join_bert_ids(b.title_ids, b.body_ids, length, special) for b in batch]
            outputs = model.signatures["embed_block_ids"](**{
                key: tf.constant(np.stack([p[key] for p in packed])) for key in packed[0]})  # int32[B, length] each
        else:
            outputs = model.signatures["embed_block"](title=tf.constant([b.title for b in batch]),  # string[B]
                                                      text=tf.constant([b.text for b in batch]))  # string[B]
        return [vector_job.finite(vector, "embedding") for vector in outputs["embedding"].numpy()]  # [B, dim]

    def get_num_bytes(self, batch: Sequence[BlockInput]) -> int:
        return sum(len(b.title) + len(b.text) for b in batch)


# ---- the embedding PTransform ---------------------------------------------------------------------------

class _ParseBlockFn(beam.DoFn):
    """Serialized block record -> ``(block_id, BlockInput)``; an unreadable record -> ``failures``."""

    def __init__(self, block_seq_length: int) -> None:
        super().__init__()
        self._block_seq_length = block_seq_length
        self._spec = example_schemas.block_feature_spec()  # built once, not per record

    def process(self, record: bytes) -> Iterator[Any]:
        job_support.count(NAMESPACE, BLOCKS_READ)
        try:
            row = job_support.parse_example(record, self._spec)
            block_id = int(row[example_schemas.BLOCK_ID])
            length = len(row[example_schemas.TITLE_IDS]) + len(row[example_schemas.BODY_IDS]) + 3
        except Exception as e:  # pylint: disable=broad-except
            job_support.count(NAMESPACE, BLOCKS_UNPARSEABLE)
            yield beam.pvalue.TaggedOutput(_FAILURES, {"block_id": None, "error": f"unparseable record: {e}"})
            return
        yield block_id, BlockInput(row[example_schemas.TITLE], row[example_schemas.TEXT],
                                   min(length, self._block_seq_length), row[example_schemas.TITLE_IDS],
                                   row[example_schemas.BODY_IDS])


def _wordpieces(keyed: tuple[int, BlockInput]) -> int:
    return keyed[1].wordpieces


class EmbedBlocks(beam.PTransform):
    """``PCollection[bytes]`` of block records -> ``{"embeddings", "failures"}`` with Beam RunInference.

    ``embeddings``: ``(block_id, float32[dim])`` = Embed_doc(z) of every block that embedded;
    ``failures``: ``{"block_id": int | None, "error": str}`` for every record that could not be parsed or
    embedded (block_id None when the record itself is unreadable). Every input record ends in exactly one.

    Args:
      export_path: the retriever export whose ``embed_block`` signature is Embed_doc.
      block_seq_length: the export's block length (``export.json``), to estimate each block's wordpieces.
      min_batch_size / max_batch_size: blocks per ``embed_block`` call.
      batching: ``"length"`` (sort each bundle by wordpieces, then cut batches) or ``"arrival"``
        (RunInference's adaptive BatchElements, in input order).
      progress_total / progress_interval: progress lines on stderr (interval 0: none).
      intra_op_threads: TensorFlow's threads per op in each worker process (0: its default; see
        :class:`BlockEmbeddingModelHandler`).
      signature: which export signature embeds (:class:`BlockEmbeddingModelHandler`; "auto": ids on a GPU).
    """

    def __init__(self, export_path: str, block_seq_length: int, min_batch_size: int = 1,
                 max_batch_size: int = 32, batching: str = "length", progress_total: int | None = None,
                 progress_interval: float = 0.0, intra_op_threads: int = 0, signature: str = "auto") -> None:
        super().__init__()
        if not 1 <= min_batch_size <= max_batch_size:
            raise errors.UserError(f"need 1 <= --min-batch-size ({min_batch_size}) <= --max-batch-size "
                                   f"({max_batch_size})")
        if batching not in ("length", "arrival"):
            raise errors.UserError(f"--batching must be 'length' or 'arrival', got {batching!r}")
        self._export_path = export_path
        self._block_seq_length = block_seq_length
        self._min_batch_size, self._max_batch_size = min_batch_size, max_batch_size
        self._batching = batching
        self._progress = (progress_total, progress_interval)
        self._intra_op_threads = intra_op_threads
        self._signature = signature

    def expand(self, records: beam.PCollection) -> dict[str, beam.PCollection]:
        parsed = records | "ParseBlocks" >> beam.ParDo(_ParseBlockFn(self._block_seq_length)).with_outputs(
            _FAILURES, main="blocks")
        handler = inference_base.KeyedModelHandler(BlockEmbeddingModelHandler(
            self._export_path, self._min_batch_size, self._max_batch_size, self._intra_op_threads, self._signature))
        blocks = parsed["blocks"]
        if self._batching == "length":
            # SortAndBatchElements buffers a bundle, sorts it by length and cuts batches (by count: the
            # weight bound can never bind); RunInference then takes the batches as they are.
            blocks = blocks | "BatchByLength" >> beam.transforms.util.SortAndBatchElements(
                min_batch_size=self._min_batch_size, max_batch_size=self._max_batch_size,
                max_batch_weight=self._max_batch_size * self._block_seq_length + 1, element_size_fn=_wordpieces)
            # A bundle's batches (all of them when one file is read) would otherwise stay on the worker that
            # sorted them: the embedding is fused to the read. Reshuffle spreads them over the workers.
            blocks = blocks | "SpreadBatches" >> beam.Reshuffle()
            handler = handler.with_no_batching()
        outcomes = (blocks
                    | "RunInference" >> inference_base.RunInference(handler)
                    | "SplitOutcomes" >> vector_job.SplitOutcomes(
                        "embed_blocks", "blocks", NAMESPACE, {"done": BLOCKS_EMBEDDED, "failed": BLOCKS_FAILED},
                        "block_id", *self._progress))
        failures = ((parsed[_FAILURES], outcomes["failures"])
                    | "MergeFailures" >> beam.Flatten())
        return {"embeddings": outcomes["values"], "failures": failures}


# ---- the job --------------------------------------------------------------------------------------------

def use_the_cores(options: pipeline_options.PipelineOptions, beam_args: Sequence[str]) -> None:
    """On the DirectRunner, unless ``--direct_running_mode`` or ``--direct_num_workers`` is given: one worker
    thread per core (``multi_threading``), each embedding its share of the batches with one TensorFlow thread per
    op (:func:`default_intra_op_threads`): a thread runs a whole matmul instead of half of one
    (``docs/performance.md``)."""
    cores = os.cpu_count() or 1
    if (not job_support.is_direct_runner(options) or cores == 1
            or any(a.startswith(("--direct_running_mode", "--direct_num_workers")) for a in beam_args)):
        return
    direct = options.view_as(pipeline_options.DirectOptions)
    direct.direct_running_mode, direct.direct_num_workers = "multi_threading", cores


def _runner_description(options: pipeline_options.PipelineOptions) -> str:
    """``DirectRunner (multi_threading x 2)``, ``DataflowRunner``...: how the embeddings were computed."""
    if not job_support.is_direct_runner(options):
        return str(options.view_as(pipeline_options.StandardOptions).runner)
    direct = options.view_as(pipeline_options.DirectOptions)
    return f"DirectRunner ({direct.direct_running_mode} x {direct.direct_num_workers})"


def default_intra_op_threads(options: pipeline_options.PipelineOptions) -> int:
    """``--intra-op-threads`` when not given: on the DirectRunner's ``multi_threading`` or ``multi_processing``
    workers, which share this machine, each worker's share of its cores; elsewhere 0 (TensorFlow's default, one
    thread per core)."""
    direct = options.view_as(pipeline_options.DirectOptions)
    if not job_support.is_direct_runner(options) or direct.direct_running_mode == "in_memory":
        return 0
    workers = direct.direct_num_workers or os.cpu_count() or 1  # Beam's default for 0: one worker per core
    return max(1, (os.cpu_count() or 1) // workers)


def resolve_export(export: str | None, export_dir: str | None, cfg: config_lib.ExperimentConfig) -> str:
    """``export``, else the newest complete export under ``export_dir`` (default refresh.export_dir)."""
    from realm_tf.export import retriever_export  # pylint: disable=import-outside-toplevel

    if export:
        return export.rstrip("/")
    export_dir = export_dir or cfg.refresh.export_dir
    steps = retriever_export.list_exports(export_dir)
    if not steps:
        raise errors.UserError(f"{export_dir}: no complete retriever export (run realm-tf export-retriever, or "
                               f"pass --export)")
    return os.path.join(export_dir, str(steps[-1]))


def _scratch_directory(target: _Target, embeddings_dir: str | None) -> str:
    """Where the job's shards go before the matrix is assembled (default: a new hidden directory beside the
    versions); shards of an earlier run into the same directory are removed first."""
    embeddings_dir = embeddings_dir or job_support.scratch_directory(
        target.index_dir, f"embeddings-{index_publisher.version_name(target.version)}")
    job_support.delete_matching([filesystems.FileSystems.join(embeddings_dir, f"{prefix}-*")
                                 for prefix in (EMBEDDINGS_PREFIX, FAILURES_PREFIX)])
    return embeddings_dir


def _runner_options(beam_args: Sequence[str], worker_per_core: bool,
                    intra_op_threads: int | None) -> tuple[pipeline_options.PipelineOptions, int]:
    """The pipeline options of ``beam_args`` (a worker per core with ``worker_per_core``) and the TensorFlow
    threads per op of each worker (``intra_op_threads``, else :func:`default_intra_op_threads`)."""
    options = job_support.pipeline_options_for(beam_args)
    if worker_per_core:
        use_the_cores(options, beam_args)
    return options, default_intra_op_threads(options) if intra_op_threads is None else intra_op_threads


def embed_and_publish(cfg: config_lib.ExperimentConfig, export_path: str, index_dir: str | None = None,
                      blocks: str | None = None, beam_args: Sequence[str] = (), embeddings_dir: str | None = None,
                      keep_embeddings: bool = False, min_batch_size: int = 1, max_batch_size: int = 32,
                      batching: str = "length", num_shards: int = 0, progress_interval: float | None = None,
                      pause_before_commit: float = 0.0, intra_op_threads: int | None = None,
                      worker_per_core: bool = False) -> dict[str, Any]:
    """The job's Python API: embeds every block of ``blocks`` (default: the current corpus version of
    ``data.blocks_dir``) with the retriever export ``export_path`` and publishes ``<index_dir>/<export step>/``
    (``index_publisher.version_for_export``); returns the summary (``index.json`` plus timings). The flags of
    ``python -m beam_jobs.embed_blocks`` name the same arguments (``job_flags.add_embed_blocks_args``);
    ``beam_args`` are Beam pipeline options. ``worker_per_core``: a DirectRunner worker per core, as the command
    runs; a refresh inside or beside a trainer, which holds the cores, leaves it off (Beam's single worker).

    Raises:
      IndexVersionExistsError: that version is already published.
      IncompleteEmbeddingsError: some block is missing, duplicated or failed (nothing is published).
    """
    started = time.time()
    target = _target(cfg, export_path, index_dir, blocks)
    export = target.export
    embeddings_dir = _scratch_directory(target, embeddings_dir)

    options, intra_op_threads = _runner_options(beam_args, worker_per_core, intra_op_threads)
    logger.info("embed_blocks: export %s (step %d, dim %d) over %s%s -> %s", export_path, int(export["step"]),
                export["embedding_dim"], target.blocks,
                f" ({target.num_blocks:,} blocks)" if target.num_blocks is not None else "", target.index_dir)
    pipeline = beam.Pipeline(options=options)
    outputs = (pipeline
               | "ReadBlocks" >> beam.io.ReadFromTFRecord(target.blocks)
               | "EmbedBlocks" >> EmbedBlocks(export_path, int(export["block_seq_length"]), min_batch_size,
                                              max_batch_size, batching, target.num_blocks,
                                              job_support.progress_interval_for(progress_interval, options),
                                              intra_op_threads))
    _ = outputs["embeddings"] | "WriteEmbeddings" >> vector_job.WriteKeyedVectors(embeddings_dir, EMBEDDINGS_PREFIX,
                                                                                  num_shards)
    _ = outputs["failures"] | "WriteFailures" >> vector_job.WriteFailures(embeddings_dir, FAILURES_PREFIX)
    counts = vector_job.run_pipeline(pipeline, NAMESPACE)
    embed_seconds = time.time() - started

    start = time.time()
    matrix = vector_job.read_matrix(embeddings_dir, EMBEDDINGS_PREFIX, int(export["embedding_dim"]),
                                    target.num_blocks, where=f" (blocks {target.blocks}; embeddings kept in "
                                                             f"{embeddings_dir})")  # [N, dim]
    metadata = {
        **_export_metadata(export_path, export), "corpus_version": target.corpus_version,
        "blocks_pattern": target.blocks, "blocks_manifest": target.num_blocks is not None, "counts": counts,
        "batching": {"mode": batching, "min_batch_size": min_batch_size, "max_batch_size": max_batch_size},
        "runner": _runner_description(options), "intra_op_threads": intra_op_threads,
        "embed_seconds": round(embed_seconds, 3), "assemble_seconds": round(time.time() - start, 3),
        "config_hash": config_lib.config_hash(cfg),
    }
    _, path, publish_seconds = vector_job.build_and_publish(cfg, target.index_dir, matrix, metadata, target.version,
                                                            pause_before_commit=pause_before_commit)
    if not keep_embeddings:
        job_support.remove_scratch_directory(embeddings_dir)
    summary = {**index_publisher.read_index_json(path), "index_path": path,
               "publish_seconds": round(publish_seconds, 3), "total_seconds": round(time.time() - started, 3),
               "embeddings_dir": embeddings_dir if keep_embeddings else None}
    logger.info("%s", format_summary(summary))
    return summary


def refresh_index(config: str | Sequence[str], overrides: Sequence[str] = (), index_dir: str | None = None,
                  beam_args: Sequence[str] | None = None, pause_before_commit: float = 0.0) -> int | None:
    """One round of REALM's index builder (Guu et al., 2020, §3.4): the newest retriever export of
    ``refresh.export_dir`` not yet indexed is embedded over the corpus and published
    (``index_refresher.IndexRefresher.refresh_once`` with :func:`embed_and_publish`). ``config`` is the experiment's
    YAML (a trainer's ``params.yaml``), with ``overrides``; ``beam_args`` default to ``refresh.beam_options``.

    Returns:
      The index version published, or None when the index was up to date.

    Raises:
      UserError: the newest export could not be indexed (the error is in the message; nothing was published).
    """
    refresher = index_refresher.IndexRefresher(config, embed_and_publish, overrides, index_dir=index_dir,
                                               beam_args=beam_args, pause_before_commit=pause_before_commit)
    version = refresher.refresh_once()
    if refresher.failed:
        raise errors.UserError("refresh-index: could not index " + "; ".join(
            f"export {step}: {error}" for step, error in sorted(refresher.failed.items())))
    return version



class _Target(NamedTuple):
    """What one run embeds and where it publishes."""

    blocks: str  # the block files
    corpus_version: int
    index_dir: str
    export: Mapping[str, Any]  # the export's export.json
    version: int  # the index version to publish
    num_blocks: int | None  # from the blocks' manifest (None: no manifest)


def _target(cfg: config_lib.ExperimentConfig, export_path: str, index_dir: str | None,
            blocks: str | None) -> _Target:
    """Checks a run's inputs before anything is embedded: the export, the version it would publish (not yet
    published), the index kind, the blocks (their vocabulary the export's)."""
    from realm_tf.export import retriever_export  # pylint: disable=import-outside-toplevel

    blocks = blocks or corpus_versions.current_pattern(cfg.data.blocks_dir, "blocks-*.tfrecord")
    index_dir = index_dir or cfg.index.index_dir
    export = retriever_export.read_export_metadata(export_path)
    version = index_publisher.version_for_export(index_dir, int(export["step"]))
    if index_publisher.is_complete(index_publisher.version_dir(index_dir, version)):
        raise index_publisher.IndexVersionExistsError(
            f"{index_publisher.version_dir(index_dir, version)}: index version {version} (export step) is "
            f"already published")
    index_kinds.index_class(cfg.index.kind)  # an unknown kind fails before the embedding, not after
    manifest = job_support.check_input(blocks, export["vocab_hash"], flag="--blocks")
    num_blocks = int(manifest["blocks"]) if manifest and "blocks" in manifest else None
    return _Target(blocks, corpus_versions.version_of(cfg.data.blocks_dir, blocks), index_dir, export, version,
                   num_blocks)


def _export_metadata(export_path: str, export: Mapping[str, Any]) -> dict[str, Any]:
    """What an index version records of the export that embedded it."""
    return {"export_step": int(export["step"]),
            "export_path": export_path if "://" in export_path else os.path.abspath(export_path),
            "exported_at": export.get("exported_at"), "export_config_hash": export.get("config_hash"),
            "vocab_hash": export["vocab_hash"], "block_seq_length": int(export["block_seq_length"])}


class EmbedBlocksJob(job_support.BeamJob):
    """``python -m beam_jobs.embed_blocks`` / ``realm-tf embed-blocks``: the flags of :func:`embed_and_publish`."""

    name = "embed_blocks"

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        job_flags.add_embed_blocks_args(parser)

    def run_with_args(self, args: argparse.Namespace, beam_args: Sequence[str]) -> dict[str, Any]:
        """Runs the job; a rerun whose index version is already published from the same export and blocks (a
        run that finished, or was killed after its commit) has nothing to do and says so."""
        cfg = config_lib.load_config(args.config, args.overrides)
        export_path = resolve_export(args.export, args.export_dir, cfg)
        try:
            return embed_and_publish(
                cfg, export_path, args.index_dir, args.blocks, beam_args, args.embeddings_dir, args.keep_embeddings,
                args.min_batch_size, args.max_batch_size, args.batching, args.num_shards, args.progress_interval,
                args.pause_before_commit, args.intra_op_threads, worker_per_core=True)
        except index_publisher.IndexVersionExistsError:
            published = _already_published(cfg, export_path, args.index_dir, args.blocks)
            if published is None:
                raise
            logger.warning("embed_blocks: %s already holds the index of %s over %s: nothing to do",
                           published["index_path"], export_path, published["blocks_pattern"])
            return published


def _already_published(cfg: config_lib.ExperimentConfig, export_path: str, index_dir: str | None,
                       blocks: str | None) -> dict[str, Any] | None:
    """The index version this run would publish when it is already published from the same export (path and
    step) and the same blocks; None otherwise."""
    from realm_tf.export import retriever_export  # pylint: disable=import-outside-toplevel

    index_dir = index_dir or cfg.index.index_dir
    export = retriever_export.read_export_metadata(export_path)
    path = index_publisher.version_dir(index_dir, index_publisher.version_for_export(index_dir, int(export["step"])))
    published = index_publisher.read_index_json(path)
    mine = _export_metadata(export_path, export)
    blocks = blocks or corpus_versions.current_pattern(cfg.data.blocks_dir, "blocks-*.tfrecord")
    same = all(published.get(k) == mine[k] for k in ("export_step", "export_path", "vocab_hash")) and \
        published.get("blocks_pattern") == blocks
    return {**published, "index_path": path} if same else None


def format_summary(summary: Mapping[str, Any]) -> str:
    """A few lines summing up a finished run."""
    counts = summary["counts"]
    padded = counts.get(PADDED_WORDPIECES, 0)
    efficiency = f"{counts.get(WORDPIECES, 0) / padded:.1%}" if padded else "n/a"
    rate = summary["num_blocks"] / summary["embed_seconds"] if summary["embed_seconds"] else 0.0
    return (f"embed_blocks: published index version {summary['version']} ({summary['kind']}, "
            f"{summary['num_blocks']:,} x {summary['dim']}) at {summary['index_path']}\n"
            f"  export:   {summary['export_path']} (step {summary['export_step']}, "
            f"vocab {summary['vocab_hash'][:12]})\n"
            f"  blocks:   {counts.get(BLOCKS_READ, 0):,} read, {counts.get(BLOCKS_EMBEDDED, 0):,} embedded, "
            f"{counts.get(BLOCKS_FAILED, 0):,} failed, {counts.get(BLOCKS_UNPARSEABLE, 0):,} unparseable; "
            f"{counts.get(BATCHES, 0):,} batches, {efficiency} of the padded wordpieces real\n"
            f"  seconds:  embed {summary['embed_seconds']:.1f} ({rate:,.1f} blocks/s), assemble "
            f"{summary['assemble_seconds']:.1f}, build {summary['build_seconds']:.1f}, publish "
            f"{summary['publish_seconds']:.1f}, total {summary['total_seconds']:.1f}")


JOB = EmbedBlocksJob()
run = JOB.run  # python: embed_blocks.run(argv)


if __name__ == "__main__":
    sys.exit(job_support.main(__spec__))
