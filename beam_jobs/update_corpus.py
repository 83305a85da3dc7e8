"""Beam job: add, replace and delete documents of the knowledge corpus, embedding only the blocks that are new.

REALM keeps its knowledge in the corpus Z, not in its parameters (Guu et al., 2020, §1; §4 swaps the corpus
at test time), and rebuilds the MIPS index by re-embedding Z (§3.4). A change of a few documents should not
cost a pass over all of Z: this job makes the change a new **corpus version** (``realm_tf/data/corpus_versions``)
and a new **index version** in the embedding space of the current one, embedding only the blocks whose uid
(SHA1 of title and text) the current version does not already have::

  ReadCorpus .. PackBlocks  the --add files, read, parsed, deduplicated and packed exactly as preprocess_corpus
  OneDocumentPerId          two different documents with one id in one update: the first (file, line) wins,
                            the others are dead letters (duplicate_id)
  ReadBaseBlocks            the blocks of the corpus version the newest index version was built over
  ScanBaseBlocks            per block: its (id, record); its doc id's entry when the update touches that id; its
                            (uid, id) when a new block has that uid. Only the change is shuffled, never Z.
  Decide                    per touched document id: added | replaced | unchanged | deleted, or a dead letter
                            unknown_id for a delete of an id the corpus does not hold (counted, never fatal)
  RenumberKeptBlocks        kept blocks keep their order, ids closed up over the removed ones
  NumberNewBlocks           the new documents' blocks after them, in (document SHA1, block index) order
  EmbedNewBlocks            the new blocks whose uid is new, with embed_blocks.EmbedBlocks and the retriever
                            export that built the newest index version (same embedding space); the others
                            reuse their row of that version's matrix
  WriteBlocks, WriteDeadLetters, WriteChanges   into the new corpus version (staged)
  WritePlan                 removed ids and reused rows, for the launcher (scratch)

The launching process then assembles the new ``[num_blocks, dim]`` matrix (the kept rows, the reused rows, the
new vectors: it refuses to publish unless every block has exactly one), builds the index (``index.kind``) and
commits the corpus version, then the index version: the index version is what the trainer's IndexLoader and
serving follow, so a reader sees the whole change or none of it. Both carry the manifest (``manifest.json`` of
the corpus version, ``update`` in ``index.json``): documents added, replaced, deleted, unchanged, blocks
embedded and reused, dead letters. With ``--serve`` a new version of the served model follows
(``export.open_qa_export.publish_corpus_update``: the same weights, the new corpus, no re-embedding).

Usage (DirectRunner by default; any Beam runner through the standard pipeline options)::

    realm-tf update-corpus --config configs/minilm.yaml --add new.jsonl --delete id1,id2 --serve runs/minilm/served
    python -m beam_jobs.update_corpus --config c.yaml --add 'gs://b/changes-*.jsonl' --delete @gone.txt \\
        -- --runner=DataflowRunner --project=P --region=R --temp_location=gs://b/tmp --setup_file=./setup.py
"""
from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import logging
import sys
import time
from typing import Any, Iterable, Iterator, Mapping, Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)

# isort: split
import apache_beam as beam
import numpy as np
from apache_beam.io import filesystem
from apache_beam.io import filesystems

from beam_jobs import embed_blocks
from beam_jobs import job_flags
from beam_jobs import job_support
from beam_jobs import preprocess_corpus
from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import corpus_reader
from realm_tf.data import corpus_versions
from realm_tf.data import document_packing
from realm_tf.data import example_schemas
from realm_tf.index import embedding_matrix
from realm_tf.index import index_kinds
from realm_tf.index import index_publisher

logger = logging.getLogger(__name__)

NAMESPACE = "realm_tf.update_corpus"
CHANGES_PREFIX = "changes"
PLAN_PREFIX = "plan"

# Dead-letter reasons of this job (besides corpus_reader.REASONS).
DUPLICATE_ID = "duplicate_id"  # a second, different document with the same id in one update
UNKNOWN_ID = "unknown_id"  # --delete of an id the corpus does not hold
REASONS = corpus_reader.REASONS + (DUPLICATE_ID, UNKNOWN_ID)

# What happened to a document id (the changes file, and counters "documents_<change>").
ADDED, REPLACED, UNCHANGED, DELETED = "added", "replaced", "unchanged", "deleted"
CHANGES = (ADDED, REPLACED, UNCHANGED, DELETED)

# Counter names.
BASE_BLOCKS_READ = "base_blocks_read"
BASE_BLOCKS_UNPARSEABLE = "base_blocks_unparseable"
BLOCKS_REMOVED = "blocks_removed"
BLOCKS_ADDED = "blocks_added"
BLOCKS_TO_EMBED = "blocks_to_embed"
BLOCKS_REUSED = "blocks_reused"
DELETES_SUPERSEDED = "deletes_superseded"  # a deleted id that the same update adds again

# Output tags.
_TOUCHED = "touched"
_REUSABLE = "reusable"
_UNPARSEABLE = "unparseable"
REMOVED = "removed"
NEW_DOCUMENTS = "new_documents"
DEAD_LETTERS = preprocess_corpus.DEAD_LETTERS
_REUSED = "reused"
_EMBED = "embed"


