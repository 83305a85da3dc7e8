"""The span reader's levers, one at a time: gold-block exact match on held-out NQ questions.

REALM (Guu et al., 2020, §4) and ORQA (Lee et al., 2019) read with BERT-base after years of reading-comprehension
practice in the literature; here the reader starts from all-MiniLM-L6-v2, a sentence embedder, and learns to
extract spans in the reader warm start (``realm-tf train-reader``). Each lever changes one thing against the same
base warm start, and each reader is scored on the gold blocks of the same held-out questions
(``realm-tf evaluate --retriever gold``): reading comprehension, with retrieval taken out. Per lever: EM, F1, their
differences to the base with paired bootstrap intervals over questions, and the error table
(:mod:`realm_tf.tasks.answer_errors`).

The base is the demo's warm start made step-bound (so that the machine's speed does not decide how much a reader
reads): gold blocks only, batch 8, learning rate 3e-4, ``--steps`` steps, SQuAD + the NQ training split.

Levers (``--levers``; each a set of config overrides, or extra question files):
- ``span_width_24``: answers up to 24 wordpieces (REALM: 10). A fifth of the NQ (QED) references are longer than
  10 wordpieces, so the reader has no target for them in training and cannot produce them.
- ``steps_x3``: three times the steps (REALM++, Balachandran et al. 2021: REALM's fine-tuning was under-trained).
- ``batch_32`` / ``steps_x4``: REALM++'s larger batches (Balachandran et al., 2021), at the same number of
  questions read: 32 questions a step for the base's steps, against the base's batch of 8 for four times its
  steps (``batch_32`` is compared with ``steps_x4``). Both decay to 0 at their end, at the base's rate.
- ``nq_open_answers``: train on NQ-open's answers only (ORQA's five-token filter, ``qa.train_max_answer_tokens=5``;
  the SQuAD questions too), where the base also trains on longer answers that a span of ``model.max_span_width``
  wordpieces mostly cannot reach; judged on every held-out question and on NQ-open's.
- ``negatives_2``: each gold block read next to 2 BM25 negatives (the block choice among read blocks).
- ``lr_1e-4``: the benchmark's slower rate.
- ``window_128`` / ``window_96``: each block's body read through a window of that many wordpieces in training,
  the gold block's holding an answer at a random offset (``qa.reader_window``): a cheaper step (the batch is
  padded to its longest input, so the step's length falls from about REALM's 320 to the window's), against
  reading whole blocks; evaluation reads whole blocks either way. ``window_128_bfloat16``: ``window_128`` in
  mixed bfloat16 (compared with ``window_128``; run with ``--set reader.precision=float32``): whether a CPU that
  multiplies bfloat16 natively may train the demo's reader in it and answer as well.
- ``squad_train``: ``steps_x3`` with the SQuAD training set as more reading data (``data/reading/``: 87,636
  questions, 8× the bundled SQuAD dev questions), compared with ``steps_x3``: the same steps, more distinct
  questions. The three files are drawn about equally often (``qa.reader_source_temperature`` near 0), so the NQ
  questions keep about the share they have without it (a third, against 41%) instead of falling to 7%.
- ``minutes_linear``: a warm start bound by time (``reader.max_minutes``; a schedule of 3× the steps, so the
  minutes run out first): the linear schedule cut where the time ends. Its step count is the machine's.

Levers are chosen on ``--split`` (tune). ``--confirm dev`` scores each one on the dev split's gold blocks too,
and a lever holds only when it helps on both: one seed and 346 tune questions can show a gain that the next 725
questions do not.

Stages are resumable (``<out>/stages.json``; a killed warm start resumes from its checkpoint):

    nohup .venv/bin/python benchmarks/reader_levers.py --out runs/bench/levers > runs/bench/levers.log 2>&1 &
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf import process_settings  # noqa: E402
from realm_tf.tasks import answer_errors  # noqa: E402
from realm_tf.tasks import qa_metrics  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import open_qa_benchmark  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

LEVERS: dict[str, list[str]] = {
    "base": [],
    "span_width_24": ["model.max_span_width=24"],
    "steps_x3": ["reader.steps={steps_x3}"],
    "steps_x4": ["reader.steps={steps_x4}"],
    "batch_32": ["data.batch_size=32"],
    "nq_open_answers": ["qa.train_max_answer_tokens=5"],
    "negatives_2": ["qa.reader_negatives=2"],
    "lr_1e-4": ["reader.learning_rate=1e-4"],
    "squad_train": ["reader.steps={steps_x3}", "qa.reader_source_temperature=0.01"],
    "window_128": ["qa.reader_window=128"],
    "window_96": ["qa.reader_window=96"],
    "window_128_bfloat16": ["qa.reader_window=128", "reader.precision=mixed_bfloat16"],
    "minutes_linear": ["reader.steps={steps_x3}", "reader.max_minutes={minutes}"],
}
#: What each lever is compared with (paired, on the same questions): the base, or the lever it adds one thing to.
REFERENCE = {"squad_train": "steps_x3", "batch_32": "steps_x4", "window_128_bfloat16": "window_128"}


def base_overrides(steps: int, blocks: str) -> list[str]:
    """The demo's warm start, step-bound: gold blocks only, batch 8, 3e-4, two length groups on one thread each,
    in bfloat16 where the CPU has it (as the demo)."""
    precision = "mixed_bfloat16" if process_settings.native_bfloat16() else "float32"
    return [f"data.blocks_dir={blocks}", "data.batch_size=8", f"reader.steps={steps}", "reader.max_minutes=0",
            "reader.learning_rate=3e-4", f"reader.warmup_steps={max(steps // 20, 5)}", f"reader.precision={precision}",
            "reader.summary_every_steps=20", "reader.checkpoint_every_steps=100", "qa.reader_negatives=0",
            "model.reader_length_buckets=2", f"reader.intra_op_threads={1 if (os.cpu_count() or 1) <= 2 else 0}"]


def paired_bootstrap(a: np.ndarray, b: np.ndarray, samples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``b - a`` over questions and its 95% percentile interval, questions resampled together."""
    rng = np.random.default_rng(seed)
    diff = b.astype(np.float64) - a.astype(np.float64)  # [num_questions]
    draws = rng.integers(0, len(diff), size=(samples, len(diff)))  # [samples, num_questions]
    means = diff[draws].mean(axis=1)  # [samples]
    return float(diff.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def trained_steps(model_dir: str) -> int:
    """The step of the newest checkpoint in ``model_dir`` (a run bound by time stops where its machine got to)."""
    found = [int(m.group(1)) for m in (re.fullmatch(r"ckpt-(\d+)\.index", n) for n in
                                        os.listdir(os.path.join(model_dir, "checkpoints"))) if m]
    return max(found, default=0)


def per_question(path: str, key: str) -> dict[str, float]:
    """``{question id: value of key}`` from a predictions file; key ``nq_open_exact_match``: the exact match against
    the answers of at most five tokens, for NQ-open's questions alone (:func:`qa_metrics.short_answers`)."""
    if key == "nq_open_exact_match":
        short = {p["id"]: (p["prediction"], qa_metrics.short_answers(p["answers"]))
                 for p in answer_errors.read_predictions(path)}
        return {i: float(qa_metrics.exact_match(prediction, answers))
                for i, (prediction, answers) in short.items() if answers}
    return {p["id"]: float(p[key]) for p in answer_errors.read_predictions(path)}


def choose_variant(metrics: dict[str, Any], kind: str, values: Sequence[float], default: float) -> float:
    """The value of ``values`` whose ``realm-tf evaluate`` variant (``exact_match@<kind>=<value>``) scores the best
    EM, then F1; ``default`` when it ties with the best."""
    scores = {v: (metrics[f"exact_match@{kind}={v:g}"], metrics[f"f1@{kind}={v:g}"]) for v in values}
    return default if scores.get(default) == max(scores.values()) else max(scores, key=lambda v: scores[v])


def paired_difference(before: str, after: str, keys: Sequence[tuple[str, str]] = (("exact_match", "EM"), ("f1", "F1")),
                      ) -> dict[str, tuple[float, float, float]]:
    """``after`` minus ``before`` (two predictions files) on the questions both hold, for each ``(key, label)`` of
    ``keys`` (a key of :func:`per_question`): ``{"EM": ..., "F1": ...}``, each ``(mean, 95% low, 95% high)`` of
    :func:`paired_bootstrap`."""
    result = {}
    for key, label in keys:
        old, new = per_question(before, key), per_question(after, key)
        ids = sorted(old.keys() & new.keys())
        result[label] = paired_bootstrap(np.array([old[i] for i in ids]), np.array([new[i] for i in ids]))
    return result


def format_difference(difference: dict[str, tuple[float, float, float]]) -> str:
    """``EM +0.052 [+0.025, +0.081], F1 ...``"""
    return ", ".join(f"{label} {mean:+.3f} [{low:+.3f}, {high:+.3f}]" for label, (mean, low, high) in
                     difference.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--out", default="runs/bench/levers")
    parser.add_argument("--levers", default="base,steps_x3,squad_train,span_width_24",
                        help=f"comma-separated, from: {', '.join(LEVERS)} (base runs whenever a lever is compared "
                             "with it)")
    parser.add_argument("--steps", type=int, default=1200, help="the base warm start's steps of 8 questions")
    parser.add_argument("--minutes", type=float, default=5.0,
                        help="the time bound of the minutes_* levers (the demo's reader has 7.5)")
    parser.add_argument("--split", default="tune", choices=("tune", "dev"),
                        help="held-out NQ questions scored (choose levers on tune; report dev)")
    parser.add_argument("--confirm", default="", choices=("", "dev"),
                        help="also score every lever on this split: a lever holds when it helps on both")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz", help="the NQ questions scored")
    parser.add_argument("--reading", nargs="*", default=["data/open_qa/qa_squad_dev.jsonl.gz",
                                                         "data/open_qa/qa_qed_train.jsonl.gz"],
                        help="the warm start's question files (their train splits are read)")
    parser.add_argument("--squad-train", dest="squad_train", nargs=2,
                        default=["data/reading/qa_squad_train.jsonl.gz",
                                 "data/reading/squad_train_passages-*.jsonl.gz"],
                        metavar=("QUESTIONS", "PASSAGES"), help="the squad_train lever's questions and passages")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for every lever")
    parser.add_argument("--notebook", default="", help="the notebook entry the records point to")
    args = parser.parse_args()

    out = args.out.rstrip("/")
    names = [n for n in args.levers.split(",") if n]
    if "base" not in names and any(REFERENCE.get(n, "base") == "base" for n in names):
        names.insert(0, "base")
    unknown = [n for n in names if n not in LEVERS]
    if unknown:
        raise SystemExit(f"reader_levers: unknown levers {unknown}: one of {', '.join(LEVERS)}")
    for name in names:
        if REFERENCE.get(name, "base") not in names:
            raise SystemExit(f"reader_levers: {name} is compared with {REFERENCE[name]}: run both")
    stage = stages.Stages(out)
    bundled = "data/open_qa/passages.jsonl.gz"
    stage("blocks", lambda: stages.cli(["preprocess", "--config", args.config, "--output", f"{out}/blocks",
                                        "--input", bundled]))
    if "squad_train" in names:  # the reading blocks of the extra passages too (block ids differ; gold ids do not)
        stage("blocks_squad_train", lambda: stages.cli([
            "preprocess", "--config", args.config, "--output", f"{out}/blocks_squad_train", "--input", bundled,
            "--input", args.squad_train[1]]))
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        blocks = f"{out}/blocks_squad_train" if name == "squad_train" else f"{out}/blocks"
        sets = [*base_overrides(args.steps, blocks), *args.overrides,
                *(o.format(steps_x3=3 * args.steps, steps_x4=4 * args.steps, minutes=args.minutes)
                  for o in LEVERS[name]),
                f"reader.model_dir={out}/{name}"]
        flags = ["--config", args.config, *sum((["--set", o] for o in sets), [])]
        reading = list(args.reading) + ([args.squad_train[0]] if name == "squad_train" else [])
        stage(f"reader_{name}", lambda flags=flags, reading=reading: stages.cli(
            ["train-reader", *flags, "--questions", *reading]))
        for split in filter(None, (args.split, args.confirm)):
            predictions = f"{out}/predictions-{split}-gold-{name}.jsonl"
            results.setdefault(split, {})[name] = stage(
                f"{split}_gold_{name}", lambda flags=flags, predictions=predictions, split=split:
                open_qa_benchmark.evaluate([*flags, "--questions", args.questions, "--split", split, "--retriever",
                                            "gold", "--model", f"{out}/{name}", "--predictions", predictions],
                                           f"{out}/metrics-{split}-gold-{name}.json"))
    base = ", ".join(base_overrides(args.steps, out + "/blocks") + args.overrides)
    record = compare(out, names, args.split, results[args.split], f"{args.questions} (base: {base})")
    confirmed = compare(out, names, args.confirm, results[args.confirm], args.questions) if args.confirm else {}
    write_records(args, names, record, confirmed)
    print("\nstage minutes: " + stage.minutes())
    print(json.dumps({"record": record, "confirmed": confirmed}))
    return 0


def compare(out: str, names: Sequence[str], split: str, results: dict[str, dict[str, Any]],
            what: str) -> dict[str, dict[str, Any]]:
    """Each lever's scores on ``split``'s gold blocks against its reference's, paired over questions; prints the
    table and each lever's error table."""
    def path(name: str) -> str:
        return f"{out}/predictions-{split}-gold-{name}.jsonl"

    print(f"\n== reader levers, gold blocks of the {split} split of {what} ==")
    print("| lever | questions | EM | F1 | compared with | EM difference [95% paired bootstrap] | F1 difference | "
          "NQ-open EM |")
    print("| --- | ---: | ---: | ---: | --- | --- | --- | ---: |")
    record = {}
    for name in names:
        metrics, reference = results[name], REFERENCE.get(name, "base")
        differences = paired_difference(path(reference), path(name),
                                        keys=[(k, k) for k in ("exact_match", "f1", "nq_open_exact_match")])
        (em, em_low, em_high), (f1, f1_low, f1_high) = differences["exact_match"], differences["f1"]
        nq_open = per_question(path(name), "nq_open_exact_match")
        print(f"| {name} | {metrics['num_questions']} | {metrics['exact_match']:.3f} | {metrics['f1']:.3f} | "
              f"{reference} | {em:+.3f} [{em_low:+.3f}, {em_high:+.3f}] | {f1:+.3f} [{f1_low:+.3f}, {f1_high:+.3f}] | "
              f"{np.mean(list(nq_open.values())):.3f} on {len(nq_open)} |")
        record[name] = {"nq_open_exact_match": float(np.mean(list(nq_open.values()))),
                        "nq_open_questions": len(nq_open),
                        "nq_open_difference": list(differences["nq_open_exact_match"]),
                        "exact_match": metrics["exact_match"], "f1": metrics["f1"],
                        "num_questions": metrics["num_questions"], "compared_with": reference,
                        "steps": trained_steps(f"{out}/{name}"),
                        "em_difference": list(differences["exact_match"]), "f1_difference": list(differences["f1"]),
                        "outcomes": metrics["outcomes"], "reader_oracle": metrics["reader_oracle"]}
    for name in names:
        print(f"\n{name} ({split}):\n{answer_errors.format_table(results[name]['outcomes'])}")
    return record


def write_records(args: argparse.Namespace, names: Sequence[str], record: dict[str, dict[str, Any]],
                  confirmed: dict[str, dict[str, Any]]) -> None:
    """One record per lever: its difference on ``--split`` and, with ``--confirm``, on that split too; a lever
    holds when it helps on each split scored and reads worse on none."""
    for name in names:
        r = record[name]
        splits = {args.split: r, **({args.confirm: confirmed[name]} if confirmed else {})}
        if name == "base":
            for split, s in splits.items():
                result_records.write(
                    f"open-qa-reader-gold-block-{split}", area="Open-QA", order=20, verdict="open",
                    claim=f"The reader's EM on each {split} question's gold blocks (goal 0.50)",
                    figure=f"EM {s['exact_match']:.3f}, F1 {s['f1']:.3f} on {s['num_questions']} questions "
                           f"({args.steps} warm-start steps); reader oracle {s['reader_oracle']:.3f}; EM on NQ-open's "
                           f"{s['nq_open_questions']} (answers of at most 5 tokens) {s['nq_open_exact_match']:.3f}",
                    notebook=args.notebook)
            continue
        verdicts = {split: direction(s) for split, s in splits.items()}
        helps = all(v == "helps" for v in verdicts.values())
        claim = SAID[verdicts[args.split]] if len(set(verdicts.values())) == 1 else "; ".join(
            f"{split}: {SAID[v]}" for split, v in verdicts.items())
        result_records.write(
            f"open-qa-lever-{name.replace('_', '-')}", area="Open-QA", order=30,
            verdict="holds" if helps else "negative",
            claim=f"Reader lever {name} against {r['compared_with']} ({' and '.join(splits)} gold blocks): {claim}",
            figure="; ".join(f"{split}: " + lever_figure(s, record[s["compared_with"]]["steps"])
                             for split, s in splits.items()),
            interval="95% paired bootstrap: " + "; ".join(f"{split}: " + lever_interval(s)
                                                          for split, s in splits.items()),
            notebook=args.notebook)


#: How a record says each :func:`direction`.
SAID = {"helps": "helps", "worse": "reads worse, outside the interval",
        "apart": "EM and F1 move apart, each outside its interval", "none": "no difference outside the interval"}


def direction(r: dict[str, Any]) -> str:
    """``helps`` (EM or F1 up, its interval clear of 0, neither down), ``worse``, ``apart`` (one up, one down) or
    ``none``."""
    (_, em_low, em_high), (_, f1_low, f1_high) = r["em_difference"], r["f1_difference"]
    up, down = f1_low > 0 or em_low > 0, f1_high < 0 or em_high < 0
    return {(True, False): "helps", (False, True): "worse", (True, True): "apart", (False, False): "none"}[up, down]


def lever_figure(r: dict[str, Any], reference_steps: int) -> str:
    (em, _, _), (f1, _, _) = r["em_difference"], r["f1_difference"]
    return (f"EM {r['exact_match']:.3f} ({em:+.3f}), F1 {r['f1']:.3f} ({f1:+.3f}) on {r['num_questions']} questions, "
            f"{r['steps']} warm-start steps ({r['compared_with']}: {reference_steps}); EM on NQ-open's "
            f"{r['nq_open_questions']} (answers of at most 5 tokens) {r['nq_open_exact_match']:.3f} "
            f"({r['nq_open_difference'][0]:+.3f})")


def lever_interval(r: dict[str, Any]) -> str:
    (_, em_low, em_high), (_, f1_low, f1_high), (_, nq_low, nq_high) = (
        r["em_difference"], r["f1_difference"], r["nq_open_difference"])
    return (f"EM [{em_low:+.3f}, {em_high:+.3f}], F1 [{f1_low:+.3f}, {f1_high:+.3f}], "
            f"NQ-open EM [{nq_low:+.3f}, {nq_high:+.3f}]")


if __name__ == "__main__":
    sys.exit(main())
