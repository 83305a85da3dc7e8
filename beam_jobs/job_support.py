"""The one skeleton of every Beam job: flags, inputs, outputs, counters, manifest, progress, entry point.

Every job (``preprocess_corpus``, ``generate_pretraining_data``, ``generate_ict_data``, ``embed_blocks``,
``update_corpus``, ...) is a :class:`BeamJob`: it parses its own flags (``job_flags``: ``--input``, ``--output``,
``--config``, ``--set``, ...) and hands every other flag to Beam's standard ``PipelineOptions``, so the same
command runs on the DirectRunner, Dataflow (``--runner=DataflowRunner --project ... --setup_file ./setup.py``),
Flink or Spark. The shape is read → transform → write (labelled steps) → counters (read back from the result) →
a marker written last (``manifest.json`` or an index version's ``index.json``) → a summary; long steps print
:class:`Progress` lines. ``python -m beam_jobs.<job>`` and ``realm-tf <job>`` both call :meth:`BeamJob.run`.
"""
from __future__ import annotations

import abc
import argparse
import contextlib
import copy
import importlib
import importlib.machinery
import logging
import os
import sys
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import apache_beam as beam
from apache_beam.io import filesystems
from apache_beam.metrics import metric
from apache_beam.options import pipeline_options

import realm_tf
from beam_jobs import job_flags
from realm_tf import artifacts
from realm_tf import command_line
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf import library_logs
from realm_tf import process_settings
from realm_tf.data import corpus_versions
from realm_tf.data import job_manifest

logger = logging.getLogger(__name__)
# Beam's worker processes import this module (through the job's transforms) without running a launcher: their
# known-harmless library messages are dropped too (REALM_TF_VERBOSE=1 keeps them; TensorFlow is not imported here).
library_logs.quiet_known_noise(find_devices=False)


def resolve(args: argparse.Namespace, beam_args: Sequence[str]
            ) -> tuple[config_lib.ExperimentConfig, pipeline_options.PipelineOptions]:
    """The resolved config (``--config`` + ``--set``) and Beam options; fills ``args.input`` from the config
    (the blocks of the current corpus version, ``realm_tf/data/corpus_versions``)."""
    cfg = config_lib.load_config(args.config, args.overrides)
    if args.input is None:
        args.input = corpus_versions.current_pattern(cfg.data.blocks_dir, "blocks-*.tfrecord")
    return cfg, pipeline_options_for(beam_args)


def prepare_output(output_dir: str, *globs: str) -> None:
    """Removes a previous run's manifest, then its files matching ``globs`` (names inside ``output_dir``,
    e.g. ``"ict-*.tfrecord"``), and creates ``output_dir``.

    The manifest goes first: a directory is complete only while its manifest exists, so a rerun that
    fails half-way never looks finished, and stale shards with another shard count cannot linger.
    """
    manifest = job_manifest.manifest_path(output_dir)
    if filesystems.FileSystems.exists(manifest):
        filesystems.FileSystems.delete([manifest])
    delete_matching([filesystems.FileSystems.join(output_dir, glob) for glob in globs])
    if not filesystems.FileSystems.exists(output_dir):
        filesystems.FileSystems.mkdirs(output_dir)


@contextlib.contextmanager
def replacing_output(output_dir: str) -> Iterator[str]:
    """The directory a job writes its whole output into, manifest included: a staging directory beside
    ``output_dir`` that replaces it in one step when the body returns (``artifacts.staged``). Until then readers
    keep the previous complete output; a job that fails or is killed leaves it as it was (a killed job's
    staging directory is removed by the next run)."""
    with artifacts.staged(output_dir, artifacts.JOB_MANIFEST, replace=True, marker_written=True) as staging:
        yield staging.path


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


