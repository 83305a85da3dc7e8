"""``realm-tf`` commands that train: the retriever's initialisation and ICT warm start, REALM pre-training
(Guu et al. 2020), the reader warm start, Open-QA fine-tuning and RETRO's decoder (Borgeaud et al. 2021)."""
from __future__ import annotations

import argparse

from realm_tf.commands import command
from realm_tf.commands import experiments


def _cmd_init_retriever(args: argparse.Namespace) -> int:
    """The imported retriever with its projection fitted to the corpus (model.projection_init), as a run."""
    from realm_tf.tasks import projection_init

    info = projection_init.init_retriever(command.load(args), args.out, args.blocks)
    print(f"init-retriever: wrote {args.out} (projection {info})")
    return 0


def _args_init_retriever(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument("--output", old=("--out",), dest="out", required=True,
                   help="run directory to write (then model.retriever_checkpoint / "
                        "qa.retriever_checkpoint / export-retriever --model-dir)")
    p.add_argument("--num-blocks", old=("--blocks",), dest="blocks", type=int, default=4096,
                   help="corpus blocks sampled to fit the projection")


def _cmd_train_ict(args: argparse.Namespace) -> int:
    """ICT warm start of the retriever, then a retriever export for the index builder."""
    from realm_tf.tasks import ict

    result = ict.train_ict(command.load(args), file_pattern=args.input)
    print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in result["train"].items()))
    print(f"exported retriever to {result['export']}")
    return command.training_exit_code(result)


