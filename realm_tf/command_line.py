"""The command-line convention of ``realm-tf`` and of ``python -m beam_jobs.<job>``: one parser class for both.

- Flags are kebab-case (``--model-dir``). A flag declared in snake_case is registered under its kebab-case
  spelling; the snake_case one stays accepted, is hidden from ``--help`` and prints a deprecation line when used.
- An unknown flag is refused with exit code 2 and the nearest known flag ("did you mean --index-dir?").
- A parser made with ``beam_options=True`` (a Beam job) passes Apache Beam's pipeline options through to
  ``PipelineOptions``: everything after ``--``, and, before it, any flag Beam itself declares (``--runner``,
  ``--direct_num_workers``, ...). Other unknown flags are refused as above.
- ``add_argument(..., hidden=True)`` declares a flag that works but is not shown (test hooks);
  ``add_argument("--output", old=("--out",))`` keeps a renamed flag's old name, hidden and deprecated.
- No abbreviations: a prefix of a flag is an unknown flag.
"""
from __future__ import annotations

import argparse
import difflib
import functools
import logging
import sys
from typing import Any, Sequence


def kebab(flag: str) -> str:
    """``--model_dir`` → ``--model-dir``; short flags and positionals unchanged."""
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag


@functools.lru_cache(maxsize=1)
def beam_option_flags() -> frozenset[str]:
    """Every ``--flag`` that Apache Beam's ``PipelineOptions`` subclasses declare (imported on first use only,
    without the warnings Beam logs at import when its optional Google Cloud extras are missing)."""
    logging.disable(logging.WARNING)
    try:
        from apache_beam.options import pipeline_options  # pylint: disable=import-outside-toplevel  (slow import)
    finally:
        logging.disable(logging.NOTSET)

    parser = argparse.ArgumentParser(add_help=False)
    pending, seen = list(pipeline_options.PipelineOptions.__subclasses__()), set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        try:
            cls._add_argparse_args(parser)  # noqa: SLF001  (Beam's own way to list its options)
        except argparse.ArgumentError:  # an option declared by two classes
            continue
    return frozenset(o for a in parser._actions for o in a.option_strings)  # noqa: SLF001


class _HidingFormatter(argparse.RawDescriptionHelpFormatter):
    """Help without the deprecated spellings of a flag."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        deprecated = getattr(action, "deprecated_spellings", ())
        if not deprecated:
            return super()._format_action_invocation(action)
        shown = argparse.Action.__new__(type(action))
        shown.__dict__.update(action.__dict__, option_strings=[o for o in action.option_strings if o not in deprecated])
        return super()._format_action_invocation(shown)


def _declare(parser: "ConventionParser", add: Any, names: Sequence[str], hidden: bool,
             kwargs: dict[str, Any]) -> argparse.Action:
    """``add(*names, **kwargs)`` with the flags spelled by the convention (:meth:`ConventionParser.add_argument`)."""
    if hidden:
        kwargs["help"] = argparse.SUPPRESS
    renamed = kwargs.pop("old", ())
    old = [n for n in names if kebab(n) != n] + list(renamed)
    action = add(*dict.fromkeys([kebab(n) for n in names] + old), **kwargs)
    action.deprecated_spellings = tuple(old)
    primary = next((kebab(n) for n in names if n.startswith("--")), names[0])
    parser.deprecated.update({n: primary for n in old})
    return action


class ConventionParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` that applies this module's convention to its flags and its sub-parsers.

    Args:
      beam_options: keep Apache Beam pipeline options in the second value of ``parse_known_args`` (the caller
        hands them to ``PipelineOptions``) instead of refusing them.
      passthrough: keep every unknown argument (a command that forwards its arguments to another).
    """

    def __init__(self, *args: Any, beam_options: bool = False, passthrough: bool = False, **kwargs: Any):
        kwargs.setdefault("formatter_class", _HidingFormatter)
        kwargs.setdefault("allow_abbrev", False)  # a prefix of a flag is an unknown flag, not a guess
        self.deprecated: dict[str, str] = {}  # old spelling -> its kebab-case flag
        self.beam_options = beam_options
        self.passthrough = passthrough
        super().__init__(*args, **kwargs)

    def add_argument(self, *names: str, hidden: bool = False, **kwargs: Any) -> argparse.Action:
        """``argparse``'s ``add_argument``, with every ``--snake_case`` name registered as kebab-case first and
        kept as a hidden, deprecated spelling; ``hidden``: the flag is not shown in ``--help``."""
        return _declare(self, super().add_argument, names, hidden, kwargs)

    def add_mutually_exclusive_group(self, **kwargs: Any) -> argparse._MutuallyExclusiveGroup:  # noqa: SLF001
        group = super().add_mutually_exclusive_group(**kwargs)
        plain = group.add_argument
        group.add_argument = lambda *names, hidden=False, **kw: _declare(self, plain, names, hidden, kw)
        return group

    def add_subparsers(self, **kwargs: Any) -> argparse._SubParsersAction:  # noqa: SLF001
        kwargs.setdefault("parser_class", ConventionParser)
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        args = list(sys.argv[1:] if args is None else args)
        cut = args.index("--") if "--" in args and not self._has_subparsers() else len(args)
        own, after = args[:cut], args[cut + 1:]
        for item in own:
            flag = item.split("=", 1)[0]
            if flag in self.deprecated:
                print(f"{self.prog}: {flag} is deprecated and will be removed; use {self.deprecated[flag]}",
                      file=sys.stderr)
        namespace, rest = super().parse_known_args(own, namespace)
        if self.passthrough:
            return namespace, rest + after
        refused = [r for r in rest if not (self.beam_options and r.startswith("-")
                                           and r.split("=", 1)[0] in beam_option_flags())]
        refused_flags = [r for r in refused if r.startswith("-")]
        if refused_flags:
            self.error(self.unknown_flag_message(refused_flags[0]))
        if refused and not self._has_subparsers():
            self.error(f"unrecognized arguments: {' '.join(refused)}")
        return namespace, rest + after

    def unknown_flag_message(self, item: str) -> str:
        """The error for an unknown ``item``, with the nearest known flag."""
        flag = item.split("=", 1)[0]
        known = [o for a in self._actions if a.help != argparse.SUPPRESS for o in a.option_strings
                 if o.startswith("--") and o not in self.deprecated]
        names = {o.lstrip("-"): o for o in known}
        near = difflib.get_close_matches(kebab(flag).lstrip("-"), list(names), n=1, cutoff=0.75)
        hint = f"; did you mean {names[near[0]]}?" if near else ""
        beam = " (Apache Beam pipeline options go after --.)" if self.beam_options else ""
        return f"unrecognized argument {flag}{hint}{beam}"

    def _has_subparsers(self) -> bool:
        return any(isinstance(a, argparse._SubParsersAction) for a in self._actions)  # noqa: SLF001