class BeamJob(abc.ABC):
    """A Beam job: its flags, and :meth:`run_with_args`, which builds, runs and sums up one pipeline.

    Subclasses set ``name`` (the module and the ``realm-tf`` subcommand) and implement :meth:`add_args` and
    :meth:`run_with_args`; :meth:`run` and :meth:`main` are the entry points.
    """

    name: str = ""

    @abc.abstractmethod
    def add_args(self, parser: argparse.ArgumentParser) -> None:
        """Adds the job's own flags (every other flag is a Beam pipeline option)."""

    @abc.abstractmethod
    def run_with_args(self, args: argparse.Namespace, beam_args: Sequence[str]) -> Any:
        """Runs the job on parsed flags and Beam options; returns what it published (manifest / summary)."""

    def parser(self) -> argparse.ArgumentParser:
        """The job's flags, ``--version`` and its ``Examples:`` (``job_flags.EXAMPLES``)."""
        prog = f"python -m beam_jobs.{self.name}"
        examples = job_flags.EXAMPLES.get(self.name, ())
        parser = command_line.ConventionParser(
            prog=prog, beam_options=True, description=(sys.modules[type(self).__module__].__doc__ or "").split(
                "\n\n")[0],
            epilog="Examples:\n" + "\n".join(f"  {prog} {e}" for e in examples) if examples else None)
        parser.add_argument("--version", action="version", version=f"{prog} (realm-tf {realm_tf.__version__})")
        self.add_args(parser)
        return parser

    def run(self, argv: Sequence[str] | None = None) -> Any:
        """Runs the job on ``argv`` (job flags, then ``--`` and Beam pipeline options)."""
        args, beam_args = self.parser().parse_known_args(argv)
        return self.run_with_args(args, beam_args)

    def call(self, beam_args: Sequence[str] = (), **flags: Any) -> Any:
        """Runs the job from Python: its flags as keyword arguments named as their values are (``config``,
        ``overrides=["section.key=value", ...]``, ``input=[...]``, ``output``, ...), the others at their command-line
        defaults; ``beam_args`` are Beam pipeline options. The same :meth:`run_with_args` as the command line.

        Raises:
          TypeError: an argument the job does not take, or a required one missing.
        """
        actions = {a.dest: a for a in self.parser()._actions  # noqa: SLF001  (argparse's own)
                   if not isinstance(a, (argparse._HelpAction, argparse._VersionAction))}  # noqa: SLF001
        unknown = sorted(set(flags) - set(actions))
        missing = sorted(dest for dest, a in actions.items() if a.required and dest not in flags)
        if unknown or missing:
            raise TypeError(f"{self.name}: " + "; ".join(
                ([f"unknown arguments {unknown} (it takes {sorted(actions)})"] if unknown else [])
                + ([f"missing required arguments {missing}"] if missing else [])))
        values = {dest: copy.deepcopy(a.default) for dest, a in actions.items()}
        return self.run_with_args(argparse.Namespace(**{**values, **flags}), list(beam_args))

    def main(self) -> int:
        """``python -m beam_jobs.<job>``: runs the job, reporting configuration errors without a traceback. The
        process takes ``realm-tf``'s TensorFlow settings (:mod:`realm_tf.process_settings`), as do the DirectRunner's
        worker processes, which inherit its environment, and its quiet start (``REALM_TF_VERBOSE=1``: everything,
        as ``realm-tf --verbose``)."""
        process_settings.prepare_process()  # before the job's first tensor; REALM_TF_VERBOSE=1 keeps everything
        try:
            self.run(sys.argv[1:])
        except (errors.UserError, FileNotFoundError) as e:
            print(f"{self.name}: error: {e}", file=sys.stderr)
            return 2
        return 0


def main(spec: importlib.machinery.ModuleSpec | None) -> int:
    """``python -m beam_jobs.<job>``: runs the ``JOB`` of the job's module imported under its package name.

    Run with ``-m``, the job's file is ``__main__``. Beam pickles elements of the job's own classes (e.g.
    ``embed_blocks.BlockInput``) by reference, and a worker in another process (Dataflow, Flink, Spark, the
    DirectRunner's ``multi_processing`` mode) can import ``beam_jobs.embed_blocks`` but not the driver's
    ``__main__``. ``spec`` is the ``__main__`` module's ``__spec__`` (None when the file is run by path).
    """
    module = importlib.import_module(spec.name) if spec is not None else sys.modules["__main__"]
    return module.JOB.main()


