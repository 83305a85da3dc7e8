"""Beam job: a raw text corpus -> REALM knowledge-corpus blocks (Guu et al., 2020, §4.1).

REALM retrieves from a knowledge corpus Z: "the December 20, 2018 snapshot of English Wikipedia. Documents
are greedily split into chunks of up to 288 BERT wordpieces" (§4.1 "Knowledge corpus"); each chunk is read
by the document tower as ``join_BERT(title, body) = [CLS] title [SEP] body [SEP]`` (§3.2). This job makes
those blocks from JSONL, DPR-style TSV or tf.Example TFRecord files (``realm_tf/data/corpus_reader.py``):

  ReadCorpus            glob patterns -> RawRecord(file, line, bytes)   (TSV headers counted apart)
  ParseDocuments        RawRecord -> Document | DeadLetter(reason)
  DeduplicateDocuments  same SHA1(title, body) -> one Document, the one with the smallest (file, line)
  PackBlocks            sentence split, tokenize (batched), greedy packing into <= max_block_length
                        wordpieces incl. [CLS]/[SEP]/[SEP] (BlockPacker); a sentence longer than a block is
                        cut at word boundaries, never dropped; TEXT is the exact substring of the body
  AssignBlockIds        dense, deterministic ids 0..N-1 in (document SHA1, block_index) order
  WriteBlocks           <output>/blocks-SSSSS-of-NNNNN.tfrecord   (example_schemas.block_feature_spec)
  WriteDeadLetters      <output>/dead_letter-SSSSS-of-NNNNN.jsonl (file, line, reason, detail, text)
  WriteManifest         <output>/manifest.json, LAST: counts, shard names, vocab hash, config

Every input line ends up in exactly one place, checked when the manifest is written:
``documents + duplicates_merged + sum(dead_letters) == input_lines``.

Usage (DirectRunner by default; any Beam runner through the standard pipeline options)::

    realm-tf preprocess --input 'data/open_qa/passages.jsonl.gz' --output /tmp/realm_tf/blocks
    python -m beam_jobs.preprocess_corpus --input 'gs://b/wiki-*.jsonl.gz' --output gs://b/blocks \\
        -- --runner=DataflowRunner --project=P --region=R --temp_location=gs://b/tmp --setup_file=./setup.py
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from typing import Any, Iterable, Iterator, Mapping, Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)

# isort: split
import apache_beam as beam
import numpy as np
from apache_beam.io import fileio
from apache_beam.io import filesystem
from apache_beam.io import filesystems

from beam_jobs import job_flags
from beam_jobs import job_support
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import block_packer
from realm_tf.data import corpus_reader
from realm_tf.data import corpus_versions
from realm_tf.data import document_packing
from realm_tf.data import example_schemas
from realm_tf.data import job_manifest
from realm_tf.data import sentence_splitter

logger = logging.getLogger(__name__)

NAMESPACE = "realm_tf.preprocess_corpus"
BLOCKS_PREFIX = "blocks"
DEAD_LETTER_PREFIX = "dead_letter"
SHARD_TEMPLATE = "-SSSSS-of-NNNNN"

# Output tags.
RECORDS = "records"
HEADERS = "headers"
DOCUMENTS = "documents"
DEAD_LETTERS = "dead_letters"

# Counter names (dead letters: "dead_letters_<reason>").
INPUT_LINES = "input_lines"
HEADER_LINES = "header_lines"
PARSED = "parsed_documents"
DUPLICATES = "duplicates_merged"
BLOCKS = "blocks"



# ---- ReadCorpus -----------------------------------------------------------------------------------------

class _ReadRecordsFn(job_support.ReportingDoFn):
    """file path -> RawRecord per line / record (main); TSV header lines -> ``headers`` (path)."""

    def __init__(self, input_format: str, progress_total: int | None, progress_interval: float) -> None:
        super().__init__("preprocess", "lines", progress_total, progress_interval, stage="read")
        self._format = input_format

    def process(self, path: str) -> Iterator[Any]:
        fmt = corpus_reader.detect_format(path, self._format)
        with filesystems.FileSystems.open(path, compression_type=filesystem.CompressionTypes.AUTO) as f:
            for record in corpus_reader.iter_records(f, path, fmt):
                if record.is_header:
                    job_support.count(NAMESPACE, HEADER_LINES)
                    yield beam.pvalue.TaggedOutput(HEADERS, path)
                    continue
                job_support.count(NAMESPACE, INPUT_LINES)
                assert self.progress is not None
                self.progress.update(1)
                yield record


class ReadCorpus(beam.PTransform):
    """Glob patterns -> ``records``: PCollection[RawRecord] (one per line), ``headers``: PCollection[str].

    Patterns are matched with Beam's ``fileio`` (any filesystem); a file matched by two patterns is read
    once; each file is read whole by one worker (split big corpora into many files for parallelism).
    """

    def __init__(self, patterns: Sequence[str], input_format: str = corpus_reader.AUTO,
                 progress_total: int | None = None, progress_interval: float = 0.0) -> None:
        super().__init__()
        self._patterns = list(patterns)
        self._format = input_format
        self._progress = (progress_total, progress_interval)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        paths = (pbegin
                 | "Patterns" >> beam.Create(self._patterns)
                 | "MatchFiles" >> fileio.MatchAll(fileio.EmptyMatchTreatment.DISALLOW)
                 | "FilePaths" >> beam.Map(lambda metadata: metadata.path)
                 | "DistinctFiles" >> beam.Distinct())
        return paths | "ReadRecords" >> beam.ParDo(
            _ReadRecordsFn(self._format, *self._progress)).with_outputs(HEADERS, main=RECORDS)


# ---- ParseDocuments -------------------------------------------------------------------------------------

class _ParseFn(beam.DoFn):
    """RawRecord -> Document (main) or DeadLetter (``dead_letters``)."""

    def process(self, record: corpus_reader.RawRecord) -> Iterator[Any]:
        parsed = corpus_reader.parse_record(record)
        if isinstance(parsed, corpus_reader.DeadLetter):
            job_support.count(NAMESPACE, f"{DEAD_LETTERS}_{parsed.reason}")
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, parsed)
        else:
            job_support.count(NAMESPACE, PARSED)
            yield parsed


class ParseDocuments(beam.PTransform):
    """PCollection[RawRecord] -> ``documents``: PCollection[Document], ``dead_letters``: PCollection[DeadLetter]."""

    def expand(self, records: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return records | "ParseLines" >> beam.ParDo(_ParseFn()).with_outputs(DEAD_LETTERS, main=DOCUMENTS)


# ---- DeduplicateDocuments -------------------------------------------------------------------------------

def _keep_first(keyed: tuple[str, Iterable[corpus_reader.Document]]) -> Iterator[corpus_reader.Document]:
    """Of documents with the same content, the one with the smallest (file, line); the rest are counted."""
    _, documents = keyed
    first, count = None, 0
    for doc in documents:
        count += 1
        if first is None or (doc.file, doc.line) < (first.file, first.line):
            first = doc
    assert first is not None
    job_support.count(NAMESPACE, DUPLICATES, count - 1)
    yield dataclasses.replace(first, duplicates=count - 1)


class DeduplicateDocuments(beam.PTransform):
    """PCollection[Document] -> PCollection[Document], one per distinct SHA1(title, body), ``duplicates`` set."""

    def expand(self, documents: beam.PCollection) -> beam.PCollection:
        return (documents
                | "KeyByContent" >> beam.Map(lambda doc: (doc.content_hash, doc))
                | "GroupByContent" >> beam.GroupByKey()
                | "KeepFirst" >> beam.FlatMap(_keep_first))


# ---- PackBlocks -----------------------------------------------------------------------------------------

class _PackFn(job_support.ReportingDoFn):
    """list[Document] -> PackedDocument (main) or DeadLetter(no_wordpieces) (``dead_letters``).

    The tokenizer is built once per DoFn instance in ``setup``; the titles and sentences of a whole batch
    of documents are tokenized in a few calls (at most ``_TOKENIZE_BYTES`` of text each).
    """

    _TOKENIZE_BYTES = 1 << 21
    _TOKENIZE_TEXTS = 8192

    def __init__(self, vocab_file: str, lower_case: bool, max_block_length: int, max_title_length: int,
                 progress_total: int | None, progress_interval: float) -> None:
        super().__init__("preprocess", "lines", progress_total, progress_interval, stage="pack")
        self._vocab_file = vocab_file
        self._lower_case = lower_case
        self._max_block_length = max_block_length
        self._max_title_length = max_title_length
        self._tokenizer: Any = None

    def setup(self) -> None:
        from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel

        super().setup()

        self._tokenizer = bert_tokenizer.BertTokenizer(self._vocab_file, lower_case=self._lower_case)
        self._continuation = bert_tokenizer.continuation_table(self._tokenizer.vocab)
        self._tokenize_graph = bert_tokenizer.traced_tokenize_with_offsets(self._tokenizer)
        self._splitter = sentence_splitter.SentenceSplitter()
        self._packer = block_packer.BlockPacker(self._max_block_length, self._max_title_length)

    def _tokenize(self, texts: Sequence[str]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per text: wordpiece ids ``int32[n]`` and UTF-8 byte start offsets ``int64[n]``."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        all_ids: list[np.ndarray] = []
        all_starts: list[np.ndarray] = []
        begin = 0
        while begin < len(texts):
            end, size = begin, 0
            while end < len(texts) and (end == begin or (size + len(texts[end]) <= self._TOKENIZE_BYTES
                                                         and end - begin < self._TOKENIZE_TEXTS)):
                size += len(texts[end])
                end += 1
            ids, starts, _ = self._tokenize_graph(tf.constant(list(texts[begin:end])))  # [rows, (pieces)] each
            flat_ids = ids.flat_values.numpy()  # int32[total_pieces]
            flat_starts = starts.flat_values.numpy()  # int64[total_pieces]: UTF-8 byte offsets in each text
            splits = ids.row_splits.numpy()  # int64[rows + 1]
            for row in range(end - begin):
                all_ids.append(flat_ids[splits[row]:splits[row + 1]])
                all_starts.append(flat_starts[splits[row]:splits[row + 1]])
            begin = end
        return all_ids, all_starts

    def process(self, batch: Sequence[corpus_reader.Document]) -> Iterator[Any]:
        texts: list[str] = []
        layouts: list[tuple[int, list[tuple[int, int]]]] = []
        for doc in batch:
            spans = self._splitter.split(doc.text)  # [(start, end)] character spans of the body
            layouts.append((len(texts), spans))
            texts.append(doc.title)
            texts.extend(doc.text[start:end] for start, end in spans)
        ids, starts = self._tokenize(texts)
        lines = documents = blocks = 0
        for doc, (row, spans) in zip(batch, layouts):
            sentences = [document_packing.Sentence(start, end, ids[row + 1 + i], starts[row + 1 + i])
                         for i, (start, end) in enumerate(spans)]
            packed = document_packing.pack_document(doc, ids[row], sentences, self._packer, self._continuation)
            lines += doc.source_lines
            if not packed:
                job_support.count(NAMESPACE, f"{DEAD_LETTERS}_{corpus_reader.NO_WORDPIECES}")
                yield beam.pvalue.TaggedOutput(DEAD_LETTERS, corpus_reader.DeadLetter(
                    doc.file, doc.line, corpus_reader.NO_WORDPIECES,
                    "the tokenizer makes no wordpiece of the body", doc.text, doc.duplicates))
                continue
            job_support.count(NAMESPACE, DOCUMENTS)
            job_support.count(NAMESPACE, BLOCKS, len(packed))
            documents += 1
            blocks += len(packed)
            yield document_packing.PackedDocument(doc.content_hash, doc.source_lines, tuple(packed))
        assert self.progress is not None
        self.progress.update(lines, documents=documents, blocks=blocks)


class PackBlocks(beam.PTransform):
    """PCollection[Document] -> ``documents``: PCollection[PackedDocument], ``dead_letters``.

    Args:
      vocab_file: WordPiece vocabulary (``model.vocab_file``; ``package:`` paths allowed).
      lower_case: ``model.lower_case``.
      max_block_length: wordpieces per block including ``[CLS]``, ``[SEP]``, ``[SEP]`` (REALM: 288).
      max_title_length: title wordpieces kept in every block.
      batch_size: at most this many documents per tokenizer batch.
    """

    def __init__(self, vocab_file: str, lower_case: bool = True, max_block_length: int = 288,
                 max_title_length: int = 64, batch_size: int = 64, progress_total: int | None = None,
                 progress_interval: float = 0.0) -> None:
        super().__init__()
        block_packer.BlockPacker(max_block_length, max_title_length)  # fail at construction when invalid
        self._fn = _PackFn(vocab_file, lower_case, max_block_length, max_title_length, progress_total,
                           progress_interval)
        self._batch_size = batch_size

    def expand(self, documents: beam.PCollection) -> beam.pvalue.DoOutputsTuple:
        return (documents
                | "BatchDocuments" >> beam.BatchElements(min_batch_size=1, max_batch_size=self._batch_size)
                | "SplitTokenizePack" >> beam.ParDo(self._fn).with_outputs(DEAD_LETTERS, main=DOCUMENTS))


# ---- AssignBlockIds -------------------------------------------------------------------------------------

class AssignBlockIds(beam.PTransform):
    """PCollection[PackedDocument] -> PCollection[(block_id, Block)], ids dense in 0..N-1.

    Ids follow (document SHA1, block_index) order, so they depend only on the corpus content
    (``job_support.AssignDenseIds``).
    """

    def expand(self, documents: beam.PCollection) -> beam.PCollection:
        return documents | "NumberBlocks" >> job_support.AssignDenseIds(_content_hash, _blocks_of)


def _content_hash(doc: document_packing.PackedDocument) -> str:
    return doc.content_hash


def _blocks_of(doc: document_packing.PackedDocument) -> tuple[document_packing.Block, ...]:
    return doc.blocks


# ---- writing --------------------------------------------------------------------------------------------

class WriteBlocks(beam.PTransform):
    """PCollection[(block_id, Block)] -> ``<dir>/blocks-SSSSS-of-NNNNN.tfrecord``; returns the shard paths."""

    def __init__(self, output_dir: str, num_shards: int = 0) -> None:
        super().__init__()
        self._prefix = filesystems.FileSystems.join(output_dir, BLOCKS_PREFIX)
        self._num_shards = num_shards

    def expand(self, blocks: beam.PCollection) -> beam.PCollection:
        return (blocks
                | "ToExample" >> beam.Map(document_packing.block_to_example)
                | "WriteTFRecords" >> beam.io.WriteToTFRecord(self._prefix, file_name_suffix=".tfrecord",
                                                              num_shards=self._num_shards,
                                                              shard_name_template=SHARD_TEMPLATE))


class WriteDeadLetters(beam.PTransform):
    """PCollection[DeadLetter] -> ``<dir>/dead_letter-SSSSS-of-NNNNN.jsonl``; returns the shard paths."""

    def __init__(self, output_dir: str) -> None:
        super().__init__()
        self._prefix = filesystems.FileSystems.join(output_dir, DEAD_LETTER_PREFIX)

    def expand(self, dead_letters: beam.PCollection) -> beam.PCollection:
        return (dead_letters
                | "ToJson" >> beam.Map(corpus_reader.DeadLetter.to_json)
                | "WriteJsonl" >> beam.io.WriteToText(self._prefix, file_name_suffix=".jsonl",
                                                      shard_name_template=SHARD_TEMPLATE))


def _write_manifest(_: None, output_dir: str, static: Mapping[str, Any], block_shards: list[str],
                    dead_letter_shards: list[str], input_lines: int, header_lines: int, documents: int,
                    source_lines: int, duplicates: int, blocks: int,
                    dead_letters: Mapping[str, int]) -> Iterator[str]:
    """Checks that every input line is accounted for, then writes manifest.json (after all shards)."""
    dead_total = sum(dead_letters.values())
    if documents + duplicates + dead_total != input_lines:
        raise RuntimeError(f"preprocess_corpus: lines unaccounted for: {documents} documents + {duplicates} "
                           f"duplicates + {dead_total} dead letters != {input_lines} input lines")
    content = dict(static)
    content.update({
        "input_lines": input_lines,
        "header_lines": header_lines,
        "documents": documents,
        "document_source_lines": source_lines,
        "duplicates_merged": duplicates,
        "blocks": blocks,
        # Every known reason is listed (0 when none), so a reader sees what was checked.
        "dead_letters": {**{reason: 0 for reason in corpus_reader.REASONS}, **dict(sorted(dead_letters.items()))},
        "dead_letters_total": dead_total,
        "block_shards": sorted(filesystems.FileSystems.split(p)[1] for p in block_shards),
        "dead_letter_shards": sorted(filesystems.FileSystems.split(p)[1] for p in dead_letter_shards),
    })
    yield job_manifest.write_manifest(output_dir, content)


class WriteManifest(beam.PTransform):
    """Writes ``manifest.json`` from the written shard paths and the counts, all taken as side inputs.

    Input: a dict of PCollections: ``block_shards``, ``dead_letter_shards`` (paths), ``records``,
    ``headers``, ``documents`` (deduplicated Documents), ``packed`` (PackedDocuments), ``blocks``,
    ``dead_letters``. Returns the manifest path.
    """

    def __init__(self, output_dir: str, static: Mapping[str, Any]) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._static = dict(static)

    def expand(self, inputs: Mapping[str, beam.PCollection]) -> beam.PCollection:
        def total(label: str, pcoll: beam.PCollection, value: Any = None) -> beam.pvalue.AsSingleton:
            if value is not None:
                pcoll = pcoll | f"{label}Values" >> beam.Map(value)
            else:
                pcoll = pcoll | f"{label}Ones" >> beam.Map(lambda _: 1)
            return beam.pvalue.AsSingleton(pcoll | f"Sum{label}" >> beam.CombineGlobally(sum))

        reasons = (inputs["dead_letters"]
                   | "DeadLetterReasons" >> beam.Map(lambda dead: dead.reason)
                   | "CountReasons" >> beam.combiners.Count.PerElement())
        return (inputs["records"].pipeline
                | "Once" >> beam.Create([None])
                | "Write" >> beam.FlatMap(
                    _write_manifest, self._output_dir, self._static,
                    block_shards=beam.pvalue.AsList(inputs["block_shards"]),
                    dead_letter_shards=beam.pvalue.AsList(inputs["dead_letter_shards"]),
                    input_lines=total("InputLines", inputs["records"]),
                    header_lines=total("HeaderLines", inputs["headers"]),
                    documents=total("Documents", inputs["packed"]),
                    source_lines=total("SourceLines", inputs["packed"], lambda doc: doc.source_lines),
                    duplicates=total("Duplicates", inputs["documents"], lambda doc: doc.duplicates),
                    blocks=total("Blocks", inputs["blocks"]),
                    dead_letters=beam.pvalue.AsDict(reasons)))


# ---- the job --------------------------------------------------------------------------------------------

def build_pipeline(pipeline: beam.Pipeline, patterns: Sequence[str], output_dir: str,
                   cfg: config_lib.ExperimentConfig, static: Mapping[str, Any], input_format: str = "auto",
                   num_shards: int = 0, batch_size: int = 64, max_title_length: int = 64,
                   progress_total: int | None = None, progress_interval: float = 0.0) -> None:
    """Adds the whole job to ``pipeline`` (see the module docstring for the steps)."""
    read = pipeline | "ReadCorpus" >> ReadCorpus(patterns, input_format, progress_total, progress_interval)
    parsed = read[RECORDS] | "ParseDocuments" >> ParseDocuments()
    documents = parsed[DOCUMENTS] | "DeduplicateDocuments" >> DeduplicateDocuments()
    packed = documents | "PackBlocks" >> PackBlocks(
        cfg.model.vocab_file, cfg.model.lower_case, cfg.data.max_block_length, max_title_length, batch_size,
        progress_total, progress_interval)
    blocks = packed[DOCUMENTS] | "AssignBlockIds" >> AssignBlockIds()
    block_shards = blocks | "WriteBlocks" >> WriteBlocks(output_dir, num_shards)
    dead_letters = ((parsed[DEAD_LETTERS], packed[DEAD_LETTERS])
                    | "AllDeadLetters" >> beam.Flatten())
    dead_letter_shards = dead_letters | "WriteDeadLetters" >> WriteDeadLetters(output_dir)
    _ = ({"block_shards": block_shards, "dead_letter_shards": dead_letter_shards, "records": read[RECORDS],
          "headers": read[HEADERS], "documents": documents, "packed": packed[DOCUMENTS], "blocks": blocks,
          "dead_letters": dead_letters}
         | "WriteManifest" >> WriteManifest(output_dir, static))


def match_inputs(patterns: Sequence[str], input_format: str, flag: str = "--input") -> list[str]:
    """Every input file, checked before the pipeline starts (no match, unknown format: UserError naming ``flag``)."""
    paths: list[str] = []
    for pattern, result in zip(patterns, filesystems.FileSystems.match(list(patterns))):
        if not result.metadata_list:
            raise errors.UserError(f"{flag} {pattern}: no file matches")
        for metadata in result.metadata_list:
            try:
                corpus_reader.detect_format(metadata.path, input_format)
            except ValueError as e:
                raise errors.UserError(str(e)) from e
            paths.append(metadata.path)
    return sorted(set(paths))


def count_input_lines(paths: Sequence[str], input_format: str = "auto") -> int:
    """Lines / records of the inputs (TSV headers excluded): the total for the progress display."""
    total = 0
    for path in paths:
        fmt = corpus_reader.detect_format(path, input_format)
        with filesystems.FileSystems.open(path, compression_type=filesystem.CompressionTypes.AUTO) as f:
            total += sum(1 for record in corpus_reader.iter_records(f, path, fmt) if not record.is_header)
    return total


def refuse_to_replace(output_dir: str, overwrite: bool) -> None:
    """UserError when ``output_dir`` already holds a corpus (a manifest, block shards or update versions) and
    ``overwrite`` is not set: preprocessing again would replace its blocks and discard its updates."""
    held = []
    if filesystems.FileSystems.exists(job_manifest.manifest_path(output_dir)) or filesystems.FileSystems.match(
            [filesystems.FileSystems.join(output_dir, f"{BLOCKS_PREFIX}-*")])[0].metadata_list:
        held.append("a preprocessed corpus")
    if filesystems.FileSystems.exists(filesystems.FileSystems.join(output_dir, corpus_versions.VERSIONS_DIR)):
        held.append(f"the updates made on it ({corpus_versions.VERSIONS_DIR}/, from update-corpus)")
    if held and not overwrite:
        raise errors.UserError(f"--output {output_dir}: already holds {' and '.join(held)}; preprocessing again "
                               f"would replace it. Pass --overwrite to do so, or choose another --output")


class PreprocessCorpusJob(job_support.BeamJob):
    """``python -m beam_jobs.preprocess_corpus`` / ``realm-tf preprocess``.

    On the DirectRunner with progress lines on (``--progress-interval``), the input lines are counted first,
    so that progress lines show a percentage; on a distributed runner the launcher does not read the corpus.
    """

    name = "preprocess_corpus"

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        job_flags.add_preprocess_args(parser)

    def run_with_args(self, args: argparse.Namespace, beam_args: Sequence[str]) -> dict[str, Any]:
        """Builds and runs the job, waits for it, prints the manifest it wrote and returns it, with the run's
        Beam counters under ``"counters"``."""
        cfg = config_lib.load_config(args.config, args.overrides)
        paths = match_inputs(args.input, args.format)
        from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel

        vocab_hash = bert_tokenizer.vocab_hash(cfg.model.vocab_file)
        try:
            block_packer.BlockPacker(cfg.data.max_block_length, args.max_title_length)
        except ValueError as e:
            raise errors.UserError(f"data.max_block_length: {e}") from e
        static = {
            "job": self.name,
            "input_patterns": list(args.input),
            "input_files": paths,
            "input_format": args.format,
            "output_dir": args.output,
            "vocab_file": cfg.model.vocab_file,
            "vocab_hash": vocab_hash,
            "lower_case": cfg.model.lower_case,
            "max_block_length": cfg.data.max_block_length,
            "max_title_length": args.max_title_length,
            "num_shards": args.num_shards,
            "batch_size": args.batch_size,
            "beam_args": [a for a in beam_args if a != "--"],
            "schema": sorted(example_schemas.block_feature_spec()),
            "config": config_lib.to_dict(cfg),
            "config_hash": config_lib.config_hash(cfg),
        }
        options = job_support.pipeline_options_for(beam_args)
        total = None
        if args.progress_interval > 0 and job_support.is_direct_runner(options):
            start = time.time()
            total = count_input_lines(paths, args.format)
            logger.info("preprocess: %d input file(s), %s lines (counted in %.1fs)", len(paths), f"{total:,}",
                        time.time() - start)
        refuse_to_replace(args.output, args.overwrite)
        start = time.time()
        # Written beside the output and swapped in whole: a previous corpus (and the updates made on it, which do
        # not apply to this new version 0) stays readable until this run completes.
        with job_support.replacing_output(args.output) as staging_dir:
            pipeline = beam.Pipeline(options=options)
            build_pipeline(pipeline, args.input, staging_dir, cfg, static, args.format, args.num_shards,
                           args.batch_size, args.max_title_length, total, args.progress_interval)
            result = pipeline.run()
            result.wait_until_finish()
        manifest = job_manifest.read_manifest(args.output)
        logger.info("%s", format_summary(manifest, time.time() - start))
        return {**manifest, "counters": job_support.read_counters(result, NAMESPACE)}


def format_summary(manifest: Mapping[str, Any], seconds: float | None = None) -> str:
    """A few lines summing up a finished run, from its manifest."""
    dead = manifest["dead_letters"]
    reasons = ", ".join(f"{reason}: {n:,}" for reason, n in dead.items()) or "none"
    took = f" in {seconds:.1f}s" if seconds is not None else ""
    return (f"preprocess_corpus: {manifest['input_lines']:,} input lines{took}\n"
            f"  documents:         {manifest['documents']:,} ({manifest['duplicates_merged']:,} duplicates merged)\n"
            f"  blocks:            {manifest['blocks']:,} of <= {manifest['max_block_length']} wordpieces in "
            f"{len(manifest['block_shards'])} shard(s)\n"
            f"  dead letters:      {manifest['dead_letters_total']:,} ({reasons})\n"
            f"  output:            {manifest['output_dir']} (manifest.json, vocab {manifest['vocab_hash'][:12]})")


JOB = PreprocessCorpusJob()
run = JOB.run  # python: preprocess_corpus.run(argv)


if __name__ == "__main__":
    sys.exit(job_support.main(__spec__))
