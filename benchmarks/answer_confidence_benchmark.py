"""Answer confidence on a fine-tuned Open-QA model: a calibrator fitted on the tune split, measured on dev against
the uncalibrated span probability, with span aggregation off (N = 1) and at the N chosen on tune.

Stages (each kept in ``<out>/stages.json`` and skipped on a rerun):

1. ``tune``: ``realm-tf evaluate --split tune`` with ``--aggregate-spans`` candidates; N is the one of best tune
   EM (ties: the smallest), or 1;
2. for N = 1 and the chosen N: ``tune-N`` (its tune predictions), ``calibrate-N`` (``realm-tf calibrate``, kinds
   ``features`` and ``platt``), ``dev-N`` (``realm-tf evaluate --split dev`` with the features calibrator; the
   Platt confidence is computed from the same dev features);
3. ``report``: per N and confidence (score, Platt, features) the selective figures with 95% bootstrap intervals,
   the paired differences against the score, and the threshold chosen on tune for precision 0.8 with what it
   gives on dev; a reliability diagram of dev at N = 1; ``--record`` writes the result records.

The model is the one ``benchmarks/open_qa_benchmark.py`` trains (``--run``: its ``--out``; the same ``--set``)::

    nohup .venv/bin/python benchmarks/answer_confidence_benchmark.py --run runs/bench/qa5 \\
        --set model.projection_size=384 --set model.projection_init=pca \\
        --set model.retrieval_temperature=19.5959 --record > runs/bench/qa5/confidence.log 2>&1 &
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import numpy as np  # noqa: E402

from realm_tf import config as config_lib  # noqa: E402
from realm_tf.tasks import answer_calibration  # noqa: E402
from realm_tf.tasks import selective_qa  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

AGGREGATIONS = (5, 10, 30)  # the candidates for N, on tune
TARGET_PRECISION = 0.8


def _evaluate(sets: list[str], args: list[str]) -> dict[str, Any]:
    """``realm-tf evaluate``'s metrics (its last stdout line)."""
    return json.loads(stages.cli(["evaluate", *sets, *args], capture=True).strip().splitlines()[-1])


def _choose_aggregation(metrics: dict[str, Any]) -> int:
    """N of the best tune EM among 1 and :data:`AGGREGATIONS` (the smallest on a tie)."""
    scores = {1: metrics["exact_match"], **{n: metrics[f"exact_match@agg={n}"] for n in AGGREGATIONS}}
    return max(sorted(scores), key=lambda n: (scores[n], -n))


def _confidences(predictions: list[dict[str, Any]],
                 calibrators: dict[str, answer_calibration.Calibrator]) -> dict[str, np.ndarray]:
    """``{score, platt, features}``: each answer's three confidences, from its recorded features."""
    features = answer_calibration.prediction_features(predictions)
    return {"score": np.array([p["score"] for p in predictions]),
            **{kind: calibrator.confidence(features) for kind, calibrator in calibrators.items()}}


def _report(out: str, n: int) -> dict[str, Any]:
    """The figures of aggregation ``n`` (module docstring, stage 3)."""
    calibrators = {kind: answer_calibration.read_calibrator(f"{out}/calibrator-{kind}-{n}.json")
                   for kind in ("platt", "features")}
    tune = answer_calibration.read_predictions(f"{out}/predictions-tune-{n}.jsonl")
    dev = answer_calibration.read_predictions(f"{out}/predictions-dev-{n}.jsonl")
    tune_conf, dev_conf = _confidences(tune, calibrators), _confidences(dev, calibrators)
    # evaluate computed dev's confidence with the features calibrator: the same as from its recorded features
    assert np.allclose([p["confidence"] for p in dev], dev_conf["features"], atol=1e-4)
    tune_hit = [p["exact_match"] for p in tune]
    dev_hit = [p["exact_match"] for p in dev]
    report: dict[str, Any] = {"num_tune": len(tune), "num_dev": len(dev)}
    for name, conf in dev_conf.items():
        threshold = selective_qa.threshold_for_precision(tune_conf[name], tune_hit, TARGET_PRECISION)
        report[name] = {**selective_qa.selective_metrics(conf, dev_hit),
                        "precision_at_coverage_0.2": selective_qa.precision_at_coverage(conf, dev_hit, 0.2),
                        f"at_tune_threshold_{TARGET_PRECISION}": selective_qa.at_threshold(conf, dev_hit, threshold)}
        if name != "score":
            report[name]["minus_score"] = selective_qa.paired_differences(conf, dev_conf["score"], dev_hit)
    if n == 1:
        selective_qa.write_reliability_diagram(
            f"{out}/reliability-dev-calibrators.png", {k: (v, dev_hit) for k, v in dev_conf.items()},
            f"dev: {len(dev)} questions, N = 1")
    return report


def _interval(figure: dict[str, float]) -> str:
    return f"{figure['value']:.3f} [{figure['low']:.3f}, {figure['high']:.3f}]"