def _args_train_ict(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument(
    "--input", default=None, help="ICT TFRecord pattern (default: data.ict_dir/ict-*.tfrecord*)")


def _cmd_pretrain(args: argparse.Namespace) -> int:
    """REALM pre-training with asynchronous index refresh; resumes from model_dir's latest checkpoint."""
    from beam_jobs import embed_blocks
    from realm_tf.tasks import realm_pretraining

    result = realm_pretraining.pretrain(command.load(args), pretraining_pattern=args.input, evaluate=not args.no_eval,
                                        eval_pattern=args.eval_input, index_builder=embed_blocks.embed_and_publish,
                                        train=not args.eval_only)
    print(realm_pretraining.format_result(result))
    if args.metrics:
        from realm_tf.core import evaluation

        evaluation.write_metrics({"step": result["step"], "train": result["train"], "eval": result.get("eval", {})},
                                 args.metrics)
    return command.training_exit_code(result)


def _args_pretrain(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument("--input", default=None,
                   help="pre-training TFRecords (default: data.pretraining_dir/pretraining-*)")
    p.add_argument("--eval-input", dest="eval_input", default=None,
                   help="pre-training TFRecords whose held-out salient spans are scored "
                        "at the end (default: --input); e.g. salient-span data for a run "
                        "trained on data.masking_strategy=random_span")
    p.add_argument("--no-eval", dest="no_eval", action="store_true",
                   help="skip the held-out evaluation at the end")
    p.add_argument("--eval-only", dest="eval_only", action="store_true",
                   help="train nothing: score the held-out salient spans of the latest checkpoint of "
                        "pretrain.model_dir (= realm-tf evaluate --experiment pretrain)")
    p.add_argument("--metrics", default=None, metavar="FILE.json",
                   help="also write the final step, training logs and held-out scores "
                        "to this file")


def _cmd_train_reader(args: argparse.Namespace) -> int:
    """Reader warm start on gold + negative blocks (resumable)."""
    from realm_tf.tasks import reader_warm_start

    result = reader_warm_start.train_reader(command.load(args), args.questions)
    print(f"train-reader: step {result['step']}: " + ", ".join(f"{k}={v:.4g}" for k, v in result["train"].items()))
    return command.training_exit_code(result)


def _args_train_reader(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument("--questions", nargs="*", default=(), metavar="FILE.jsonl",
                   help="{question, answers, gold_passage_ids} files (default: "
                        "qa.reader_questions); their dev and tune splits are held "
                        "out")


def _cmd_finetune(args: argparse.Namespace) -> int:
    """Open-QA fine-tuning on any {question, answers} JSONL (dev split held out); resumable."""
    from realm_tf.tasks import open_qa

    result = open_qa.finetune(command.load(args), args.train, retriever=args.retriever)
    print(f"finetune: step {result['step']}: " + ", ".join(f"{k}={v:.4g}" for k, v in result["train"].items()))
    return command.training_exit_code(result)


def _args_finetune(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument("--train", default=None, required=True, metavar="FILE.jsonl",
                   help="questions with answers (.jsonl or .jsonl.gz); the dev and tune "
                        "splits (data.qa_dev_fraction, qa_tune_fraction) are held out")
    p.add_argument("--retriever", choices=("dense", "bm25"), default="dense",
                   help="dense: retriever and reader trained together (ORQA); bm25: the "
                        "reader alone on BM25's top blocks (the BM25 + reader baseline)")


def _cmd_train_retro(args: argparse.Namespace) -> int:
    """Trains RETRO's decoder (or its baseline, or RETRO-fits a baseline) on the chunk database's documents."""
    from realm_tf.core import experiment
    from realm_tf.retro import retro_lm

    result = experiment.run_experiment(retro_lm.RetroLmTask(command.load(args), retrieval=not args.baseline))
    print(f"step {result['step']}: " + ", ".join(f"{k}={v:.4g}" for k, v in result["train"].items()))
    return command.training_exit_code(result)


def _args_train_retro(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument(
    "--baseline", action="store_true",
    help="the same decoder without retrieval (no RETRO layers): the baseline")


def _train(args: argparse.Namespace) -> int:
    """``realm-tf train --experiment NAME ARGS``: the experiment's own command with ARGS."""
    return experiments.forward(args, [experiments.EXPERIMENTS[args.experiment].train], args.experiment_args)


def _args_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiment", required=True, choices=sorted(experiments.EXPERIMENTS),
                   help=experiments.help_text("train"))
    p.epilog = ("Every other argument is the experiment's own (realm-tf train-ict --help, ...): --config FILE.yaml, "
                "--set KEY=VALUE, ...")
    command.keep_unknown_args(p, "experiment_args")


COMMANDS = [
    command.Command("train", "train a named experiment (--experiment ict, pretrain, reader, finetune, retro): its "
                    "command, generated from the experiment registry", _train, _args_train, starts_tensorflow=False,
                    group="train",
                    examples=("realm-tf train --experiment pretrain --config configs/minilm.yaml --set "
                              "pretrain.steps=1000",)),
    command.Command("init-retriever",
                    "the retriever from model.init_checkpoint with its projection fitted to the corpus "
                    "(model.projection_init: pca keeps an imported embedder's ranking), saved as a run",
                    _cmd_init_retriever, _args_init_retriever,
                    group="train",
                    examples=("realm-tf init-retriever --config configs/minilm.yaml --output "
                              "runs/minilm/retriever_init",)),
    command.Command("train-ict",
                    "train the retriever with the Inverse Cloze Task (resumable), then export it",
                    _cmd_train_ict, _args_train_ict,
                    group="train",
                    examples=("realm-tf train-ict --config configs/minilm.yaml --set ict.steps=400",)),
    command.Command("pretrain",
                    "REALM pre-training (salient spans, null doc, async index refresh); resumable",
                    _cmd_pretrain, _args_pretrain,
                    group="train",
                    examples=("realm-tf pretrain --config configs/minilm.yaml --set pretrain.steps=1000",
                              "realm-tf pretrain --config configs/minilm.yaml --eval-only",)),
    command.Command("train-reader",
                    "reader warm start: span reading on gold blocks next to BM25 negatives, before finetune; "
                    "resumable",
                    _cmd_train_reader, _args_train_reader,
                    group="train",
                    examples=("realm-tf train-reader --config configs/minilm.yaml --set reader.steps=500",)),
    command.Command("finetune",
                    "Open-QA fine-tuning (retriever + span reader) on a {question, answers} JSONL; resumable",
                    _cmd_finetune, _args_finetune,
                    group="train",
                    examples=("realm-tf finetune --config configs/minilm.yaml --train "
                              "data/open_qa/qa_qed_train.jsonl.gz",)),
    command.Command("train-retro",
                    "train RETRO's decoder on the chunk database's training documents, neighbours retrieved in the "
                    "input pipeline (resumable; retro.retro_fit_from RETRO-fits a baseline)",
                    _cmd_train_retro, _args_train_retro,
                    group="lm",
                    examples=("realm-tf train-retro --config configs/minilm.yaml",
                              "realm-tf train-retro --config configs/minilm.yaml --baseline",)),
]
