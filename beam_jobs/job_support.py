"""Command-line handling, output preparation and counters shared by the example-generation Beam jobs.

Each job parses its own flags (``job_flags``: ``--input``, ``--output``, ``--config``, ``--set``, ...) and hands
every other flag to Beam's standard ``PipelineOptions``, so the same command runs on the DirectRunner, Dataflow
(``--runner=DataflowRunner --project ... --setup_file ./setup.py``), Flink or Spark. After the pipeline has
finished, the job's Beam counters are read back from the result and written into ``manifest.json``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Mapping, Sequence

import apache_beam as beam
from apache_beam.io import filesystems
from apache_beam.metrics import metric
from apache_beam.options import pipeline_options

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import job_manifest


def resolve(args: argparse.Namespace, beam_args: Sequence[str]
            ) -> tuple[config_lib.ExperimentConfig, pipeline_options.PipelineOptions]:
    """The resolved config (``--config`` + ``--set``) and Beam options; fills ``args.input`` from the config."""
    cfg = config_lib.load_config(args.config, args.overrides)
    if args.input is None:
        args.input = filesystems.FileSystems.join(cfg.data.blocks_dir, "blocks-*.tfrecord")
    return cfg, pipeline_options.PipelineOptions([a for a in beam_args if a != "--"])


def prepare_output(output_dir: str, prefix: str) -> None:
    """Removes a previous run's manifest, then its ``<prefix>-*.tfrecord`` shards, from ``output_dir``.

    The manifest goes first: a directory is complete only while its manifest exists, so a rerun that
    fails half-way never looks finished, and stale shards with another shard count cannot linger.
    """
    manifest = job_manifest.manifest_path(output_dir)
    if filesystems.FileSystems.exists(manifest):
        filesystems.FileSystems.delete([manifest])
    pattern = filesystems.FileSystems.join(output_dir, f"{prefix}-*.tfrecord")
    stale = [m.path for r in filesystems.FileSystems.match([pattern]) for m in r.metadata_list]
    if stale:
        filesystems.FileSystems.delete(stale)


def check_input(pattern: str, vocab_hash: str, flag: str = "--input") -> dict[str, object] | None:
    """Fails early when no block file matches ``pattern`` or the blocks' manifest names another vocabulary.

    Returns the blocks' ``manifest.json`` (None when the directory has none).
    """
    matched = filesystems.FileSystems.match([pattern])[0].metadata_list
    if not matched:
        raise errors.UserError(f"{flag} {pattern}: no block TFRecords match (run realm-tf preprocess first)")
    directory = filesystems.FileSystems.split(matched[0].path)[0]
    try:
        manifest = job_manifest.read_manifest(directory)
    except FileNotFoundError:
        return None
    recorded = manifest.get("vocab_hash")
    if recorded and recorded != vocab_hash:
        raise errors.UserError(f"{job_manifest.manifest_path(directory)}: blocks were tokenized with vocabulary "
                               f"{recorded}, this job uses {vocab_hash} (check model.vocab_file / model.lower_case)")
    return manifest


def parse_example(record: bytes, spec: Mapping[str, object]) -> dict[str, object]:
    """One serialized tf.train.Example -> plain Python values, following an ``example_schemas`` spec.

    Pure protobuf (no TensorFlow op per record): scalar ``FixedLenFeature``s become ``bytes`` / ``int``
    (their default when absent), ``RaggedFeature``s become lists of ints (or of bytes).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    features = tf.train.Example.FromString(record).features.feature
    row: dict[str, object] = {}
    for key, feature_spec in spec.items():
        feature = features.get(key)
        is_bytes = feature_spec.dtype == tf.string
        values = list((feature.bytes_list if is_bytes else feature.int64_list).value) if feature else []
        if isinstance(feature_spec, tf.io.RaggedFeature):
            row[key] = values
        elif values:
            row[key] = values[0]
        elif feature_spec.default_value is not None:
            row[key] = feature_spec.default_value
        else:
            raise ValueError(f"record has no required feature {key!r}")
    return row


def count(namespace: str, name: str, value: int = 1) -> None:
    """Increments the Beam counter ``namespace:name`` (no-op for 0)."""
    if value:
        metric.Metrics.counter(namespace, name).inc(value)


def read_counters(result: beam.runners.runner.PipelineResult, namespace: str) -> dict[str, int]:
    """The job's counters after the run (committed values where the runner reports them)."""
    query = result.metrics().query(metric.MetricsFilter().with_namespace(namespace))
    totals: dict[str, int] = {}
    for counter in query["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + int(value or 0)
    return dict(sorted(totals.items()))


def main(run: Callable[[list[str] | None], object], name: str) -> int:
    """``python -m beam_jobs.<job>``: runs the job, reporting configuration errors without a traceback."""
    try:
        run(sys.argv[1:])
    except (errors.UserError, FileNotFoundError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    return 0

