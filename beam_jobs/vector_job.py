"""The skeleton the vector jobs share: a model turns items into vectors, the vectors become a published index.

``embed_blocks`` (Embed_doc of every block: REALM's index refresh, Guu et al. 2020, §3.4), ``build_chunk_database``
(RETRO's chunk keys, Borgeaud et al. 2021, §2.3) and ``build_knn_datastore`` (kNN-LM's keys, Khandelwal et al.
2020, §2) are the same job with another model:

  RunInference(FallbackModelHandler)   a batch per model call; a batch that raises is retried item by item, so a
                                       bad item costs one :class:`Outcome` with an ``error``, not the job
  SplitOutcomes                        ``(key, Outcome)`` -> ``(key, value)`` | a failure record; counters, progress
  WriteKeyedVectors / WriteFailures    ``(id, float32[dim])`` shards and ``failures-*.jsonl`` in a scratch directory

then, in the launching process, :func:`read_matrix` (every id once, no failure: else nothing is published) and
:func:`build_and_publish` (the MIPS index, published as a new version of an index directory).
"""
from __future__ import annotations

import abc
import json
import logging
import time
from typing import Any, Generic, Iterable, Iterator, Mapping, NamedTuple, Sequence, TypeVar

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)

# isort: split
import apache_beam as beam
import numpy as np
from apache_beam.io import filesystems
from apache_beam.ml.inference import base as inference_base

from beam_jobs import job_support
from realm_tf import config as config_lib
from realm_tf.index import embedding_matrix
from realm_tf.index import index_kinds
from realm_tf.index import index_publisher

logger = logging.getLogger(__name__)

FAILURES = "failures"  # the tagged output of failures, and the prefix of their shards
ItemT = TypeVar("ItemT")


class Outcome(NamedTuple):
    """What the model made of one item: ``value`` (a vector, or what the job keeps) or the ``error`` that stopped
    it; ``weight`` is what the item counts for (e.g. the targets of a sequence), 1 by default."""

    value: Any
    error: str | None
    weight: int = 1


def describe(error: BaseException) -> str:
    """An exception as one short line for a failure record."""
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}"


def finite(vector: np.ndarray, what: str = "vector") -> Outcome:
    """``vector`` as float32, or an error when any of its entries is NaN or Inf."""
    vector = np.asarray(vector, np.float32)  # [dim]
    if not np.isfinite(vector).all():
        return Outcome(None, f"non-finite {what} (NaN or Inf)")
    return Outcome(vector, None)


class FallbackModelHandler(inference_base.ModelHandler[ItemT, Outcome, Any], Generic[ItemT], abc.ABC):
    """A Beam ModelHandler whose failures are data: :meth:`infer` runs the model on a batch; when it raises, each
    item is run alone, and an item that still raises becomes an :class:`Outcome` with the error
    (:meth:`failed`), next to its batch's other items' outcomes.

    Subclasses implement ``load_model`` (once per worker: RunInference shares the model between the DoFn
    instances of a process), :meth:`infer` and ``get_num_bytes``, and set ``namespace`` (the job's counters).
    """

    namespace: str = "realm_tf"

    @abc.abstractmethod
    def infer(self, model: Any, batch: Sequence[ItemT]) -> list[Outcome]:
        """One outcome per item of ``batch``, in order; may raise (the batch is then retried item by item)."""

    def failed(self, item: ItemT, error: str) -> Outcome:
        """The outcome of an item the model raised on."""
        del item
        return Outcome(None, error)

    def run_inference(self, batch: Sequence[ItemT], model: Any,
                      inference_args: dict[str, Any] | None = None) -> Iterable[Outcome]:
        try:
            return self.infer(model, batch)
        except Exception as e:  # pylint: disable=broad-except  # find the culprit(s) one by one
            logger.warning("%s: a batch of %d failed (%s); retrying one by one", self.namespace, len(batch), e)
        outcomes = []
        for item in batch:
            try:
                outcomes.extend(self.infer(model, [item]))
            except Exception as e:  # pylint: disable=broad-except
                outcomes.append(self.failed(item, describe(e)))
        return outcomes

    def get_metrics_namespace(self) -> str:
        return self.namespace + ".RunInference"


class _SplitOutcomesFn(job_support.ReportingDoFn):
    """``(key, Outcome)`` -> ``(key, value)`` | ``failures``; counters and progress lines."""

    def __init__(self, job: str, unit: str, namespace: str, counters: Mapping[str, str], failure_key: str,
                 progress_total: int | None, progress_interval: float, weight_unit: str | None) -> None:
        super().__init__(job, unit, progress_total, progress_interval)
        self._namespace, self._counters, self._failure_key = namespace, dict(counters), failure_key
        self._weight_unit = weight_unit

    def _count(self, name: str, value: int) -> None:
        if name in self._counters:
            job_support.count(self._namespace, self._counters[name], value)

    def process(self, keyed: tuple[Any, Outcome]) -> Iterator[Any]:
        key, outcome = keyed
        assert self.progress is not None
        if outcome.error is not None:
            self._count("failed", 1)
            self._count("failed_weight", outcome.weight)
            self.progress.update(1, failed=1)
            yield beam.pvalue.TaggedOutput(FAILURES, {self._failure_key: key, "error": outcome.error})
            return
        self._count("done", 1)
        self._count("done_weight", outcome.weight)
        if self._weight_unit:
            self.progress.update(1, **{self._weight_unit: outcome.weight})
        else:
            self.progress.update(1)
        yield key, outcome.value


