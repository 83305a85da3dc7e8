"""Command-line flags of every Beam job (stdlib only, so ``realm-tf --help`` imports no Beam/TensorFlow).

The jobs (``python -m beam_jobs.<job>``) and their ``realm-tf`` subcommands share these definitions, under the
convention of :mod:`realm_tf.command_line`. Beam pipeline options (``--runner``, ``--project``,
``--direct_num_workers``...) go after ``--``; before it, a flag Beam declares is passed to Beam as well, and any
other unknown flag is refused with the nearest known one.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from realm_tf import command_line

FORMATS = ("auto", "jsonl", "tsv", "tfrecord")
#: Each job's ``Examples:``, as its arguments: ``realm-tf <command>`` and ``python -m beam_jobs.<job>`` print them
#: after their own name, so that the two help texts cannot disagree.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "preprocess_corpus": (
        "--config configs/minilm.yaml --input my_documents.jsonl --output runs/minilm/blocks",
        "--config configs/minilm.yaml --input 'gs://B/docs/*.jsonl' --output gs://B/blocks -- "
        "--runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp"),
    "generate_pretraining_data": ("--config configs/minilm.yaml",),
    "generate_ict_data": ("--config configs/minilm.yaml",),
    "embed_blocks": ("--config configs/minilm.yaml", "--config configs/minilm.yaml --export runs/minilm/export/400"),
    "update_corpus": ("--config configs/minilm.yaml --add new_documents.jsonl --delete 17,42",
                      "--config configs/minilm.yaml --add new_documents.jsonl --serve runs/minilm/served"),
    "build_chunk_database": ("--config configs/minilm.yaml",),
    "build_knn_datastore": ("--config configs/minilm.yaml --model-dir runs/minilm/retro/baseline",),
}


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """``--config FILE.yaml`` and repeatable ``--set key=value``: every job reads the experiment config."""
    parser.add_argument("--config", default=None, action="append", metavar="FILE.yaml",
                        help="experiment config (default: the paper's settings); repeatable: a later file "
                             "overrides the keys it sets")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value, e.g. --set data.seed=1 (repeatable)")


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """The flags every example-generation job takes."""
    add_config_args(parser)
    parser.add_argument("--input", default=None, metavar="PATTERN",
                        help="block TFRecords (default: <data.blocks_dir>/blocks-*.tfrecord)")
    parser.add_argument("--num_shards", type=int, default=0, help="output shards (0: let the runner decide)")
    parser.add_argument("--batch_size", type=int, default=64, help="blocks tokenized together")


def add_pretraining_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``beam_jobs.generate_pretraining_data``."""
    add_common_args(parser)
    parser.add_argument("--output", default=None, help="output directory (default: data.pretraining_dir)")
    parser.add_argument("--max_span_wordpieces", type=int, default=None,
                        help="longest maskable salient span in wordpieces (default: model.max_span_width)")


def add_ict_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``beam_jobs.generate_ict_data``."""
    add_common_args(parser)
    parser.add_argument("--output", default=None, help="output directory (default: data.ict_dir)")
    parser.add_argument("--sentences_per_block", type=int, default=0,
                        help="0: every sentence is a query (ORQA); K: a deterministic sample of K per block")


def add_preprocess_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``beam_jobs.preprocess_corpus``."""
    parser.add_argument("--input", action="append", required=True, metavar="GLOB",
                        help="input files: local paths or any Beam filesystem (gs://...), globs allowed, "
                             ".gz/.bz2 decompressed by extension; repeatable")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="output directory: blocks-*.tfrecord, dead_letter-*.jsonl, manifest.json")
    parser.add_argument("--format", default="auto", choices=FORMATS,
                        help="jsonl {title, text[, id]}, tsv (DPR: id<TAB>text<TAB>title), tfrecord "
                             "(tf.Example title, text[, id]); auto: from each file's extension")
    add_config_args(parser)  # reads data.max_block_length, model.vocab_file, model.lower_case
    parser.add_argument("--num_shards", type=int, default=0,
                        help="block TFRecord shards (0: let the runner decide)")
    parser.add_argument("--batch_size", type=int, default=64,
                        help="documents per tokenizer call")
    parser.add_argument("--max_title_length", type=int, default=64,
                        help="title wordpieces kept in every block")
    parser.add_argument("--progress_interval", type=float, default=10.0, metavar="SECONDS",
                        help="print progress lines at most this often (0: never)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the corpus already in --output (its blocks, and the updates made on it with "
                             "update-corpus); without it, a non-empty --output is refused")