@dataclasses.dataclass(frozen=True)
class DeleteRequest:
    """One ``--delete`` id and where it was given (the flag, or ``@FILE`` and its line)."""

    doc_id: str
    source: str
    line: int


def parse_deletes(values: Sequence[str]) -> list[DeleteRequest]:
    """``--delete`` values (``a,b`` or ``@FILE``) -> one request per distinct id, first mention kept."""
    requests: dict[str, DeleteRequest] = {}
    for position, value in enumerate(values, 1):
        if value.startswith("@"):
            path = value[1:]
            if not filesystems.FileSystems.exists(path):
                raise errors.UserError(f"--delete {value}: no such file")
            with filesystems.FileSystems.open(path, compression_type=filesystem.CompressionTypes.AUTO) as f:
                lines = f.read().decode("utf-8").splitlines()
            found = [DeleteRequest(line.strip(), path, number) for number, line in enumerate(lines, 1)]
        else:
            found = [DeleteRequest(doc_id.strip(), "--delete", position) for doc_id in value.split(",")]
        for request in found:
            if request.doc_id:
                requests.setdefault(request.doc_id, request)
    return list(requests.values())


# ---- the new documents ------------------------------------------------------------------------------------

def _one_per_id(keyed: tuple[str, Iterable[corpus_reader.Document]]) -> Iterator[Any]:
    """Of different documents sharing an id (their content differs: equal ones were merged), the one with the
    smallest (file, line); each other is a dead letter."""
    doc_id, documents = keyed
    ordered = sorted(documents, key=lambda doc: (doc.file, doc.line))
    yield ordered[0]
    for doc in ordered[1:]:
        job_support.count(NAMESPACE, f"dead_letters_{DUPLICATE_ID}")
        yield beam.pvalue.TaggedOutput(DEAD_LETTERS, corpus_reader.DeadLetter(
            doc.file, doc.line, DUPLICATE_ID, f"id {doc_id!r} is given with another text at "
            f"{ordered[0].file}:{ordered[0].line} in the same update", doc.text, doc.duplicates))


class OneDocumentPerId(beam.PTransform):
    """PCollection[Document] -> main: one Document per id; ``dead_letters``: the others (``duplicate_id``)."""

    def expand(self, documents: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return (documents
                | "KeyById" >> beam.Map(lambda doc: (doc.doc_id, doc))
                | "GroupById" >> beam.GroupByKey()
                | "KeepFirst" >> beam.FlatMap(_one_per_id).with_outputs(DEAD_LETTERS, main="documents"))


def doc_id_of(doc: document_packing.PackedDocument) -> str:
    return doc.blocks[0].doc_id


# ---- the base corpus --------------------------------------------------------------------------------------

class _ScanBaseBlocksFn(beam.DoFn):
    """Block record -> ``(block_id, record)``; ``touched``: ``(doc_id, (block_index, block_id, uid))`` when the
    update touches that id; ``reusable``: ``(uid, block_id)`` when a new block has that uid."""

    _SPEC_KEYS = (example_schemas.BLOCK_ID, example_schemas.UID, example_schemas.DOC_ID, example_schemas.BLOCK_INDEX)

    def setup(self) -> None:
        spec = example_schemas.block_feature_spec()
        self._spec = {key: spec[key] for key in self._SPEC_KEYS}

    def process(self, record: bytes, touched: set[str], new_uids: set[str]) -> Iterator[Any]:
        job_support.count(NAMESPACE, BASE_BLOCKS_READ)
        try:
            row = job_support.parse_example(record, self._spec)
        except Exception as e:  # pylint: disable=broad-except
            job_support.count(NAMESPACE, BASE_BLOCKS_UNPARSEABLE)
            yield beam.pvalue.TaggedOutput(_UNPARSEABLE, f"{type(e).__name__}: {e}")
            return
        block_id = int(row[example_schemas.BLOCK_ID])
        uid = row[example_schemas.UID].decode()
        doc_id = row[example_schemas.DOC_ID].decode("utf-8")
        yield block_id, record
        if doc_id in touched:
            yield beam.pvalue.TaggedOutput(_TOUCHED, (doc_id, (int(row[example_schemas.BLOCK_INDEX]), block_id, uid)))
        if uid in new_uids:
            yield beam.pvalue.TaggedOutput(_REUSABLE, (uid, block_id))


# ---- the decision per document id -------------------------------------------------------------------------

class _DecideFn(beam.DoFn):
    """``(doc_id, {"new", "old", "delete"})`` -> main: the change (one JSON line); ``removed``: old block ids;
    ``new_documents``: PackedDocuments to add; ``dead_letters``: deletes of unknown ids."""

    def __init__(self, corpus_version: int) -> None:
        super().__init__()
        self._corpus_version = corpus_version

    def process(self, keyed: tuple[str, Mapping[str, Iterable[Any]]]) -> Iterator[Any]:
        doc_id, groups = keyed
        new = list(groups["new"])  # at most one (OneDocumentPerId)
        old = sorted(groups["old"])  # [(block_index, block_id, uid)] of the base corpus
        deletes = list(groups["delete"])
        if deletes and new:
            job_support.count(NAMESPACE, DELETES_SUPERSEDED)
        if new:
            doc = new[0]
            if not old:
                change = ADDED
            elif [uid for _, _, uid in old] == [block.uid for block in doc.blocks]:
                change = UNCHANGED  # same text: same blocks, nothing to do
            else:
                change = REPLACED
        elif old:
            change = DELETED
        else:
            request = deletes[0]
            job_support.count(NAMESPACE, f"dead_letters_{UNKNOWN_ID}")
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, corpus_reader.DeadLetter(
                request.source, request.line, UNKNOWN_ID,
                f"no document with id {doc_id!r} in corpus version {self._corpus_version}", doc_id))
            return
        job_support.count(NAMESPACE, f"documents_{change}")
        if change in (REPLACED, DELETED):
            job_support.count(NAMESPACE, BLOCKS_REMOVED, len(old))
            for _, block_id, _ in old:
                yield beam.pvalue.TaggedOutput(REMOVED, block_id)
        if change in (ADDED, REPLACED):
            job_support.count(NAMESPACE, BLOCKS_ADDED, len(new[0].blocks))
            yield beam.pvalue.TaggedOutput(NEW_DOCUMENTS, new[0])
        yield json.dumps({"id": doc_id, "change": change, "blocks_before": len(old),
                          "blocks_after": len(new[0].blocks) if new and change != DELETED else 0},
                         ensure_ascii=False, sort_keys=True)


