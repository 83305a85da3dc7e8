"""Issue #15 §5: the demo's reader warm start with the question files mixed by temperature
(``qa.reader_source_temperature``, p_i ∝ n_i^T: Arivazhagan et al., 2019; Conneau et al., 2020).

The demo's warm start reads SQuAD (about 9,000 training questions) and the training split of its NQ sample (about
700) from one shuffled pool, so 6% of what it reads is in the domain it is evaluated on. This script repeats a
demo workspace's ``train-reader`` stage (its data, start and rates; step-capped, so the comparison does not depend
on the machine's load) at each temperature, then measures every reader on **gold blocks of the benchmark's dev
split** (``evaluate --retriever gold`` over the whole bundled corpus), leaving out the demo's own held-out
questions, so that the choice is not made on the questions the demo reports.

    .venv/bin/python benchmarks/reader_mixture_benchmark.py --workdir runs/demo --steps 786 \\
        --temperatures 1.0 0.5 --reuse 1.0=runs/demo/reader --out runs/bench/mixture

``--all-nq`` reads every bundled NQ training question (the benchmark's reading set) instead of the workspace's
sample of them. (``--reuse T=DIR``: a reader already trained with the workspace's stage at that temperature and step
count, e.g. the demo's own at T = 1.) Stages resume (``<out>/stages.json``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf import config as config_lib  # noqa: E402
from realm_tf.data import question_split  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import open_qa_benchmark  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)
import scalar_windows  # noqa: E402  (benchmarks/)


def held_out_ids(questions_path: str, fraction: float) -> set[str]:
    """The ids of a demo workspace's held-out questions (its `questions.jsonl`, dev split)."""
    with open(questions_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return {str(r["id"]) for r in rows if question_split.is_dev(str(r["id"]), fraction)}


def read_predictions(path: str) -> list[dict]:
    """The rows of an ``evaluate --predictions`` file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def right_ids(rows: list[dict], excluded: set[str]) -> set[str]:
    """The ids of the questions answered exactly, outside ``excluded``."""
    return {str(r["id"]) for r in rows if r["exact_match"] and str(r["id"]) not in excluded}


def mcnemar_p(alone: int, other_alone: int) -> float:
    """Exact two-sided McNemar p of a paired comparison with these discordant counts."""
    n, low = alone + other_alone, min(alone, other_alone)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(low + 1)) / 2 ** n) if n else 1.0


def scores(rows: list[dict], excluded: set[str], inside: bool = False) -> dict[str, float]:
    """EM / F1 over the questions of ``rows`` not in ``excluded`` (``inside``: only those in it)."""
    kept = [r for r in rows if (str(r["id"]) in excluded) == inside]
    return {"exact_match": sum(bool(r["exact_match"]) for r in kept) / len(kept),
            "f1": sum(float(r["f1"]) for r in kept) / len(kept), "num_questions": len(kept),
            "left_out": len(rows) - len(kept)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a `realm-tf demo` workspace (its params.yaml and data)")
    parser.add_argument("--steps", type=int, required=True, help="warm-start steps of every reader")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.5])
    parser.add_argument("--reuse", action="append", default=[], metavar="T=DIR",
                        help="a reader trained before at temperature T (same stage, same steps)")
    parser.add_argument("--blocks", default="runs/bench/blocks", help="the whole bundled corpus, preprocessed")
    parser.add_argument("--baseline", default="runs/bench/qa4",
                        help="an open_qa_benchmark.py run (its index and retriever initialisation build the model)")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--out", default="runs/bench/mixture")
    parser.add_argument("--window", type=int, default=200, help="steps per progressive-validation window")
    parser.add_argument("--against", metavar="PREDICTIONS.jsonl", action="append", default=[],
                        help="another reader's dev gold-block predictions (repeatable): its EM on the same questions "
                             "(outside the demo's held-out ones), the questions each gets right alone and the exact "
                             "two-sided McNemar p of that split")
    parser.add_argument("--all-nq", action="store_true",
                        help="read the training split of the whole --questions file over --blocks (every bundled "
                             "NQ training question, as the benchmark's warm start does) instead of the workspace's "
                             "NQ sample over its own blocks")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of every warm start trained here (repeatable), e.g. "
                             "reader.precision=mixed_bfloat16; name the variant with --tag")
    parser.add_argument("--tag", default="", help="appended to the readers' and stages' names (a variant of --set)")
    args = parser.parse_args()

    work, out, base = args.workdir.rstrip("/"), args.out.rstrip("/"), args.baseline.rstrip("/")
    params = os.path.join(work, "params.yaml")
    cfg = config_lib.load_config(params, [])
    reused = {float(t): d for t, d in (item.split("=", 1) for item in args.reuse)}
    tag = args.tag
    readers = {t: reused.get(t, f"{out}/reader_t{t:g}{tag}") for t in args.temperatures}
    stage = stages.Stages(out)
    for t, reader in readers.items():
        if t in reused:
            continue
        # The demo's stage 6 (realm_tf/demo.py), with a step cap in place of its minutes.
        stage(f"reader_t{t:g}{tag}", lambda t=t, reader=reader: stages.cli([
            "train-reader", "--config", params, "--set", f"reader.model_dir={reader}",
            "--set", f"qa.reader_checkpoint={cfg.pretrain.model_dir}", "--set", "data.batch_size=8",
            "--set", f"reader.steps={args.steps}", "--set", "reader.max_minutes=100000",
            "--set", f"qa.reader_source_temperature={t}", *(x for item in args.sets for x in ("--set", item)),
            *(["--set", f"data.blocks_dir={args.blocks}"] if args.all_nq else []),
            "--questions", f"{work}/squad.jsonl", args.questions if args.all_nq else f"{work}/questions.jsonl"]))
    sets = ["--config", params, "--set", f"data.blocks_dir={args.blocks}", "--set", f"index.index_dir={base}/index",
            "--set", f"model.retriever_checkpoint={base}/retriever_init"]
    excluded = held_out_ids(f"{work}/questions.jsonl", cfg.data.qa_dev_fraction)
    results, demo_held_out, right = {}, {}, {}
    for t, reader in readers.items():
        predictions = f"{out}/predictions-dev-gold-t{t:g}{tag}.jsonl"
        stage(f"dev_gold_t{t:g}{tag}", lambda reader=reader, predictions=predictions, t=t: open_qa_benchmark.evaluate(
            [*sets, "--questions", args.questions, "--split", "dev", "--retriever", "gold", "--model", reader,
             "--predictions", predictions], f"{out}/metrics-dev-gold-t{t:g}{tag}.json"))
        rows = read_predictions(predictions)
        results[t], demo_held_out[t] = scores(rows, excluded), scores(rows, excluded, inside=True)
        right[t] = right_ids(rows, excluded)

    reading = f"SQuAD + every NQ training question of {args.questions}" if args.all_nq else "SQuAD + its NQ sample"
    settings = f"; {', '.join(args.sets)}" if args.sets else ""
    print(f"\n== the demo's reader warm start ({work}, {args.steps} steps of 8; {reading}{settings}) by source "
          "temperature ==")
    for tag in ("loss", "span_accuracy"):
        print(f"{tag} on training batches (window means)")
        curves = {t: scalar_windows.window_means(scalar_windows.read_scalars(os.path.join(d, "train")).get(tag, {}),
                                                 args.window) for t, d in readers.items()}
        for t, rows in curves.items():
            print(f"  T={t:<4g} " + "  ".join(f"{first}-{last}: {mean:.3f}" for first, last, mean, _ in rows))
    for t, r in results.items():
        print(f"T={t:g}: dev gold blocks EM {r['exact_match']:.3f}, F1 {r['f1']:.3f} ({r['num_questions']} questions; "
              f"the demo's {r['left_out']} held-out ones left out)")
    first = args.temperatures[0]
    for t in args.temperatures[1:]:  # the discordant pairs: what a paired (McNemar) comparison looks at
        print(f"right at T={t:g} only: {len(right[t] - right[first])}; right at T={first:g} only: "
              f"{len(right[first] - right[t])}")
    for path in args.against:
        rows = read_predictions(path)
        there, other = scores(rows, excluded), right_ids(rows, excluded)
        for t in args.temperatures:
            alone, other_alone = len(right[t] - other), len(other - right[t])
            p = mcnemar_p(alone, other_alone)
            print(f"T={t:g} vs {path} (EM {there['exact_match']:.3f}, F1 {there['f1']:.3f} on its "
                  f"{there['num_questions']}): right here only {alone}, right there only {other_alone} "
                  f"(exact McNemar p = {p:.3f})")
    for t, r in demo_held_out.items():  # not what the choice is made on: how hard the demo's own questions are
        print(f"T={t:g}: the demo's own held-out questions on their gold blocks: EM {r['exact_match']:.3f}, "
              f"F1 {r['f1']:.3f} ({r['num_questions']} questions)")
    print("stage minutes: " + stage.minutes())
    print(json.dumps({f"{t:g}": r for t, r in results.items()}))
    if len(args.temperatures) == 2 and not args.sets and not args.all_nq:  # one temperature against the other
        t = args.temperatures[1]
        alone, other_alone = len(right[t] - right[first]), len(right[first] - right[t])
        p = mcnemar_p(alone, other_alone)
        better = results[t]["exact_match"] > results[first]["exact_match"] and p < 0.05
        result_records.write(
            "open-qa-reader-source-temperature", area="Open-QA", order=100, verdict="holds" if better else "negative",
            claim=f"Drawing the warm start's NQ questions {'more' if t < first else 'less'} often (source temperature "
                  f"T = {t:g}) {'gives' if better else 'does not give'} a better reader than T = {first:g}.",
            figure=f"dev gold blocks, {results[t]['num_questions']} questions: EM {results[t]['exact_match']:.3f} vs "
                   f"{results[first]['exact_match']:.3f}, F1 {results[t]['f1']:.3f} vs {results[first]['f1']:.3f}; "
                   f"discordant {alone} to {other_alone} (McNemar p = {p:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
