"""REALM pre-training in a generated world of fictional facts: does the masked-LM signal alone teach the retriever
to find the documents that state a fact?

The world (``realm-tf generate-world``, :mod:`realm_tf.data.fictional_world`) invents people, places,
organisations and years from a seed, so no weights know a fact before training. The knowledge corpus holds every
document of the world; the pre-training queries are the salient-span-masked sentences of the **training** split's
documents only, and the held-out scoring reads those of the **test** split, whose facts no training query states
(the split is by person). REALM excludes each query's own source block (Guu et al., 2020, §3.4), so the only way
to predict a masked fact span is to retrieve another document that states it: the reference document or a note
that restates it in other words.

Encoders of ``--encoder LxH`` are trained from scratch (the same initialisation for each tower and the reader)
over the config's vocabulary cut to the world's pieces. The index refreshes asynchronously (``refresh.mode=thread``)
once the retriever trains. After each chunk of ``--chunk`` steps the held-out queries are scored: span recall@k
(the masked span in a retrieved block), retrieval utility, and the MLM accuracy with retrieval against the null
document alone. Resumable; the same command continues:

    nohup .venv/bin/python benchmarks/realm_fictional_world.py --out runs/bench/world --encoder 4x128 \\
        --steps 5000 > runs/bench/world.log 2>&1 &
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf import config as config_lib  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import realm_copy_control  # noqa: E402  (benchmarks/)

#: The held-out scores kept per chunk.
KEPT = ("span_recall_top1", "span_recall", "retrieval_utility", "mlm_accuracy", "mlm_accuracy_null_only",
        "mlm_accuracy_span_retrieved", "mlm_accuracy_null_only_span_retrieved", "num_examples")


def world_vocabulary(world: str, vocab_file: str, vocab_path: str) -> dict[str, int]:
    """``vocab_file`` cut to the pieces of every passage of the world in ``world``, written to ``vocab_path``."""
    from realm_tf.data import corpus_vocabulary  # pylint: disable=import-outside-toplevel  (starts TensorFlow)

    with open(f"{world}/passages.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    vocab = corpus_vocabulary.write_cut_vocabulary(vocab_file, [t for r in rows for t in (r["title"], r["text"])],
                                                   vocab_path)
    return {"vocab_size": len(vocab), "passages": len(rows)}


def describe(scores: dict) -> str:
    """The retrieval scores of one held-out evaluation, on a line."""
    return (f"span recall@1 {scores['span_recall_top1']:.3f}, @k {scores['span_recall']:.3f}; utility "
            f"{scores['retrieval_utility']:.3f}; MLM accuracy {scores['mlm_accuracy']:.3f} against "
            f"{scores['mlm_accuracy_null_only']:.3f} with the null document alone")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--out", default="runs/bench/world")
    parser.add_argument("--seed", type=int, default=0, help="the world's seed")
    parser.add_argument("--people", type=int, default=200)
    parser.add_argument("--encoder", default="4x128",
                        help="LxH trained from scratch, or 'import' (the config's weights and vocabulary)")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--chunk", type=int, default=500, help="steps between held-out evaluations")
    parser.add_argument("--learning-rate", dest="learning_rate", type=float, default=1e-3)
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=32)
    parser.add_argument("--eval-examples", dest="eval_examples", type=int, default=512)
    parser.add_argument("--max-hours", dest="max_hours", type=float, default=0.0, help="stop (resumably) after")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for every stage")
    args = parser.parse_args()

    out = args.out.rstrip("/")
    stage = stages.Stages(out)
    deadline = time.time() + args.max_hours * 3600 if args.max_hours > 0 else float("inf")
    stage("world", lambda: stages.cli(["generate-world", "--output", f"{out}/world", "--seed", str(args.seed),
                                       "--people", str(args.people)]))
    common = []
    if args.encoder != "import":
        vocab_file = config_lib.load_config(args.config, args.overrides).model.vocab_file
        vocabulary = stage("vocabulary", lambda: world_vocabulary(f"{out}/world", vocab_file, f"{out}/vocab.txt"))
        common = [f"model.vocab_file={out}/vocab.txt", f"model.encoder.vocab_size={vocabulary['vocab_size']}"]
    common += [f"index.index_dir={out}/index", f"refresh.export_dir={out}/export", f"pretrain.model_dir={out}/model",
              f"data.batch_size={args.batch_size}", f"pretrain.learning_rate={args.learning_rate}",
              f"pretrain.eval_examples={args.eval_examples}", "pretrain.eval_split=train",
              "data.pretraining_heldout_fraction=0", "pretrain.learning_rate_decay=constant",
              "pretrain.checkpoint_every_steps=250", "pretrain.summary_every_steps=50", "refresh.mode=thread",
              *realm_copy_control.encoder_overrides(args.encoder), *args.overrides]
    sets = lambda *more: ["--config", args.config, *sum((["--set", o] for o in [*common, *more]), [])]  # noqa: E731
    for part in ("", "-train", "-test"):  # every document (the index), and each split's (the queries)
        name = part.strip("-") or "all"
        stage(f"blocks_{name}", lambda part=part, name=name: stages.cli([
            "preprocess", *sets(f"data.blocks_dir={out}/blocks_{name}"), "--input", f"{out}/world/passages{part}.jsonl",
            "--output", f"{out}/blocks_{name}"]))
    for split in ("train", "test"):
        stage(f"data_{split}", lambda split=split: stages.cli([
            "generate-pretraining-data", *sets(f"data.blocks_dir={out}/blocks_{split}",
                                               f"data.pretraining_dir={out}/data_{split}")]))
    try:
        curve = realm_copy_control.train_in_chunks(
            out, sets(f"data.blocks_dir={out}/blocks_all"), args.steps, args.chunk, deadline, KEPT,
            ["--input", f"{out}/data_train/pretraining-*", "--eval-input", f"{out}/data_test/pretraining-*"], describe,
            from_step_zero=True)
    except stages.OutOfTime:
        print("realm_fictional_world: --max-hours reached; the same command continues", flush=True)
        return 0
    print(json.dumps(curve[-1]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