class DecideChanges(beam.PTransform):
    """``{"new": (doc_id, PackedDocument), "old": (doc_id, (block_index, block_id, uid)), "delete": (doc_id,
    DeleteRequest)}`` -> ``changes`` (JSON lines), ``removed`` (base block ids), ``new_documents``
    (PackedDocuments to add) and ``dead_letters`` (deletes of unknown ids).

    Args:
      corpus_version: the base corpus version (for the dead letters' messages).
    """

    def __init__(self, corpus_version: int) -> None:
        super().__init__()
        self._corpus_version = corpus_version

    def expand(self, keyed: Mapping[str, beam.PCollection]) -> beam.pvalue.DoOutputsTuple:
        return (keyed
                | "JoinById" >> beam.CoGroupByKey()
                | "Decide" >> beam.ParDo(_DecideFn(self._corpus_version)).with_outputs(
                    REMOVED, NEW_DOCUMENTS, DEAD_LETTERS, main="changes"))


# ---- numbering ----------------------------------------------------------------------------------------------

def renumber_kept(numbered: tuple[int, bytes], removed: Sequence[int]) -> Iterator[bytes]:
    """A base block record with its id closed up over the ``removed`` ids (sorted), or nothing when removed.
    Records whose id does not change are passed on as they are."""
    block_id, record = numbered
    at = bisect.bisect_left(removed, block_id)
    if at < len(removed) and removed[at] == block_id:
        return
    if at == 0:
        yield record
        return
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    example = tf.train.Example.FromString(record)
    example.features.feature[example_schemas.BLOCK_ID].int64_list.value[0] = block_id - at
    yield example.SerializeToString(deterministic=True)


class _ClassifyNewBlockFn(beam.DoFn):
    """``(position among the new blocks, Block)`` -> ``(block_id, Block)`` (main) and either ``reused``:
    ``(block_id, base row)`` when the base has a block with that uid, or ``embed``: ``(block_id, Block)``."""

    def process(self, numbered: tuple[int, document_packing.Block], first_id: int,
                reusable: Mapping[str, int]) -> Iterator[Any]:
        position, block = numbered
        block_id = first_id + position
        yield block_id, block
        row = reusable.get(block.uid)
        if row is not None:
            job_support.count(NAMESPACE, BLOCKS_REUSED)
            yield beam.pvalue.TaggedOutput(_REUSED, (block_id, row))
        else:
            job_support.count(NAMESPACE, BLOCKS_TO_EMBED)
            yield beam.pvalue.TaggedOutput(_EMBED, (block_id, block))


def _first_new_id(removed: int, base_blocks: int) -> int:
    return base_blocks - removed


# ---- the pipeline -------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Base:
    """What the update starts from: the newest index version and the corpus version it was built over."""

    index_version: int
    index_path: str
    index_meta: dict[str, Any]
    corpus_version: int
    blocks_pattern: str
    blocks_manifest: dict[str, Any]
    export_path: str
    export: dict[str, Any]

    @property
    def num_blocks(self) -> int:
        return int(self.index_meta["num_blocks"])


@dataclasses.dataclass(frozen=True)
class Outputs:
    """Where one run writes: the staged corpus version (blocks, dead letters, changes) and scratch files."""

    corpus_dir: str
    scratch_dir: str

    def scratch(self, prefix: str) -> str:
        return filesystems.FileSystems.join(self.scratch_dir, prefix)


