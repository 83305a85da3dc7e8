"""``realm-tf`` commands of Open-QA (REALM, Guu et al. 2020, §4): evaluation, the retriever and Open-QA
exports, and answering questions with an exported model."""
from __future__ import annotations

import argparse
import os

from realm_tf import errors
from realm_tf.commands import command
from realm_tf.commands import experiments


def _cmd_evaluate(args: argparse.Namespace) -> int:
    """Open-QA evaluation; the last line printed is one JSON object of the metrics."""
    import json

    from realm_tf.tasks import open_qa

    cfg = command.load(args)
    reader = args.experiment == "reader"  # the reader warm start reads each question's gold blocks
    metrics = open_qa.evaluate(cfg, args.questions, split=args.split,
                               model_dir=args.model or (cfg.reader.model_dir if reader else None),
                               index_dir=args.index, predictions_path=args.predictions,
                               retriever=args.retriever or ("gold" if reader else "dense"),
                               score_weights=args.score_weights, aggregations=args.aggregations,
                               length_biases=args.length_biases, metrics_path=args.metrics,
                               target_precision=args.target_precision)
    print(f"predictions: {metrics['predictions']} (reliability diagram: {metrics['reliability_diagram']})")
    short = metrics["short_answers"]
    print(f"NQ-open's questions (an answer of at most {short['max_tokens']} tokens, scored against those): "
          f"{short['num_questions']} of {metrics['num_questions']}, EM {short['exact_match']:.3f}, "
          f"F1 {short['f1']:.3f}")
    print(_selective_line(metrics["selective"]))
    if "selective_score" in metrics:
        print(_selective_line(metrics["selective_score"]))
    if "abstention" in metrics:
        print(_abstention_line(metrics["abstention"]))
    if args.errors:
        from realm_tf.tasks import answer_errors

        print(answer_errors.format_table(metrics["outcomes"]))
    print(json.dumps({k: v for k, v in metrics.items() if k != "predictions"}, sort_keys=True))
    return 0


def _selective_line(selective: dict) -> str:
    """The selective-QA figures of the answers' score, with their 95% bootstrap intervals, on one line."""
    def figure(name: str) -> str:
        f = selective[name]
        return f"{f['value']:.3f} [{f['low']:.3f}, {f['high']:.3f}]"
    return (f"abstaining below a {selective['confidence']} threshold: AURC {figure('aurc')} (lower is better), "
            f"coverage at precision 0.8 {figure('coverage_at_precision_0.8')}, at 0.9 "
            f"{figure('coverage_at_precision_0.9')}; calibration: ECE {figure('ece')}, Brier {figure('brier')}")


def _abstention_line(abstention: dict) -> str:
    """What the threshold chosen on tune for a target precision does on tune and on the evaluated split."""
    tune, here = abstention["tune"], abstention["evaluated"]
    return (f"abstaining below confidence {tune['threshold']:.4f} (chosen on tune for precision "
            f"{abstention['target_precision']:g}): tune coverage {tune['coverage']:.3f} at precision "
            f"{tune['precision']:.3f}; here coverage {here['coverage']:.3f} ({here['answered']} answered) at precision "
            f"{here['precision']:.3f}")