def pipeline_options_for(beam_args: Sequence[str]) -> pipeline_options.PipelineOptions:
    """Beam's standard options from the flags a job did not take (a ``--`` separator is dropped)."""
    options = pipeline_options.PipelineOptions([a for a in beam_args if a != "--"])
    options.view_as(pipeline_options.SetupOptions).save_main_session = False
    return options


def is_direct_runner(options: pipeline_options.PipelineOptions) -> bool:
    runner = options.view_as(pipeline_options.StandardOptions).runner
    return runner is None or "direct" in str(runner).lower()


def match(pattern: str) -> list[Any]:
    """The files matching ``pattern`` (Beam ``FileSystems``: any filesystem), sorted by path."""
    return sorted(filesystems.FileSystems.match([pattern])[0].metadata_list, key=lambda m: m.path)


def delete_matching(patterns: Sequence[str]) -> None:
    paths = [m.path for p in patterns for m in match(p)]
    if paths:
        filesystems.FileSystems.delete(paths)


def scratch_directory(parent: str, prefix: str) -> str:
    """A new hidden scratch directory ``<parent>/.<prefix>-<random>-<pid>@<host>`` for a job's shards; scratch
    directories of the same prefix left by jobs that died on this host (SIGKILL, power loss) are removed first."""
    for path in artifacts.dead_writers_directories(parent, (f".{prefix}-",)):
        logger.warning("%s: removed, left by a job that died", path)
        remove_scratch_directory(path)
    return filesystems.FileSystems.join(parent, artifacts.transient_name(".", prefix))


def remove_scratch_directory(directory: str) -> None:
    """Deletes a job's scratch directory (its files, then itself; object stores have no directory to delete)."""
    delete_matching([filesystems.FileSystems.join(directory, "*")])
    try:
        filesystems.FileSystems.delete([directory])
    except Exception:  # pylint: disable=broad-except  # object stores have no directories to delete
        pass


def progress_interval_for(interval: float | None, options: Any) -> float:
    """Seconds between progress lines: ``interval`` if given, else 10 on the DirectRunner (a terminal is
    watching) and 0 (none) on distributed runners, whose workers' stderr nobody reads."""
    if interval is not None:
        return interval
    return 10.0 if is_direct_runner(options) else 0.0


class Progress:
    """``<job> [<stage>, pid P] N/T <unit> (P%), R <unit>/s, ETA Ss, <extra>`` on stderr, at most every
    ``interval`` seconds (0: never); thread-safe. :class:`ReportingDoFn` shares one per process among the
    instances of its DoFn (the DirectRunner's ``multi_threading`` workers, a Dataflow worker's threads) and
    flushes it at bundle ends. The counts are the process's: with several worker processes each prints its own."""

    def __init__(self, job: str, unit: str, total: int | None, interval: float, stage: str = "") -> None:
        self._job, self._unit, self._total, self._interval = job, unit, total, interval
        self._stage = f"{stage}, " if stage else ""
        self._start = self._last = time.monotonic()
        self.done = self._reported = 0
        self.extra: dict[str, int] = {}
        self._lock = threading.Lock()

    def update(self, done: int, **extra: int) -> None:
        with self._lock:
            self.done += done
            for key, value in extra.items():
                self.extra[key] = self.extra.get(key, 0) + value
            if self._interval > 0 and time.monotonic() - self._last >= self._interval:
                self.report()

    def flush(self) -> None:
        """Reports what has not been reported yet (end of a bundle)."""
        with self._lock:
            if self._interval > 0 and self.done != self._reported:
                self.report()

    def report(self) -> None:
        """Prints the line (the caller holds the lock, or owns the object alone)."""
        now = time.monotonic()
        self._last, self._reported = now, self.done
        rate = self.done / max(now - self._start, 1e-9)
        text = f"{self.done:,}"
        if self._total:
            eta = (self._total - self.done) / rate if rate > 0 else float("inf")
            text += f"/{self._total:,} {self._unit} ({100.0 * self.done / self._total:.0f}%), ETA {eta:,.0f}s"
        else:
            text += f" {self._unit}"
        extra = "".join(f", {value:,} {key}" for key, value in self.extra.items() if value)
        print(f"{self._job} [{self._stage}pid {os.getpid()}] {text}, {rate:,.1f} {self._unit}/s{extra}",
              file=sys.stderr, flush=True)