class SplitOutcomes(beam.PTransform):
    """``PCollection[(key, Outcome)]`` -> ``{"values": (key, value), "failures": {failure_key: key, "error"}}``.

    Args:
      job / unit: the progress lines' job name and unit.
      namespace: the counters' namespace; ``counters`` names which to count, from ``done``, ``failed`` (items)
        and ``done_weight``, ``failed_weight`` (their :attr:`Outcome.weight`), each mapped to a counter name.
      failure_key: the key's field in a failure record.
      progress_total / progress_interval: progress lines on stderr (interval 0: none).
      weight_unit: what the progress lines call the weights of the items done (None: not shown).
    """

    def __init__(self, job: str, unit: str, namespace: str, counters: Mapping[str, str], failure_key: str,
                 progress_total: int | None = None, progress_interval: float = 0.0,
                 weight_unit: str | None = None) -> None:
        super().__init__()
        unknown = set(counters) - {"done", "failed", "done_weight", "failed_weight"}
        if unknown:
            raise ValueError(f"SplitOutcomes: unknown counters {sorted(unknown)}")
        self._fn = _SplitOutcomesFn(job, unit, namespace, counters, failure_key, progress_total, progress_interval,
                                    weight_unit)

    def expand(self, outcomes: beam.PCollection) -> dict[str, beam.PCollection]:
        split = outcomes | "Split" >> beam.ParDo(self._fn).with_outputs(FAILURES, main="values")
        return {"values": split["values"], "failures": split[FAILURES]}


class WriteKeyedVectors(beam.PTransform):
    """``(id, float32[dim])`` -> ``<directory>/<prefix>-SSSSS-of-NNNNN.tfrecord`` (tf.train.Example ``block_id``,
    ``embedding``; :func:`realm_tf.index.embedding_matrix.read_embedding_shards` reads them back)."""

    def __init__(self, directory: str, prefix: str, num_shards: int = 0) -> None:
        super().__init__()
        self._path, self._num_shards = filesystems.FileSystems.join(directory, prefix), num_shards

    def expand(self, vectors: beam.PCollection) -> beam.pvalue.PDone:
        return (vectors
                | "Serialize" >> beam.Map(embedding_matrix.to_embedding_record)
                | "Write" >> beam.io.WriteToTFRecord(self._path, file_name_suffix=".tfrecord",
                                                     num_shards=self._num_shards))


def _json_line(record: Mapping[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, ensure_ascii=False)


class WriteFailures(beam.PTransform):
    """Failure (or dead-letter) records -> ``<directory>/<prefix>-SSSSS-of-NNNNN.jsonl``, one JSON object a line
    (``num_shards`` 0: as the runner chooses)."""

    def __init__(self, directory: str, prefix: str = FAILURES, num_shards: int = 1) -> None:
        super().__init__()
        self._path, self._num_shards = filesystems.FileSystems.join(directory, prefix), num_shards

    def expand(self, failures: beam.PCollection) -> beam.pvalue.PDone:
        return (failures
                | "Serialize" >> beam.Map(_json_line)
                | "Write" >> beam.io.WriteToText(self._path, file_name_suffix=".jsonl", num_shards=self._num_shards))


def run_pipeline(pipeline: beam.Pipeline, namespace: str) -> dict[str, int]:
    """Runs ``pipeline`` to its end; its counters of ``namespace``."""
    result = pipeline.run()
    result.wait_until_finish()
    return job_support.read_counters(result, namespace)


def read_matrix(directory: str, prefix: str, dim: int, expected: int | None, where: str = "") -> np.ndarray:
    """The ``[N, dim]`` matrix of the ``<prefix>-*`` vector shards and ``failures-*`` of ``directory``, row i the
    vector of id i.

    Raises:
      IncompleteEmbeddingsError: an id is missing, duplicated or out of range, or an item failed.
    """
    ids, vectors = embedding_matrix.read_embedding_shards(  # [M], [M, dim]
        [m.path for m in job_support.match(filesystems.FileSystems.join(directory, f"{prefix}-*"))], dim)
    failures = embedding_matrix.read_failures(
        [m.path for m in job_support.match(filesystems.FileSystems.join(directory, f"{FAILURES}-*"))])
    return embedding_matrix.assemble_matrix(ids, vectors, expected, failures, where=where)  # [N, dim]


def build_and_publish(cfg: config_lib.ExperimentConfig, index_dir: str, matrix: np.ndarray,
                      metadata: Mapping[str, Any], version: int | None = None,
                      arrays: Mapping[str, np.ndarray] | None = None,
                      pause_before_commit: float = 0.0) -> tuple[int, str, float]:
    """Builds the ``index.kind`` index of ``matrix`` ``[N, dim]`` and publishes it as ``version`` of ``index_dir``
    (None: the one after the newest), ``metadata`` and the build's seconds (``build_seconds``) in its
    ``index.json``; ``(version, path, seconds the publish took)``."""
    start = time.time()
    index = index_kinds.build_index(cfg.index.kind, cfg.index, matrix)
    metadata = {**metadata, "build_seconds": round(time.time() - start, 3)}
    start = time.time()
    if version is None:
        version, path = index_publisher.publish_next(index_dir, matrix, index, metadata, cfg.index.keep_versions,
                                                     arrays=arrays)
    else:
        path = index_publisher.publish(index_dir, version, matrix, index, metadata, cfg.index.keep_versions,
                                       pause_before_commit=pause_before_commit, arrays=arrays)
    return version, path, time.time() - start
