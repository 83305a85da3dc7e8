"""Issue #15 §1: which starting point makes the better span reader here, the all-MiniLM-L6-v2 import or the reader
of a REALM pre-training run (Guu et al., 2020, §3.4: the knowledge-augmented encoder after salient-span MLM)?

Both starts get the same reader warm start (``open_qa_benchmark.READER_OVERRIDES``: 900 steps of 8 questions,
each with its gold block and 2 BM25 negatives, SQuAD + the NQ training split). The import-started reader is the
``reader`` stage of an ``open_qa_benchmark.py`` run (``--baseline``, e.g. ``runs/bench/qa4``); this script trains
the other from ``--pretrained`` (``qa.reader_checkpoint``) and compares:

- the warm start's training batches, each question read for the first time (progressive validation: loss and
  span accuracy by window of steps);
- EM / F1 of each warm-started reader on the dev split's gold blocks (``evaluate --retriever gold``; the dev
  questions are never trained on).

Stages (``<out>/stages.json``; a killed stage resumes from its checkpoint):

    nohup .venv/bin/python benchmarks/realm_pretraining_benchmark.py --out runs/bench/realm \\
        --set data.batch_size=4 > runs/bench/realm.log 2>&1 &        # REALM pre-training first (resumable)
    nohup .venv/bin/python benchmarks/reader_start_benchmark.py --pretrained runs/bench/realm/model \\
        --baseline runs/bench/qa4 --out runs/bench/start > runs/bench/start.log 2>&1 &
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import numpy as np  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import open_qa_benchmark  # noqa: E402  (benchmarks/)
import reader_levers  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)
import scalar_windows  # noqa: E402  (benchmarks/)


def windows(logdir: str, tag: str, window: int) -> list[tuple[int, int, float, int]]:
    """Window means of ``tag`` in the TensorBoard logs of ``logdir``."""
    rows = scalar_windows.window_means(scalar_windows.read_scalars(logdir).get(tag, {}), window)
    if not rows:
        raise SystemExit(f"reader_start_benchmark: no `{tag}` scalars under {logdir}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--pretrained", required=True,
                        help="REALM pre-training model_dir (its checkpoint's reader starts the warm start)")
    parser.add_argument("--baseline", required=True,
                        help="an open_qa_benchmark.py run directory whose `reader` stage (import start) is done; "
                             "its blocks, index and retriever initialisation are used for the dev evaluation")
    parser.add_argument("--blocks", default="runs/bench/blocks", help="the bundled corpus, preprocessed")
    parser.add_argument("--out", default="runs/bench/start")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--window", type=int, default=150, help="steps per progressive-validation window")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()

    base, out = args.baseline.rstrip("/"), args.out.rstrip("/")
    for path in (os.path.join(base, "reader", "checkpoints"), args.pretrained):
        if not os.path.isdir(path):
            raise SystemExit(f"reader_start_benchmark: {path} is missing (see this script's docstring)")
    common = [f"data.blocks_dir={args.blocks}", f"index.index_dir={base}/index",
              f"model.retriever_checkpoint={base}/retriever_init", "data.batch_size=8",
              *open_qa_benchmark.READER_OVERRIDES, *args.overrides]
    sets = ["--config", args.config, *sum((["--set", o] for o in common), [])]
    readers = {"import": f"{base}/reader", "realm": f"{out}/reader_realm"}
    stage = stages.Stages(out)
    stage("reader_realm", lambda: stages.cli([
        "train-reader", *sets, "--set", f"reader.model_dir={readers['realm']}",
        "--set", f"qa.reader_checkpoint={args.pretrained}"]))
    gold = {name: stage(f"dev_gold_{name}", lambda name=name: open_qa_benchmark.evaluate(
        [*sets, "--questions", args.questions, "--split", "dev", "--retriever", "gold", "--model", readers[name],
         "--predictions", f"{out}/predictions-dev-gold-{name}.jsonl"], f"{out}/metrics-dev-gold-{name}.json"))
        for name in readers}

    print(f"\n== reader warm start from the import vs from REALM pre-training ({args.pretrained}): "
          f"{', '.join([*open_qa_benchmark.READER_OVERRIDES, *args.overrides])} ==")
    for tag in ("loss", "span_accuracy"):
        curves = {name: {first: (last, mean) for first, last, mean, _ in windows(os.path.join(path, "train"), tag,
                                                                                   args.window)}
                  for name, path in readers.items()}
        print(f"{tag} on training batches read for the first time (window means)")
        print(f"{'steps':>12}{'import':>10}{'REALM':>10}")
        for first in sorted(curves["import"].keys() & curves["realm"].keys()):
            (last_a, a), (last_b, b) = curves["import"][first], curves["realm"][first]
            print(f"{first:>6}-{min(last_a, last_b):<5}{a:>10.3f}{b:>10.3f}")
    for name, metrics in gold.items():
        print(f"dev gold blocks, reader started from {name}: EM {metrics['exact_match']:.3f}, F1 {metrics['f1']:.3f} "
              f"({metrics['num_questions']} questions)")
    print("stage minutes: " + stage.minutes())
    print(json.dumps({name: {k: gold[name][k] for k in ("exact_match", "f1", "num_questions")} for name in gold}))
    differences = {}  # the REALM start minus the import, questions paired
    for key in ("exact_match", "f1"):
        before, now = (reader_levers.per_question(f"{out}/predictions-dev-gold-{name}.jsonl", key)
                       for name in ("import", "realm"))
        ids = sorted(before.keys() & now.keys())
        differences[key] = reader_levers.paired_bootstrap(np.array([before[i] for i in ids]),
                                                          np.array([now[i] for i in ids]))
    (em, em_low, em_high), (f1, f1_low, f1_high) = differences["exact_match"], differences["f1"]
    better = em_low > 0 or f1_low > 0
    realm, imported = gold["realm"], gold["import"]
    result_records.write(
        "realm-pretraining-reader-start", area="REALM pre-training", order=50,
        verdict="holds" if better else "negative",
        claim="Starting the reader warm start from a REALM pre-training run is "
              + ("better than from the MiniLM import." if better else
                 "no better than from the MiniLM import, which stays the starting point."),
        figure=f"dev gold blocks, {realm['num_questions']} questions: EM {realm['exact_match']:.3f}, F1 "
               f"{realm['f1']:.3f} from REALM pre-training vs {imported['exact_match']:.3f} / {imported['f1']:.3f} "
               "from the import",
        interval=f"95% paired bootstrap, 10,000 resamples: EM {em:+.3f} [{em_low:+.3f}, {em_high:+.3f}], F1 "
                 f"{f1:+.3f} [{f1_low:+.3f}, {f1_high:+.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