class BlocksDoFn(beam.DoFn):
    """Base of the DoFns that read knowledge-corpus blocks: builds the tokenizer, its ``##`` table and the
    sentence splitter once per worker (``setup``), and parses a batch of block records with their bodies
    re-tokenized with offsets (:meth:`parse_blocks`)."""

    def __init__(self, vocab_file: str, lower_case: bool) -> None:
        super().__init__()
        self._vocab_file = vocab_file
        self._lower_case = lower_case

    def setup(self) -> None:
        from realm_tf.data import sentence_splitter  # pylint: disable=import-outside-toplevel
        from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel

        self._tokenizer = bert_tokenizer.BertTokenizer(self._vocab_file, lower_case=self._lower_case)
        self._continuation = bert_tokenizer.continuation_table(self._tokenizer.vocab)
        self._splitter = sentence_splitter.SentenceSplitter()

    def parse_blocks(self, batch: Sequence[bytes]) -> list[tuple[dict[str, Any], Any]]:
        """``(block features, TokenizedText of its body)`` per serialized block of ``batch``."""
        from realm_tf.data import example_schemas  # pylint: disable=import-outside-toplevel
        from realm_tf.data import tokenized_text  # pylint: disable=import-outside-toplevel

        spec = example_schemas.block_feature_spec()
        blocks = [parse_example(record, spec) for record in batch]
        texts = [block[example_schemas.TEXT].decode("utf-8") for block in blocks]
        return list(zip(blocks, tokenized_text.TokenizedText.from_batch(self._tokenizer, texts, self._continuation)))


class ExamplesFromBlocksJob(BeamJob):
    """The jobs that turn blocks into training examples: read block TFRecords → :meth:`transform` → write
    ``<output>/<prefix>-*.tfrecord`` → counters → ``manifest.json``."""

    namespace: str = ""
    prefix: str = ""

    @abc.abstractmethod
    def output_dir(self, cfg: config_lib.ExperimentConfig) -> str:
        """The default ``--output``."""

    @abc.abstractmethod
    def transform(self, args: argparse.Namespace, cfg: config_lib.ExperimentConfig) -> beam.PTransform:
        """``PCollection[bytes]`` of block records -> ``PCollection[bytes]`` of example records."""

    @abc.abstractmethod
    def manifest_fields(self, args: argparse.Namespace, cfg: config_lib.ExperimentConfig) -> dict[str, Any]:
        """The job's own settings, recorded in the manifest."""

    @abc.abstractmethod
    def summarize(self, counts: Mapping[str, int]) -> str:
        """The counters in one line."""

    def run_with_args(self, args: argparse.Namespace, beam_args: Sequence[str]) -> dict[str, Any]:
        from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel

        cfg, options = resolve(args, beam_args)
        output = args.output or self.output_dir(cfg)
        vocab_hash = bert_tokenizer.vocab_hash(cfg.model.vocab_file)
        check_input(args.input, vocab_hash)
        prepare_output(output, f"{self.prefix}-*.tfrecord")
        started = time.time()
        pipeline = beam.Pipeline(options=options)
        _ = (pipeline
             | "ReadBlocks" >> beam.io.ReadFromTFRecord(args.input)
             | "GenerateExamples" >> self.transform(args, cfg)
             | "WriteExamples" >> beam.io.WriteToTFRecord(
                 filesystems.FileSystems.join(output, self.prefix), file_name_suffix=".tfrecord",
                 num_shards=args.num_shards))
        result = pipeline.run()
        result.wait_until_finish()
        counts = read_counters(result, self.namespace)
        manifest = {
            "job": self.name,
            "input": args.input,
            "output_pattern": filesystems.FileSystems.join(output, f"{self.prefix}-*.tfrecord"),
            "counts": counts,
            "vocab_file": cfg.model.vocab_file,
            "vocab_hash": vocab_hash,
            **self.manifest_fields(args, cfg),
            "config_hash": config_lib.config_hash(cfg),
            "config": config_lib.to_dict(cfg),
            "seconds": round(time.time() - started, 1),
        }
        job_manifest.write_manifest(output, manifest)
        logger.info("%s: %s; wrote %s in %ss", self.name, self.summarize(counts), manifest["output_pattern"],
                    manifest["seconds"])
        return manifest


