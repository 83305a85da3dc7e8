"""Beam job: a trained decoder + RETRO's chunk database -> kNN-LM's datastore (Khandelwal et al., 2020, §2).

"For every training token, the key is the decoder's hidden state at the input of the final layer's feed-forward
block (after its LayerNorm), and the value is the next token." The sequences are those the decoder trained on
(``retro/retro_sequences``: the training documents' token streams cut at chunk boundaries) and, when
``retro.training_document_fraction`` < 1, those of the ``database`` split: text RETRO retrieves but the decoder
never trained on (kNN-LM §4.2, "more data without training": a datastore larger than the training set):

  ReadChunks          <retro.chunks_dir>/chunks-*.tfrecord
  ParseChunks         chunk -> (doc_id, (chunk_id, tokens)) | DeadLetter(unparseable_chunk)
  GroupByDocument     a document's chunks
  Sequences           training and database documents (held-out ones counted, not read) -> (sequence key, ids [n],
                      mask [n]); the key is SHA1(doc_id) and the sequence index
  RunInference        the decoder (restored in ``load_model``) -> per real target: the key (``knn_keys``) and the
                      next token | failures
  WriteEntries        <knn_dir>/.entries-*/entries-*.tfrecord: one record per sequence (raw float32 keys,
                      int64 values)

then reads the entries in sequence-key order (datastore row = position in that order), builds the MIPS index over
the augmented keys (``retro/knn_datastore``: inner product ranks as L2) and publishes it with ``values.npy`` as a
new version of ``retro.knn_dir``, and writes ``manifest.json`` there last, with counts that must add up.

Usage (DirectRunner by default; any Beam runner through the standard pipeline options)::

    realm-tf build-knn-datastore --config configs/minilm.yaml --set retro_trainer.model_dir=runs/minilm/baseline
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import time
from typing import Any, Iterable, Iterator, Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)

# isort: split
import apache_beam as beam
import numpy as np
from apache_beam.io import filesystems
from apache_beam.ml.inference import base as inference_base

from beam_jobs import job_flags
from beam_jobs import job_support
from beam_jobs import vector_job
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import example_schemas
from realm_tf.data import job_manifest
from realm_tf.retro import knn_datastore
from realm_tf.retro import retro_sequences

logger = logging.getLogger(__name__)

NAMESPACE = "realm_tf.build_knn_datastore"
ENTRIES_PREFIX = "entries"

# Counters (NAMESPACE)
CHUNKS_READ = "chunks_read"
HELD_OUT_CHUNKS = "held_out_chunks"  # chunks of validation / test documents: never in the datastore
DOCUMENTS = "training_documents"  # documents outside the held-out splits (retro_sequences.RETRIEVABLE)
SEQUENCES = "sequences"
TARGETS = "targets"  # real next tokens of the training sequences: one datastore entry each
ENTRIES = "entries_written"
FAILED_SEQUENCES = "failed_sequences"
FAILED_TARGETS = "failed_targets"
UNPARSEABLE = "dead_letters.unparseable_chunk"


class _ParseChunkFn(beam.DoFn):
    """A chunk record -> ``(doc_id, (chunk_id, tokens))`` of a document outside the held-out splits; others are
    counted."""

    def __init__(self, validation_fraction: float, test_fraction: float, training_fraction: float = 1.0) -> None:
        super().__init__()
        spec = example_schemas.chunk_feature_spec()
        self._spec = {k: spec[k] for k in (example_schemas.CHUNK_ID, example_schemas.DOC_ID,
                                           example_schemas.TOKENS)}
        self._fractions = (validation_fraction, test_fraction, training_fraction)

    def process(self, record: bytes) -> Iterator[Any]:
        job_support.count(NAMESPACE, CHUNKS_READ)
        try:
            row = job_support.parse_example(record, self._spec)
            doc_id = row[example_schemas.DOC_ID].decode("utf-8")
            chunk_id = int(row[example_schemas.CHUNK_ID])
            tokens = tuple(int(t) for t in row[example_schemas.TOKENS])
        except Exception as e:  # pylint: disable=broad-except  # a corrupt record is a dead letter, not a crash
            job_support.count(NAMESPACE, UNPARSEABLE)
            yield beam.pvalue.TaggedOutput("dead_letters", {"reason": "unparseable_chunk",
                                                            "detail": f"{type(e).__name__}: {str(e)[:300]}"})
            return
        if retro_sequences.document_split(doc_id, *self._fractions) not in retro_sequences.RETRIEVABLE:
            job_support.count(NAMESPACE, HELD_OUT_CHUNKS)
            return
        yield doc_id, (chunk_id, tokens)


def _sequences(grouped: tuple[str, Iterable[tuple[int, Sequence[int]]]], length: int,
               pad_id: int) -> Iterator[tuple[str, tuple[np.ndarray, np.ndarray]]]:
    """A document's chunks (in chunk-id order) -> its training sequences, keyed ``SHA1(doc_id):SSSSSS``."""
    doc_id, chunks = grouped
    stream = [t for _, tokens in sorted(chunks) for t in tokens]
    ids, mask = retro_sequences.document_sequences(stream, length, pad_id)  # [S, n] each
    job_support.count(NAMESPACE, DOCUMENTS)
    doc_key = hashlib.sha1(doc_id.encode("utf-8")).hexdigest()
    for s in range(ids.shape[0]):
        job_support.count(NAMESPACE, SEQUENCES)
        job_support.count(NAMESPACE, TARGETS, int(mask[s, 1:].sum()))
        yield f"{doc_key}:{s:06d}", (ids[s], mask[s])


