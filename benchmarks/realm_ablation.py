"""REALM's ablation (Guu et al., 2020, Table 3) on the bundled data: what pre-training is worth to Open-QA.

REALM attributes its Open-QA gain to pre-training, and its Table 3 splits it by component: REALM's retriever
or encoder alone against the baseline's, and salient spans against random masks. Here every row starts from the
same all-MiniLM-L6-v2 import, and differs only in where its retriever and its reader come from:

| row | retriever | reader |
| --- | --- | --- |
| ``import`` | the import (projection fitted to the corpus, ``init-retriever``) | the import |
| ``ict_retriever`` | ICT (ORQA's retriever pre-training), from the import's retriever | the import |
| ``realm_retriever`` | REALM pre-training (salient spans, from ICT) | the import |
| ``realm_reader`` | the import | REALM pre-training's knowledge-augmented encoder |
| ``realm`` | REALM pre-training | REALM pre-training |
| ``realm_random_span`` | REALM pre-training on random spans | the same run |
| ``realm_random_token`` | REALM pre-training on random tokens (``--rows``) | the same run |

Each row then gets the same reader warm start (``train-reader``), the same Open-QA fine-tuning and the same
evaluation on the dev split: EM, F1, accuracy@5, the error table, and the reader's EM on the gold blocks.

**Pre-training runs as long as it improves**, not for a step count chosen in advance: it trains in chunks of
``--chunk`` steps at a constant learning rate after the warm-up (``pretrain.learning_rate_decay: constant``), and
after each chunk scores ``--eval-examples`` held-out salient spans (held out by source block; a random-masking
run is scored on the salient spans of the same held-out blocks, ``pretrain --eval-input``). It stops when neither
the held-out MLM accuracy nor the retrieval utility has beaten its best by ``--min-delta`` for ``--patience``
chunks (:func:`realm_tf.tasks.held_out_progress.plateaued`). Within a chunk the retriever is exported every half
chunk and the index rebuilt from it in a thread of the trainer (REALM §3.4's asynchronous refresh; a run does not
export at its own last step, so an export interval of a whole chunk would never refresh it). The curves go to
``<out>/<run>/curve.json``, TensorBoard (``<out>/<run>/model``) and ``<out>/curves.png``. A row runs as soon as
the runs it starts from are finished, so the rows of a plateaued run do not wait for a longer one.

Everything is resumable: each stage is kept in ``<out>/stages.json``, each chunk in its curve, and a killed
training resumes from its checkpoint. ``--max-hours`` stops the harness cleanly between stages (for sessions of
limited length); the same command continues:

    nohup .venv/bin/python benchmarks/realm_ablation.py --out runs/bench/ablation > runs/bench/ablation.log 2>&1 &
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf import config as config_lib  # noqa: E402
from realm_tf.index import index_publisher  # noqa: E402
from realm_tf.tasks import answer_errors  # noqa: E402
from realm_tf.tasks import held_out_progress  # noqa: E402
from realm_tf.tasks import qa_metrics  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import open_qa_benchmark  # noqa: E402  (benchmarks/)
import reader_levers  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

#: row -> (retriever source, reader source); a source is "import", "ict" or a pre-training run's name.
ROWS: dict[str, tuple[str, str]] = {
    "import": ("import", "import"),
    "ict_retriever": ("ict", "import"),
    "realm_retriever": ("salient", "import"),
    "realm_reader": ("import", "salient"),
    "realm": ("salient", "salient"),
    "realm_random_span": ("random_span", "random_span"),
    "realm_random_token": ("random_token", "random_token"),
}
DEFAULT_ROWS = "import,ict_retriever,realm_retriever,realm_reader,realm,realm_random_span"
#: The held-out scores that decide whether pre-training still improves.
WATCHED = ("mlm_accuracy", "retrieval_utility")
#: What a curve point keeps of a chunk's held-out evaluation (``realm-tf pretrain --metrics``): the watched scores,
#: the same without retrieval (the null document alone), and whether the retriever finds a block holding the masked
#: span (other than its source block) and the reader then predicts it better than without: REALM's cold-start
#: problem (Guu et al., 2020, §3.4) is a reader that ignores its retrieved blocks, leaving the retriever no signal.
KEPT = ("mlm_accuracy", "retrieval_utility", "log_likelihood", "mlm_accuracy_null_only", "log_likelihood_null_only",
        "span_recall", "span_recall_top1", "mlm_accuracy_span_retrieved", "mlm_accuracy_null_only_span_retrieved",
        "num_examples")
#: The panels of :func:`plot_curves`: (title, solid line's key, dashed line's key or None).
PANELS = (("MLM accuracy (dashed: null document only)", "mlm_accuracy", "mlm_accuracy_null_only"),
          ("retrieval utility", "retrieval_utility", None),
          ("span in a retrieved block (dashed: top 1)", "span_recall", "span_recall_top1"),
          ("MLM accuracy where the span was retrieved\n(dashed: null document only)", "mlm_accuracy_span_retrieved",
           "mlm_accuracy_null_only_span_retrieved"))


def shared_overrides(out: str, eval_examples: int) -> list[str]:
    """The settings every stage of the ablation in ``out`` shares: its blocks, the held-out evaluation's size, a
    constant rate after the warm-up (chunks stay comparable), checkpoints every 50 steps and the index rebuilt in
    a thread of the trainer."""
    return [f"data.blocks_dir={out}/blocks", f"pretrain.eval_examples={eval_examples}",
            "pretrain.learning_rate_decay=constant", "pretrain.checkpoint_every_steps=50", "refresh.mode=thread"]


def with_evaluations(curve: list[dict[str, Any]], run: str) -> list[dict[str, Any]]:
    """``curve`` with each point's missing :data:`KEPT` scores read from its chunk's ``<run>/metrics-<step>.json``
    (points written before a score was kept), where that file exists."""
    filled = []
    for point in curve:
        path = f"{run}/metrics-{point['step']}.json"
        if not set(KEPT) <= point.keys() and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                scores = json.load(f)["eval"]
            point = {**{k: scores[k] for k in KEPT if k in scores}, **point}
        filled.append(point)
    return filled


def pretrain_until_plateau(name: str, out: str, sets: list[str], data: str, eval_data: str, args: argparse.Namespace,
                           deadline: float) -> list[dict[str, float]]:
    """Pre-trains run ``name`` chunk by chunk until its held-out scores plateau (``held_out_progress``), or for
    ``--max-chunks``; its curve."""
    run = f"{out}/{name}"
    path = f"{run}/curve.json"
    curve = with_evaluations(stages.read_curve(path), run)
    while (not held_out_progress.plateaued(curve, WATCHED, args.patience, args.min_delta)
           and len(curve) < args.max_chunks):
        if time.time() > deadline:
            raise stages.OutOfTime(name)
        step = (curve[-1]["step"] if curve else 0) + args.chunk
        started = time.time()
        metrics = f"{run}/metrics-{step}.json"
        stages.cli(["pretrain", *sets, "--set", f"pretrain.model_dir={run}/model",
                    "--set", f"index.index_dir={run}/index", "--set", f"refresh.export_dir={run}/export",
                    "--set", f"pretrain.steps={step}", "--input", data, "--eval-input", eval_data,
                    "--metrics", metrics])
        with open(metrics, encoding="utf-8") as f:
            scores = json.load(f)["eval"]
        curve.append({"step": step, "minutes": (time.time() - started) / 60,
                      **{k: scores[k] for k in KEPT if k in scores}})
        config_lib.atomic_write_text(path, json.dumps(curve, indent=2) + "\n")
    return curve


def plot_curves(curves: dict[str, list[dict[str, float]]], path: str) -> None:
    """The held-out curves of every pre-training run on the held-out salient spans, one panel per :data:`PANELS`
    entry; a point without a panel's score is left out of that panel."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    figure, axes = pyplot.subplots(1, len(PANELS), figsize=(4.5 * len(PANELS), 3.6))
    for axis, (title, solid, dashed) in zip(axes, PANELS):
        for i, (name, curve) in enumerate(curves.items()):
            for key, style in ((solid, "-"), (dashed, "--")):
                points = [(p["step"], p[key]) for p in curve if key is not None and key in p]
                if points:
                    axis.plot(*zip(*points), style, marker="o", markersize=3, color=f"C{i}",
                              label=name if style == "-" else None)
        axis.set_xlabel("pre-training step")
        axis.set_title(title, fontsize=9)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--out", default="runs/bench/ablation")
    parser.add_argument("--rows", default=DEFAULT_ROWS, help=f"comma-separated, from: {', '.join(ROWS)}")
    parser.add_argument("--corpus", default="data/open_qa/passages.jsonl.gz")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    stages.add_plateau_args(parser, 200, "pre-training steps between held-out evaluations", 0.005,
                            "what counts as an improvement of a watched score (about one standard error of the "
                            "held-out MLM accuracy at the default --eval-examples)", 1000)
    parser.add_argument("--eval-examples", dest="eval_examples", type=int, default=2048)
    parser.add_argument("--pretrain", dest="pretrain_overrides", action="append", default=[],
                        help="overrides of every pre-training run (e.g. data.batch_size=4)")
    parser.add_argument("--reader", dest="reader_overrides", action="append", default=[],
                        help="overrides of every row's reader warm start (e.g. reader.steps=1800)")
    parser.add_argument("--finetune", dest="finetune_overrides", action="append", default=[],
                        help="overrides of every row's fine-tuning")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for every stage")
    parser.add_argument("--notebook", default="", help="the notebook entry the records point to")
    args = parser.parse_args()

    out = args.out.rstrip("/")
    deadline = time.time() + args.max_hours * 3600 if args.max_hours > 0 else float("inf")
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"realm_ablation: unknown rows {unknown}: one of {', '.join(ROWS)}")
    common = [*shared_overrides(out, args.eval_examples), f"model.retriever_checkpoint={out}/retriever_init",
              *args.overrides]
    sets = ["--config", args.config, *sum((["--set", o] for o in common), [])]
    stage = stages.Stages(out)
    results: dict[str, dict[str, Any]] = {}

    def timed(name: str, fn):
        if name not in stage.state and time.time() > deadline:
            raise stages.OutOfTime(name)
        return stage(name, fn)

    try:
        timed("blocks", lambda: stages.cli(["preprocess", "--config", args.config, "--input", args.corpus,
                                            "--output", f"{out}/blocks"]))
        timed("retriever_init", lambda: stages.cli(["init-retriever", *sets, "--output", f"{out}/retriever_init"]))
        runs = {source for row in rows for source in ROWS[row]} - {"import"}
        if runs - {"ict"}:  # REALM pre-training starts its retriever from ICT, as REALM does (§3.4)
            runs.add("ict")
        if "ict" in runs:
            timed("ict_data", lambda: stages.cli(["generate-ict-data", *sets, "--set", f"data.ict_dir={out}/ict_data"]))
            timed("ict", lambda: stages.cli(["train-ict", *sets, "--set", f"data.ict_dir={out}/ict_data",
                                             "--set", f"ict.model_dir={out}/ict", "--set",
                                             f"refresh.export_dir={out}/ict_export"]))
        # Each pre-training run is named after its masking; salient first (most rows need it), and its data in
        # any case: every run is scored on the held-out salient spans.
        realm_runs = sorted(runs - {"ict"}, key=lambda name: (name != "salient", name))
        for name in sorted(set(realm_runs) | ({"salient"} if realm_runs else set())):
            timed(f"data_{name}", lambda name=name: stages.cli([
                "generate-pretraining-data", *sets, "--set", f"data.pretraining_dir={out}/data_{name}",
                "--set", f"data.masking_strategy={name}"]))
        curves, finished = {}, {"import", "ict"}

        def run_ready_rows() -> None:
            # A row runs as soon as its sources are finished: a long pre-training run does not hold the others.
            for row in rows:
                if row not in results and set(ROWS[row]) <= finished:
                    results[row] = run_row(row, out, sets, args, timed)

        run_ready_rows()
        for name in realm_runs:
            # Each chunk is a run of its own, which exports only strictly inside its steps: an export interval of
            # a chunk would never refresh the index (realm_pretraining.export_steps).
            curves[name] = pretrain_until_plateau(
                name, out, [*sets, "--set", f"model.retriever_checkpoint={out}/ict",
                            "--set", f"refresh.export_every_steps={max(1, args.chunk // 2)}",
                            *sum((["--set", o] for o in args.pretrain_overrides), [])],
                f"{out}/data_{name}/pretraining-*", f"{out}/data_salient/pretraining-*", args, deadline)
            plot_curves(curves, f"{out}/curves.png")
            finished.add(name)
            run_ready_rows()
        results = {row: results[row] for row in rows}
    except stages.OutOfTime as stopped:
        print(f"realm_ablation: --max-hours reached before {stopped}; the same command continues", flush=True)
        if results:  # the rows finished so far
            print_table(results, out, args.notebook)
        return 0
    print_table(results, out, args.notebook)
    return 0


