"""``realm-tf`` commands of RETRO (Borgeaud et al. 2021) and kNN-LM (Khandelwal et al. 2020): bits-per-byte,
generation and the SavedModel export."""
from __future__ import annotations

import argparse

from realm_tf.commands import command


def _cmd_evaluate_lm(args: argparse.Namespace) -> int:
    """Bits-per-byte of a trained decoder on held-out documents; the last line printed is one JSON object."""
    import json

    from realm_tf.retro import lm_evaluation

    cfg = command.load(args)
    result = lm_evaluation.evaluate(cfg, args.model or cfg.retro_trainer.model_dir, retrieval=not args.baseline,
                                    split=args.split, database=args.database, neighbours=not args.retrieval_off,
                                    knn=args.knn, documents=args.documents)
    if args.documents:
        print(f"{result['documents']} documents of {args.documents} ({result['document_chunks']} chunks); "
              f"withheld from the database as copies of them: {len(result['withheld'])}")
    for alpha, bpb in result["bpb"].items():
        knn = f", with kNN-LM {result['knn_bpb'][alpha]:.4f}" if args.knn else ""
        print(f"alpha <= {alpha}: bpb {bpb:.4f} over {result['chunks'][alpha]} chunks{knn}")
    print(f"(bits per byte of the documents' original UTF-8 text, {result['bytes']} bytes; per byte of their "
          f"detokenised wordpieces, {result['wordpiece_bytes']} bytes: {result['bpb_wordpieces']['1.0']:.4f} at "
          f"alpha <= 1)")
    for bucket, bpb in result["bpb_by_bucket"].items():
        knn = f", with kNN-LM {result['knn_bpb_by_bucket'][bucket]:.4f}" if args.knn else ""
        print(f"r(C) in {bucket}: bpb {bpb:.4f} over {result['chunks_by_bucket'][bucket]} chunks{knn}")
    print(json.dumps(result, sort_keys=True))
    return 0


def _args_evaluate_lm(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument("--model", default=None, metavar="DIR",
                   help="the train-retro run (default: retro_trainer.model_dir)")
    p.add_argument("--baseline", action="store_true", help="the run is a baseline decoder")
    p.add_argument("--split", choices=("validation", "test"), default="test")
    p.add_argument("--documents", default=None, metavar="FILE",
                   help="score the documents of this file instead: JSONL {text[, id, "
                        "title]} or plain text (blank lines between documents); held "
                        "out by definition, and any copy of one in the database is "
                        "withheld from it and reported")
    p.add_argument("--database", choices=("train_only", "all_but_own"),
                   default="train_only",
                   help="train_only: training documents' chunks only (no leakage); "
                        "all_but_own: every chunk but the evaluated document's own")
    p.add_argument("--retrieval-off", dest="retrieval_off", action="store_true",
                   help="RETRO with empty neighbours")
    p.add_argument("--knn", action="store_true",
                   help="also kNN-LM with retro.knn_dir's datastore (lambda, T tuned "
                        "on the validation split)")


def _cmd_generate(args: argparse.Namespace) -> int:
    """Continues prompts with a trained RETRO (retrieving after each completed chunk) or baseline decoder."""
    from realm_tf.retro import lm_evaluation
    from realm_tf.retro import retro_generation
    from realm_tf.retro import retro_lm

    cfg = command.load(args)
    task = retro_lm.RetroLmTask(cfg, retrieval=not args.baseline)
    model = lm_evaluation.restore_decoder(task, args.model or cfg.retro_trainer.model_dir)
    generator = retro_generation.RetroGenerator(task, model, database=args.database)
    for i, prompt in enumerate(args.prompt):
        result = generator.generate(prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                                    top_k=args.top_k, seed=args.seed + i)
        print(retro_generation.format_generation(result))
        print()
    return 0


def _args_generate(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument("--prompt", action="append", required=True, help="a prompt (repeatable)")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="the train-retro run (default: retro_trainer.model_dir)")
    p.add_argument("--baseline", action="store_true", help="the run is a baseline decoder")
    p.add_argument("--max-tokens", dest="max_tokens", type=int, default=64,
                   help="wordpieces to add (at most up to retro.sequence_length)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy; otherwise sample from softmax(logits / T)")
    p.add_argument("--top-k", dest="top_k", type=int, default=0,
                   help="sample among the k most likely tokens (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--database", choices=("all", "train_only"), default="all",
                   help="search every chunk, or the training documents' only")


def _cmd_export_retro(args: argparse.Namespace) -> int:
    """Exports a trained RETRO / baseline decoder as a SavedModel (scoring and generation, retrieval in-graph)."""
    from realm_tf.retro import lm_evaluation
    from realm_tf.retro import retro_export
    from realm_tf.retro import retro_lm

    cfg = command.load(args)
    out = retro_export.check_destination(args.out)  # before the model and database are read
    model_dir = args.model or cfg.retro_trainer.model_dir
    task = retro_lm.RetroLmTask(cfg, retrieval=not args.baseline)
    model = lm_evaluation.restore_decoder(task, model_dir)
    checkpoint = retro_lm.latest_checkpoint(model_dir)
    module = retro_export.RetroExportModule(
        cfg, model, task.tokenizer, **({"store": task.store, "embedder": task.retriever.embedder,
                                        "keys": task.retriever.keys, "scann_dir": task.chunk_searcher_dir()}
                                       if task.retrieval else {}))
    out = retro_export.export_retro(module, cfg, out, {"checkpoint": checkpoint})
    print(f"exported {checkpoint} to {out}")
    return 0


def _args_export_retro(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument("--model", default=None, metavar="DIR",
                   help="the train-retro run (default: retro_trainer.model_dir)")
    p.add_argument("--baseline", action="store_true",
                   help="the run is a baseline decoder")
    p.add_argument("--output", old=("--out",), dest="out", required=True,
                   help="the export directory (written atomically)")


COMMANDS = [
    command.Command("evaluate-lm",
                    "bits-per-byte of a trained RETRO / baseline decoder on held-out documents, at each leakage "
                    "threshold alpha and per leakage bucket (RETRO 2.6), optionally with kNN-LM; --set "
                    "retro.num_neighbours=10 reads 10 neighbours (chunked cross-attention takes any k)",
                    _cmd_evaluate_lm, _args_evaluate_lm,
                    group="lm",
                    examples=("realm-tf evaluate-lm --config configs/minilm.yaml --split test",
                              "realm-tf evaluate-lm --config configs/minilm.yaml --split test --knn",)),
    command.Command("generate",
                    "continue prompts with a trained RETRO decoder, retrieving after each completed chunk and "
                    "printing the neighbours that conditioned each chunk",
                    _cmd_generate, _args_generate,
                    group="lm",
                    examples=("realm-tf generate --config configs/minilm.yaml --prompt \"The Eiffel Tower is\"",)),
    command.Command("export-retro",
                    "export a trained RETRO / baseline decoder as a SavedModel: score, score_text (bits-per-byte), "
                    "retrieve and generate signatures, the chunk database and its search inside",
                    _cmd_export_retro, _args_export_retro,
                    group="lm",
                    examples=("realm-tf export-retro --config configs/minilm.yaml --output runs/minilm/retro/served",)),
]