class DecoderKeyModelHandler(vector_job.FallbackModelHandler[Any]):
    """Beam ModelHandler of a trained decoder (``retro/retro_decoder``, the baseline): a batch of sequences
    ``(ids [n], mask [n])`` -> per sequence a :class:`vector_job.Outcome` whose ``value`` is ``(keys float32
    [T, width], next tokens int32 [T])`` over its T real targets (``weight`` T), or the error that made it fail.
    ``load_model`` restores the newest checkpoint of ``model_dir``."""

    namespace = NAMESPACE

    def __init__(self, cfg: config_lib.ExperimentConfig, model_dir: str, batch_size: int) -> None:
        super().__init__(min_batch_size=1, max_batch_size=batch_size)
        self._cfg, self._model_dir = cfg, model_dir

    def load_model(self) -> Any:
        from realm_tf.retro import lm_evaluation  # pylint: disable=import-outside-toplevel
        from realm_tf.retro import retro_lm  # pylint: disable=import-outside-toplevel

        return lm_evaluation.restore_decoder(retro_lm.RetroLmTask(self._cfg, retrieval=False), self._model_dir)

    def infer(self, model: Any, batch: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[vector_job.Outcome]:
        ids = np.stack([b[0] for b in batch]).astype(np.int32)  # [B, n]
        mask = np.stack([b[1] for b in batch])  # [B, n]
        keys = model({"input_ids": ids}, training=False)["knn_keys"].numpy()  # [B, n, width]
        out = []
        for i in range(len(batch)):
            real = mask[i, 1:]  # [n - 1]: position t predicts token t + 1
            entry_keys = keys[i, :-1][real].astype(np.float32)  # [T, width]
            if not np.isfinite(entry_keys).all():
                out.append(vector_job.Outcome(None, "non-finite key (NaN or Inf)", int(real.sum())))
                continue
            out.append(vector_job.Outcome((entry_keys, ids[i, 1:][real]), None, int(real.sum())))
        return out

    def failed(self, item: tuple[np.ndarray, np.ndarray], error: str) -> vector_job.Outcome:
        return vector_job.Outcome(None, error, int(item[1][1:].sum()))

    def get_num_bytes(self, batch: Sequence[Any]) -> int:
        return sum(ids.nbytes + mask.nbytes for ids, mask in batch)


def _entry_record(keyed: tuple[str, tuple[np.ndarray, np.ndarray]]) -> bytes:
    """``(sequence key, (keys [T, width], values [T]))`` -> a serialized entry record."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    key, (keys, values) = keyed
    return tf.train.Example(features=tf.train.Features(feature={
        "sequence": tf.train.Feature(bytes_list=tf.train.BytesList(value=[key.encode()])),
        "keys": tf.train.Feature(bytes_list=tf.train.BytesList(value=[keys.astype("<f4").tobytes()])),
        "values": tf.train.Feature(int64_list=tf.train.Int64List(value=values.tolist())),
    })).SerializeToString(deterministic=True)


def build_pipeline(pipeline: beam.Pipeline, cfg: config_lib.ExperimentConfig, model_dir: str, entries_dir: str,
                   batch_size: int, progress_interval: float = 0.0) -> None:
    """Adds the job but the index: training sequences -> decoder keys -> entry shards, failures, dead letters
    (progress lines on stderr every ``progress_interval`` seconds; 0: none)."""
    retro = cfg.retro
    from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel

    pad_id = bert_tokenizer.read_vocab(cfg.model.vocab_file).index("[PAD]")
    parsed = (pipeline
              | "ReadChunks" >> beam.io.ReadFromTFRecord(filesystems.FileSystems.join(retro.chunks_dir, "chunks-*"))
              | "ParseChunks" >> beam.ParDo(_ParseChunkFn(
                  retro.validation_fraction, retro.test_fraction, retro.training_document_fraction))
              .with_outputs("dead_letters", main="chunks"))
    outcomes = (parsed["chunks"]
                | "GroupByDocument" >> beam.GroupByKey()
                | "Sequences" >> beam.FlatMap(_sequences, retro.sequence_length, pad_id)
                | "RunInference" >> inference_base.RunInference(inference_base.KeyedModelHandler(
                    DecoderKeyModelHandler(cfg, model_dir, batch_size)))
                | "SplitOutcomes" >> vector_job.SplitOutcomes(
                    "build_knn_datastore", "sequences", NAMESPACE,
                    {"failed": FAILED_SEQUENCES, "failed_weight": FAILED_TARGETS, "done_weight": ENTRIES}, "sequence",
                    progress_interval=progress_interval, weight_unit="entries"))
    _ = (outcomes["values"]
         | "ToRecords" >> beam.Map(_entry_record)
         | "WriteEntries" >> beam.io.WriteToTFRecord(filesystems.FileSystems.join(entries_dir, ENTRIES_PREFIX),
                                                     file_name_suffix=".tfrecord"))
    failures = (outcomes["failures"], parsed["dead_letters"]) | "AllFailures" >> beam.Flatten()
    _ = failures | "WriteFailures" >> vector_job.WriteFailures(entries_dir)


def read_entries(paths: Sequence[str], width: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(keys float32 [N, width], values int32 [N], sequence keys)``, sequences in key order."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    rows = []
    for path in paths:
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            feature = tf.train.Example.FromString(record).features.feature
            values = np.asarray(feature["values"].int64_list.value, np.int32)
            keys = np.frombuffer(feature["keys"].bytes_list.value[0], "<f4").reshape(len(values), width)
            rows.append((feature["sequence"].bytes_list.value[0].decode(), keys, values))
    rows.sort(key=lambda r: r[0])
    if len({r[0] for r in rows}) != len(rows):
        raise RuntimeError(f"{paths}: a sequence was written twice")
    keys = np.concatenate([r[1] for r in rows]) if rows else np.zeros([0, width], np.float32)
    values = np.concatenate([r[2] for r in rows]) if rows else np.zeros([0], np.int32)
    return keys, values, [r[0] for r in rows]


def check_counts(counts: dict[str, int]) -> None:
    """Every real target of every training sequence is an entry or a counted failure (RuntimeError otherwise)."""
    if counts.get(ENTRIES, 0) + counts.get(FAILED_TARGETS, 0) != counts.get(TARGETS, 0):
        raise RuntimeError(f"kNN datastore counts do not add up: {counts.get(ENTRIES, 0)} entries + "
                           f"{counts.get(FAILED_TARGETS, 0)} failed != {counts.get(TARGETS, 0)} targets")


def build_knn_datastore(cfg: config_lib.ExperimentConfig, model_dir: str | None = None,
                        beam_args: Sequence[str] = (), batch_size: int = 8,
                        progress_interval: float | None = None) -> dict[str, Any]:
    """Builds and publishes a new version of ``retro.knn_dir`` from the decoder of ``model_dir`` (default
    ``retro_trainer.model_dir``); returns the manifest. Progress lines every ``progress_interval`` seconds
    (default: 10 on the DirectRunner, none elsewhere)."""
    started = time.time()
    model_dir = model_dir or cfg.retro_trainer.model_dir
    knn_dir = cfg.retro.knn_dir
    if not job_support.match(filesystems.FileSystems.join(cfg.retro.chunks_dir, "chunks-*")):
        raise errors.UserError(f"{cfg.retro.chunks_dir}: no chunk database (run `realm-tf build-chunk-database`)")
    job_support.prepare_output(knn_dir)
    entries_dir = job_support.scratch_directory(knn_dir, ENTRIES_PREFIX)
    logger.info("build_knn_datastore: %s's decoder over the training documents of %s -> %s", model_dir,
                cfg.retro.chunks_dir, knn_dir)
    options = job_support.pipeline_options_for(beam_args)
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, cfg, model_dir, entries_dir, batch_size,
                   job_support.progress_interval_for(progress_interval, options))
    counts = vector_job.run_pipeline(pipeline, NAMESPACE)
    check_counts(counts)
    pipeline_seconds = time.time() - started

    start = time.time()
    keys, values, _ = read_entries(
        [m.path for m in job_support.match(filesystems.FileSystems.join(entries_dir, f"{ENTRIES_PREFIX}-*"))],
        cfg.retro.decoder_width)  # [N, width], [N]
    if keys.shape[0] != counts.get(ENTRIES, 0):
        raise RuntimeError(f"{entries_dir}: {keys.shape[0]} entries read, {counts.get(ENTRIES, 0)} written")
    augmented = knn_datastore.augment_keys(keys)  # [N, width + 1]
    del keys
    from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel

    version, path, _ = vector_job.build_and_publish(cfg, knn_dir, augmented, {
        "vocab_hash": bert_tokenizer.vocab_hash(cfg.model.vocab_file),
        "model_dir": model_dir, "chunks_dir": cfg.retro.chunks_dir,
        "keys": "[k, -|k|^2/2] of the decoder's final FFW input (after LayerNorm); queries [q, 1]",
    }, arrays={knn_datastore.VALUES_NPY: values})
    job_support.remove_scratch_directory(entries_dir)
    manifest = {
        "job": JOB.name, "model_dir": model_dir, "chunks_dir": cfg.retro.chunks_dir, "num_entries": len(values),
        "width": cfg.retro.decoder_width, "counts": counts, "index_version": version, "index_path": path,
        "beam_args": [a for a in beam_args if a != "--"], "config_hash": config_lib.config_hash(cfg),
        "config": config_lib.to_dict(cfg),
        "seconds": {"pipeline": round(pipeline_seconds, 1), "index": round(time.time() - start, 1),
                    "total": round(time.time() - started, 1)},
    }
    job_manifest.write_manifest(knn_dir, manifest)
    logger.info("%s", format_summary(manifest))
    return manifest


def format_summary(manifest: dict[str, Any]) -> str:
    """A few lines summing up a finished run."""
    counts = manifest["counts"]
    return (f"build_knn_datastore: {counts.get(DOCUMENTS, 0):,} training documents, {counts.get(SEQUENCES, 0):,} "
            f"sequences -> {manifest['num_entries']:,} entries of width {manifest['width']} "
            f"({counts.get(HELD_OUT_CHUNKS, 0):,} held-out chunks not read; failed sequences: "
            f"{counts.get(FAILED_SEQUENCES, 0)})\n  version {manifest['index_version']} at {manifest['index_path']}; "
            f"{manifest['seconds']['total']}s")


class BuildKnnDatastoreJob(job_support.BeamJob):
    """``python -m beam_jobs.build_knn_datastore`` / ``realm-tf build-knn-datastore``."""

    name = "build_knn_datastore"

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        job_flags.add_knn_datastore_args(parser)

    def run_with_args(self, args: argparse.Namespace, beam_args: Sequence[str]) -> dict[str, Any]:
        cfg = config_lib.load_config(args.config, args.overrides)
        if args.batch_size < 1:
            raise errors.UserError(f"--batch-size={args.batch_size}: must be >= 1")
        return build_knn_datastore(cfg, args.model_dir, beam_args, args.batch_size, args.progress_interval)


JOB = BuildKnnDatastoreJob()
run = JOB.run  # python: build_knn_datastore.run(argv)


if __name__ == "__main__":
    sys.exit(job_support.main(__spec__))
