"""Open-QA on the bundled corpus with the MiniLM import (issues #15, #16): every training stage, timed, then
EM / F1 of REALM's retriever + reader next to BM25 + the same reader trained the same way, on a dev split that
no stage ever reads, and serving latency of the exported model.

Stages (each recorded in ``<out>/stages.json`` when it completes, and skipped on a rerun; a stage killed midway
resumes from its checkpoint, so the script continues in a later session; on a new machine it starts with
``realm-tf preprocess`` of the bundled passages into ``--blocks``):

1. ``reader``: ``realm-tf train-reader`` (gold block + BM25 negatives; SQuAD and the train split of the NQ
   questions), for ``reader.steps`` or ``reader.max_minutes``;
2. ``index``: ``realm-tf init-retriever`` (``model.projection_init``), ``export-retriever`` and ``embed-blocks``;
3. ``finetune``: ``realm-tf finetune`` from the warm-started reader (dense retriever, ORQA's loss);
4. ``tune``: ``evaluate --split tune`` over answer-score weights w (S_read + w·S_retr); the best EM (then F1)
   is used for dev. The tune split is held out of training like dev; dev is only measured;
5. ``dev``: ``evaluate --split dev``: dense, and the readers on gold blocks;
6. ``finetune_bm25``: ``realm-tf finetune --retriever bm25``: the same reader warm start, steps and minutes,
   on BM25's blocks (ORQA's "BM25 + BERT"); ``dev_bm25``: its ``evaluate --split dev``;
7. ``serve``: ``realm-tf export`` and batch-1 latency (``answerer.Answerer``).

    nohup .venv/bin/python benchmarks/open_qa_benchmark.py --out runs/bench/qa2 > runs/bench/qa2/benchmark.log 2>&1 &

``--arms bm25`` runs only stages 1, 2, 6 (the BM25 row of a run whose dense rows were measured before).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import numpy as np  # noqa: E402

from realm_tf import config as config_lib  # noqa: E402
from realm_tf.data import questions  # noqa: E402
from realm_tf.index import index_publisher  # noqa: E402
from realm_tf.serving import answerer  # noqa: E402
from realm_tf.tasks import answer_errors  # noqa: E402
from realm_tf.tasks import open_qa  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

ROWS = ("exact_match", "f1", "regex_match", "reader_oracle", "accuracy@1", "accuracy@5", "accuracy@20",
        "accuracy@100")
WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0)
# The reader warm start: 900 steps of 8 (question, gold block, 2 negatives) (benchmarks/reader_start_benchmark.py
# trains its other starting point the same way).
READER_OVERRIDES = ("reader.steps=900", "reader.learning_rate=1e-4", "reader.warmup_steps=60",
                    "reader.checkpoint_every_steps=50", "reader.summary_every_steps=10", "reader.max_minutes=80")


def evaluate(args: list[str], metrics_path: str) -> dict[str, Any]:
    """``realm-tf evaluate``; its last stdout line (the metrics JSON) is kept in ``metrics_path``."""
    print("$ realm-tf evaluate " + " ".join(args), flush=True)
    done = subprocess.run([sys.executable, "-m", "realm_tf.cli", "evaluate", *args], check=True,
                          stdout=subprocess.PIPE, text=True)
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    config_lib.atomic_write_text(metrics_path, json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics), flush=True)
    return metrics


def measure_latency(export: str, questions: list[str], count: int) -> np.ndarray:
    """Milliseconds per batch-1 request to the exported model (after 3 warm-ups)."""
    model = answerer.Answerer(export)
    for question in questions[:3]:
        model.ask(question)  # warm-up (first calls trace and allocate)
    latencies = []
    for question in questions[3:3 + count]:
        start = time.perf_counter()
        model.ask(question)
        latencies.append(time.perf_counter() - start)
    return 1000 * np.asarray(latencies)


def format_latency(latencies_ms: np.ndarray) -> str:
    return (f"serving (exported SavedModel, batch 1, {len(latencies_ms)} requests, os.cpu_count {os.cpu_count()}): "
            f"p50 {np.percentile(latencies_ms, 50):.0f} ms, p99 {np.percentile(latencies_ms, 99):.0f} ms, "
            f"mean {latencies_ms.mean():.0f} ms")


def error_categories(predictions_path: str) -> dict[str, int]:
    """Every answer of a predictions file in one outcome of :mod:`realm_tf.tasks.answer_errors`."""
    return answer_errors.count_outcomes(answer_errors.read_predictions(predictions_path))


def write_bm25_record(cfg: config_lib.ExperimentConfig, out: str, bm25: dict[str, Any],
                      dense: dict[str, Any] | None) -> None:
    """The record of the BM25 + reader row, against the dense system's dev metrics when ``out`` has them: the EM
    gap in standard errors of the per-question differences (the same questions)."""
    not_read = error_categories(f"{out}/predictions-dev-bm25.jsonl")["answer_not_read"]
    figure = (f"EM {bm25['exact_match']:.3f}, F1 {bm25['f1']:.3f}, acc@5 {bm25['accuracy@5']:.3f} on "
              f"{bm25['num_questions']} dev questions; no answer in the {cfg.model.reader_beam_size} blocks read for "
              f"{not_read} questions")
    if dense is None:
        result_records.write("open-qa-bm25-baseline", area="Open-QA", order=20, verdict="open", figure=figure,
                             claim="BM25 with the same reader recipe, not yet compared: the run directory has no "
                                   "dev metrics of the dense system.")
        return
    figure += f" (dense: {error_categories(f'{out}/predictions-dev.jsonl')['answer_not_read']})"
    ems = [{p["id"]: float(p["exact_match"]) for p in answer_errors.read_predictions(path)}
           for path in (f"{out}/predictions-dev.jsonl", f"{out}/predictions-dev-bm25.jsonl")]
    differences = np.array([ems[0][i] - ems[1][i] for i in ems[0].keys() & ems[1].keys()])  # [num_questions]
    gap = dense["exact_match"] - bm25["exact_match"]
    error = differences.std(ddof=1) / np.sqrt(len(differences)) if len(differences) > 1 else 0.0
    below = gap > 0 and dense["accuracy@5"] > bm25["accuracy@5"]
    result_records.write(
        "open-qa-bm25-baseline", area="Open-QA", order=20, verdict="holds" if below else "negative", figure=figure,
        claim=f"BM25 with the same reader recipe scores {'below' if below else 'no lower than'} the dense system: "
              f"acc@5 {bm25['accuracy@5']:.3f} vs {dense['accuracy@5']:.3f}, EM {bm25['exact_match']:.3f} vs "
              f"{dense['exact_match']:.3f}" + (f", a gap of {gap / error:.1f} standard errors of the per-question "
                                                 "differences." if error else "."))


def run_bm25_arm(stage: stages.Stages, bm25_sets: list[str], questions: str, out: str) -> dict[str, Any]:
    """ORQA's "BM25 + BERT": the warm-started reader fine-tuned on BM25's blocks (``finetune_bm25``), then its
    dev metrics (``dev_bm25``)."""
    stage("finetune_bm25", lambda: stages.cli(["finetune", *bm25_sets, "--train", questions, "--retriever", "bm25"]))
    return stage("dev_bm25", lambda: evaluate(
        [*bm25_sets, "--questions", questions, "--split", "dev", "--retriever", "bm25", "--predictions",
         f"{out}/predictions-dev-bm25.jsonl"], f"{out}/metrics-dev-bm25.json"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", default="runs/bench/qa2", help="run directory (index, exports, models)")
    parser.add_argument("--blocks", default="runs/bench/blocks", help="the bundled corpus, preprocessed")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--latency_questions", type=int, default=100, help="batch-1 requests timed")
    parser.add_argument("--arms", choices=("all", "bm25"), default="all",
                        help="all: every stage; bm25: only what the BM25 + reader row needs (the reader warm start, "
                             "the index its corpus is read through, BM25 fine-tuning and its dev evaluation), for "
                             "a run whose dense rows were measured before with the same reader stage")
    parser.add_argument("--stop-after", choices=("reader", "index", "finetune"), default=None,
                        help="end after this stage (e.g. finetune: the model answer_confidence_benchmark.py reads)")
    args = parser.parse_args()

    out = args.out
    overrides = [f"data.blocks_dir={args.blocks}", f"index.index_dir={out}/index", f"refresh.export_dir={out}/export",
                 f"reader.model_dir={out}/reader", f"finetune.model_dir={out}/finetune",
                 f"model.retriever_checkpoint={out}/retriever_init", f"qa.reader_checkpoint={out}/reader",
                 *READER_OVERRIDES,
                 # Open-QA fine-tuning: batch 4 questions x 5 blocks; the retriever at a tenth of the rate.
                 "data.batch_size=4", "finetune.learning_rate=5e-5", "finetune.warmup_steps=30",
                 "finetune.steps=1500", "finetune.checkpoint_every_steps=25", "finetune.summary_every_steps=5",
                 "finetune.max_minutes=90", "finetune.learning_rate_scales=[knowledge_retriever=0.1]",
                 *args.overrides]
    cfg = config_lib.load_config(args.config, overrides)
    sets = ["--config", args.config, *sum((["--set", o] for o in overrides), [])]
    os.makedirs(out, exist_ok=True)
    print(f"config: projection_init {cfg.model.projection_init}, reader {cfg.reader.steps} steps / "
          f"{cfg.reader.max_minutes} min at batch 8, finetune {cfg.finetune.steps} steps / "
          f"{cfg.finetune.max_minutes} min at batch {cfg.data.batch_size}, beam {cfg.model.reader_beam_size}, "
          f"lengths question/reader {cfg.qa.question_seq_length}/{cfg.model.reader_seq_length}, length buckets "
          f"{cfg.model.reader_length_buckets}, os.cpu_count {os.cpu_count()}", flush=True)

    stage = stages.Stages(out)

    def index() -> None:  # each step skipped when its output is there (e.g. built by hand with these commands)
        if not os.path.exists(f"{out}/retriever_init/projection.json"):
            stages.cli(["init-retriever", *sets, "--output", f"{out}/retriever_init"])
        if not index_publisher.complete_versions(cfg.index.index_dir):
            stages.cli(["export-retriever", *sets, "--model-dir", f"{out}/retriever_init", "--step", "0"])
            stages.cli(["embed-blocks", *sets])

    if not os.path.exists(os.path.join(args.blocks, "manifest.json")):  # a new machine: the corpus first
        stages.cli(["preprocess", "--config", args.config, "--input", cfg.data.corpus_pattern, "--output", args.blocks])
    # The warm start starts from the import (not from its own output) and reads batches of 8 questions; it reads
    # given blocks, so it needs no retriever (whose initialisation the ``index`` stage writes after it).
    reader_overrides = [o for o in overrides if not o.startswith(("data.batch_size=", "qa.reader_checkpoint=",
                                                                  "model.retriever_checkpoint="))]
    reader_sets = ["--config", args.config, *sum((["--set", o] for o in reader_overrides), [])]
    stage("reader", lambda: stages.cli(["train-reader", *reader_sets, "--set", "data.batch_size=8"]))
    if args.stop_after == "reader":
        return 0
    stage("index", index)
    if args.stop_after == "index":
        return 0
    bm25_sets = [*sets, "--set", f"finetune.model_dir={out}/finetune_bm25"]
    if args.arms == "bm25":
        bm25 = run_bm25_arm(stage, bm25_sets, args.questions, out)
        print(f"\n== BM25 + the same reader: {bm25['num_questions']} dev questions (never trained on, nor tuned on)")
        for key in ROWS:
            print(f"{key:<16}{bm25[key]:>10.3f}")
        print(f"dev outcomes (bm25): {error_categories(f'{out}/predictions-dev-bm25.jsonl')}")
        print("stage minutes: " + stage.minutes())
        dense = None  # the dense rows, when this directory's run measured them before
        if os.path.exists(f"{out}/metrics-dev.json") and os.path.exists(f"{out}/predictions-dev.jsonl"):
            with open(f"{out}/metrics-dev.json", encoding="utf-8") as f:
                dense = json.load(f)
        write_bm25_record(cfg, out, bm25, dense)
        return 0
    stage("finetune", lambda: stages.cli(["finetune", *sets, "--train", args.questions]))
    if args.stop_after == "finetune":
        print("stage minutes: " + stage.minutes())
        return 0

    def tune() -> dict[str, Any]:
        metrics = evaluate([*sets, "--questions", args.questions, "--split", "tune", "--score-weights",
                            *map(str, WEIGHTS), "--predictions", f"{out}/predictions-tune.jsonl"],
                           f"{out}/metrics-tune.json")
        best = max(WEIGHTS, key=lambda w: (metrics[f"exact_match@w={w:g}"], metrics[f"f1@w={w:g}"]))
        return {"weight": best, "num_questions": metrics["num_questions"],
                **{f"w={w:g}": [metrics[f"exact_match@w={w:g}"], metrics[f"f1@w={w:g}"]] for w in WEIGHTS}}

    chosen = stage("tune", tune)
    weight = ["--set", f"qa.retrieval_score_weight={chosen['weight']}"]

    def dev() -> dict[str, Any]:
        base = ["--questions", args.questions, "--split", "dev"]
        return {
            "dense": evaluate([*sets, *weight, *base, "--predictions", f"{out}/predictions-dev.jsonl"],
                              f"{out}/metrics-dev.json"),
            "gold_warm_start": evaluate([*sets, *base, "--retriever", "gold", "--model", f"{out}/reader",
                                         "--predictions", f"{out}/predictions-dev-gold-reader.jsonl"],
                                        f"{out}/metrics-dev-gold-reader.json"),
            "gold_finetuned": evaluate([*sets, *base, "--retriever", "gold", "--predictions",
                                        f"{out}/predictions-dev-gold-finetuned.jsonl"],
                                       f"{out}/metrics-dev-gold-finetuned.json"),
        }

    results = dict(stage("dev", dev))
    # BM25 + the same reader last: the dense figures do not wait for its fine-tuning.
    results["bm25"] = run_bm25_arm(stage, bm25_sets, args.questions, out)

    def serve() -> dict[str, Any]:
        export = os.path.join(out, "serving", str(int(time.time())))
        stages.cli(["export", *sets, *weight, "--output", export])
        dev_questions = open_qa.select_split(questions.read_questions(args.questions), "dev", cfg.data)
        latencies = measure_latency(export, [e.question for e in dev_questions], args.latency_questions)
        return {"export": export, "latency": format_latency(latencies)}

    served = stage("serve", serve)

    print(f"\n== Open-QA benchmark: {results['dense']['num_questions']} dev questions (never trained on, nor tuned "
          f"on), answer score S_read + {chosen['weight']:g}·S_retr (chosen on {chosen['num_questions']} tune "
          f"questions: " + ", ".join(f"w={w:g} EM {chosen[f'w={w:g}'][0]:.3f}" for w in WEIGHTS) + ") ==")
    print(f"{'metric':<16}{'REALM retriever + reader':>26}{'BM25 + same reader':>22}")
    for key in ROWS:
        print(f"{key:<16}{results['dense'][key]:>26.3f}{results['bm25'][key]:>22.3f}")
    for name in ("gold_warm_start", "gold_finetuned"):
        print(f"reader on dev gold blocks ({name}): EM {results[name]['exact_match']:.3f}, F1 {results[name]['f1']:.3f}"
              f" ({results[name]['num_questions']} questions)")
    for name, path in (("dense", f"{out}/predictions-dev.jsonl"), ("bm25", f"{out}/predictions-dev-bm25.jsonl")):
        print(f"dev outcomes ({name}): {error_categories(path)}")
    print(served["latency"])
    print("stage minutes: " + stage.minutes())
    dense, gold, warm_start = results["dense"], results["gold_finetuned"], results["gold_warm_start"]
    with open(os.path.join(args.blocks, "manifest.json"), encoding="utf-8") as f:
        num_blocks = json.load(f)["blocks"]
    result_records.write(
        "open-qa-dense-dev-em", area="Open-QA", order=10,
        claim=f"The REALM-style system ({cfg.model.projection_size}-d {cfg.model.projection_init}-initialised "
              f"retriever and span reader, fine-tuned {cfg.finetune.steps:,} steps) answers held-out NQ questions "
              "over the whole bundled corpus.",
        figure=f"EM {dense['exact_match']:.3f}, F1 {dense['f1']:.3f}, acc@5 {dense['accuracy@5']:.3f}, reader oracle "
               f"{dense['reader_oracle']:.3f} on {dense['num_questions']} dev questions ({num_blocks:,} blocks)")
    write_bm25_record(cfg, out, results["bm25"], dense)
    reached = gold["exact_match"] >= 0.5
    result_records.write(
        "open-qa-gold-block-reader-em", area="Open-QA", order=30, verdict="holds" if reached else "open",
        claim="Handed the gold blocks, the fine-tuned reader "
              + ("reaches the 0.50 gold-block EM goal." if reached else
                 "is still short of the 0.50 gold-block EM goal: reading, not retrieval, limits the system."),
        figure=f"EM {gold['exact_match']:.3f}, F1 {gold['f1']:.3f} on the gold blocks of {gold['num_questions']} dev "
               f"questions (warm-start reader alone: {warm_start['exact_match']:.3f} / {warm_start['f1']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