def _args_evaluate(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument("--experiment", choices=sorted(experiments.EXPERIMENTS), default="finetune",
                   help="the experiment to score (default finetune); " + experiments.help_text("evaluate") +
                        ". Every other argument is then that command's own")
    p.add_argument("--questions", required=True, metavar="FILE.jsonl",
                   help="questions with answers (and optional gold_passage_ids)")
    p.add_argument("--split", choices=("all", "dev", "tune", "train"), default="all",
                   help="evaluate all questions, or the held-out dev / tune, or the "
                        "train part")
    p.add_argument("--score-weights", dest="score_weights", type=float, nargs="*",
                   default=(), metavar="W",
                   help="also report EM/F1 with the answer picked by S_read + W·S_retr "
                        "for each W (choose qa.retrieval_score_weight on --split tune)")
    p.add_argument("--aggregate-spans", dest="aggregations", type=int, nargs="*",
                   default=(), metavar="N",
                   help="also report EM/F1 with the probabilities of the best N spans "
                        "summed by answer text, for each N (choose "
                        "qa.answer_aggregation_spans on --split tune)")
    p.add_argument("--length-biases", dest="length_biases", type=float, nargs="*",
                   default=(), metavar="B",
                   help="also report EM/F1 with answers picked with a span length bias of B per wordpiece, for "
                        "each B (choose qa.span_length_bias on --split tune)")
    p.add_argument("--model", default=None,
                   help="the run directory (default: finetune.model_dir; reader.model_dir with "
                        "--experiment reader)")
    p.add_argument("--index", default=None, help="index root (default: index.index_dir)")
    p.add_argument("--predictions", default=None,
                   help="predictions JSONL (default: <model>/predictions-<split>.jsonl)")
    p.add_argument("--metrics", default=None, metavar="FILE.json",
                   help="also write the metrics (and the predictions' path) to this file")
    p.add_argument("--errors", action="store_true",
                   help="print where the answers went wrong: each question in one outcome "
                        "(too long, too short, partial overlap, answer not read, right "
                        "block wrong span, wrong block), with its share")
    p.add_argument("--target-precision", dest="target_precision", type=float, default=None, metavar="P",
                   help="also evaluate the tune split, choose there the confidence threshold whose answers are "
                        "right at least P of the time, and report the coverage and precision it gives here")
    p.add_argument("--retriever", choices=("dense", "bm25", "gold"), default=None,
                   help="dense (default): the model's retriever; bm25: BM25's top blocks read by the "
                        "same reader (the baseline; needs bm25s); gold (default of --experiment reader): the gold "
                        "block holding the answer alone (reading comprehension)")


def _cmd_export_retriever(args: argparse.Namespace) -> int:
    """Exports embed_query / embed_block from the config's init_checkpoint, or a trained model_dir (an ICT,
    REALM pre-training or Open-QA fine-tuning run: :func:`warm_start.restore_from_run` knows their layouts and
    fails if the retriever's variables are not all in the checkpoint)."""
    from realm_tf.core import warm_start

    result = warm_start.export_retriever_of_run(command.load(args), args.model_dir, args.from_init, args.step)
    print(warm_start.format_retriever_export(result))
    return 0


def _args_export_retriever(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument("--from-init", action="store_true",
                   help="export model.init_checkpoint, ignoring any checkpoint")
    p.add_argument("--model_dir", default=None,
                   help="training dir whose latest checkpoint to export "
                        "(default: ict.model_dir)")
    p.add_argument("--step", type=int, default=0,
                   help="version number of the export (default: checkpoint step)")


def _cmd_export(args: argparse.Namespace) -> int:
    """Exports the fine-tuned Open-QA model (search, reading, decoding in the graph) for TF Serving: one SavedModel
    (``--out``), or the next numbered version under a model base path (``--base-path``), or (``--corpus-only``)
    a version with the weights of the newest one over the newest index version's corpus."""
    from realm_tf.export import open_qa_export
    from realm_tf.tasks import open_qa

    cfg = command.load(args)
    if args.corpus_only:
        if not args.base_path:
            raise errors.UserError("--corpus-only needs --base-path (the served model to take the weights from)")
        path = open_qa_export.publish_corpus_update(cfg, args.base_path, index_dir=args.index)
        print(f"exported {path}: the weights of the previous version, the corpus of the newest index version")
        return 0
    path = open_qa.export_for_serving(cfg, args.out, model_dir=args.model, index_dir=args.index,
                                      base_path=args.base_path)
    print(f"exported the Open-QA model to {path} (serving_default: question -> answer, score, blocks)")
    return 0


def _add_export_destination_args(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base_path", default=None, metavar="DIR",
                       help="TF Serving's model base path: write DIR/<n>, the version after the newest")
    where.add_argument("--output", old=("--out",), dest="out", default=None, metavar="DIR",
                       help="one SavedModel directory")
    parser.add_argument("--corpus_only", action="store_true",
                        help="with --base-path: a new version with the weights of the newest one and the corpus of the "
                             "newest index version (after realm-tf update-corpus; no model is built, nothing embedded)")


def _args_export(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    _add_export_destination_args(p)
    p.add_argument("--model", default=None,
                   help="fine-tuning run directory (default: finetune.model_dir)")
    p.add_argument("--index", default=None, help="index root (default: index.index_dir)")


def _cmd_ask(args: argparse.Namespace) -> int:
    """Answers questions with an exported Open-QA model."""
    from realm_tf.serving import answerer

    answerer.ask(args.model or default_model(), args.questions, snippet=args.snippet,
                 min_confidence=args.min_confidence)
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    """Fits the answer confidence on an evaluation's predictions (of a split no training read: tune)."""
    from realm_tf.tasks import answer_calibration
    from realm_tf.tasks import selective_qa

    predictions = answer_calibration.read_predictions(args.predictions)  # read once: fitted, then scored
    calibrator = answer_calibration.fit_predictions(args.predictions, kind=args.kind, l2=args.l2,
                                                    predictions=predictions)
    answer_calibration.write_calibrator(calibrator, args.output)
    correct = [p["exact_match"] for p in predictions]
    fitted = calibrator.confidence(answer_calibration.prediction_features(predictions, args.predictions))
    raw = [p["score"] for p in predictions]
    print(f"calibrator ({calibrator.kind}) fitted on {len(predictions)} answers of {args.predictions} "
          f"(exact match {calibrator.fitted_on['accuracy']:.3f}): {args.output}")
    print(f"on those answers (in-sample): ECE {selective_qa.expected_calibration_error(fitted, correct):.3f} "
          f"(span probability {selective_qa.expected_calibration_error(raw, correct):.3f}), AURC "
          f"{selective_qa.aurc(fitted, correct):.3f} ({selective_qa.aurc(raw, correct):.3f}); measure it on "
          f"another split: realm-tf evaluate --set qa.confidence_calibrator={args.output}")
    return 0


def _args_calibrate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--predictions", required=True, metavar="FILE.jsonl",
                   help="the predictions of `realm-tf evaluate` on a split no training stage read (--split tune)")
    p.add_argument("--output", required=True, metavar="FILE.json", help="the calibrator file written")
    p.add_argument("--kind", choices=("features", "platt"), default="features",
                   help="features (default): a logistic regression over the answer's features; platt: over the "
                        "span probability's logit alone (monotone: calibrates, cannot re-rank)")
    p.add_argument("--l2", type=float, default=0.01, help="L2 penalty on the standardised weights, per answer")


#: Where ``ask`` looks for a served model when ``--model`` is not given, in this order: the model of the
#: configs/minilm.yaml guides' export, then ``make demo``'s.
DEFAULT_MODELS = ("runs/minilm/served", "runs/demo/served")


def default_model() -> str:
    """The first of :data:`DEFAULT_MODELS` that holds an export; a UserError naming them and ``--model`` when
    none does."""
    for path in DEFAULT_MODELS:
        if os.path.isdir(path):
            return path
    raise errors.UserError(f"no served model at {' or '.join(DEFAULT_MODELS)} (from {os.getcwd()}): run `make demo` "
                           f"or `realm-tf export`, or pass --model PATH, the export's base path")


def _args_ask(p: argparse.ArgumentParser) -> None:
    p.add_argument("questions", nargs="+", help="one or more questions")
    p.add_argument("--model", default=None,
                   help="a model base path (its newest complete version is served) or one export (default: the "
                        "first of " + ", ".join(DEFAULT_MODELS) + " that exists)")
    p.add_argument("--snippet", type=int, default=160, help="characters of each block shown")
    p.add_argument("--min-confidence", dest="min_confidence", type=float, default=0.0, metavar="P",
                   help="answer only where the answer's confidence is at least P, else say \"no answer\" and show "
                        "the best candidate (default 0: always answer)")


COMMANDS = [
    command.Command("evaluate",
                    "Open-QA evaluation: EM, regex match, retrieval accuracy@k, reader oracle, predictions JSONL",
                    _cmd_evaluate, _args_evaluate,
                    group="qa",
                    examples=("realm-tf evaluate --config configs/minilm.yaml --questions "
                              "data/open_qa/qa_qed_train.jsonl.gz --split dev",
                              "realm-tf evaluate --experiment pretrain --config configs/minilm.yaml",)),
    command.Command("export-retriever",
                    "export embed_query/embed_block SavedModel to refresh.export_dir/<step>/",
                    _cmd_export_retriever, _args_export_retriever,
                    group="index",
                    examples=("realm-tf export-retriever --config configs/minilm.yaml --model-dir runs/minilm/model",)),
    command.Command("export",
                    "export the fine-tuned Open-QA model as one SavedModel for TF Serving (MIPS in the graph)",
                    _cmd_export, _args_export,
                    group="qa",
                    examples=("realm-tf export --config configs/minilm.yaml --base-path runs/minilm/served",)),
    command.Command("ask",
                    "answer questions with an exported Open-QA model: answer, score and the evidence blocks",
                    _cmd_ask, _args_ask,
                    group="qa",
                    examples=("realm-tf ask \"who wrote the origin of species?\" --model runs/minilm/served",
                              "realm-tf ask \"who wrote the origin of species?\" --min-confidence 0.6",)),
    command.Command("calibrate",
                    "fit the answers' confidence (a probability of being right) on an evaluation's predictions",
                    _cmd_calibrate, _args_calibrate,
                    group="qa",
                    examples=("realm-tf calibrate --predictions runs/minilm/finetune/predictions-tune.jsonl "
                              "--output runs/minilm/calibrator.json",
                              "realm-tf calibrate --predictions runs/minilm/finetune/predictions-tune.jsonl "
                              "--kind platt --output runs/minilm/calibrator-platt.json",)),
]
