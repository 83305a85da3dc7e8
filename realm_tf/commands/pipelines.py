"""``realm-tf`` commands that run a Beam job (``realm-tf <command>`` = ``python -m beam_jobs.<job>``, its flags
declared in ``beam_jobs/job_flags`` next to the job), and the index builder that runs ``embed_blocks`` for each new
retriever export (REALM's asynchronous refresh, Guu et al. 2020, §3.4)."""
from __future__ import annotations

import argparse
from typing import Any, Callable

from beam_jobs import job_flags  # stdlib and realm_tf.command_line only: realm-tf --help stays light
from realm_tf.commands import command


def _job(name: str) -> Any:
    """The ``JOB`` of the Beam job behind ``realm-tf name``; the jobs are imported only when one of them runs."""
    # pylint: disable=import-outside-toplevel
    from beam_jobs import build_chunk_database
    from beam_jobs import build_knn_datastore
    from beam_jobs import embed_blocks
    from beam_jobs import generate_ict_data
    from beam_jobs import generate_pretraining_data
    from beam_jobs import preprocess_corpus
    from beam_jobs import update_corpus

    return {"preprocess": preprocess_corpus.JOB, "generate-pretraining-data": generate_pretraining_data.JOB,
            "generate-ict-data": generate_ict_data.JOB, "embed-blocks": embed_blocks.JOB,
            "build-chunk-database": build_chunk_database.JOB, "build-knn-datastore": build_knn_datastore.JOB,
            "update-corpus": update_corpus.JOB}[name]


def _run_beam_job(args: argparse.Namespace) -> int:
    """Runs the Beam job of ``args.command`` with its flags and the Beam pipeline options."""
    _job(args.command).run_with_args(args, args.beam_args)
    return 0


def _beam_job_args(adder: str) -> Callable[[argparse.ArgumentParser], None]:
    """The job's flags (``job_flags.<adder>``); every other flag is passed to Beam as a pipeline option."""

    def add(parser: argparse.ArgumentParser) -> None:
        getattr(job_flags, adder)(parser)
        job_flags.pass_unknown_through(parser)

    return add


def _refresh_index(args: argparse.Namespace) -> int:
    """The index builder: embeds the corpus with each new retriever export and publishes an index version."""
    from beam_jobs import embed_blocks  # pylint: disable=import-outside-toplevel
    from realm_tf.index import index_refresher  # pylint: disable=import-outside-toplevel

    if args.watch is None:
        version = embed_blocks.refresh_index(args.config, args.overrides, index_dir=args.index_dir,
                                             beam_args=args.beam_args or None,
                                             pause_before_commit=args.pause_before_commit)
        print(f"refresh-index: {'published version ' + str(version) if version is not None else 'index is up to date'}")
        return 0
    refresher = index_refresher.IndexRefresher(args.config, embed_blocks.embed_and_publish, args.overrides,
                                               export_dir=args.watch or None,
                                               index_dir=args.index_dir, beam_args=args.beam_args or None,
                                               pause_before_commit=args.pause_before_commit)
    print(f"refresh-index: watching {refresher.export_dir} every {refresher.poll_seconds:g}s -> "
          f"{refresher.index_dir} (Ctrl-C to stop)", flush=True)
    try:
        refresher.watch()
    except KeyboardInterrupt:
        pass
    return 0


def _refresh_index_args(parser: argparse.ArgumentParser) -> None:
    command.add_config_args(parser)
    parser.add_argument("--watch", nargs="?", const="", default=None, metavar="EXPORT_DIR", dest="watch",
                        help="keep watching EXPORT_DIR (default: refresh.export_dir) and index every new export; "
                             "without --watch, index the newest export once and exit")
    parser.add_argument("--index_dir", default=None, help="versioned index root (default: index.index_dir)")
    parser.add_argument("--pause_before_commit", type=float, default=0.0, metavar="SECONDS", hidden=True,
                        help="fault-injection tests: sleep with each new version staged, before committing it")
    job_flags.pass_unknown_through(parser)


#: ``realm-tf`` name -> (one line of help, the job_flags function that declares the job's flags, the group, the
#: job's module, whose ``job_flags.EXAMPLES`` the command's examples are)
_BEAM_JOBS = {
    "preprocess": ("Beam job: corpus (JSONL/TSV/TFRecord) -> REALM blocks of <= 288 wordpieces + manifest",
                   "add_preprocess_args", "data", "preprocess_corpus"),
    "generate-pretraining-data": ("Beam job: blocks -> salient-span-masked pre-training examples (REALM 3.4)",
                                  "add_pretraining_args", "data", "generate_pretraining_data"),
    "generate-ict-data": ("Beam job: blocks -> Inverse Cloze Task examples for the retriever warm start",
                          "add_ict_args", "data", "generate_ict_data"),
    "embed-blocks": ("Beam job: embed every block with a retriever export, publish a new MIPS index (REALM 3.4)",
                     "add_embed_blocks_args", "index", "embed_blocks"),
    "update-corpus": ("Beam job: add, replace, delete documents (--add FILE, --delete IDS): a new corpus version and "
                      "index version, only the new blocks embedded (--serve: and a new served version)",
                      "add_update_corpus_args", "data", "update_corpus"),
    "build-chunk-database": ("Beam job: RETRO's chunk database from the blocks (frozen-BERT keys) and its MIPS index",
                             "add_chunk_database_args", "lm", "build_chunk_database"),
    "build-knn-datastore": ("Beam job: kNN-LM's datastore (a trained decoder's final-FFW inputs over the training "
                            "tokens -> next token) and its MIPS index", "add_knn_datastore_args", "lm",
                            "build_knn_datastore"),
}

COMMANDS = [
    *(command.Command(name, help_text, _run_beam_job, _beam_job_args(adder), group=group,
                      examples=tuple(f"realm-tf {name} {e}" for e in job_flags.EXAMPLES[module]))
      for name, (help_text, adder, group, module) in _BEAM_JOBS.items()),
    command.Command("refresh-index",
                    "index builder: re-embed the corpus for each new retriever export (--watch: keep going)",
                    _refresh_index, _refresh_index_args,
                    group="index",
                    examples=("realm-tf refresh-index --config configs/minilm.yaml --watch",)),
]
