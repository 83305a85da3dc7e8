"""The span reader trained as long as it reads better: gold-block exact match against warm-start steps.

REALM++ (Balachandran et al., 2021) found REALM's fine-tuning under-trained: larger batches and more steps gave
+5.5 points with the same model. Here, three times the reader warm start's 600 steps raised the tune split's
gold-block EM by 0.069 [+0.026, +0.113] (``reader_levers.py``, lever ``steps_x3``). This run does not choose the
steps in advance. The reader warm start (``realm-tf train-reader``) trains in chunks of ``--chunk`` steps at a
constant learning rate after its warm-up, and after each chunk its reader is scored on the gold blocks of the tune
split (``realm-tf evaluate --retriever gold``): reading comprehension, with retrieval taken out. It stops once
neither EM nor F1 has beaten its best by ``--min-delta`` for ``--patience`` chunks
(:func:`realm_tf.tasks.held_out_progress.plateaued`), or at ``--max-chunks``.

The reading data is everything bundled for reading: the NQ training split, SQuAD dev and SQuAD train
(``data/reading/``), drawn about equally often (``qa.reader_source_temperature`` near 0, so that 87,636 SQuAD
training questions do not crowd NQ out), with answers of up to 24 wordpieces (REALM's 10 cannot reach a fifth of
NQ's references; ``reader_levers.py``, lever ``span_width_24``).

The first chunk's reader and the best chunk's are kept (``<out>/first``, ``<out>/best``) and scored on the dev
split's gold blocks, the best against the first with a paired bootstrap over questions. The curve goes to
``<out>/curve.json``, ``<out>/curve.png`` and the record ``open-qa-reader-curve``.

A constant rate keeps the chunks comparable but leaves out the annealing that a linear schedule's end gives. With
``--cooldown N``, the best chunk's reader is then trained N more steps with the rate decayed linearly to 0
(``reader.learning_rate_decay=cooldown``: the warm-up-stable-decay schedule, Hu et al. 2024; Hägele et al. 2024)
and scored on tune and dev, against the best chunk's reader on the same dev questions (record
``open-qa-reader-cooldown``). ``--tag TAG`` names the records ``open-qa-reader-curve-TAG``, ... instead, for a
run with other ``--set`` settings (a larger batch: REALM++'s lever) beside the first.

Everything is resumable: each chunk's evaluation is kept in the curve, a killed warm start resumes from its
checkpoint, and ``--max-hours`` stops cleanly between chunks; the same command continues:

    nohup .venv/bin/python benchmarks/reader_curve.py --out runs/bench/reader_curve --max-hours 2.5 \\
      >> runs/bench/reader_curve.log 2>&1 &
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf import config as config_lib  # noqa: E402
from realm_tf.tasks import answer_errors  # noqa: E402
from realm_tf.tasks import held_out_progress  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import open_qa_benchmark  # noqa: E402  (benchmarks/)
import reader_levers  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

#: The held-out scores that decide whether the reader still improves.
WATCHED = ("exact_match", "f1")
#: The warm start's levers kept so far, on top of ``reader_levers.base_overrides``.
READING = ["model.max_span_width=24", "qa.reader_source_temperature=0.01", "reader.learning_rate_decay=constant"]


def keep_checkpoint(run: str, target: str) -> None:
    """Copies the newest checkpoint of ``run`` to ``target/checkpoints`` (a run directory ``evaluate --model``
    reads), replacing ``target`` whole: written beside it, then renamed."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    latest = tf.train.latest_checkpoint(os.path.join(run, "checkpoints"))
    if latest is None:
        raise FileNotFoundError(f"{run}/checkpoints: no checkpoint to keep")
    staging = f"{target}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(os.path.join(staging, "checkpoints"))
    for name in os.listdir(os.path.dirname(latest)):
        if name.startswith(os.path.basename(latest) + "."):
            shutil.copy2(os.path.join(os.path.dirname(latest), name), os.path.join(staging, "checkpoints", name))
    name = os.path.basename(latest)  # the CheckpointState text proto that tf.train.latest_checkpoint reads
    with open(os.path.join(staging, "checkpoints", "checkpoint"), "w", encoding="utf-8") as f:
        f.write(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    shutil.rmtree(f"{target}.old", ignore_errors=True)
    if os.path.exists(target):
        os.replace(target, f"{target}.old")
    os.replace(staging, target)
    shutil.rmtree(f"{target}.old", ignore_errors=True)


def train_until_plateau(out: str, flags: list[str], reading: list[str], args: argparse.Namespace,
                        deadline: float) -> list[dict[str, Any]]:
    """Trains the reader chunk by chunk, scoring the tune split's gold blocks after each, until the scores
    plateau or ``--max-chunks``; the curve (one point per chunk)."""
    path = f"{out}/curve.json"
    curve = stages.read_curve(path)
    while (not held_out_progress.plateaued(curve, WATCHED, args.patience, args.min_delta)
           and len(curve) < args.max_chunks):
        if time.time() > deadline:
            raise stages.OutOfTime(f"chunk {len(curve) + 1}")
        step = (curve[-1]["step"] if curve else 0) + args.chunk
        started = time.time()
        stages.cli(["train-reader", *flags, "--set", f"reader.steps={step}", "--questions", *reading])
        trained = time.time() - started
        predictions = f"{out}/predictions-tune-gold-{step}.jsonl"
        metrics = open_qa_benchmark.evaluate(
            [*flags, "--questions", args.questions, "--split", "tune", "--retriever", "gold",
             "--model", f"{out}/reader", "--predictions", predictions], f"{out}/metrics-tune-gold-{step}.json")
        best = max((p["exact_match"], p["f1"]) for p in curve) if curve else None
        if not curve:
            keep_checkpoint(f"{out}/reader", f"{out}/first")
        if best is None or (metrics["exact_match"], metrics["f1"]) > best:
            keep_checkpoint(f"{out}/reader", f"{out}/best")
        curve.append({"step": step, "train_minutes": trained / 60, "exact_match": metrics["exact_match"],
                      "f1": metrics["f1"], "reader_oracle": metrics["reader_oracle"],
                      "num_questions": metrics["num_questions"], "outcomes": metrics["outcomes"]})
        config_lib.atomic_write_text(path, json.dumps(curve, indent=2) + "\n")
        print(f"reader_curve: step {step}: tune gold-block EM {metrics['exact_match']:.3f}, F1 {metrics['f1']:.3f} "
              f"({trained / 60:.1f} min of training)", flush=True)
    return curve


def plot_curve(curve: list[dict[str, Any]], path: str, batch_size: int) -> None:
    """Tune gold-block EM and F1 against the warm start's steps."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    figure, axis = pyplot.subplots(figsize=(6, 3.5))
    for key in WATCHED:
        axis.plot([p["step"] for p in curve], [p[key] for p in curve], marker="o", label=key)
    axis.set_xlabel(f"reader warm-start step ({batch_size} questions each)")
    axis.set_title("tune split, each question on its gold blocks")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def settings(args: argparse.Namespace) -> str:
    """What a record's claim adds about this run's own ``--set`` overrides (nothing without them)."""
    return f" (with {', '.join(args.overrides)})" if args.overrides else ""


def report(out: str, curve: list[dict[str, Any]], dev: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    """The table, the error tables and the record."""
    best = max(curve, key=lambda p: (p["exact_match"], p["f1"]))
    difference = reader_levers.paired_difference(f"{out}/predictions-dev-gold-first.jsonl",
                                                 f"{out}/predictions-dev-gold-best.jsonl")
    print(f"\n== the reader's curve ({out}) ==\n| step | tune EM | tune F1 | reader oracle |\n"
          "| ---: | ---: | ---: | ---: |")
    for p in curve:
        print(f"| {p['step']} | {p['exact_match']:.3f} | {p['f1']:.3f} | {p['reader_oracle']:.3f} |")
    for name in ("first", "best"):
        print(f"\ndev gold blocks, {name} chunk's reader: EM {dev[name]['exact_match']:.3f}, F1 {dev[name]['f1']:.3f}"
              f"\n{answer_errors.format_table(dev[name]['outcomes'])}")
    goal = dev["best"]["exact_match"] >= 0.50
    result_records.write(
        result_records.tagged("open-qa-reader-curve", args.tag), area="Open-QA", order=21, notebook=args.notebook,
        verdict="holds" if goal else "negative",
        claim="Trained at a constant learning rate for as long as the tune split's gold-block scores improve, the "
              f"reader reaches the 0.50 gold-block EM goal on the dev split{settings(args)}",
        figure=f"dev gold blocks: EM {dev['best']['exact_match']:.3f}, F1 {dev['best']['f1']:.3f} at step "
               f"{best['step']} (the best of {len(curve)} chunks of {curve[0]['step']} steps on tune) against "
               f"{dev['first']['exact_match']:.3f} / {dev['first']['f1']:.3f} after the first chunk; tune EM by "
               "chunk: " + ", ".join(f"{p['step']}: {p['exact_match']:.3f}" for p in curve),
        interval=f"best minus first, 95% paired bootstrap over {dev['best']['num_questions']} dev questions: "
                 + reader_levers.format_difference(difference))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--out", default="runs/bench/reader_curve")
    stages.add_plateau_args(parser, 600, "warm-start steps between tune evaluations", 0.01,
                            "what counts as an improvement of EM or F1 (about half the standard error of EM on the "
                            "346 tune questions)", 100)
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz", help="the NQ questions scored")
    parser.add_argument("--reading", nargs="*", default=["data/open_qa/qa_squad_dev.jsonl.gz",
                                                         "data/open_qa/qa_qed_train.jsonl.gz",
                                                         "data/reading/qa_squad_train.jsonl.gz"],
                        help="the warm start's question files (their train splits are read)")
    parser.add_argument("--passages", nargs="*", default=["data/open_qa/passages.jsonl.gz",
                                                          "data/reading/squad_train_passages-*.jsonl.gz"],
                        help="every passage a reading question's gold ids name")
    parser.add_argument("--cooldown", type=int, default=0,
                        help="after the plateau: train the best chunk's reader this many more steps, decaying the "
                             "rate to 0, and score it (0: no cool-down)")
    parser.add_argument("--cooldown-last", dest="cooldown_last", action="store_true",
                        help="with --cooldown: also cool down the last chunk's reader, against the best chunk's "
                             "cooled down (more constant-rate steps before the same cool-down)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for every stage")
    parser.add_argument("--tag", default="",
                        help="appended to the records' names (open-qa-reader-curve-TAG, ...), so that a run with other "
                             "settings does not replace the records of the first")
    parser.add_argument("--notebook", default="", help="the notebook entry the records point to")
    args = parser.parse_args()

    out = args.out.rstrip("/")
    deadline = time.time() + args.max_hours * 3600 if args.max_hours > 0 else float("inf")
    sets = [*reader_levers.base_overrides(args.chunk, f"{out}/blocks"), *READING, *args.overrides,
            f"reader.model_dir={out}/reader"]
    flags = ["--config", args.config, *sum((["--set", o] for o in sets), [])]
    stage = stages.Stages(out)
    stage("blocks", lambda: stages.cli(["preprocess", "--config", args.config, "--output", f"{out}/blocks",
                                        *sum((["--input", p] for p in args.passages), [])]))
    try:
        curve = train_until_plateau(out, flags, args.reading, args, deadline)
    except stages.OutOfTime as stopped:
        print(f"reader_curve: --max-hours reached before {stopped}; the same command continues", flush=True)
        return 0
    plot_curve(curve, f"{out}/curve.png", config_lib.load_config(args.config, sets).data.batch_size)
    dev = {name: stage(f"dev_gold_{name}", lambda name=name: open_qa_benchmark.evaluate(
        [*flags, "--questions", args.questions, "--split", "dev", "--retriever", "gold", "--model", f"{out}/{name}",
         "--predictions", f"{out}/predictions-dev-gold-{name}.jsonl"], f"{out}/metrics-dev-gold-{name}.json"))
        for name in ("first", "best")}
    report(out, curve, dev, args)
    if args.cooldown > 0:
        best = max(curve, key=lambda p: (p["exact_match"], p["f1"]))
        cooled = {"cooldown": cool_down(out, flags, args, f"{out}/best", best["step"], stage)}
        if args.cooldown_last and curve[-1]["step"] != best["step"]:
            cooled["cooldown-last"] = cool_down(out, flags, args, f"{out}/reader", curve[-1]["step"], stage)
        report_cool_downs(out, args, curve, cooled)
    return 0


def cool_down(out: str, flags: list[str], args: argparse.Namespace, start: str, step: int,
              stage: stages.Stages) -> dict[str, dict[str, Any]]:
    """The reader of run directory ``start`` (at ``step``) trained ``--cooldown`` more steps with the rate decayed
    to 0, in ``<out>/cooldown`` (from the best chunk) or ``<out>/cooldown-last``, scored on the tune and dev gold
    blocks: ``{split: metrics}``; the predictions are ``<out>/predictions-<split>-gold-<run>.jsonl``."""
    end = step + args.cooldown
    name = "cooldown" if start.endswith("/best") else "cooldown-last"
    run = f"{out}/{name}"
    cool = [*flags, "--set", f"reader.model_dir={run}", "--set", f"reader.steps={end}", "--set",
            "reader.learning_rate_decay=cooldown", "--set", f"reader.cooldown_steps={args.cooldown}"]

    def train() -> None:
        if not os.path.exists(f"{run}/checkpoints"):
            keep_checkpoint(start, run)  # the chunk's checkpoint, optimiser state included
        stages.cli(["train-reader", *cool, "--questions", *args.reading])

    stage(f"{name.replace('-', '_')}_{end}", train)
    return {split: stage(f"{split}_gold_{name.replace('-', '_')}_{end}", lambda split=split: open_qa_benchmark.evaluate(
        [*cool, "--questions", args.questions, "--split", split, "--retriever", "gold", "--model", run,
         "--predictions", f"{out}/predictions-{split}-gold-{name}.jsonl"], f"{out}/metrics-{split}-gold-{name}.json"))
        for split in ("tune", "dev")}


def report_cool_downs(out: str, args: argparse.Namespace, curve: list[dict[str, Any]],
                      cooled: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Error tables and the records: the best chunk cooled against the best chunk; the last chunk cooled against
    the best chunk cooled (more constant-rate steps before the same cool-down)."""
    best, last = max(curve, key=lambda p: (p["exact_match"], p["f1"])), curve[-1]
    for name, scored in cooled.items():
        print(f"\ndev gold blocks, {name}: EM {scored['dev']['exact_match']:.3f}, F1 {scored['dev']['f1']:.3f}\n"
              f"{answer_errors.format_table(scored['dev']['outcomes'])}")

    def figure(scored: dict[str, dict[str, Any]], step: int) -> str:
        dev = scored["dev"]
        return (f"dev gold blocks, {dev['num_questions']} questions: EM {dev['exact_match']:.3f}, F1 {dev['f1']:.3f} "
                f"after {args.cooldown} cool-down steps from step {step} (tune EM "
                f"{scored['tune']['exact_match']:.3f}); too short {dev['outcomes']['too_short']}, right block wrong "
                f"span {dev['outcomes']['right_block_wrong_span']}")

    difference = reader_levers.paired_difference(f"{out}/predictions-dev-gold-best.jsonl",
                                                    f"{out}/predictions-dev-gold-cooldown.jsonl")
    result_records.write(
        result_records.tagged("open-qa-reader-cooldown", args.tag), area="Open-QA", order=22, notebook=args.notebook,
        verdict="holds" if difference["EM"][1] > 0 else "negative",
        claim="Annealing the constant-rate reader (its rate decayed linearly to 0 over a cool-down) reads better than "
              f"the constant-rate reader it starts from{settings(args)}",
        figure=figure(cooled["cooldown"], best["step"]) + f"; before: EM {best['exact_match']:.3f} on tune",
        interval="cooled minus before, 95% paired bootstrap over dev questions: "
                 + reader_levers.format_difference(difference))
    if "cooldown-last" in cooled and last["step"] != best["step"]:
        difference = reader_levers.paired_difference(f"{out}/predictions-dev-gold-cooldown.jsonl",
                                                        f"{out}/predictions-dev-gold-cooldown-last.jsonl")
        result_records.write(
            result_records.tagged("open-qa-reader-cooldown-later", args.tag), area="Open-QA", order=23,
            notebook=args.notebook,
            verdict="holds" if difference["EM"][1] > 0 else "negative",
            claim="More constant-rate steps before the same cool-down read better: the last chunk's reader cooled down "
                  f"against the best chunk's{settings(args)}",
            figure=figure(cooled["cooldown-last"], last["step"]) + f"; from step {best['step']}: EM "
                   f"{cooled['cooldown']['dev']['exact_match']:.3f}, F1 {cooled['cooldown']['dev']['f1']:.3f}",
            interval="last minus best, 95% paired bootstrap over dev questions: "
                     + reader_levers.format_difference(difference))


if __name__ == "__main__":
    sys.exit(main())
