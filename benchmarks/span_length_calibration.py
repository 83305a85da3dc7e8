"""Span-length calibration of the reader: a length prior chosen on the tune split, measured on the dev split.

The reader's misses on gold blocks include answers cut too short or too long against NQ's references (the
``too_short`` / ``too_long`` outcomes of :mod:`realm_tf.tasks.answer_errors`). ``qa.span_length_bias`` b adds
b·|s| to each span's score before the answer is picked (a log-linear length prior, p(s) ∝ exp(b·|s|)), without
retraining. This run scores one reader on the tune split's gold blocks with every bias of ``--biases`` in one
evaluation (``realm-tf evaluate --length-biases``), takes the bias with the best EM (F1 breaks ties; 0 wins a
tie), then scores the dev split's gold blocks with no bias and with the chosen one, and compares them with a
paired bootstrap over questions, with the error table of each. The record is ``open-qa-span-length-bias``.

The reader is the best reader of ``benchmarks/reader_curve.py`` by default (its run directory and its
configuration: answers of up to 24 wordpieces). Resumable: each evaluation is a stage of ``<out>/stages.json``.

    .venv/bin/python benchmarks/span_length_calibration.py --out runs/bench/span_length
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf.tasks import answer_errors  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import open_qa_benchmark  # noqa: E402  (benchmarks/)
import reader_curve  # noqa: E402  (benchmarks/)
import reader_levers  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

#: The biases tried on tune, per wordpiece (0 is the span score alone).
BIASES = (-0.4, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--out", default="runs/bench/span_length")
    parser.add_argument("--reader-run", dest="reader_run", default="runs/bench/reader_curve",
                        help="a reader_curve.py run: its blocks and configuration")
    parser.add_argument("--model", default=None, help="the reader's run directory (default: <reader-run>/best)")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--biases", type=float, nargs="+", default=list(BIASES), help="tried on tune")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for every evaluation")
    args = parser.parse_args()

    out, run = args.out.rstrip("/"), args.reader_run.rstrip("/")
    model = args.model or f"{run}/best"
    biases = sorted(set(args.biases) | {0.0})
    sets = [*reader_levers.base_overrides(600, f"{run}/blocks"), *reader_curve.READING, *args.overrides]
    flags = ["--config", args.config, *sum((["--set", o] for o in sets), []), "--questions", args.questions,
             "--retriever", "gold", "--model", model]
    stage = stages.Stages(out)
    tune = stage("tune_sweep", lambda: open_qa_benchmark.evaluate(
        [*flags, "--split", "tune", "--length-biases", *map(str, biases),
         "--predictions", f"{out}/predictions-tune.jsonl"], f"{out}/metrics-tune.json"))
    chosen = reader_levers.choose_variant(tune, "len", biases, 0.0)
    dev = {b: stage(f"dev_{b:g}", lambda b=b: open_qa_benchmark.evaluate(
        [*flags, "--split", "dev", "--set", f"qa.span_length_bias={b}",
         "--predictions", f"{out}/predictions-dev-{b:g}.jsonl"], f"{out}/metrics-dev-{b:g}.json"))
        for b in sorted({0.0, chosen})}
    print("\n| bias per wordpiece | tune EM | tune F1 |\n| ---: | ---: | ---: |")
    for b in biases:
        print(f"| {b:g} | {tune[f'exact_match@len={b:g}']:.3f} | {tune[f'f1@len={b:g}']:.3f} |")
    for b, metrics in dev.items():
        print(f"\ndev gold blocks, bias {b:g}: EM {metrics['exact_match']:.3f}, F1 {metrics['f1']:.3f}\n"
              f"{answer_errors.format_table(metrics['outcomes'])}")
    sweep = ", ".join(f"{b:g}: {tune[f'exact_match@len={b:g}']:.3f}" for b in biases)
    if chosen == 0.0:
        result_records.write(
            "open-qa-span-length-bias", area="Open-QA", order=23, verdict="negative",
            claim="A span length bias chosen on the tune split raises the reader's gold-block EM on the dev split",
            figure=f"tune chose no bias (tune gold-block EM by bias per wordpiece: {sweep}); dev gold blocks EM "
                   f"{dev[0.0]['exact_match']:.3f}, F1 {dev[0.0]['f1']:.3f} on {dev[0.0]['num_questions']} questions")
        return 0
    diff = reader_levers.paired_difference(f"{out}/predictions-dev-0.jsonl", f"{out}/predictions-dev-{chosen:g}.jsonl")
    outcomes = {b: dev[b]["outcomes"] for b in dev}
    result_records.write(
        "open-qa-span-length-bias", area="Open-QA", order=23, verdict="holds" if diff["EM"][1] > 0 else "negative",
        claim="A span length bias chosen on the tune split raises the reader's gold-block EM on the dev split",
        figure=f"bias {chosen:g} per wordpiece (tune gold-block EM by bias: {sweep}); dev gold blocks, "
               f"{dev[chosen]['num_questions']} questions: EM {dev[chosen]['exact_match']:.3f}, F1 "
               f"{dev[chosen]['f1']:.3f} against {dev[0.0]['exact_match']:.3f} / {dev[0.0]['f1']:.3f} without; too "
               f"short {outcomes[0.0]['too_short']} -> {outcomes[chosen]['too_short']}, too long "
               f"{outcomes[0.0]['too_long']} -> {outcomes[chosen]['too_long']}",
        interval=f"with minus without, 95% paired bootstrap over questions: {reader_levers.format_difference(diff)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
