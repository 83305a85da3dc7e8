"""What a ``realm-tf`` command is: its name, one line of help, its arguments and the function it runs.

Each area's module (``pipelines``, ``training``, ``question_answering``, ``language_models``, ``tools``) declares
its commands as a ``COMMANDS`` list next to the functions they drive; ``realm_tf.cli`` builds the parser from those
lists. A command module imports TensorFlow and the library only inside its functions, so ``realm-tf --help`` starts
at once.
"""
from __future__ import annotations

import argparse
import dataclasses
import signal
from typing import Any, Callable, Mapping, Sequence

from realm_tf import config as config_lib


@dataclasses.dataclass(frozen=True)
class Command:
    """``realm-tf NAME``: ``run(args)`` returns the exit code; ``add_args(parser)`` declares its arguments.
    ``starts_tensorflow``: the command runs TensorFlow in its own process, which then starts it quietly before its
    first tensor (False: it never imports TensorFlow, or its children do, and it starts in a fraction of a
    second instead of TensorFlow's seconds). ``group``: its heading in ``realm-tf --help`` (one of
    :data:`GROUPS`); ``examples``: the command lines of its ``Examples:`` epilog."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    add_args: Callable[[argparse.ArgumentParser], None]
    starts_tensorflow: bool = True
    group: str = "tools"
    examples: tuple[str, ...] = ()


#: The headings of ``realm-tf --help``, in order.
GROUPS = {"data": "data (corpora and training examples)", "index": "index (block embeddings and MIPS indexes)",
          "train": "training (the retriever, REALM and the reader)", "qa": "QA (evaluate, export and ask)",
          "lm": "LM (RETRO and kNN-LM)", "tools": "tools"}


def epilog(examples: Sequence[str]) -> str:
    """The ``Examples:`` epilog of a command's help."""
    return "Examples:\n" + "\n".join(f"  {e}" for e in examples) if examples else ""


def add_config_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """``--config FILE.yaml`` (repeatable: each later file overrides the keys it sets) and any number of
    ``--set key=value`` (applied last)."""
    parser.add_argument("--config", required=required, action="append", metavar="FILE.yaml",
                        help="experiment config (configs/tiny.yaml, configs/minilm.yaml, configs/base.yaml); "
                             "repeatable: a later file overrides the keys it sets, e.g. --config "
                             "configs/minilm.yaml --config my_paths.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value after every --config file, e.g. --set pretrain.steps=100 "
                             "(repeatable)")


def load(args: argparse.Namespace) -> config_lib.ExperimentConfig:
    """The config of the ``--config`` files, layered in order, with the ``--set`` overrides."""
    return config_lib.load_config(args.config, args.overrides)


def training_exit_code(result: Mapping[str, Any]) -> int:
    """0 when training ran to its end (or its ``max_minutes``); 143 (128 + SIGTERM) when a SIGTERM stopped it after
    a checkpoint, so that a supervisor or a benchmark harness does not take a preempted run for a finished one."""
    return 128 + signal.SIGTERM if result.get("stopped_by") == "SIGTERM" else 0


def keep_unknown_args(parser: argparse.ArgumentParser, dest: str) -> None:
    """Makes a sub-parser keep the flags it does not know in ``args.<dest>`` instead of failing (argparse reports
    what a sub-parser leaves unparsed as an error of the main parser)."""
    parser.passthrough = True  # realm_tf.command_line.ConventionParser: no unknown flag is refused here
    parse_known_args = parser.parse_known_args

    def parse_keeping(args: Sequence[str] | None = None,
                      namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        namespace, rest = parse_known_args(args, namespace)
        setattr(namespace, dest, list(rest))
        return namespace, []

    parser.parse_known_args = parse_keeping  # type: ignore[method-assign]