# ---- dense ids --------------------------------------------------------------------------------------------

#: Groups are numbered per bucket of their key's first 4 hex digits: 65,536 buckets at most.
BUCKET_HEX_DIGITS = 4


class AssignDenseIds(beam.PTransform):
    """PCollection[group] -> PCollection[(id, item)]: the items of every group, ids dense in 0..N-1.

    Ids follow (``key(group)``, position in ``items(group)``) order, so they depend only on the content when the
    key is a content hash (block ids of ``preprocess_corpus``, chunk ids of the RETRO chunk database). Groups are
    bucketed by the first hex digits of their key; a side input of per-bucket item counts (at most 65,536 ints,
    not one entry per group) gives each bucket its first id, and each bucket numbers its groups in key order.

    Args:
      key: a group's hex key (e.g. a SHA1); ties between equal keys are broken by nothing: make keys unique.
      items: the group's items, in order.
    """

    def __init__(self, key: Callable[[Any], str], items: Callable[[Any], Sequence[Any]]) -> None:
        super().__init__()
        self._key = key
        self._items = items

    def expand(self, groups: beam.PCollection) -> beam.PCollection:
        key, items = self._key, self._items
        keyed = groups | "KeyByBucket" >> beam.Map(lambda group: (int(key(group)[:BUCKET_HEX_DIGITS], 16), group))
        offsets = (keyed
                   | "ItemsPerGroup" >> beam.Map(lambda kv: (kv[0], len(items(kv[1]))))
                   | "ItemsPerBucket" >> beam.CombinePerKey(sum)
                   | "AllBuckets" >> beam.combiners.ToList()
                   | "BucketOffsets" >> beam.Map(bucket_offsets))
        return (keyed
                | "GroupByBucket" >> beam.GroupByKey()
                | "Number" >> beam.FlatMap(_number, key, items, offsets=beam.pvalue.AsSingleton(offsets)))


def bucket_offsets(bucket_sizes: Iterable[tuple[int, int]]) -> dict[int, int]:
    """[(bucket, items in it)] -> {bucket: id of its first item} (prefix sums in bucket order)."""
    offsets, total = {}, 0
    for bucket, size in sorted(bucket_sizes):
        offsets[bucket] = total
        total += size
    return offsets


def _number(keyed: tuple[int, Iterable[Any]], key: Callable[[Any], str], items: Callable[[Any], Sequence[Any]],
            offsets: Mapping[int, int]) -> Iterator[tuple[int, Any]]:
    bucket, groups = keyed
    next_id = offsets[bucket]
    for group in sorted(groups, key=key):
        for item in items(group):
            yield next_id, item
            next_id += 1


class ReportingDoFn(beam.DoFn):
    """Base of the DoFns that report progress: one :class:`Progress` per process for all the instances of the
    DoFn (found in ``setup``), flushed at every bundle's end; subclasses call ``self.progress.update``."""

    # The Progress of each DoFn in this process, by the DoFn's run key; held by the instances that use it.
    _shared: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
    _shared_lock = threading.Lock()

    def __init__(self, job: str, unit: str, total: int | None, interval: float, stage: str = "") -> None:
        super().__init__()
        self._progress_args = (job, unit, total, interval)
        self._stage = stage
        self._key = uuid.uuid4().hex  # made once, where the pipeline is built: every copy of this DoFn shares it
        self.progress: Progress | None = None

    def setup(self) -> None:
        with ReportingDoFn._shared_lock:
            self.progress = ReportingDoFn._shared.get(self._key)
            if self.progress is None:
                self.progress = Progress(*self._progress_args, stage=self._stage)
                ReportingDoFn._shared[self._key] = self.progress

    def finish_bundle(self) -> None:
        if self.progress is not None:
            self.progress.flush()
