"""The named experiments of ``realm-tf train --experiment NAME`` and ``realm-tf evaluate --experiment NAME``.

Each experiment names the config section that holds its training settings, the command that trains it and the
command that scores it on held-out data; both surfaces are generated from this registry, and the commands they
reach keep their own names (``train-ict``, ``pretrain``, ``evaluate-lm``, ...).
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Sequence

from realm_tf import errors


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One named experiment.

    Attributes:
      section: the config section of its training settings (``model_dir``, ``steps``, ...).
      train: the ``realm-tf`` command that trains it.
      evaluate: the ``realm-tf`` command (and its fixed flags) that scores it on held-out data; empty when it has
        no evaluation of its own.
      what: one line of help.
    """

    section: str
    train: str
    evaluate: tuple[str, ...]
    what: str


EXPERIMENTS: dict[str, Experiment] = {
    "ict": Experiment("ict", "train-ict", (),
                      "the retriever's Inverse Cloze Task warm start (ORQA, Lee et al. 2019) and export"),
    "pretrain": Experiment("pretrain", "pretrain", ("pretrain", "--eval-only"),
                           "REALM pre-training: salient spans, null document, asynchronous index refresh"),
    "reader": Experiment("reader", "train-reader", ("evaluate", "--experiment", "reader"),
                         "the reader warm start on gold blocks, before Open-QA fine-tuning"),
    "finetune": Experiment("finetune", "finetune", ("evaluate",),
                           "Open-QA fine-tuning of the retriever and the span reader (REALM §4)"),
    "retro": Experiment("retro_trainer", "train-retro", ("evaluate-lm",),
                        "RETRO's decoder (Borgeaud et al. 2021), or its baseline (--baseline)"),
}


def help_text(surface: str) -> str:
    """``--experiment``'s help on the ``train`` or ``evaluate`` surface: what each name runs."""
    items = []
    for name, e in EXPERIMENTS.items():
        target = e.train if surface == "train" else " ".join(e.evaluate) or "no evaluation of its own"
        items.append(f"{name}: {e.what} (= realm-tf {target}, config section {e.section})")
    return "; ".join(items)


def forward(args: argparse.Namespace, target: Sequence[str], rest: Sequence[str]) -> int:
    """Runs ``realm-tf TARGET REST`` in this process (``args.entry_point``, the CLI's ``main``)."""
    return args.entry_point([*target, *rest, *(["--verbose"] if args.verbose else [])])


def resolve(argv: Sequence[str]) -> list[str]:
    """``evaluate --experiment NAME ARGS`` as the command that scores NAME (``pretrain --eval-only ARGS``,
    ``evaluate-lm ARGS``, ...), before any parsing: the target's own flags may share a name with ``evaluate``'s
    (``--split``) and differ in meaning. Open-QA experiments stay with ``evaluate``; any other argv is unchanged.

    Raises:
      UserError: the experiment has no evaluation of its own.
    """
    argv = list(argv)
    if not argv or argv[0] != "evaluate":
        return argv
    for i, item in enumerate(argv):
        if item == "--experiment" and i + 1 < len(argv):
            name, rest = argv[i + 1], argv[1:i] + argv[i + 2:]
        elif item.startswith("--experiment="):
            name, rest = item.split("=", 1)[1], argv[1:i] + argv[i + 1:]
        else:
            continue
        found = EXPERIMENTS.get(name)
        if found is None or found.evaluate[:1] == ("evaluate",):
            return argv  # evaluate's parser refuses an unknown name; Open-QA experiments are its own
        if not found.evaluate:
            raise errors.UserError(f"evaluate --experiment {name}: {found.what} has no held-out evaluation of its "
                                   f"own; evaluate what it feeds (--experiment finetune)")
        return [*found.evaluate, *rest]
    return argv