def _added_documents(pipeline: beam.Pipeline, cfg: config_lib.ExperimentConfig, manifest: Mapping[str, Any],
                     add_paths: Sequence[str], input_format: str, batch_size: int,
                     progress_interval: float) -> tuple[Any, Any, Any]:
    """The added documents read, parsed, deduplicated (one per id) and packed into blocks the way the base corpus
    was (its manifest's vocabulary casing and lengths); each stage's outputs, dead letters included."""
    read = pipeline | "ReadCorpus" >> preprocess_corpus.ReadCorpus(list(add_paths), input_format)
    parsed = read[preprocess_corpus.RECORDS] | "ParseDocuments" >> preprocess_corpus.ParseDocuments()
    documents = (parsed[preprocess_corpus.DOCUMENTS]
                 | "DeduplicateDocuments" >> preprocess_corpus.DeduplicateDocuments()
                 | "OneDocumentPerId" >> OneDocumentPerId())
    packed = documents["documents"] | "PackBlocks" >> preprocess_corpus.PackBlocks(
        cfg.model.vocab_file, bool(manifest.get("lower_case", cfg.model.lower_case)),
        int(manifest.get("max_block_length", cfg.data.max_block_length)), int(manifest.get("max_title_length", 64)),
        batch_size, None, progress_interval)
    return parsed, documents, packed


def _embed_and_plan(new_blocks: Any, unparseable: Any, removed: Any, base: Base, outputs: Outputs,
                    min_batch_size: int, max_batch_size: int, progress_interval: float) -> None:
    """Embeds the new blocks that reuse no base row with the base index's export; writes their vectors, the
    failures (with the base records that did not parse) and the plan (removed rows, reused rows) to scratch."""
    embedded = (new_blocks[_EMBED]
                | "ToEmbedRecords" >> beam.Map(document_packing.block_to_example)
                | "EmbedNewBlocks" >> embed_blocks.EmbedBlocks(
                    base.export_path, int(base.export["block_seq_length"]), min_batch_size, max_batch_size,
                    progress_interval=progress_interval))
    _ = (embedded["embeddings"]
         | "SerializeEmbeddings" >> beam.Map(embedding_matrix.to_embedding_record)
         | "WriteEmbeddings" >> beam.io.WriteToTFRecord(outputs.scratch(embed_blocks.EMBEDDINGS_PREFIX),
                                                        file_name_suffix=".tfrecord"))
    _ = ((embedded["failures"], unparseable | "BaseFailures" >> beam.Map(
            lambda error: {"block_id": None, "error": f"base corpus record: {error}"}))
         | "AllFailures" >> beam.Flatten()
         | "SerializeFailures" >> beam.Map(lambda failure: json.dumps(failure, sort_keys=True))
         | "WriteFailures" >> beam.io.WriteToText(outputs.scratch(embed_blocks.FAILURES_PREFIX),
                                                  file_name_suffix=".jsonl", num_shards=1))
    _ = ((removed | "RemovedRows" >> beam.Map(lambda block_id: json.dumps({"removed": block_id})),
          new_blocks[_REUSED] | "ReusedRows" >> beam.Map(lambda pair: json.dumps({"reused": list(pair)})))
         | "AllPlanRows" >> beam.Flatten()
         | "WritePlan" >> beam.io.WriteToText(outputs.scratch(PLAN_PREFIX), file_name_suffix=".jsonl", num_shards=1))


def build_pipeline(pipeline: beam.Pipeline, cfg: config_lib.ExperimentConfig, base: Base, add_paths: Sequence[str],
                   deletes: Sequence[DeleteRequest], outputs: Outputs, input_format: str = "auto",
                   num_shards: int = 0, batch_size: int = 64, min_batch_size: int = 1, max_batch_size: int = 32,
                   progress_interval: float = 0.0) -> None:
    """Adds the whole job to ``pipeline`` (see the module docstring for the steps)."""
    parsed, documents, packed = _added_documents(pipeline, cfg, base.blocks_manifest, add_paths, input_format,
                                                 batch_size, progress_interval)
    new_docs = packed[preprocess_corpus.DOCUMENTS]
    delete_requests = pipeline | "Deletes" >> beam.Create(list(deletes))

    touched = beam.pvalue.AsSingleton(
        ((new_docs | "NewIds" >> beam.Map(doc_id_of)),
         (delete_requests | "DeleteIds" >> beam.Map(lambda request: request.doc_id)))
        | "TouchedIds" >> beam.Flatten()
        | "TouchedSet" >> beam.combiners.ToSet())
    new_uids = beam.pvalue.AsSingleton(
        new_docs
        | "NewUids" >> beam.FlatMap(lambda doc: [block.uid for block in doc.blocks])
        | "NewUidSet" >> beam.combiners.ToSet())
    base_blocks = (pipeline
                   | "ReadBaseBlocks" >> beam.io.ReadFromTFRecord(base.blocks_pattern)
                   | "ScanBaseBlocks" >> beam.ParDo(_ScanBaseBlocksFn(), touched, new_uids).with_outputs(
                       _TOUCHED, _REUSABLE, _UNPARSEABLE, main="blocks"))

    decided = ({"new": new_docs | "KeyNewById" >> beam.Map(lambda doc: (doc_id_of(doc), doc)),
                "old": base_blocks[_TOUCHED],
                "delete": delete_requests | "KeyDeleteById" >> beam.Map(lambda request: (request.doc_id, request))}
               | "DecideChanges" >> DecideChanges(base.corpus_version))
    removed = decided[REMOVED]
    removed_sorted = beam.pvalue.AsSingleton(removed | "RemovedList" >> beam.combiners.ToList()
                                             | "SortRemoved" >> beam.Map(sorted))
    first_id = beam.pvalue.AsSingleton(removed
                                       | "CountRemoved" >> beam.combiners.Count.Globally()
                                       | "FirstNewId" >> beam.Map(_first_new_id, base.num_blocks))
    kept = base_blocks["blocks"] | "RenumberKeptBlocks" >> beam.FlatMap(renumber_kept, removed_sorted)
    reusable = beam.pvalue.AsDict(base_blocks[_REUSABLE] | "OneRowPerUid" >> beam.CombinePerKey(min))
    new_blocks = (decided[NEW_DOCUMENTS]
                  | "NumberNewBlocks" >> preprocess_corpus.AssignBlockIds()  # (document SHA1, block index) order
                  | "ClassifyNewBlocks" >> beam.ParDo(_ClassifyNewBlockFn(), first_id, reusable).with_outputs(
                      _REUSED, _EMBED, main="blocks"))

    _ = ((kept, new_blocks["blocks"] | "NewBlockRecords" >> beam.Map(document_packing.block_to_example))
         | "AllBlocks" >> beam.Flatten()
         | "WriteBlocks" >> beam.io.WriteToTFRecord(
             filesystems.FileSystems.join(outputs.corpus_dir, preprocess_corpus.BLOCKS_PREFIX),
             file_name_suffix=".tfrecord", num_shards=num_shards,
             shard_name_template=preprocess_corpus.SHARD_TEMPLATE))
    _ = ((parsed[preprocess_corpus.DEAD_LETTERS], documents[DEAD_LETTERS], packed[preprocess_corpus.DEAD_LETTERS],
          decided[DEAD_LETTERS])
         | "AllDeadLetters" >> beam.Flatten()
         | "WriteDeadLetters" >> preprocess_corpus.WriteDeadLetters(outputs.corpus_dir))
    _ = (decided["changes"]
         | "WriteChanges" >> beam.io.WriteToText(filesystems.FileSystems.join(outputs.corpus_dir, CHANGES_PREFIX),
                                                 file_name_suffix=".jsonl",
                                                 shard_name_template=preprocess_corpus.SHARD_TEMPLATE))

    _embed_and_plan(new_blocks, base_blocks[_UNPARSEABLE], removed, base, outputs, min_batch_size, max_batch_size,
                    progress_interval)


