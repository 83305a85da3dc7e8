"""RETRO's positive control through the real pipeline: does RETRO read a neighbour that holds the answer?

For a fraction p of the chunks (``retro.own_neighbour_rate``), the chunk's own database entry [C_u, C_{u+1}] is
forced in as neighbour 1, in training and in scoring: the continuation F of that neighbour is exactly the next
chunk the decoder has to predict (RETRO, Borgeaud et al., 2021, §2.3-2.4; controlled leakage). Everything else is
the product's path: the chunk database (``build-chunk-database``), its index, the neighbour tables, the tf.data
input and ``train-retro``. At p = 1 a decoder that reads its neighbours approaches copying; the smallest p at which
RETRO beats its own retrieval-off score is the dose it needs.

Per dose p, a RETRO decoder is trained from scratch next to one baseline decoder (same steps, same data order) and,
with ``--retro-fit``, the baseline is also RETRO-fitted (§4.2: the baseline frozen, only the chunked cross-attention
and the neighbour encoder train, ``retro.retro_fit_from``) for the same steps. Bits-per-byte of the documents'
UTF-8 bytes is measured on the training and validation documents with retrieval on and off, over all chunks and
over the chunks >= 1 (those after a sequence's first, the only ones that read neighbours under RETRO's causal
shift, §2.4); the records judge the chunks >= 1 of the validation documents, with 95% paired bootstrap intervals
over them.

Resumable (``<out>/stages.json``; training resumes from its checkpoints)::

    .venv/bin/python benchmarks/retro_positive_control.py --out runs/bench/retro_control --steps 2000 --lr 2e-3 \
        --rates 1.0,0.1,0.03 --retro-fit
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf import config as config_lib  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

#: The decoder and chunking of the control (``--config`` configs/tiny.yaml): m = 8, r = 16, k = 2, 2 × 64 decoder.
RETRO_SETTINGS = ["retro.chunk_length=8", "retro.continuation_length=8", "retro.sequence_length=32",
                  "retro.num_neighbours=2", "retro.decoder_layers=2", "retro.decoder_width=64", "retro.decoder_heads=2",
                  "retro.decoder_intermediate=128", "retro.dropout_rate=0.0", "retro.validation_fraction=0.2",
                  "retro.test_fraction=0.1", "index.kind=brute_force", "data.batch_size=16", "data.shuffle_buffer=256"]


def tiny_embedder(path: str, cfg: config_lib.ExperimentConfig) -> str:
    """A fixed random BERT of the config's size (the chunk keys; forced neighbours do not depend on them)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from realm_tf.networks import bert_encoder  # pylint: disable=import-outside-toplevel
    from realm_tf.networks import bert_weight_import  # pylint: disable=import-outside-toplevel

    encoder = bert_encoder.build_bert_encoder(cfg.model.encoder)
    bert_weight_import.ensure_built(encoder)
    return tf.train.Checkpoint(encoder=encoder).write(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--out", default="runs/bench/retro_control")
    parser.add_argument("--passages", type=int, default=600, help="bundled passages in the chunk database")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", default="2e-3", help="peak learning rate (linear warm-up 20 steps, then decay); at "
                        "5e-3 and above the tiny decoder does not learn to copy even on synthetic data")
    parser.add_argument("--rates", default="1.0", help="comma-separated doses p (RETRO §2.3 leakage, forced)")
    parser.add_argument("--retro-fit", dest="retro_fit", action="store_true",
                        help="also RETRO-fit the baseline at each dose (RETRO §4.2)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for every run")
    args = parser.parse_args()

    out = args.out.rstrip("/")
    stage = stages.Stages(out)
    cfg = config_lib.load_config(args.config)

    def corpus() -> None:
        with gzip.open(cfg.data.corpus_pattern, "rt", encoding="utf-8") as f, \
                open(f"{out}/corpus.jsonl", "w", encoding="utf-8") as corpus_out:
            corpus_out.writelines(itertools.islice(f, args.passages))

    stage("corpus", corpus)
    stage("blocks", lambda: stages.cli(["preprocess", "--config", args.config, "--input", f"{out}/corpus.jsonl",
                                        "--output", f"{out}/blocks", "--overwrite", "--progress-interval", "0"]))
    embedder = stage("embedder", lambda: tiny_embedder(f"{out}/embedder/bert", cfg))
    common = [f"data.blocks_dir={out}/blocks", f"retro.chunks_dir={out}/chunks", f"retro.index_dir={out}/index",
              f"retro.embedder_checkpoint={embedder}", *RETRO_SETTINGS, f"retro_trainer.steps={args.steps}",
              "retro_trainer.warmup_steps=20", f"retro_trainer.learning_rate={args.lr}",
              "retro_trainer.summary_every_steps=50", "retro_trainer.checkpoint_every_steps=100", *args.overrides]
    flags = lambda sets: ["--config", args.config, *sum((["--set", s] for s in sets), [])]  # noqa: E731
    stage("chunks", lambda: stages.cli(["build-chunk-database", *flags(common)]))
    runs = [("baseline", common + [f"retro_trainer.model_dir={out}/baseline"], False)]
    runs += [(f"retro_p{p}", common + [f"retro_trainer.model_dir={out}/retro_p{p}", f"retro.own_neighbour_rate={p}"],
              True) for p in args.rates.split(",") if p]
    if args.retro_fit:
        runs += [(f"retrofit_p{p}", common + [f"retro_trainer.model_dir={out}/retrofit_p{p}",
                                              f"retro.own_neighbour_rate={p}", f"retro.retro_fit_from={out}/baseline"],
                  True) for p in args.rates.split(",") if p]
    table: dict[str, dict[str, float]] = {}
    for name, sets, retrieval in runs:
        stage(f"train_{name}", lambda sets=sets, retrieval=retrieval: stages.cli(
            ["train-retro", *flags(sets), *([] if retrieval else ["--baseline"])]))

        def score(sets=sets, retrieval=retrieval) -> dict[str, float]:
            from realm_tf.retro import lm_evaluation  # pylint: disable=import-outside-toplevel

            run_cfg = config_lib.load_config(args.config, sets)
            model_dir = run_cfg.retro_trainer.model_dir
            scores = {}
            for split in ("train", "validation"):
                for neighbours in ((True, False) if retrieval else (True,)):
                    result = lm_evaluation.evaluate(run_cfg, model_dir, retrieval=retrieval, split=split,
                                                    neighbours=neighbours)
                    key = f"{split}_{'on' if neighbours else 'off'}"
                    scores[f"{key}_all"] = result["bpb"]["1.0"]  # every chunk (r(C) <= 1)
                    scores[key] = result["later_chunks"]["bpb"]  # the chunks >= 1
                    if split == "validation":  # per document, for intervals over documents
                        scores[f"{key}_documents"] = result["later_chunks"]["per_document"]
            return scores

        table[name] = stage(f"scores_{name}", score)

    print(f"\n== RETRO positive control ({args.passages} passages, {args.steps} steps at lr {args.lr}; bits per "
          f"UTF-8 byte, chunks >= 1 / all chunks) ==")
    print("| run | train on | train off | validation on | validation off |")
    print("| --- | ---: | ---: | ---: | ---: |")
    cell = lambda s, key: (f"{s[key]:.4f} / {s[key + '_all']:.4f}" if key in s else "-")  # noqa: E731
    for name, s in table.items():
        print(f"| {name} | {cell(s, 'train_on')} | {cell(s, 'train_off')} | {cell(s, 'validation_on')} | "
              f"{cell(s, 'validation_off')} |")
    print("\nstage minutes: " + stage.minutes())
    base = table["baseline"]
    from realm_tf.retro import lm_evaluation  # pylint: disable=import-outside-toplevel

    def interval(first: dict, second: dict) -> str:
        diff, low, high = lm_evaluation.bpb_difference(first, second)
        return f"{diff:+.4f} [{low:+.4f}, {high:+.4f}]"

    for name, s in table.items():
        if name == "baseline":
            continue
        s["reads"] = lm_evaluation.bpb_difference(s["validation_off_documents"], s["validation_on_documents"])[2] < 0
        reads = s["reads"] and s["validation_on"] < base["validation_on"]
        result_records.write(
            f"retro-positive-control-{name.replace('_', '-').replace('.', '')}", area="RETRO and kNN-LM", order=40,
            verdict="holds" if reads and s["validation_on"] < 0.5 * base["validation_on"] else "open",
            claim=f"RETRO with its own chunk and continuation forced in as neighbour 1 ({name}) learns to copy it "
                  f"through the real pipeline: on the chunks >= 1, retrieval on below off (outside the interval) and "
                  f"at most half the baseline's bits",
            figure=f"validation bpb on the chunks >= 1 {s['validation_on']:.4f} with retrieval, "
                   f"{s['validation_off']:.4f} without, baseline {base['validation_on']:.4f}; all chunks "
                   f"{s['validation_on_all']:.4f} / {s['validation_off_all']:.4f} / {base['validation_on_all']:.4f} "
                   f"({args.steps} steps at lr {args.lr}, tiny decoder; bits per UTF-8 byte)",
            interval=f"on minus off on the chunks >= 1, 95% paired bootstrap over the "
                     f"{len(s['validation_on_documents']['documents'])} validation documents: "
                     f"{interval(s['validation_off_documents'], s['validation_on_documents'])}; on minus the baseline: "
                     f"{interval(base['validation_on_documents'], s['validation_on_documents'])}")
    for family in ("retro", "retrofit"):  # the smallest dose at which retrieval beats the same model without it
        doses = sorted((float(name.split("_p")[1]), s) for name, s in table.items() if name.startswith(family + "_p"))
        if not doses:
            continue
        # The dose it needs: the smallest p from which on every larger dose tried retrieval on beats off, the
        # whole interval over documents below zero (a lower dose that reads while a higher one does not is noise).
        needed = next((p for i, (p, _) in enumerate(doses) if all(s["reads"] for _, s in doses[i:])), None)
        stray = [p for p, s in doses if s["reads"] and (needed is None or p < needed)]
        result_records.write(
            f"retro-positive-control-{family}-dose", area="RETRO and kNN-LM", order=41,
            verdict="holds" if needed is not None else "open",
            claim=f"The smallest dose p of forced own-chunk neighbours from which {family.replace('fit', '-fit')} "
                  f"beats its own retrieval-off score at every larger dose tried, outside the interval over documents "
                  f"(the dose it needs to read its neighbours)",
            figure=(f"p = {needed:g}" if needed is not None else "none of the doses tried")
                   + (f" (p = {', '.join(f'{p:g}' for p in stray)} also read, but a larger dose did not)" if stray
                      else "") + " (validation bpb on the chunks >= 1, on/off: "
                   + "; ".join(f"p {p:g}: {s['validation_on']:.3f}/{s['validation_off']:.3f}" for p, s in doses)
                   + f"; {args.steps} steps at lr {args.lr}; one seed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