def add_embed_blocks_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``beam_jobs.embed_blocks``."""
    add_config_args(parser)
    parser.add_argument("--blocks", default=None, metavar="PATTERN",
                        help="block TFRecords (default: <data.blocks_dir>/blocks-*.tfrecord)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--export", default=None, metavar="DIR",
                        help="one retriever export, <export_dir>/<step> (its step is the index version)")
    source.add_argument("--export_dir", default=None, metavar="DIR",
                        help="use the newest complete export under DIR (default: refresh.export_dir)")
    parser.add_argument("--index_dir", default=None, help="versioned index root (default: index.index_dir)")
    parser.add_argument("--embeddings_dir", default=None,
                        help="staging for the embedding shards (default: <index_dir>/.embeddings-<version>-<rand>)")
    parser.add_argument("--keep_embeddings", action="store_true",
                        help="keep the embedding shards after a successful publish")
    parser.add_argument("--min_batch_size", type=int, default=1, help="smallest RunInference batch")
    parser.add_argument("--max_batch_size", type=int, default=32, help="largest RunInference batch")
    parser.add_argument("--batching", choices=("length", "arrival"), default="length",
                        help="length: batch blocks of similar wordpiece length (less padding); "
                             "arrival: RunInference's own BatchElements in input order")
    parser.add_argument("--num_shards", type=int, default=0, help="embedding shards (0: let the runner decide)")
    parser.add_argument("--intra_op_threads", type=int, default=None, metavar="N",
                        help="TensorFlow threads per op in each worker process; 0: TensorFlow's default (one per "
                             "core). Default: on the DirectRunner's multi_threading or multi_processing workers, "
                             "the cores divided by the workers, else 0. On the DirectRunner the job runs a "
                             "multi_threading worker per core unless --direct_running_mode or --direct_num_workers "
                             "is given (2 cores: 2 workers of 1 thread, faster than 1 worker of 2). Set it to 1 "
                             "where a machine runs several worker processes (Dataflow's Python workers start one "
                             "per vCPU)")
    add_progress_interval_arg(parser)
    parser.add_argument("--pause_before_commit", type=float, default=0.0, metavar="SECONDS", hidden=True,
                        help="fault-injection tests: sleep with the new index version staged, before committing it")


def add_update_corpus_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``beam_jobs.update_corpus``."""
    parser.add_argument("--add", action="append", default=[], metavar="GLOB",
                        help="documents to add, or to replace when their id is already in the corpus: files as "
                             "preprocess reads them (JSONL/TSV/TFRecord, globs, any Beam filesystem); repeatable")
    parser.add_argument("--delete", action="append", default=[], metavar="IDS",
                        help="document ids to delete, comma-separated, or @FILE with one id a line; repeatable. "
                             "An id not in the corpus is counted and reported (dead letter unknown_id)")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="format of the --add files (as preprocess)")
    add_config_args(parser)
    parser.add_argument("--blocks_dir", default=None, help="the corpus of record (default: data.blocks_dir)")
    parser.add_argument("--index_dir", default=None, help="versioned index root (default: index.index_dir)")
    parser.add_argument("--serve", default=None, metavar="MODEL_BASE_PATH",
                        help="then write a new version of the served model under MODEL_BASE_PATH: the weights of its "
                             "newest version, the corpus of the new index version (as realm-tf export --corpus-only)")
    parser.add_argument("--num_shards", type=int, default=0, help="block TFRecord shards (0: let the runner decide)")
    parser.add_argument("--batch_size", type=int, default=64, help="documents per tokenizer call")
    parser.add_argument("--min_batch_size", type=int, default=1, help="smallest embedding batch")
    parser.add_argument("--max_batch_size", type=int, default=32, help="largest embedding batch")
    add_progress_interval_arg(parser)
    parser.add_argument("--pause_before_commit", type=float, default=0.0, metavar="SECONDS", hidden=True,
                        help="fault-injection tests: sleep with the new corpus and index versions staged, before "
                             "committing them")


def add_chunk_database_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``beam_jobs.build_chunk_database`` (RETRO's retrieval database)."""
    add_config_args(parser)
    parser.add_argument("--blocks", default=None, metavar="PATTERN",
                        help="block TFRecords (default: <data.blocks_dir>/blocks-*.tfrecord*)")
    parser.add_argument("--num_shards", type=int, default=0, help="output shards (0: let the runner decide)")
    add_progress_interval_arg(parser)


def add_knn_datastore_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``beam_jobs.build_knn_datastore`` (kNN-LM's datastore)."""
    add_config_args(parser)
    parser.add_argument("--model_dir", default=None, metavar="DIR",
                        help="the trained decoder whose hidden states are the keys (default: retro_trainer.model_dir; "
                             "kNN-LM uses the baseline: train-retro --baseline)")
    parser.add_argument("--batch_size", type=int, default=8, help="sequences per decoder call")
    add_progress_interval_arg(parser)


def add_progress_interval_arg(parser: argparse.ArgumentParser) -> None:
    """``--progress-interval`` of the jobs whose progress lines are on by default only on the DirectRunner."""
    parser.add_argument("--progress_interval", type=float, default=None, metavar="SECONDS",
                        help="progress lines every SECONDS (default: 10 on the DirectRunner, off elsewhere)")


def pass_unknown_through(parser: command_line.ConventionParser) -> None:
    """Makes a ``realm-tf`` sub-parser keep Apache Beam's pipeline options in ``args.beam_args``.

    argparse reports whatever a sub-parser leaves unparsed as an error of the main parser; Beam options must
    reach ``PipelineOptions`` instead. Any other unknown flag is refused (:mod:`realm_tf.command_line`).
    """
    parser.beam_options = True
    parse_known_args = parser.parse_known_args

    def parse_keeping_beam_args(args: Sequence[str] | None = None,
                                namespace: argparse.Namespace | None = None
                                ) -> tuple[argparse.Namespace, list[str]]:
        namespace, rest = parse_known_args(args, namespace)
        namespace.beam_args = list(rest)
        return namespace, []

    parser.parse_known_args = parse_keeping_beam_args  # type: ignore[method-assign]
    parser.epilog = ("Apache Beam pipeline options go after --, e.g. -- --runner=DataflowRunner --project=P "
                     "--region=R --temp_location=gs://... --setup_file=./setup.py, or -- --direct_num_workers=2.")
