"""``realm-tf``: the command line of realm_tf (REALM, Guu et al. 2020, in TensorFlow 2).

The commands are declared next to the functions they drive, in ``realm_tf/commands/`` (one module per area, each
a ``COMMANDS`` list); this module generates the parser from them. Every command that runs an experiment takes
``--config FILE.yaml`` and any number of ``--set section.key=value`` overrides; the resolved config is written to
``<model_dir>/params.yaml``. Run ``realm-tf COMMAND --help`` for the options of one command.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)
from realm_tf import command_line
from realm_tf import errors
from realm_tf import process_settings
from realm_tf.commands import command
from realm_tf.commands import experiments
from realm_tf.commands import language_models
from realm_tf.commands import pipelines
from realm_tf.commands import question_answering
from realm_tf.commands import tools
from realm_tf.commands import training

_DESCRIPTION = """\
REALM (Retrieval-Augmented Language Model pre-training) in TensorFlow 2.

A knowledge retriever p(z|x) over a corpus of 288-wordpiece blocks and a knowledge-augmented
encoder p(y|z,x), trained end to end through the marginal likelihood over retrieved blocks."""

#: Every command, in the order ``realm-tf --help`` lists them.
COMMANDS: tuple[command.Command, ...] = (*tools.COMMANDS, *pipelines.COMMANDS, *training.COMMANDS,
                                         *question_answering.COMMANDS, *language_models.COMMANDS)


def command_table(commands: Sequence[command.Command], columns: int = 98) -> str:
    """The command list of ``realm-tf --help``: one heading per group, each help wrapped to ``columns`` (argparse
    indents it by 2 more)."""
    width = max(len(c.name) for c in commands) + 4
    parts = []
    for group, heading in command.GROUPS.items():
        members = [c for c in commands if c.group == group]
        if members:
            parts.append(heading + ":\n" + "\n".join(
                textwrap.fill(c.help, columns, initial_indent=f"  {c.name:<{width - 2}}", subsequent_indent=" " * width)
                for c in members))
    return "\n\n".join(parts)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per command."""
    parser = command_line.ConventionParser(prog="realm-tf", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"realm-tf {realm_tf.__version__}")
    names = [c.name for c in COMMANDS]
    if len(set(names)) != len(names):
        raise ValueError(f"realm-tf: a command is declared twice: {sorted(n for n in names if names.count(n) > 1)}")
    unknown = sorted({c.group for c in COMMANDS} - set(command.GROUPS))
    if unknown:
        raise ValueError(f"realm-tf: commands in groups that realm-tf --help does not list: {unknown}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                                help="run realm-tf COMMAND --help for its options and examples",
                                description=command_table(COMMANDS))
    for c in COMMANDS:
        p = sub.add_parser(c.name, description=c.help)
        c.add_args(p)
        p.add_argument("--verbose", action="store_true",
                       help="also show the start-up messages of TensorFlow and Beam that are known to be harmless "
                            "(no GPU found, Beam's Google Cloud extras not installed)")
        p.epilog = "\n\n".join(e for e in (command.epilog(c.examples), p.epilog) if e)
        p.set_defaults(handler=c.run, entry_point=main, starts_tensorflow=c.starts_tensorflow)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``realm-tf`` console script."""
    parser = build_parser()
    try:  # evaluate --experiment NAME: the command that scores NAME
        argv = experiments.resolve(sys.argv[1:] if argv is None else argv)
    except errors.UserError as e:
        print(f"realm-tf: error: {e}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    # Before the command's first tensor: TensorFlow reads the settings then. The demo's own process starts no
    # TensorFlow (each stage runs in a child that does this itself), nor does printing a config.
    process_settings.prepare_process(verbose=args.verbose, find_devices=args.starts_tensorflow)
    try:
        return int(args.handler(args) or 0)
    except (errors.UserError, FileNotFoundError) as e:
        print(f"realm-tf {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # pylint: disable=broad-except  # a full disk is the user's to fix; the rest, a bug
        full = errors.disk_full(e)
        if not full:
            raise
        print(f"realm-tf {args.command}: error: the disk is full ({full}). What this run was writing was not "
              f"published: earlier versions are intact. Free space, then run the same command again", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