def run_row(row: str, out: str, sets: list[str], args: argparse.Namespace, timed) -> dict[str, Any]:
    """Index, reader warm start, fine-tuning and dev evaluation of one row."""
    retriever, reader = ROWS[row]
    source = {"import": f"{out}/retriever_init", "ict": f"{out}/ict"}
    retriever_run = source.get(retriever, f"{out}/{retriever}/model")
    reader_run = "" if reader == "import" else f"{out}/{reader}/model"
    base = f"{out}/rows/{row}"
    # The index holds Embed_doc of the retriever's source, which Open-QA fine-tuning keeps fixed (ORQA's block
    # encoder): rows that start their retriever from the same source share it.
    index_base = f"{out}/indexes/{retriever}"
    row_sets = [*sets, "--set", f"index.index_dir={index_base}/index", "--set",
                f"refresh.export_dir={index_base}/export",
                "--set", f"qa.retriever_checkpoint={retriever_run}", "--set", f"finetune.model_dir={base}/finetune"]

    def index() -> None:
        if not index_publisher.complete_versions(f"{index_base}/index"):
            stages.cli(["export-retriever", *row_sets, "--model-dir", retriever_run])
            stages.cli(["embed-blocks", *row_sets])

    timed(f"index_{retriever}", index)
    # The reader warm start reads gold blocks without retrieval scores (tasks/reader_warm_start): rows that start
    # their reader from the same source share it.
    warm_reader = f"{out}/readers/{reader}"
    start_reader = ["--set", f"qa.reader_checkpoint={reader_run}"] if reader_run else []
    timed(f"reader_{reader}", lambda: stages.cli([
        "train-reader", *row_sets, "--set", f"reader.model_dir={warm_reader}", *start_reader,
        *sum((["--set", o] for o in args.reader_overrides), [])]))
    timed(f"{row}_finetune", lambda: stages.cli([
        "finetune", *row_sets, "--set", f"qa.reader_checkpoint={warm_reader}",
        *sum((["--set", o] for o in args.finetune_overrides), []), "--train", args.questions]))
    question = ["--questions", args.questions, "--split", "dev"]
    dense = timed(f"{row}_dev", lambda: open_qa_benchmark.evaluate(
        [*row_sets, *question, "--predictions", f"{base}/predictions-dev.jsonl"], f"{base}/metrics-dev.json"))
    gold = timed(f"{row}_dev_gold", lambda: open_qa_benchmark.evaluate(
        [*row_sets, *question, "--retriever", "gold", "--predictions", f"{base}/predictions-dev-gold.jsonl"],
        f"{base}/metrics-dev-gold.json"))
    return {"exact_match": dense["exact_match"], "f1": dense["f1"], "accuracy@5": dense["accuracy@5"],
            "gold_exact_match": gold["exact_match"], "num_questions": dense["num_questions"],
            "outcomes": dense["outcomes"],
            "short_answers": short_answer_scores(f"{base}/predictions-dev.jsonl"),
            "gold_short_answers": short_answer_scores(f"{base}/predictions-dev-gold.jsonl")}


