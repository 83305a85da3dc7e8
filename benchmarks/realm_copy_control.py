"""REALM's reader handed the block its masked span came from: does it copy? A positive control through the real
pipeline.

REALM pre-training (Guu et al., 2020, §3.4) excludes each query's own source block from its candidates, because a
reader that reads it can predict the span by copying it, and the retriever then learns to look for exact string
matches. Here the opposite is done on purpose: every query, in training and in the held-out scoring, has its source
block forced in as candidate 1 (``pretrain.force_source_block`` with ``trivial_retrieval_rate_while_frozen=1`` and
``eval_keep_source_block``), and the retriever stays frozen. A knowledge-augmented encoder that works copies the
span: its held-out MLM accuracy reading the source block alone, p(y | x, z = source), approaches 1, far above its
accuracy with the null document alone.

Everything is the product's pipeline: ``preprocess`` → ``generate-pretraining-data`` (salient spans) → ``pretrain``
(its first index, candidate selection, tf.data input and ``RealmPretrainingTask``) in chunks of ``--chunk`` steps,
each followed by the held-out evaluation (held out by source block, so the held-out blocks were never read in
training). ``--encoder LxH`` trains encoders of L layers and width H from scratch (no import), over the config's
vocabulary cut to the corpus's pieces (``realm_tf.data.corpus_vocabulary``); ``--encoder import`` keeps the
config's (MiniLM in configs/minilm.yaml). Resumable (``<out>/stages.json`` and each run's checkpoints):

    nohup .venv/bin/python benchmarks/realm_copy_control.py --out runs/bench/copy_small --encoder 4x128 \\
        --steps 5000 > runs/bench/copy_small.log 2>&1 &
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import sys
import time
from typing import Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf import config as config_lib  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

#: The control: the retriever frozen for the whole run, every query's source block forced among its candidates in
#: training and in the held-out scoring, beside the null document only (with a frozen retriever p(z | x) is about
#: even, so each further candidate takes a share of the reader's gradient from the source block; ``--set
#: model.num_candidates=K`` reads more).
CONTROL = ["pretrain.freeze_retriever_steps=1000000000", "pretrain.trivial_retrieval_rate_while_frozen=1.0",
           "pretrain.force_source_block=true", "pretrain.eval_keep_source_block=true",
           "pretrain.learning_rate_decay=constant", "refresh.mode=external", "model.num_candidates=2"]
#: The held-out scores kept per chunk.
KEPT = ("mlm_accuracy_source_alone", "mlm_accuracy_source_held", "mlm_accuracy_null_only", "mlm_accuracy",
        "source_in_candidates", "retrieval_utility", "num_examples")
#: The record holds when the reader reading its source block alone gets this share of the held-out spans right.
COPIES_AT = 0.9


def encoder_overrides(encoder: str) -> list[str]:
    """``LxH``: L layers of width H trained from scratch (H / 64 heads, at least 2; feed-forward 4H); ``import``:
    the config's own encoder and weights."""
    if encoder == "import":
        return []
    layers, width = (int(n) for n in encoder.lower().split("x"))
    return [f"model.encoder.num_layers={layers}", f"model.encoder.hidden_size={width}",
            f"model.encoder.num_attention_heads={max(2, width // 64)}", f"model.encoder.intermediate_size={4 * width}",
            "model.init_checkpoint=", "model.retriever_checkpoint=", "pretrain.mlm_head_warmup_blocks=0"]


def write_corpus(source: str, count: int, path: str, vocab_file: str, vocab_path: str) -> dict[str, int]:
    """The first ``count`` passages of ``source`` (JSONL, gzip or not) into ``path``, and ``vocab_file`` cut to
    the pieces their texts use into ``vocab_path`` (:mod:`realm_tf.data.corpus_vocabulary`)."""
    from realm_tf.data import corpus_vocabulary  # pylint: disable=import-outside-toplevel  (starts TensorFlow)

    opener = gzip.open if source.endswith(".gz") else open
    with opener(source, "rt", encoding="utf-8") as f:
        lines = list(itertools.islice(f, count))
    config_lib.atomic_write_text(path, "".join(lines))
    texts = [value for line in lines for value in json.loads(line).values() if isinstance(value, str)]
    vocab = corpus_vocabulary.write_cut_vocabulary(vocab_file, texts, vocab_path)
    return {"passages": len(lines), "vocab_size": len(vocab)}


