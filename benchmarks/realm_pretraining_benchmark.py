"""REALM pre-training on the bundled corpus with the MiniLM import: curves, held-out MLM accuracy, speed.

Runs ``realm-tf pretrain`` (in this process) with ``configs/minilm.yaml`` plus overrides, then reads the
TensorBoard scalars back and prints the curves' start and end points (mean of the first / last few summary
points), steps/s, the fraction of step time the trainer waited for its input pipeline, the off-policy delay,
the index versions used, and the held-out evaluation: masked-LM accuracy of the marginal model vs the same
model reading only the null document. Resumable: rerunning continues from the last checkpoint.

    nohup python benchmarks/realm_pretraining_benchmark.py --out runs/bench/realm \\
        --set data.batch_size=4 --set pretrain.max_minutes=90 > runs/bench/realm.log 2>&1 &

Needs the bundled corpus preprocessed with the MiniLM vocabulary (``--blocks``; ``realm-tf preprocess``) and
makes the salient-span pre-training examples itself when ``<out>/pretraining`` has none.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from beam_jobs import embed_blocks  # noqa: E402
from realm_tf import config as config_lib  # noqa: E402
from realm_tf.tasks import realm_pretraining  # noqa: E402

import result_records  # noqa: E402  (benchmarks/)

CURVES = ("loss", "mlm_accuracy", "retrieval_utility", "null_probability", "query_similarity", "off_policy_delay_steps",
          "off_policy_delay_seconds", "index_version", "steps_per_second", "examples_per_second",
          "input_wait_fraction")


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` from the TensorBoard event files under ``logdir``."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return {k: sorted(v) for k, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", default="runs/bench/realm", help="run directory (model, index, exports, data)")
    parser.add_argument("--blocks", default="runs/bench/blocks", help="preprocessed bundled corpus")
    parser.add_argument("--window", type=int, default=5, help="summary points averaged for start / end values")
    args = parser.parse_args()

    out = args.out
    overrides = [f"data.blocks_dir={args.blocks}", f"data.pretraining_dir={out}/pretraining",
                 f"index.index_dir={out}/index", f"refresh.export_dir={out}/export",
                 f"pretrain.model_dir={out}/model", *args.overrides]
    cfg = config_lib.load_config(args.config, overrides)
    if not glob.glob(f"{out}/pretraining/pretraining-*.tfrecord*"):
        subprocess.run([sys.executable, "-m", "realm_tf.cli", "generate-pretraining-data", "--config", args.config,
                        *sum((["--set", o] for o in overrides), [])], check=True)
    print(f"config: batch {cfg.data.batch_size}, k {cfg.model.num_candidates}, lengths query/block/reader "
          f"{cfg.model.query_seq_length}/{cfg.model.block_seq_length}/{cfg.model.reader_seq_length}, lr "
          f"{cfg.pretrain.learning_rate}, steps {cfg.pretrain.steps}, max_minutes {cfg.pretrain.max_minutes}, export "
          f"every {cfg.refresh.export_every_steps} steps, refresh mode {cfg.refresh.mode}, os.cpu_count "
          f"{os.cpu_count()}", flush=True)
    start = time.time()
    result = realm_pretraining.pretrain(cfg, index_builder=embed_blocks.embed_and_publish)
    wall = time.time() - start
    print(realm_pretraining.format_result(result))

    scalars = read_scalars(os.path.join(cfg.pretrain.model_dir, "train"))
    w = args.window
    print(f"\n== REALM pre-training benchmark ({wall / 60:.1f} min wall in this run, final step {result['step']}) ==")
    frozen = cfg.pretrain.freeze_retriever_steps
    middle = f"{'up to step ' + str(frozen):>16}" if frozen else ""
    print(f"{'scalar':<26}{'first ' + str(w) + ' points':>16}{middle}{'last ' + str(w) + ' points':>16}   (steps)")
    for tag in CURVES:
        points = scalars.get(tag, [])
        if not points:
            continue
        head, tail = points[:w], points[-w:]
        mid = ""
        if frozen:  # the window that ends where the retriever starts training
            before = [v for s, v in points if s <= frozen][-w:]
            mid = f"{np.mean(before):>16.4f}" if before else f"{'-':>16}"
        print(f"{tag:<26}{np.mean([v for _, v in head]):>16.4f}{mid}{np.mean([v for _, v in tail]):>16.4f}   "
              f"({head[0][0]}-{head[-1][0]} / {tail[0][0]}-{tail[-1][0]})")
    ru = scalars.get("retrieval_utility", [])
    if ru:
        positive = [s for s, v in ru if v > 0]
        print(f"retrieval utility > 0 at {len(positive)}/{len(ru)} summary points; first at step "
              f"{positive[0] if positive else '-'}")
    sps = [v for _, v in scalars.get("steps_per_second", [])]
    wait = [v for _, v in scalars.get("input_wait_fraction", [])]
    if sps:
        print(f"steps/s (mean over the run): {np.mean(sps):.4f} = {1 / np.mean(sps):.1f} s/step; input pipeline "
              f"stall: {np.mean(wait):.1%} of wall time (max window {np.max(wait):.1%})")
    print(f"index versions used (batches): {result['index_versions']}; trivial retrievals kept in the frozen stage "
          f"{result.get('trivial_retrievals_kept', 0)}, source blocks excluded {result['excluded_source_blocks']}")
    if "eval" in result:
        e = result["eval"]
        print(f"held-out salient-span examples: {e['num_examples']}; MLM accuracy with retrieval "
              f"{e['mlm_accuracy']:.4f} vs null document only {e['mlm_accuracy_null_only']:.4f}; log-likelihood "
              f"{e['log_likelihood']:.3f} vs {e['log_likelihood_null_only']:.3f}; retrieval utility "
              f"{e['retrieval_utility']:.4f}; masked span in the top-1 retrieved block {e['span_recall_top1']:.3f}, "
              f"in any {e['span_recall']:.3f}; MLM accuracy on the examples with the span in a retrieved block "
              f"{e['mlm_accuracy_span_retrieved']:.4f} with retrieval vs "
              f"{e['mlm_accuracy_null_only_span_retrieved']:.4f}")
        helps = e["mlm_accuracy"] > e["mlm_accuracy_null_only"] and e["log_likelihood"] > e["log_likelihood_null_only"]
        figure = (f"{e['num_examples']} held-out examples: MLM accuracy {e['mlm_accuracy']:.2%} with retrieval vs "
                  f"{e['mlm_accuracy_null_only']:.2%} null document only; log-likelihood {e['log_likelihood']:.3f} vs "
                  f"{e['log_likelihood_null_only']:.3f}")
        if all(o.startswith("data.batch_size=") for o in args.overrides):  # the config as it is
            result_records.write(
                "realm-pretraining-config-run", area="REALM pre-training", order=20,
                verdict="holds" if helps else "negative", figure=figure,
                claim=f"The {result['step']}-step pre-training run of {os.path.basename(args.config)} "
                      + ("raised held-out MLM accuracy and likelihood with retrieval." if helps else
                         "did not raise both the held-out MLM accuracy and likelihood with retrieval."))
        else:
            result_records.write(
                "realm-pretraining-heldout-mlm", area="REALM pre-training", order=10,
                verdict="holds" if helps else "negative", figure=f"step {result['step']}, {figure}",
                claim=f"With retrieval temperature {cfg.model.retrieval_temperature:g} and trivial retrievals kept "
                      f"(rate {cfg.pretrain.trivial_retrieval_rate_while_frozen:g}) while the retriever is frozen "
                      f"({cfg.pretrain.freeze_retriever_steps} steps), retrieval "
                      f"{'helps' if helps else 'does not help'} held-out salient-span MLM (one run, one seed).")
    versions = sorted(result["index_versions"])
    delay = [v for _, v in scalars.get("off_policy_delay_steps", [])][-w:]
    if versions and wait and delay:
        stall = float(np.mean(wait))
        result_records.write(
            "realm-pretraining-async-refresh", area="REALM pre-training", order=40,
            verdict="open" if len(versions) < 2 else "holds" if stall < 0.05 else "negative",
            claim="The asynchronous index refresh works on the real corpus: the running input pipeline swaps to each "
                  "new index version without a restart and barely stalls the trainer.",
            figure=f"to step {result['step']}: index versions {', '.join(map(str, versions))} picked up without a "
                   f"restart; input pipeline stall {stall:.1%} of wall time; off-policy delay {np.mean(delay):.0f} "
                   "steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