def short_answer_scores(predictions_path: str) -> dict[str, float]:
    """EM and F1 of a predictions file on NQ-open's questions (:func:`qa_metrics.short_answer_scores`)."""
    return qa_metrics.short_answer_scores(answer_errors.read_predictions(predictions_path))


def paired_difference(out: str, row: str, kind: str, against: str = "import") -> tuple[float, float, float]:
    """Exact match of ``row`` minus ``against``'s on the same questions (``kind``: ``dev`` end to end, ``dev-gold``
    on each question's gold block), with its 95% paired bootstrap interval."""
    return reader_levers.paired_difference(f"{out}/rows/{against}/predictions-{kind}.jsonl",
                                           f"{out}/rows/{row}/predictions-{kind}.jsonl",
                                           keys=[("exact_match", "EM")])["EM"]


def print_table(results: dict[str, dict[str, Any]], out: str, notebook: str = "") -> None:
    print(f"\n== REALM's ablation on the bundled data ({out}) ==")
    print("| row | retriever | reader | dev EM | F1 | accuracy@5 | gold-block EM | NQ-open EM | NQ-open gold-block "
          "EM |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row, r in results.items():
        retriever, reader = ROWS[row]
        print(f"| {row} | {retriever} | {reader} | {r['exact_match']:.3f} | {r['f1']:.3f} | {r['accuracy@5']:.3f} | "
              f"{r['gold_exact_match']:.3f} | {r['short_answers']['exact_match']:.3f} | "
              f"{r['gold_short_answers']['exact_match']:.3f} |")
    for row, r in results.items():
        print(f"\n{row}:\n{answer_errors.format_table(r['outcomes'])}")
    curves = {os.path.basename(os.path.dirname(p)): stages.read_curve(p)
              for p in sorted(glob.glob(f"{out}/*/curve.json"))}
    for name, curve in curves.items():
        print(f"\npre-training run {name}: " + ", ".join(
            f"step {p['step']}: MLM acc {p['mlm_accuracy']:.4f}, utility {p['retrieval_utility']:.4f}" for p in curve))
    print(json.dumps(results))
    for order, (row, r) in enumerate(results.items()):
        retriever, reader = ROWS[row]
        steps = ", ".join(f"{name} {curve[-1]['step']} steps" for name, curve in curves.items() if curve and
                          name in (retriever, reader))
        short, gold_short = r["short_answers"], r["gold_short_answers"]
        figure = (f"dev EM {r['exact_match']:.3f}, F1 {r['f1']:.3f}, accuracy@5 {r['accuracy@5']:.3f}, gold-block EM "
                  f"{r['gold_exact_match']:.3f} on {r['num_questions']} questions; on NQ-open's "
                  f"{short['num_questions']} (an answer of at most {short['max_tokens']} tokens): EM "
                  f"{short['exact_match']:.3f}, gold-block EM {gold_short['exact_match']:.3f}"
                  + (f" ({steps})" if steps else ""))
        verdict, interval = "holds", ""
        if row != "import" and "import" in results:  # against no pre-training, questions paired
            (mean, low, high), (gold, gold_low, gold_high) = (
                paired_difference(out, row, kind) for kind in ("dev", "dev-gold"))
            figure += f"; EM {mean:+.3f} vs import, gold-block EM {gold:+.3f}"
            interval = (f"95% paired bootstrap over questions: EM [{low:+.3f}, {high:+.3f}], gold-block EM "
                        f"[{gold_low:+.3f}, {gold_high:+.3f}]")
            verdict = "holds" if low > 0 else "negative"
            if reader != "import":  # the reader's own part: reading comprehension on each question's gold block
                result_records.write(
                    f"realm-ablation-{row.replace('_', '-')}-gold-block", area="REALM pre-training", order=30 + order,
                    verdict="holds" if gold_low > 0 else "negative",
                    claim=f"REALM pre-training's knowledge-augmented encoder as the reader's start reads better (row "
                          f"{row}: gold-block EM against the import's reader, same warm start and fine-tuning)",
                    figure=f"gold-block EM {r['gold_exact_match']:.3f} vs {results['import']['gold_exact_match']:.3f} "
                           f"({gold:+.3f}) on the dev questions with a gold block" + (f" ({steps})" if steps else ""),
                    interval=f"95% paired bootstrap over questions [{gold_low:+.3f}, {gold_high:+.3f}]",
                    notebook=notebook)
        result_records.write(
            f"realm-ablation-{row.replace('_', '-')}", area="REALM pre-training", order=10 + order, verdict=verdict,
            claim=f"REALM's ablation row {row}: retriever from {retriever}, reader from {reader}, then the same "
                  f"Open-QA fine-tuning" + ("" if row == "import" else ": better than no pre-training end to end"),
            figure=figure, interval=interval, notebook=notebook)

    if {"realm", "realm_random_span"} <= results.keys():  # REALM's masking comparison: salient against random spans
        salient, random_span = results["realm"], results["realm_random_span"]
        (mean, low, high), (gold, gold_low, gold_high) = (
            paired_difference(out, "realm", kind, against="realm_random_span") for kind in ("dev", "dev-gold"))
        result_records.write(
            "realm-ablation-salient-vs-random-span", area="REALM pre-training", order=16,
            verdict="holds" if low > 0 else "negative",
            claim="Salient-span masking makes a better pre-training than random spans (REALM's Table 3 comparison: "
                  "rows realm and realm_random_span, the same pre-training, warm start and fine-tuning otherwise)",
            figure=f"dev EM {salient['exact_match']:.3f} vs {random_span['exact_match']:.3f} ({mean:+.3f}), "
                   f"accuracy@5 {salient['accuracy@5']:.3f} vs {random_span['accuracy@5']:.3f}, gold-block EM "
                   f"{salient['gold_exact_match']:.3f} vs {random_span['gold_exact_match']:.3f} ({gold:+.3f}) on "
                   f"{salient['num_questions']} questions",
            interval=f"95% paired bootstrap over questions: EM [{low:+.3f}, {high:+.3f}], gold-block EM "
                     f"[{gold_low:+.3f}, {gold_high:+.3f}]",
            notebook=notebook)


if __name__ == "__main__":
    sys.exit(main())