def _model_setting(run: str) -> str:
    """How the run's model was trained (its fine-tuning run's saved config): the steps change what the figures
    mean."""
    cfg = config_lib.load_config(os.path.join(run, "finetune", "params.yaml"))
    return (f"model: reader warm start {cfg.reader.steps:,} steps, Open-QA fine-tuning {cfg.finetune.steps:,} steps "
            f"at batch {cfg.data.batch_size}")


def _record(report: dict[str, Any], chosen: int, model: str) -> None:
    """The result records: the calibrated confidence against the span probability on dev, N = 1 and chosen."""
    for n, row in report.items():
        score, fit = row["score"], row["features"]
        delta = fit["minus_score"]
        figure = (f"{model}; {row['num_dev']} dev questions (calibrator fitted on {row['num_tune']} tune), span "
                  f"aggregation "
                  f"N = {n}: ECE {_interval(fit['ece'])} against {_interval(score['ece'])}, Brier "
                  f"{_interval(fit['brier'])} against {_interval(score['brier'])}, AURC {_interval(fit['aurc'])} "
                  f"against {_interval(score['aurc'])}, precision at 20% coverage "
                  f"{fit['precision_at_coverage_0.2']:.3f} against {score['precision_at_coverage_0.2']:.3f}")
        goals = (fit["ece"]["high"] <= 0.08 and fit["ece"]["high"] < score["ece"]["high"]
                 and delta["brier"]["high"] < 0 and fit["precision_at_coverage_0.2"] >= 0.8
                 and fit["aurc"]["value"] <= 0.8 * score["aurc"]["value"] and delta["aurc"]["high"] < 0)
        result_records.write(
            f"open-qa-answer-confidence-agg-{n}", area="Open-QA", order=60 + n, verdict="holds" if goals else "open",
            claim=f"A logistic calibrator over the answer's features (tune-fitted) gives each answer a probability of "
                  f"being right{' (N chosen on tune)' if n == chosen and n != 1 else ''}.",
            figure=figure, interval=f"95% bootstrap over dev questions; paired differences: ECE "
                                    f"{_interval(delta['ece'])}, Brier {_interval(delta['brier'])}, AURC "
                                    f"{_interval(delta['aurc'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--run", required=True, help="the open_qa_benchmark.py run directory (its --out)")
    parser.add_argument("--blocks", default="runs/bench/blocks", help="the bundled corpus, preprocessed")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--out", default=None, help="default: <run>/confidence")
    parser.add_argument("--record", action="store_true", help="write the result records")
    args = parser.parse_args()
    run, out = args.run, args.out or os.path.join(args.run, "confidence")
    overrides = [f"data.blocks_dir={args.blocks}", f"index.index_dir={run}/index", f"finetune.model_dir={run}/finetune",
                 "data.batch_size=4", *args.overrides]
    sets = ["--config", args.config, *sum((["--set", o] for o in overrides), [])]
    stage = stages.Stages(out)
    questions = ["--questions", args.questions]
    tuned = stage("tune", lambda: _evaluate(sets, [*questions, "--split", "tune", "--predictions",
                                                   f"{out}/predictions-tune-choice.jsonl", "--aggregate-spans",
                                                   *map(str, AGGREGATIONS)]))
    chosen = _choose_aggregation(tuned)
    report = {}
    for n in sorted({1, chosen}):
        agg = ["--set", f"qa.answer_aggregation_spans={n}"]
        stage(f"tune-{n}", lambda agg=agg, n=n: _evaluate(sets, [*agg, *questions, "--split", "tune", "--predictions",
                                                                 f"{out}/predictions-tune-{n}.jsonl"]))
        for kind in ("features", "platt"):
            stage(f"calibrate-{kind}-{n}", lambda kind=kind, n=n: stages.cli([
                "calibrate", "--predictions", f"{out}/predictions-tune-{n}.jsonl", "--kind", kind,
                "--output", f"{out}/calibrator-{kind}-{n}.json"], capture=True))
        stage(f"dev-{n}", lambda agg=agg, n=n: _evaluate(sets, [
            *agg, "--set", f"qa.confidence_calibrator={out}/calibrator-features-{n}.json", *questions, "--split", "dev",
            "--predictions", f"{out}/predictions-dev-{n}.jsonl"]))
        report[n] = _report(out, n)
    config_path = os.path.join(out, "report.json")
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump({"chosen_aggregation": chosen, "report": report}, f, indent=1)
    for n, row in report.items():
        for name in ("score", "platt", "features"):
            r = row[name]
            print(f"N={n} {name:<9} ECE {_interval(r['ece'])}  Brier {_interval(r['brier'])}  AURC "
                  f"{_interval(r['aurc'])}  precision@20% {r['precision_at_coverage_0.2']:.3f}  "
                  f"tune threshold for {TARGET_PRECISION}: {json.dumps(r[f'at_tune_threshold_{TARGET_PRECISION}'])}")
    print(f"report: {config_path}; reliability diagram: {out}/reliability-dev-calibrators.png")
    if args.record:
        _record(report, chosen, _model_setting(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