# ---- after the pipeline -------------------------------------------------------------------------------------

def read_plan(paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(removed base ids int64[R], reused new ids int64[U], their base rows int64[U])`` from the plan shards."""
    removed: list[int] = []
    reused: list[tuple[int, int]] = []
    for row in embedding_matrix.read_failures(paths):  # the same JSON-lines reader
        if "removed" in row:
            removed.append(int(row["removed"]))
        else:
            reused.append((int(row["reused"][0]), int(row["reused"][1])))
    pairs = np.asarray(reused, np.int64).reshape([-1, 2])
    return np.asarray(sorted(removed), np.int64), pairs[:, 0], pairs[:, 1]


def assemble_update(base_matrix: np.ndarray, removed: np.ndarray, reused_ids: np.ndarray, reused_rows: np.ndarray,
                    embedded_ids: np.ndarray, embedded: np.ndarray, failures: Sequence[Mapping[str, Any]],
                    where: str = "") -> np.ndarray:
    """The new version's ``[num_blocks, dim]`` matrix: the base rows that are kept, in order, then the new
    blocks (ids from ``len(kept)``), each from a reused base row or a new vector.

    Args:
      base_matrix: ``float32[base_blocks, dim]`` of the base index version.
      removed: ``int64[R]`` base block ids that are gone.
      reused_ids / reused_rows: ``int64[U]`` new block ids and the base rows they take.
      embedded_ids / embedded: ``int64[E]``, ``float32[E, dim]``: the new vectors.

    Raises:
      IncompleteEmbeddingsError: a new block has no vector, or more than one, or one failed.
    """
    keep = np.ones(base_matrix.shape[0], bool)  # [base_blocks]
    keep[removed] = False
    kept = base_matrix[keep]  # [K, dim]
    ids = np.concatenate([reused_ids, embedded_ids]) - kept.shape[0]  # positions among the new blocks
    vectors = np.concatenate([base_matrix[reused_rows], embedded.reshape([-1, base_matrix.shape[1]])])
    if ids.size == 0 and not failures:
        return kept
    new = embedding_matrix.assemble_matrix(ids, vectors, None, failures, where=where)  # [N - K, dim]
    return np.concatenate([kept, new])


def find_base(cfg: config_lib.ExperimentConfig, blocks_dir: str, index_dir: str) -> Base:
    """The newest index version, its corpus version and its export; UserError naming what is missing."""
    from realm_tf.export import retriever_export  # pylint: disable=import-outside-toplevel
    from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel

    vocab_hash = bert_tokenizer.vocab_hash(cfg.model.vocab_file)
    path, meta = index_publisher.newest_version(index_dir, vocab_hash)
    corpus = index_publisher.corpus_version(meta)
    pattern = corpus_versions.blocks_pattern(blocks_dir, corpus, f"{preprocess_corpus.BLOCKS_PREFIX}-*.tfrecord")
    if not job_support.match(pattern):
        raise errors.UserError(f"{path}: built over corpus version {corpus}, but {pattern} matches no block file")
    blocks_manifest = job_support.check_input(pattern, vocab_hash, flag=f"corpus version {corpus}") or {}
    export_path, export = retriever_export.find_export(meta["version"], meta, cfg.refresh.export_dir)
    return Base(meta["version"], path, meta, corpus, pattern, blocks_manifest, export_path, export)


def _account(counts: Mapping[str, int], pre: Mapping[str, int], deletes: int) -> None:
    """Every input line and every delete id ends in exactly one place, or the run is refused."""
    documents = sum(counts.get(f"documents_{change}", 0) for change in (ADDED, REPLACED, UNCHANGED))
    dead = sum(pre.get(f"{preprocess_corpus.DEAD_LETTERS}_{reason}", 0) for reason in corpus_reader.REASONS)
    lines = pre.get(preprocess_corpus.INPUT_LINES, 0)
    placed = documents + pre.get(preprocess_corpus.DUPLICATES, 0) + dead + counts.get(f"dead_letters_{DUPLICATE_ID}", 0)
    if placed != lines:
        raise RuntimeError(f"update_corpus: input lines unaccounted for: {placed} placed != {lines} read")
    requests = (counts.get(f"documents_{DELETED}", 0) + counts.get(f"dead_letters_{UNKNOWN_ID}", 0)
                + counts.get(DELETES_SUPERSEDED, 0))
    if requests != deletes:
        raise RuntimeError(f"update_corpus: delete ids unaccounted for: {requests} placed != {deletes} given")


class _NothingChanged(Exception):
    """An update that adds, replaces and deletes nothing: no version is published."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        super().__init__("nothing changed")
        self.counts = counts


def _request(args: argparse.Namespace, cfg: config_lib.ExperimentConfig) -> tuple[list[str], list[str]]:
    """The files to add and the ids to delete; refused before anything runs when there are none (or the index
    kind is unknown)."""
    deletes = parse_deletes(args.delete)
    paths = preprocess_corpus.match_inputs(args.add, args.format, flag="--add") if args.add else []
    if not paths and not deletes:
        raise errors.UserError("update-corpus: nothing to do (give --add FILE and/or --delete IDS)")
    index_kinds.index_class(cfg.index.kind)  # an unknown kind fails now, not after the embedding
    return paths, deletes


def _check_update(counters: Mapping[str, dict[str, int]], base: Base, num_deletes: int) -> None:
    """Completes the update's counts (``_account``) and refuses to publish an update that changed nothing
    (:class:`_NothingChanged`) or that did not read every block of its base."""
    counts = counters["update_corpus"]
    _account(counts, counters["preprocess_corpus"], num_deletes)
    if not any(counts.get(f"documents_{change}", 0) for change in (ADDED, REPLACED, DELETED)):
        raise _NothingChanged(counts)  # nothing is published: the staged versions are dropped
    if counts.get(BASE_BLOCKS_READ, 0) != base.num_blocks:
        raise embedding_matrix.IncompleteEmbeddingsError(
            f"{base.blocks_pattern}: {counts.get(BASE_BLOCKS_READ, 0)} blocks read but index version "
            f"{base.index_version} has {base.num_blocks} rows: refusing to publish")


def _run(pipeline: beam.Pipeline) -> dict[str, dict[str, int]]:
    """Runs the update's pipeline to its end; the counters of the update and of the two jobs it reuses."""
    result = pipeline.run()
    result.wait_until_finish()
    return {name: job_support.read_counters(result, namespace) for name, namespace in (
        ("update_corpus", NAMESPACE), ("preprocess_corpus", preprocess_corpus.NAMESPACE),
        ("embed_blocks", embed_blocks.NAMESPACE))}


def _nothing_published(base: Base, counts: Mapping[str, int]) -> dict[str, Any]:
    """What an update that changed nothing returns (and says): the versions in service are the base's."""
    logger.warning("update-corpus: nothing changed (%d documents unchanged, %d deletes of unknown ids): no version "
                   "published; index version %d and corpus version %d still serve",
                   counts.get(f"documents_{UNCHANGED}", 0), counts.get(f"dead_letters_{UNKNOWN_ID}", 0),
                   base.index_version, base.corpus_version)
    return {"published": False, "index_version": base.index_version, "corpus_version": base.corpus_version,
            "counters": dict(counts)}


def _serve(cfg: config_lib.ExperimentConfig, base_path: str, index_dir: str, blocks_dir: str, corpus_version: int,
           index_version: int) -> str:
    """``--serve``: the next served version under ``base_path``, the newest one's weights over the new corpus."""
    from realm_tf.export import open_qa_export  # pylint: disable=import-outside-toplevel

    try:
        return open_qa_export.publish_corpus_update(cfg, base_path, index_dir, blocks_dir)
    except errors.UserError as e:
        raise errors.UserError(f"{e} (corpus version {corpus_version} and index version {index_version} are "
                               f"published; the served version is not: realm-tf export --base-path {base_path} "
                               f"--corpus-only writes it)") from e


class UpdateCorpusJob(job_support.BeamJob):
    """``python -m beam_jobs.update_corpus`` / ``realm-tf update-corpus``."""

    name = "update_corpus"

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        job_flags.add_update_corpus_args(parser)

    def run_with_args(self, args: argparse.Namespace, beam_args: Sequence[str]) -> dict[str, Any]:
        """Runs the update and publishes it: the manifest, with the index (and served) path, counters, timings."""
        started = time.time()
        cfg = config_lib.load_config(args.config, args.overrides)
        paths, deletes = _request(args, cfg)
        blocks_dir, index_dir = args.blocks_dir or cfg.data.blocks_dir, args.index_dir or cfg.index.index_dir
        base = find_base(cfg, blocks_dir, index_dir)
        corpus_version = corpus_versions.next_version(blocks_dir)
        index_version = index_publisher.complete_versions(index_dir)[-1] + 1
        options = job_support.pipeline_options_for(beam_args)
        outputs_scratch = job_support.scratch_directory(index_dir, f"update-{index_version}")
        logger.info("update_corpus: corpus version %d (index version %d, %s blocks) + %d file(s) - %d id(s) -> "
                    "corpus version %d, index version %d", base.corpus_version, base.index_version,
                    f"{base.num_blocks:,}", len(paths), len(deletes), corpus_version, index_version)
        timings: dict[str, float] = {}
        index_final, corpus_final = (index_publisher.version_dir(index_dir, index_version),
                                     corpus_versions.version_dir(blocks_dir, corpus_version))
        try:
            with artifacts.staged(index_final, artifacts.INDEX) as index_staging, \
                    artifacts.staged(corpus_final, artifacts.JOB_MANIFEST,
                                     pause_before_commit=args.pause_before_commit) as corpus_staging:
                # The corpus version commits first (inner), the index version last: readers follow the index.
                outputs = Outputs(corpus_staging.path, outputs_scratch)
                pipeline = beam.Pipeline(options=options)
                build_pipeline(pipeline, cfg, base, paths, deletes, outputs, args.format, args.num_shards,
                               args.batch_size, args.min_batch_size, args.max_batch_size,
                               job_support.progress_interval_for(args.progress_interval, options))
                start = time.time()
                counters = _run(pipeline)
                timings["pipeline_seconds"] = round(time.time() - start, 3)
                _check_update(counters, base, len(deletes))
                start = time.time()
                matrix = self._assemble(base, outputs)  # [num_blocks, dim]
                index = index_kinds.build_index(cfg.index.kind, cfg.index, matrix)
                timings["index_seconds"] = round(time.time() - start, 3)
                manifest = self._manifest(args, cfg, base, paths, deletes, corpus_version, index_version,
                                          matrix.shape[0], counters, corpus_staging.path, beam_args)
                index_staging.metadata = index_publisher.write_version(
                    index_staging.path, index_version, matrix, index,
                    self._index_metadata(cfg, base, manifest, blocks_dir))
                corpus_staging.metadata = manifest
        except _NothingChanged as nothing:
            return _nothing_published(base, nothing.counts)
        except FileExistsError as e:
            raise index_publisher.IndexVersionExistsError(
                f"{corpus_final} / {index_final}: published concurrently by another update or refresh; nothing of "
                f"this update is in service (run it again)") from e
        finally:
            job_support.remove_scratch_directory(outputs_scratch)
        index_publisher.delete_old_versions(index_dir, cfg.index.keep_versions, protect=index_version)
        in_use = {index_publisher.corpus_version(meta) for meta in index_publisher.published_metadata(index_dir)}
        corpus_versions.prune(blocks_dir, keep=in_use)
        summary = {**manifest, "index_path": index_final, "corpus_path": corpus_final, "published": True}
        if args.serve:
            start = time.time()
            summary["served_path"] = _serve(cfg, args.serve, index_dir, blocks_dir, corpus_version, index_version)
            timings["serve_seconds"] = round(time.time() - start, 3)
        summary["seconds"] = {**timings, "total_seconds": round(time.time() - started, 3)}
        logger.info("%s", format_summary(summary))
        return summary

    @staticmethod
    def _assemble(base: Base, outputs: Outputs) -> np.ndarray:
        dim = int(base.index_meta["dim"])
        removed, reused_ids, reused_rows = read_plan(
            [m.path for m in job_support.match(outputs.scratch(f"{PLAN_PREFIX}-*.jsonl"))])
        ids, vectors = embedding_matrix.read_embedding_shards(  # [E], [E, dim]
            [m.path for m in job_support.match(outputs.scratch(f"{embed_blocks.EMBEDDINGS_PREFIX}-*.tfrecord"))], dim)
        failures = embedding_matrix.read_failures(
            [m.path for m in job_support.match(outputs.scratch(f"{embed_blocks.FAILURES_PREFIX}-*.jsonl"))])
        base_matrix = index_publisher.read_embeddings(base.index_path)  # [base_blocks, dim]
        return assemble_update(base_matrix, removed, reused_ids, reused_rows, ids, vectors, failures,
                               where=f" (update of index version {base.index_version}; nothing published)")

    def _manifest(self, args: argparse.Namespace, cfg: config_lib.ExperimentConfig, base: Base,
                  paths: Sequence[str], deletes: Sequence[DeleteRequest], corpus_version: int, index_version: int,
                  num_blocks: int, counters: Mapping[str, Mapping[str, int]], corpus_dir: str,
                  beam_args: Sequence[str]) -> dict[str, Any]:
        counts, pre, embed = counters["update_corpus"], counters["preprocess_corpus"], counters["embed_blocks"]
        dead = {reason: pre.get(f"{preprocess_corpus.DEAD_LETTERS}_{reason}", 0) for reason in corpus_reader.REASONS}
        dead.update({reason: counts.get(f"dead_letters_{reason}", 0) for reason in (DUPLICATE_ID, UNKNOWN_ID)})
        shards = lambda prefix: sorted(filesystems.FileSystems.split(m.path)[1] for m in job_support.match(
            filesystems.FileSystems.join(corpus_dir, f"{prefix}-*")))
        manifest = base.blocks_manifest
        return {
            "job": self.name,
            "version": corpus_version,
            "parent_version": base.corpus_version,
            "base_index_version": base.index_version,
            "index_version": index_version,
            "export_path": base.export_path,
            "export_step": index_publisher.export_step(base.index_meta),
            "input_patterns": list(args.add),
            "input_files": list(paths),
            "input_format": args.format,
            "delete_ids": len(deletes),
            "input_lines": pre.get(preprocess_corpus.INPUT_LINES, 0),
            "duplicates_merged": pre.get(preprocess_corpus.DUPLICATES, 0),
            "documents": {change: counts.get(f"documents_{change}", 0) for change in CHANGES},
            "deletes_superseded": counts.get(DELETES_SUPERSEDED, 0),
            "blocks": num_blocks,
            "blocks_kept": base.num_blocks - counts.get(BLOCKS_REMOVED, 0),
            "blocks_removed": counts.get(BLOCKS_REMOVED, 0),
            "blocks_added": counts.get(BLOCKS_ADDED, 0),
            "blocks_embedded": embed.get(embed_blocks.BLOCKS_EMBEDDED, 0),
            "blocks_reused": counts.get(BLOCKS_REUSED, 0),
            "dead_letters": dead,
            "dead_letters_total": sum(dead.values()),
            "block_shards": shards(preprocess_corpus.BLOCKS_PREFIX),
            "dead_letter_shards": shards(preprocess_corpus.DEAD_LETTER_PREFIX),
            "change_shards": shards(CHANGES_PREFIX),
            "vocab_file": cfg.model.vocab_file,
            "vocab_hash": base.index_meta["vocab_hash"],
            "lower_case": bool(manifest.get("lower_case", cfg.model.lower_case)),
            "max_block_length": int(manifest.get("max_block_length", cfg.data.max_block_length)),
            "max_title_length": int(manifest.get("max_title_length", 64)),
            "beam_args": [a for a in beam_args if a != "--"],
            "counters": dict(counters),
            "config": config_lib.to_dict(cfg),
            "config_hash": config_lib.config_hash(cfg),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    @staticmethod
    def _index_metadata(cfg: config_lib.ExperimentConfig, base: Base, manifest: Mapping[str, Any],
                        blocks_dir: str) -> dict[str, Any]:
        """``index.json`` of the new version: the base version's export (same embedding space), the new corpus."""
        keep = ("export_path", "exported_at", "export_config_hash", "vocab_hash", "block_seq_length")
        return {
            **{key: base.index_meta[key] for key in keep if key in base.index_meta},
            index_publisher.EXPORT_STEP: index_publisher.export_step(base.index_meta),
            index_publisher.CORPUS_VERSION: manifest["version"],
            "blocks_pattern": corpus_versions.blocks_pattern(blocks_dir, manifest["version"],
                                                             f"{preprocess_corpus.BLOCKS_PREFIX}-*.tfrecord"),
            "update": {key: manifest[key] for key in (
                "parent_version", "base_index_version", "documents", "blocks", "blocks_removed", "blocks_added",
                "blocks_embedded", "blocks_reused", "dead_letters_total")},
            "config_hash": config_lib.config_hash(cfg),
        }


def format_summary(summary: Mapping[str, Any]) -> str:
    """A few lines summing up a finished update."""
    documents = ", ".join(f"{n:,} {change}" for change, n in summary["documents"].items())
    dead = ", ".join(f"{reason}: {n:,}" for reason, n in summary["dead_letters"].items() if n) or "none"
    seconds = summary.get("seconds", {})
    served = f"\n  served:        {summary['served_path']}" if summary.get("served_path") else ""
    return (f"update_corpus: corpus version {summary['parent_version']} -> {summary['version']}, index version "
            f"{summary['base_index_version']} -> {summary['index_version']} in {seconds.get('total_seconds', 0):.1f}s\n"
            f"  documents:     {documents} ({summary['input_lines']:,} input lines, {summary['delete_ids']:,} delete "
            f"ids, {summary['duplicates_merged']:,} duplicates merged)\n"
            f"  blocks:        {summary['blocks']:,} = {summary['blocks_kept']:,} kept + {summary['blocks_added']:,} "
            f"added ({summary['blocks_embedded']:,} embedded, {summary['blocks_reused']:,} reused); "
            f"{summary['blocks_removed']:,} removed\n"
            f"  dead letters:  {summary['dead_letters_total']:,} ({dead})\n"
            f"  published:     {summary['corpus_path']}, {summary['index_path']}{served}")


JOB = UpdateCorpusJob()
run = JOB.run  # python: update_corpus.run(argv)


if __name__ == "__main__":
    sys.exit(job_support.main(__spec__))