def train_in_chunks(out: str, sets: list[str], steps: int, chunk: int, deadline: float,
                    kept: Sequence[str] = KEPT, inputs: Sequence[str] = (),
                    describe: Callable[[dict], str] | None = None, from_step_zero: bool = False) -> list[dict]:
    """Pre-trains ``<out>/model`` to ``steps`` in chunks of ``chunk`` steps (``realm-tf pretrain`` with ``sets``
    and ``inputs``), scoring the held-out spans after each; the curve of the ``kept`` scores, kept in
    ``<out>/curve.json`` (a rerun continues it). ``describe(scores)``: the line printed after a chunk;
    ``from_step_zero``: the curve starts with the untrained start's scores."""
    path = f"{out}/curve.json"
    curve = stages.read_curve(path)
    describe = describe or describe_copying
    while not curve or curve[-1]["step"] < steps:
        if time.time() > deadline:
            raise stages.OutOfTime("pretrain")
        step = min(steps, curve[-1]["step"] + chunk) if curve else (0 if from_step_zero else min(steps, chunk))
        metrics, started = f"{out}/metrics-{step}.json", time.time()
        stages.cli(["pretrain", *sets, "--set", f"pretrain.steps={step}", *inputs, "--metrics", metrics])
        with open(metrics, encoding="utf-8") as f:
            scores = json.load(f)["eval"]
        curve.append({"step": step, "minutes": (time.time() - started) / 60, **{k: scores[k] for k in kept}})
        config_lib.atomic_write_text(path, json.dumps(curve, indent=2) + "\n")
        print(f"step {step}: {describe(scores)}", flush=True)
    return curve


def describe_copying(scores: dict) -> str:
    """The copying scores of one held-out evaluation, on a line."""
    return (f"source alone {scores['mlm_accuracy_source_alone']:.3f}, marginal "
            f"{scores['mlm_accuracy_source_held']:.3f}, null document only {scores['mlm_accuracy_null_only']:.3f} "
            f"(source among the candidates: {scores['source_in_candidates']:.3f})")


