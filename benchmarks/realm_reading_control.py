"""REALM's reader handed a block that holds the span: a positive control for the ablation's pre-training.

In REALM pre-training (Guu et al., 2020) the knowledge-augmented encoder learns to read its retrieved blocks only
from the queries whose candidates hold the masked span, and a reader that ignores its blocks gives the retriever no
signal to learn from: the cold start of REALM's §3.4. This run keeps the retriever frozen at the ICT warm start
that the ablation's pre-training starts from (``pretrain.freeze_retriever_steps`` beyond the run), and keeps every
query's own source block among its candidates (``pretrain.trivial_retrieval_rate_while_frozen=1.0``), so a block
to copy the span from is always there. Everything else is the ablation's salient-span run: its blocks, data,
starting weights, batch, candidates, learning rate and held-out evaluation (``benchmarks/realm_ablation.py``,
whose stages this reads and never writes).

The evaluation excludes the source block, as REALM does. The scores to compare are the MLM accuracy on the
held-out queries whose retrieved blocks hold the span, with those blocks and with the null document alone. A reader
that has learned to read predicts the span more often with them. A reader that has not learned to read predicts it
equally often either way. After the last chunk, the same held-out queries are scored once more with their own source
block left among their candidates (``pretrain.eval_keep_source_block``): the copying test, with the span verbatim
in a block the reader reads, as in every training query of this run.

It trains in chunks until neither held-out score that the ablation watches improves, as the ablation does, and it is
resumable; the same command continues:

    nohup .venv/bin/python benchmarks/realm_reading_control.py --out runs/bench/reading_control --max-chunks 3 \\
      --set pretrain.precision=mixed_bfloat16 --pretrain data.batch_size=4 --pretrain model.num_candidates=4 \\
      >> runs/bench/reading_control.log 2>&1 &
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import realm_ablation  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

#: The control's settings on top of the ablation's pre-training: a frozen retriever, the source block always read.
CONTROL = ["pretrain.freeze_retriever_steps=1000000000", "pretrain.trivial_retrieval_rate_while_frozen=1.0"]
#: The ablation's run compared with it.
REFERENCE_RUN = "salient"
#: The record holds when, at the last chunk, the reader predicts the span this much more often with the retrieved
#: blocks that hold it than with the null document alone: about two standard errors of an accuracy on the ~90 held-out
#: queries whose span a block holds.
READS_BY = 0.06


def table(curves: dict[str, list[dict]]) -> str:
    """One line per chunk of each run: MLM accuracy, span recall and the paired accuracies where it was retrieved."""
    lines = ["run | step | MLM acc. | null only | span recall | acc. where retrieved | null only"]
    for name, curve in curves.items():
        for p in curve:
            lines.append(f"{name} | {p['step']} | {p['mlm_accuracy']:.4f} | {p['mlm_accuracy_null_only']:.4f} | "
                         f"{p.get('span_recall', float('nan')):.3f} | "
                         f"{p.get('mlm_accuracy_span_retrieved', float('nan')):.3f} | "
                         f"{p.get('mlm_accuracy_null_only_span_retrieved', float('nan')):.3f}")
    return "\n".join(lines)


def copying_test(out: str, sets: list[str], data: str, step: int) -> dict[str, float]:
    """The held-out scores of the run's checkpoint at ``step`` with each query's source block kept among its
    candidates (``realm-tf pretrain --eval-only``); kept in ``<out>/control/metrics-copy-<step>.json``."""
    run, metrics = f"{out}/control", f"{out}/control/metrics-copy-{step}.json"
    if not os.path.exists(metrics):
        stages.cli(["pretrain", "--eval-only", *sets, "--set", "pretrain.eval_keep_source_block=true",
                    "--set", f"pretrain.model_dir={run}/model", "--set", f"index.index_dir={run}/index",
                    "--set", f"refresh.export_dir={run}/export", "--set", f"pretrain.steps={step}",
                    "--input", data, "--eval-input", data, "--metrics", metrics])
    with open(metrics, encoding="utf-8") as f:
        return json.load(f)["eval"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--ablation", default="runs/bench/ablation",
                        help="the ablation's run directory: its blocks, retriever_init, ict and data_salient stages")
    parser.add_argument("--out", default="runs/bench/reading_control")
    stages.add_plateau_args(parser, 200, "pre-training steps between held-out evaluations", 0.005,
                            "what counts as an improvement of a watched score", 1000)
    parser.add_argument("--eval-examples", dest="eval_examples", type=int, default=2048)
    parser.add_argument("--pretrain", dest="pretrain_overrides", action="append", default=[],
                        help="overrides of the pre-training run, as the ablation's --pretrain")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for every stage")
    parser.add_argument("--notebook", default="", help="the notebook entry the record points to")
    parser.add_argument("--record", default="realm-pretraining-reading-control",
                        help="the result record's name (a variant, e.g. another learning rate, gets its own)")
    args = parser.parse_args()

    ablation, out = args.ablation.rstrip("/"), args.out.rstrip("/")
    for stage in ("blocks", "retriever_init", "ict", "data_salient"):
        if not os.path.exists(f"{ablation}/{stage}"):
            raise SystemExit(f"realm_reading_control: {ablation}/{stage} is missing: run benchmarks/realm_ablation.py "
                             "first (it builds the blocks, the ICT warm start and the salient-span data)")
    deadline = time.time() + args.max_hours * 3600 if args.max_hours > 0 else float("inf")
    common = [*realm_ablation.shared_overrides(ablation, args.eval_examples),
              f"model.retriever_checkpoint={ablation}/ict", *args.overrides, *args.pretrain_overrides, *CONTROL]
    sets = ["--config", args.config, *sum((["--set", o] for o in common), [])]
    data = f"{ablation}/data_salient/pretraining-*"
    os.makedirs(out, exist_ok=True)
    try:
        curve = realm_ablation.pretrain_until_plateau("control", out, sets, data, data, args, deadline)
    except stages.OutOfTime:
        print("realm_reading_control: --max-hours reached; the same command continues", flush=True)
        return 0
    last = curve[-1]
    copy = copying_test(out, sets, data, last["step"])
    reference = realm_ablation.with_evaluations(
        stages.read_curve(f"{ablation}/{REFERENCE_RUN}/curve.json"), f"{ablation}/{REFERENCE_RUN}")
    curves = {"source block always read, retriever frozen": curve, "the ablation's salient-span run": reference}
    realm_ablation.plot_curves(curves, f"{out}/curves.png")
    print(table(curves), flush=True)
    print(f"copying test at step {last['step']} (source block kept): span in a read block {copy['span_recall']:.3f}, "
          f"MLM accuracy there {copy['mlm_accuracy_span_retrieved']:.3f} vs null document only "
          f"{copy['mlm_accuracy_null_only_span_retrieved']:.3f}", flush=True)
    gap = last["mlm_accuracy_span_retrieved"] - last["mlm_accuracy_null_only_span_retrieved"]
    chunks = "; ".join(f"step {p['step']}: {p['mlm_accuracy_span_retrieved']:.3f}/"
                       f"{p['mlm_accuracy_null_only_span_retrieved']:.3f} where retrieved, {p['mlm_accuracy']:.3f}/"
                       f"{p['mlm_accuracy_null_only']:.3f} all, utility {p['retrieval_utility']:.2f} nats"
                       for p in curve)
    overrides = ", ".join(args.pretrain_overrides + args.overrides)
    result_records.write(
        args.record, area="REALM pre-training",
        claim="REALM's reader learns to read a retrieved block that holds the masked span when one is always there "
              "(positive control: retriever frozen at ICT, the source block among every query's candidates): on "
              "held-out salient spans, its MLM accuracy where a retrieved block holds the span exceeds its accuracy "
              "with the null document alone",
        figure=f"held-out salient spans ({last['num_examples']} queries, the source block excluded as in REALM; a "
               f"retrieved block holds the span for {last['span_recall']:.3f} of them): MLM accuracy with the "
               f"blocks / with the null document alone, {chunks}; last chunk's gap where retrieved {gap:+.3f}. "
               f"Copying test at step {last['step']} (the source block kept among the candidates): the span is in a "
               f"read block for {copy['span_recall']:.3f} of the queries, MLM accuracy there "
               f"{copy['mlm_accuracy_span_retrieved']:.3f} vs {copy['mlm_accuracy_null_only_span_retrieved']:.3f} "
               f"with the null document alone (settings: {overrides})",
        verdict="holds" if gap >= READS_BY else "negative", notebook=args.notebook, order=9,
        interval=f"the accuracies where the span was retrieved are on "
                 f"~{last['span_recall'] * last['num_examples']:.0f} queries, about ±{READS_BY / 2:.2f} each, paired; "
                 f"{len(curve)} chunks of {args.chunk} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
