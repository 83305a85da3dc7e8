"""Open-QA on the bundled corpus with the MiniLM import: EM and accuracy@5 of REALM's retriever + reader next to
BM25 + the same reader, on a held-out split never trained on, and serving latency of the exported model.

Stages (each skipped when its output exists, so a rerun resumes):

1. ``realm-tf export-retriever --from-init`` and ``realm-tf embed-blocks``: the retriever as initialised from
   all-MiniLM-L6-v2 (or ``--retriever_run``, e.g. an ICT / REALM run, exported at its checkpoint) and an index
   of every block;
2. ``realm-tf finetune`` on the non-dev questions of ``--questions`` (frozen document embeddings, batch of
   many questions) for ``finetune.steps`` or ``finetune.max_minutes``; resumes from its checkpoint;
3. ``realm-tf evaluate --split dev`` with the model's retriever and with ``--retriever bm25``;
4. ``realm-tf export`` and batch-1 latency of the SavedModel (``answerer.Answerer``, ScaNN op in the graph).

    nohup python benchmarks/open_qa_benchmark.py --out runs/bench/qa --set finetune.max_minutes=50 \\
        > runs/bench/qa/benchmark.log 2>&1 &
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from realm_tf import config as config_lib  # noqa: E402
from realm_tf.index import index_publisher  # noqa: E402
from realm_tf.serving import answerer  # noqa: E402
from realm_tf.serving import open_qa_export  # noqa: E402
from realm_tf.tasks import open_qa  # noqa: E402

ROWS = ("exact_match", "regex_match", "reader_oracle", "accuracy@1", "accuracy@5", "accuracy@20", "accuracy@100")


def cli(args: list[str]) -> None:
    """Runs one ``realm-tf`` command in a child process (its own TensorFlow runtime, like a user would)."""
    print("$ realm-tf " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "realm_tf.cli", *args], check=True)


def measure_latency(export: str, questions: str, dev_fraction: float, count: int) -> tuple[np.ndarray, int]:
    """Milliseconds per batch-1 request to the exported model over ``count`` dev questions (after 3 warm-ups)."""
    _, dev = open_qa.split_questions(open_qa.read_questions(questions), dev_fraction)
    model = answerer.Answerer(export)
    for example in dev[:3]:
        model.ask(example.question)  # warm-up (first calls trace and allocate)
    latencies = []
    for example in dev[3:3 + count]:
        t = time.perf_counter()
        model.ask(example.question)
        latencies.append(time.perf_counter() - t)
    return 1000 * np.asarray(latencies), len(latencies)


def format_latency(latencies_ms: np.ndarray, count: int) -> str:
    return (f"serving (exported SavedModel, ScaNN op in the graph, batch 1, {count} requests, os.cpu_count "
            f"{os.cpu_count()}): p50 {np.percentile(latencies_ms, 50):.0f} ms, p99 "
            f"{np.percentile(latencies_ms, 99):.0f} ms, mean {latencies_ms.mean():.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", default="runs/bench/qa", help="run directory (index, exports, model)")
    parser.add_argument("--blocks", default="runs/bench/blocks", help="the bundled corpus, preprocessed")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--latency_questions", type=int, default=100, help="batch-1 requests timed")
    parser.add_argument("--latency_only", metavar="EXPORT", default=None,
                        help="only time batch-1 requests to this exported model (on an otherwise idle machine)")
    args = parser.parse_args()
    if args.latency_only:
        cfg = config_lib.load_config(args.config, args.overrides)
        print(format_latency(*measure_latency(args.latency_only, args.questions, cfg.data.qa_dev_fraction,
                                              args.latency_questions)))
        return 0

    out = args.out
    overrides = [f"data.blocks_dir={args.blocks}", f"index.index_dir={out}/index", f"refresh.export_dir={out}/export",
                 f"finetune.model_dir={out}/model", "data.batch_size=4", "finetune.learning_rate=5e-5",
                 "finetune.warmup_steps=30", "finetune.steps=600", "finetune.checkpoint_every_steps=25",
                 "finetune.summary_every_steps=5", *args.overrides]
    sets = sum((["--set", o] for o in overrides), [])
    cfg = config_lib.load_config(args.config, overrides)
    print(f"config: batch {cfg.data.batch_size}, reader beam {cfg.model.reader_beam_size}, lengths question/reader "
          f"{cfg.qa.question_seq_length}/{cfg.model.reader_seq_length}, lr {cfg.finetune.learning_rate}, steps "
          f"{cfg.finetune.steps}, max_minutes {cfg.finetune.max_minutes}, pooling {cfg.model.pooling}, "
          f"os.cpu_count {os.cpu_count()}", flush=True)
    timings: dict[str, float] = {}

    start = time.time()
    if not index_publisher.complete_versions(cfg.index.index_dir):
        cli(["export-retriever", "--config", args.config, *sets, "--from-init", "--step", "0"])
        cli(["embed-blocks", "--config", args.config, *sets])
    timings["index"] = time.time() - start

    start = time.time()
    cli(["finetune", "--config", args.config, *sets, "--train", args.questions])
    timings["finetune"] = time.time() - start

    results = {}
    for retriever in open_qa.RETRIEVERS:
        start = time.time()
        results[retriever] = open_qa.evaluate(cfg, args.questions, split="dev", retriever=retriever)
        timings[f"evaluate {retriever}"] = time.time() - start
        print(json.dumps({k: v for k, v in results[retriever].items() if k != "predictions"}), flush=True)

    start = time.time()
    export = os.path.join(out, "serving", str(int(time.time())))
    open_qa_export.export_open_qa(cfg, export)
    timings["export"] = time.time() - start
    latencies_ms, count = measure_latency(export, args.questions, cfg.data.qa_dev_fraction, args.latency_questions)

    step = tf.train.latest_checkpoint(os.path.join(cfg.finetune.model_dir, "checkpoints"))
    print(f"\n== Open-QA benchmark: {results['dense']['num_questions']} held-out dev questions "
          f"(data.qa_dev_fraction={cfg.data.qa_dev_fraction}), fine-tuned to {step} ==")
    print(f"{'metric':<16}{'REALM retriever + reader':>26}{'BM25 + same reader':>22}")
    for key in ROWS:
        print(f"{key:<16}{results['dense'][key]:>26.3f}{results['bm25'][key]:>22.3f}")
    print(format_latency(latencies_ms, count))
    print("wall time: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in timings.items()))
    print(f"exported model: {export}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