def plot(curves: dict[str, list[dict]], path: str) -> None:
    """Held-out MLM accuracy over steps: the source block read alone (solid), the marginal (dotted) and the null
    document alone (dashed), one colour per run."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    figure, axis = pyplot.subplots(figsize=(6, 3.8))
    for i, (name, curve) in enumerate(curves.items()):
        steps = [p["step"] for p in curve]
        for key, style, label in (("mlm_accuracy_source_alone", "-", name), ("mlm_accuracy_source_held", ":", None),
                                  ("mlm_accuracy_null_only", "--", None)):
            axis.plot(steps, [p[key] for p in curve], style, marker="o", markersize=3, color=f"C{i}", label=label)
    axis.set_xlabel("pre-training step")
    axis.set_ylabel("held-out MLM accuracy")
    axis.set_title("source block alone (solid), marginal (dotted), null document (dashed)", fontsize=9)
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--out", default="runs/bench/copy_control")
    parser.add_argument("--corpus", default="data/open_qa/passages.jsonl.gz")
    parser.add_argument("--passages", type=int, default=2000, help="the corpus: the first this many passages")
    parser.add_argument("--encoder", default="4x128", help="LxH from scratch, or 'import' (the config's weights)")
    parser.add_argument("--full-vocabulary", dest="full_vocabulary", action="store_true",
                        help="keep the config's whole vocabulary (default for LxH: cut to the corpus's pieces)")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--chunk", type=int, default=500, help="steps between held-out evaluations")
    parser.add_argument("--learning-rate", dest="learning_rate", type=float, default=1e-3)
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=16)
    parser.add_argument("--eval-examples", dest="eval_examples", type=int, default=512)
    parser.add_argument("--heldout-fraction", dest="heldout_fraction", type=float, default=0.1,
                        help="share of the salient-span queries held out (by source block) for the scoring")
    parser.add_argument("--train-masking", dest="train_masking", default="salient",
                        choices=("salient", "random_span", "random_token"),
                        help="what the training queries mask (data.masking_strategy); the held-out scoring always "
                             "reads salient spans")
    parser.add_argument("--max-hours", dest="max_hours", type=float, default=0.0, help="stop (resumably) after")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for every stage")
    parser.add_argument("--record", default="", help="write this result record (e.g. realm-copy-control-small)")
    parser.add_argument("--notebook", default="", help="the notebook entry the record points to")
    args = parser.parse_args()

    out = args.out.rstrip("/")
    common = [f"data.blocks_dir={out}/blocks", f"data.pretraining_dir={out}/pretraining",
              f"index.index_dir={out}/index", f"refresh.export_dir={out}/export", f"pretrain.model_dir={out}/model",
              f"data.batch_size={args.batch_size}", f"pretrain.learning_rate={args.learning_rate}",
              f"pretrain.eval_examples={args.eval_examples}", "pretrain.checkpoint_every_steps=250",
              f"data.pretraining_heldout_fraction={args.heldout_fraction}",
              "pretrain.summary_every_steps=50", *encoder_overrides(args.encoder), *CONTROL, *args.overrides]
    sets = ["--config", args.config, *sum((["--set", o] for o in common), [])]
    stage = stages.Stages(out)
    deadline = time.time() + args.max_hours * 3600 if args.max_hours > 0 else float("inf")
    vocab_file = config_lib.load_config(args.config, args.overrides).model.vocab_file
    corpus = stage("corpus", lambda: write_corpus(args.corpus, args.passages, f"{out}/corpus.jsonl", vocab_file,
                                                  f"{out}/vocab.txt"))
    if args.encoder != "import" and not args.full_vocabulary:
        sets += ["--set", f"model.vocab_file={out}/vocab.txt",
                 "--set", f"model.encoder.vocab_size={corpus['vocab_size']}"]
    stage("blocks", lambda: stages.cli(["preprocess", *sets, "--input", f"{out}/corpus.jsonl",
                                        "--output", f"{out}/blocks"]))
    stage("data", lambda: stages.cli(["generate-pretraining-data", *sets]))
    inputs: list[str] = []
    if args.train_masking != "salient":
        masked = f"{out}/pretraining-{args.train_masking}"
        stage(f"data-{args.train_masking}", lambda: stages.cli([
            "generate-pretraining-data", *sets, "--set", f"data.pretraining_dir={masked}",
            "--set", f"data.masking_strategy={args.train_masking}"]))
        inputs = ["--input", f"{masked}/pretraining-*", "--eval-input", f"{out}/pretraining/pretraining-*"]
    try:
        curve = train_in_chunks(out, sets, args.steps, args.chunk, deadline, inputs=inputs)
    except stages.OutOfTime:
        print("realm_copy_control: --max-hours reached; the same command continues", flush=True)
        return 0
    plot({f"encoder {args.encoder}": curve}, f"{out}/curve.png")
    last = curve[-1]
    if args.record:
        points = "; ".join(f"step {p['step']}: {p['mlm_accuracy_source_alone']:.3f} / "
                           f"{p['mlm_accuracy_source_held']:.3f} / {p['mlm_accuracy_null_only']:.3f}" for p in curve)
        result_records.write(
            args.record, area="REALM pre-training",
            claim=f"With its source block forced among its candidates, REALM's knowledge-augmented encoder (encoder "
                  f"{args.encoder}) learns to copy the masked salient span: held-out MLM accuracy reading the "
                  f"source block alone >= {COPIES_AT}",
            figure=f"held-out salient spans ({last['num_examples']} queries, held out by source block; source among "
                   f"the candidates for {last['source_in_candidates']:.3f} of them): MLM accuracy reading the source "
                   f"alone / marginal / null document alone, {points}",
            verdict="holds" if last["mlm_accuracy_source_alone"] >= COPIES_AT else "negative",
            interval=f"one seed; an accuracy on {last['num_examples']} queries is within about "
                     f"±{(0.25 / max(last['num_examples'], 1)) ** 0.5 * 2:.3f} (2 s.e.)",
            notebook=args.notebook, order=8)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
