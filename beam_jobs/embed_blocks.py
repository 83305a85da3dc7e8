"""Beam job: re-embed every knowledge-corpus block with a retriever export and publish a new MIPS index.

This is the index builder of REALM's asynchronous refresh (Guu et al., 2020, §3.4 "Asynchronous MIPS
refreshes"): the trainer periodically exports its current Embed_doc (``realm_tf/serving/retriever_export``,
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
    RunInference      KeyedModelHandler(BlockEmbeddingModelHandler): the SavedModel is loaded once per
                      worker by Beam, its ``embed_block(title, text)`` signature is called per batch, the
                      block ids stay attached as keys; a failing batch is retried block by block, and a
                      block that still fails (or gives a non-finite vector) goes to ``failures``
    SplitOutcomes     (block_id, vector) -> embeddings | (block_id, error) -> failures; counters, progress
  WriteEmbeddings     <embeddings_dir>/embeddings-SSSSS-of-NNNNN.tfrecord  (tf.train.Example block_id,
                      embedding: float32[dim])
  WriteFailures       <embeddings_dir>/failures-SSSSS-of-NNNNN.jsonl  ({"block_id", "error"})

After the pipeline has finished, the **launching process** reads the shards back through Beam's
``FileSystems`` (so gs:// works as well as local disk), orders the vectors by block_id into one matrix and
checks that every id 0..N-1 is present exactly once (N from the blocks' ``manifest.json`` when there is
one, else the largest id + 1). Any missing, duplicated or out-of-range id, or any failed block, refuses the
publish with :class:`IncompleteEmbeddingsError` naming the ids (the shards are kept for inspection).
Otherwise it builds the index (``index.kind``: ScaNN or brute force, with the config's ScaNN parameters) on
the whole matrix, in the same process, and publishes it with
:func:`realm_tf.index.index_publisher.publish` (staging + rename, ``index.json`` last), version = the
export's step, with the export step/path, vocabulary hash, counts and timings in ``index.json``.

Usage::

    python -m beam_jobs.embed_blocks --config configs/minilm.yaml --export runs/minilm/export/200
    realm-tf embed-blocks --config configs/minilm.yaml -- --runner=DataflowRunner --project=P ...
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)
import apache_beam as beam
import numpy as np
from apache_beam.io import filesystems
from apache_beam.io import tfrecordio
from apache_beam.ml.inference import base as inference_base
from apache_beam.options import pipeline_options

from beam_jobs import job_flags
from beam_jobs import job_support
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import example_schemas
from realm_tf.data import job_manifest

NAMESPACE = "realm_tf.embed_blocks"
EMBEDDINGS_PREFIX = "embeddings"
FAILURES_PREFIX = "failures"
EMBEDDING = "embedding"  # float32[dim] feature of an embedding record (with example_schemas.BLOCK_ID)

# Counter names (also the keys of the returned summary's "counts").
BLOCKS_READ = "blocks_read"
BLOCKS_UNPARSEABLE = "blocks_unparseable"
BLOCKS_EMBEDDED = "blocks_embedded"
BLOCKS_FAILED = "blocks_failed"
BATCHES = "batches"
WORDPIECES = "wordpieces"  # real wordpieces of the embedded blocks ([CLS]/[SEP] included)
PADDED_WORDPIECES = "padded_wordpieces"  # batch size x longest block, summed over batches

_FAILURES = "failures"  # tagged output
_SHOWN_IDS = 20  # ids listed in an error message before "... and N more"


class IncompleteEmbeddingsError(errors.UserError, ValueError):
    """The embedded blocks are not exactly the ids 0..N-1 once each; the publish is refused."""


class BlockInput(NamedTuple):
    """One block as the ``embed_block`` signature takes it, plus its packed length (for batching).

    Attributes:
      title: UTF-8 title.
      text: UTF-8 body text.
      wordpieces: ``len([CLS] title [SEP] body [SEP])`` after REALM's truncation to block_seq_length,
        from the record's title_ids / body_ids (the export re-tokenizes the text with the same vocabulary).
    """

    title: bytes
    text: bytes
    wordpieces: int


class BlockEmbedding(NamedTuple):
    """What the model handler returns per block: a vector, or why there is none."""

    embedding: np.ndarray | None  # float32 [dim]
    error: str | None


# ---- RunInference model handler -------------------------------------------------------------------------

class BlockEmbeddingModelHandler(inference_base.ModelHandler[BlockInput, BlockEmbedding, Any]):
    """Beam ModelHandler for the ``embed_block`` signature of a retriever export (Embed_doc, REALM §3.2).

    ``load_model`` runs once per worker (RunInference shares the model between the DoFn instances of a
    process); ``run_inference`` embeds one batch with a single signature call. A batch that raises is
    retried one block at a time, so one bad block costs one :class:`BlockEmbedding` with an ``error``
    rather than the batch or the job.

    Args:
      export_path: ``<export_dir>/<step>`` written by ``retriever_export.export_retriever`` (local or gs://).
      min_batch_size / max_batch_size: RunInference's BatchElements bounds (``--batching arrival``).
    """

    def __init__(self, export_path: str, min_batch_size: int = 1, max_batch_size: int = 32) -> None:
        super().__init__(min_batch_size=min_batch_size, max_batch_size=max_batch_size)
        self._export_path = export_path

    def load_model(self) -> Any:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        import tensorflow_text  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import  (tokenizer ops)

        return tf.saved_model.load(self._export_path)  # keep the object: it owns the variables

    def run_inference(self, batch: Sequence[BlockInput], model: Any,
                      inference_args: dict[str, Any] | None = None) -> Iterable[BlockEmbedding]:
        job_support.count(NAMESPACE, BATCHES)
        job_support.count(NAMESPACE, WORDPIECES, sum(b.wordpieces for b in batch))
        job_support.count(NAMESPACE, PADDED_WORDPIECES, len(batch) * max((b.wordpieces for b in batch), default=0))
        try:
            vectors = self._embed(model, batch)  # [B, dim]
        except Exception as e:  # pylint: disable=broad-except  # find the culprit(s) block by block
            logging.warning("embed_block failed on a batch of %d blocks (%s); retrying one by one", len(batch), e)
            return [self._embed_one(model, block) for block in batch]
        return [_outcome(vector) for vector in vectors]

    def _embed(self, model: Any, batch: Sequence[BlockInput]) -> np.ndarray:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        outputs = model.signatures["embed_block"](title=tf.constant([b.title for b in batch]),  # string[B]
                                                  text=tf.constant([b.text for b in batch]))  # string[B]
        return outputs["embedding"].numpy()  # float32 [B, dim]

    def _embed_one(self, model: Any, block: BlockInput) -> BlockEmbedding:
        try:
            return _outcome(self._embed(model, [block])[0])
        except Exception as e:  # pylint: disable=broad-except
            return BlockEmbedding(None, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")

    def get_num_bytes(self, batch: Sequence[BlockInput]) -> int:
        return sum(len(b.title) + len(b.text) for b in batch)

    def get_metrics_namespace(self) -> str:
        return NAMESPACE + ".RunInference"


def _outcome(vector: np.ndarray) -> BlockEmbedding:
    vector = np.asarray(vector, np.float32)  # [dim]
    if not np.isfinite(vector).all():
        return BlockEmbedding(None, "non-finite embedding (NaN or Inf)")
    return BlockEmbedding(vector, None)


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
                                   min(length, self._block_seq_length))


class _Progress:
    """``embed_blocks [pid P] N/T blocks (P%), R blocks/s, ETA`` on stderr at most every ``interval`` s."""

    def __init__(self, total: int | None, interval: float) -> None:
        self._total, self._interval = total, interval
        self._start = self._last = time.monotonic()
        self.done = self.failed = self._reported = 0

    def update(self, embedded: int, failed: int) -> None:
        self.done += embedded + failed
        self.failed += failed
        if self._interval > 0 and time.monotonic() - self._last >= self._interval:
            self.report()

    def flush(self) -> None:
        if self._interval > 0 and self.done != self._reported:
            self.report()

    def report(self) -> None:
        now = time.monotonic()
        self._last, self._reported = now, self.done
        rate = self.done / max(now - self._start, 1e-9)
        text = f"{self.done:,}"
        if self._total:
            eta = (self._total - self.done) / rate if rate > 0 else float("inf")
            text += f"/{self._total:,} blocks ({100.0 * self.done / self._total:.0f}%), ETA {eta:,.0f}s"
        else:
            text += " blocks"
        failed = f", {self.failed:,} failed" if self.failed else ""
        print(f"embed_blocks [pid {os.getpid()}] {text}, {rate:,.1f} blocks/s{failed}", file=sys.stderr, flush=True)


class _SplitOutcomesFn(beam.DoFn):
    """``(block_id, BlockEmbedding)`` -> ``(block_id, float32[dim])`` | ``failures``; counters + progress."""

    def __init__(self, progress_total: int | None, progress_interval: float) -> None:
        super().__init__()
        self._progress_args = (progress_total, progress_interval)
        self._progress: _Progress | None = None

    def setup(self) -> None:
        self._progress = _Progress(*self._progress_args)

    def process(self, keyed: tuple[int, BlockEmbedding]) -> Iterator[Any]:
        block_id, outcome = keyed
        assert self._progress is not None
        if outcome.error is not None:
            job_support.count(NAMESPACE, BLOCKS_FAILED)
            self._progress.update(0, 1)
            yield beam.pvalue.TaggedOutput(_FAILURES, {"block_id": block_id, "error": outcome.error})
            return
        job_support.count(NAMESPACE, BLOCKS_EMBEDDED)
        self._progress.update(1, 0)
        yield block_id, outcome.embedding

    def finish_bundle(self) -> None:
        if self._progress is not None:
            self._progress.flush()


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
    """

    def __init__(self, export_path: str, block_seq_length: int, min_batch_size: int = 1,
                 max_batch_size: int = 32, batching: str = "length", progress_total: int | None = None,
                 progress_interval: float = 0.0) -> None:
        super().__init__()
        if not 1 <= min_batch_size <= max_batch_size:
            raise errors.UserError(f"need 1 <= --min_batch_size ({min_batch_size}) <= --max_batch_size "
                                   f"({max_batch_size})")
        if batching not in ("length", "arrival"):
            raise errors.UserError(f"--batching must be 'length' or 'arrival', got {batching!r}")
        self._export_path = export_path
        self._block_seq_length = block_seq_length
        self._min_batch_size, self._max_batch_size = min_batch_size, max_batch_size
        self._batching = batching
        self._progress = (progress_total, progress_interval)

    def expand(self, records: beam.PCollection) -> dict[str, beam.PCollection]:
        parsed = records | "ParseBlocks" >> beam.ParDo(_ParseBlockFn(self._block_seq_length)).with_outputs(
            _FAILURES, main="blocks")
        handler = inference_base.KeyedModelHandler(BlockEmbeddingModelHandler(
            self._export_path, self._min_batch_size, self._max_batch_size))
        blocks = parsed["blocks"]
        if self._batching == "length":
            # SortAndBatchElements buffers a bundle, sorts it by length and cuts batches (by count: the
            # weight bound can never bind); RunInference then takes the batches as they are.
            blocks = blocks | "BatchByLength" >> beam.transforms.util.SortAndBatchElements(
                min_batch_size=self._min_batch_size, max_batch_size=self._max_batch_size,
                max_batch_weight=self._max_batch_size * self._block_seq_length + 1, element_size_fn=_wordpieces)
            handler = handler.with_no_batching()
        outcomes = (blocks
                    | "RunInference" >> inference_base.RunInference(handler)
                    | "SplitOutcomes" >> beam.ParDo(_SplitOutcomesFn(*self._progress)).with_outputs(
                        _FAILURES, main="embeddings"))
        failures = ((parsed[_FAILURES], outcomes[_FAILURES])
                    | "MergeFailures" >> beam.Flatten())
        return {"embeddings": outcomes["embeddings"], "failures": failures}


def to_embedding_record(keyed: tuple[int, np.ndarray]) -> bytes:
    """``(block_id, float32[dim])`` -> serialized tf.train.Example ``{block_id, embedding}``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    block_id, vector = keyed
    return tf.train.Example(features=tf.train.Features(feature={
        example_schemas.BLOCK_ID: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(block_id)])),
        EMBEDDING: tf.train.Feature(float_list=tf.train.FloatList(value=np.asarray(vector, np.float32))),
    })).SerializeToString(deterministic=True)


# ---- the whole matrix, in the launching process ---------------------------------------------------------

def read_embedding_shards(pattern: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Every ``(block_id, vector)`` of the shards matching ``pattern``, read with Beam ``FileSystems``.

    Returns ``(ids int64 [M], vectors float32 [M, dim])`` in file order (TFRecord framing and checksums
    by Beam's ``tfrecordio``, with google-crc32c).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    ids: list[int] = []
    vectors: list[np.ndarray] = []
    for metadata in _match(pattern):
        with filesystems.FileSystems.open(metadata.path) as f:
            while (record := tfrecordio._TFRecordUtil.read_record(f)) is not None:  # pylint: disable=protected-access
                features = tf.train.Example.FromString(record).features.feature
                vector = np.asarray(features[EMBEDDING].float_list.value, np.float32)  # [dim]
                if vector.shape != (dim,):
                    raise IncompleteEmbeddingsError(f"{metadata.path}: an embedding of shape {vector.shape}, "
                                                    f"expected ({dim},)")
                ids.append(int(features[example_schemas.BLOCK_ID].int64_list.value[0]))
                vectors.append(vector)
    matrix = np.stack(vectors) if vectors else np.zeros([0, dim], np.float32)  # [M, dim]
    return np.asarray(ids, np.int64), matrix


def read_failures(pattern: str) -> list[dict[str, Any]]:
    """The ``{"block_id", "error"}`` lines of the failure shards matching ``pattern``."""
    failures = []
    for metadata in _match(pattern):
        with filesystems.FileSystems.open(metadata.path) as f:
            failures += [json.loads(line) for line in f.read().decode("utf-8").splitlines() if line.strip()]
    return failures


def assemble_matrix(ids: np.ndarray, vectors: np.ndarray, num_blocks: int | None,
                    failures: Sequence[Mapping[str, Any]] = (), where: str = "") -> np.ndarray:
    """Orders ``vectors`` ([M, dim], row i = block ``ids[i]``) by block id into ``[num_blocks, dim]``.

    Every id 0..num_blocks-1 must occur exactly once (``num_blocks`` None: the largest id + 1) and
    ``failures`` must be empty; otherwise :class:`IncompleteEmbeddingsError` names the missing,
    duplicated and out-of-range ids and the failures (``where`` is appended to the message).
    """
    if num_blocks is None:
        num_blocks = int(ids.max()) + 1 if ids.size else 0
    in_range = (ids >= 0) & (ids < num_blocks)  # [M]
    counts = np.bincount(ids[in_range], minlength=num_blocks)  # [num_blocks]
    missing = np.flatnonzero(counts == 0)
    duplicated = np.flatnonzero(counts > 1)
    out_of_range = np.unique(ids[~in_range])
    problems = []
    if missing.size:
        problems.append(f"{missing.size} of {num_blocks} block ids missing: {format_ids(missing)}")
    if duplicated.size:
        problems.append(f"{duplicated.size} block ids embedded more than once: {format_ids(duplicated)}")
    if out_of_range.size:
        problems.append(f"{out_of_range.size} block ids outside 0..{num_blocks - 1}: {format_ids(out_of_range)}")
    if failures:
        shown = "; ".join(f"{f.get('block_id')}: {f.get('error')}" for f in list(failures)[:5])
        more = f"; ... and {len(failures) - 5} more" if len(failures) > 5 else ""
        problems.append(f"{len(failures)} block(s) failed to embed or parse ({shown}{more})")
    if num_blocks == 0:
        problems.append("no blocks at all")
    if problems:
        raise IncompleteEmbeddingsError("refusing to publish the index: " + "; ".join(problems) + where)
    matrix = np.empty([num_blocks, vectors.shape[1]], np.float32)  # [num_blocks, dim]
    matrix[ids] = vectors
    return matrix


def format_ids(ids: Sequence[int] | np.ndarray, limit: int = _SHOWN_IDS) -> str:
    """``[0, 1, 2, 5, 9, 10]`` -> ``"0-2, 5, 9-10"``, at most ``limit`` runs then ``... and N more ids``."""
    ids = sorted(int(i) for i in np.asarray(ids).ravel())
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit])
    if len(runs) > limit:
        text += f", ... and {sum(b - a + 1 for a, b in runs[limit:])} more ids"
    return text


def build_index(kind: str, index_config: config_lib.IndexConfig, embeddings: np.ndarray) -> Any:
    """The ``index.kind`` MipsIndex built over ``embeddings`` ([num_blocks, dim], row = block id)."""
    from realm_tf.index import brute_force_index  # pylint: disable=import-outside-toplevel
    from realm_tf.index import scann_index  # pylint: disable=import-outside-toplevel

    if kind == scann_index.ScannIndex.kind:
        index = scann_index.ScannIndex(index_config)
    elif kind == brute_force_index.BruteForceIndex.kind:
        index = brute_force_index.BruteForceIndex()
    else:
        raise errors.UserError(f"index.kind must be 'scann' or 'brute_force', got {kind!r}")
    index.build(embeddings)
    return index


# ---- the job --------------------------------------------------------------------------------------------

def resolve_export(args: argparse.Namespace, cfg: config_lib.ExperimentConfig) -> str:
    """``--export``, else the newest complete export under ``--export_dir`` (default refresh.export_dir)."""
    from realm_tf.serving import retriever_export  # pylint: disable=import-outside-toplevel

    if args.export:
        return args.export.rstrip("/")
    export_dir = args.export_dir or cfg.refresh.export_dir
    steps = retriever_export.list_exports(export_dir)
    if not steps:
        raise errors.UserError(f"{export_dir}: no complete retriever export (run realm-tf export-retriever, or "
                               f"pass --export)")
    return os.path.join(export_dir, str(steps[-1]))


def _match(pattern: str) -> list[Any]:
    return sorted(filesystems.FileSystems.match([pattern])[0].metadata_list, key=lambda m: m.path)


def _delete_matching(patterns: Sequence[str]) -> None:
    paths = [m.path for p in patterns for m in _match(p)]
    if paths:
        filesystems.FileSystems.delete(paths)


def _is_direct_runner(options: pipeline_options.PipelineOptions) -> bool:
    runner = options.view_as(pipeline_options.StandardOptions).runner
    return runner is None or "direct" in str(runner).lower() or "DirectRunner" in str(runner)


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the job on ``argv`` (job flags + Beam pipeline options); returns the summary it printed."""
    parser = argparse.ArgumentParser(prog="python -m beam_jobs.embed_blocks", description=__doc__.split("\n\n")[0])
    job_flags.add_embed_blocks_args(parser)
    args, beam_args = parser.parse_known_args(argv)
    return run_with_args(args, beam_args)


def run_with_args(args: argparse.Namespace, beam_args: Sequence[str]) -> dict[str, Any]:
    """Runs the job on parsed ``job_flags.add_embed_blocks_args`` flags and Beam options (used by ``realm-tf``)."""
    from realm_tf.index import index_publisher  # pylint: disable=import-outside-toplevel
    from realm_tf.serving import retriever_export  # pylint: disable=import-outside-toplevel

    started = time.time()
    cfg = config_lib.load_config(args.config, args.overrides)
    blocks = args.blocks or filesystems.FileSystems.join(cfg.data.blocks_dir, "blocks-*.tfrecord")
    index_dir = args.index_dir or cfg.index.index_dir
    export_path = resolve_export(args, cfg)
    export = retriever_export.read_export_metadata(export_path)
    version = int(export["step"])
    if index_publisher.is_complete(index_publisher.version_dir(index_dir, version)):
        raise index_publisher.IndexVersionExistsError(
            f"{index_publisher.version_dir(index_dir, version)}: index version {version} (export step) is "
            f"already published")
    manifest = job_support.check_input(blocks, export["vocab_hash"], flag="--blocks")
    expected_blocks = int(manifest["blocks"]) if manifest and "blocks" in manifest else None
    embeddings_dir = args.embeddings_dir or filesystems.FileSystems.join(
        index_dir, f".embeddings-{index_publisher.version_name(version)}-{uuid.uuid4().hex[:8]}")
    embeddings_pattern = filesystems.FileSystems.join(embeddings_dir, f"{EMBEDDINGS_PREFIX}-*.tfrecord")
    failures_pattern = filesystems.FileSystems.join(embeddings_dir, f"{FAILURES_PREFIX}-*.jsonl")
    _delete_matching([embeddings_pattern, failures_pattern])  # a rerun into the same --embeddings_dir

    options = pipeline_options.PipelineOptions([a for a in beam_args if a != "--"])
    options.view_as(pipeline_options.SetupOptions).save_main_session = False
    interval = args.progress_interval if args.progress_interval is not None else (
        10.0 if _is_direct_runner(options) else 0.0)
    print(f"embed_blocks: export {export_path} (step {version}, dim {export['embedding_dim']}) over {blocks}"
          f"{f' ({expected_blocks:,} blocks)' if expected_blocks is not None else ''} -> {index_dir}",
          file=sys.stderr, flush=True)

    pipeline = beam.Pipeline(options=options)
    outputs = (pipeline
               | "ReadBlocks" >> beam.io.ReadFromTFRecord(blocks)
               | "EmbedBlocks" >> EmbedBlocks(export_path, int(export["block_seq_length"]), args.min_batch_size,
                                              args.max_batch_size, args.batching, expected_blocks, interval))
    _ = (outputs["embeddings"]
         | "SerializeEmbeddings" >> beam.Map(to_embedding_record)
         | "WriteEmbeddings" >> beam.io.WriteToTFRecord(
             filesystems.FileSystems.join(embeddings_dir, EMBEDDINGS_PREFIX), file_name_suffix=".tfrecord",
             num_shards=args.num_shards))
    _ = (outputs["failures"]
         | "SerializeFailures" >> beam.Map(lambda f: json.dumps(f, sort_keys=True))
         | "WriteFailures" >> beam.io.WriteToText(filesystems.FileSystems.join(embeddings_dir, FAILURES_PREFIX),
                                                  file_name_suffix=".jsonl", num_shards=1))
    result = pipeline.run()
    result.wait_until_finish()
    embed_seconds = time.time() - started
    counts = job_support.read_counters(result, NAMESPACE)

    start = time.time()
    ids, vectors = read_embedding_shards(embeddings_pattern, int(export["embedding_dim"]))  # [M], [M, dim]
    failures = read_failures(failures_pattern)
    matrix = assemble_matrix(ids, vectors, expected_blocks, failures,
                             where=f" (blocks {blocks}; embeddings kept in {embeddings_dir})")  # [N, dim]
    del ids, vectors
    assemble_seconds = time.time() - start

    start = time.time()
    index = build_index(cfg.index.kind, cfg.index, matrix)
    build_seconds = time.time() - start
    metadata = {
        "export_step": version,
        "export_path": export_path if "://" in export_path else os.path.abspath(export_path),
        "exported_at": export.get("exported_at"),
        "export_config_hash": export.get("config_hash"),
        "vocab_hash": export["vocab_hash"],
        "block_seq_length": int(export["block_seq_length"]),
        "blocks_pattern": blocks,
        "blocks_manifest": expected_blocks is not None,
        "counts": counts,
        "batching": {"mode": args.batching, "min_batch_size": args.min_batch_size,
                     "max_batch_size": args.max_batch_size},
        "embed_seconds": round(embed_seconds, 3),
        "assemble_seconds": round(assemble_seconds, 3),
        "build_seconds": round(build_seconds, 3),
        "config_hash": config_lib.config_hash(cfg),
    }
    start = time.time()
    path = index_publisher.publish(index_dir, version, matrix, index, metadata, cfg.index.keep_versions,
                                   pause_before_commit=args.pause_before_commit)
    publish_seconds = time.time() - start
    if not args.keep_embeddings:
        _delete_matching([embeddings_pattern, failures_pattern])
        try:
            filesystems.FileSystems.delete([embeddings_dir])
        except Exception:  # pylint: disable=broad-except  # object stores have no directories to delete
            pass
    summary = {**index_publisher.read_index_json(path), "index_path": path, "publish_seconds": round(publish_seconds, 3),
               "total_seconds": round(time.time() - started, 3),
               "embeddings_dir": embeddings_dir if args.keep_embeddings else None}
    print(format_summary(summary))
    return summary


def format_summary(summary: Mapping[str, Any]) -> str:
    """A few lines summing up a finished run."""
    counts = summary["counts"]
    padded = counts.get(PADDED_WORDPIECES, 0)
    efficiency = f"{counts.get(WORDPIECES, 0) / padded:.1%}" if padded else "n/a"
    rate = summary["num_blocks"] / summary["embed_seconds"] if summary["embed_seconds"] else 0.0
    return (f"embed_blocks: published index version {summary['version']} ({summary['kind']}, "
            f"{summary['num_blocks']:,} x {summary['dim']}) at {summary['index_path']}\n"
            f"  export:   {summary['export_path']} (step {summary['export_step']}, vocab {summary['vocab_hash'][:12]})\n"
            f"  blocks:   {counts.get(BLOCKS_READ, 0):,} read, {counts.get(BLOCKS_EMBEDDED, 0):,} embedded, "
            f"{counts.get(BLOCKS_FAILED, 0):,} failed, {counts.get(BLOCKS_UNPARSEABLE, 0):,} unparseable; "
            f"{counts.get(BATCHES, 0):,} batches, {efficiency} of the padded wordpieces real\n"
            f"  seconds:  embed {summary['embed_seconds']:.1f} ({rate:,.1f} blocks/s), assemble "
            f"{summary['assemble_seconds']:.1f}, build {summary['build_seconds']:.1f}, publish "
            f"{summary['publish_seconds']:.1f}, total {summary['total_seconds']:.1f}")


if __name__ == "__main__":
    sys.exit(job_support.main(run, "embed_blocks"))
