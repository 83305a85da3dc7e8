"""Questions per second of the Open-QA reader, with and without length bucketing (issue #15 §2).

Times the span reader on rows drawn from the real block-length distribution of the bundled corpus (``[CLS]
question [SEP] title [SEP] body [SEP]``, a 12-wordpiece question), ``--questions`` questions × ``--beam``
blocks per batch, as fine-tuning (forward + backward) and as evaluation (forward), for each
``model.reader_length_buckets`` given, and with ``--static`` also as before §2: every row padded to
``model.reader_seq_length`` (``data.static_padding=true``, one group). numpy's sgemm is timed in the same run as
the machine's reference.

    .venv/bin/python benchmarks/reader_speed.py --static --buckets 1 4
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

import machine_reference  # noqa: E402  (benchmarks/machine_reference.py)
import result_records  # noqa: E402  (benchmarks/)

# isort: split
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from realm_tf import config as config_lib  # noqa: E402
from realm_tf.data import block_store  # noqa: E402
from realm_tf.models import span_reader  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--blocks", default="runs/bench/blocks")
    parser.add_argument("--questions", type=int, default=4, help="questions per batch")
    parser.add_argument("--beam", type=int, default=5, help="blocks read per question")
    parser.add_argument("--buckets", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=4, help="timed batches per setting (after one warm-up)")
    parser.add_argument("--static", action="store_true",
                        help="also time rows padded to model.reader_seq_length (before length-dependent padding)")
    args = parser.parse_args()
    blocks = block_store.BlockStore.load(os.path.join(args.blocks, "blocks-*.tfrecord*"))
    lengths = np.array([len(blocks.title_ids(i)) + len(blocks.body_ids(i)) for i in range(len(blocks))])
    rng = np.random.default_rng(0)
    base = config_lib.load_config(args.config)
    seq = base.model.reader_seq_length
    print(f"numpy sgemm: {machine_reference.sgemm_gflops():.0f} GFLOP/s; rows {args.questions} x {args.beam}, "
          f"reader_seq_length {seq}", flush=True)
    batches, static_batches = [], []
    for _ in range(args.repeats + 1):
        rows = np.minimum(rng.choice(lengths, args.questions * args.beam) + 12 + 4, seq)  # [rows]
        width = int(rows.max())  # the batch is padded to its longest row (data.static_padding=false)
        static_batches.append(_batch(rows, seq, args.questions, args.beam, rng))
        batches.append(_batch(rows, width, args.questions, args.beam, rng))
    settings = [("static padding", 1, static_batches)] if args.static else []
    settings += [(f"length_buckets {buckets}", buckets, batches) for buckets in args.buckets]
    rates: dict[tuple[str, str], float] = {}  # (setting, what is timed) -> questions per second
    for label, buckets, timed in settings:
        cfg = config_lib.load_config(args.config, [f"model.reader_length_buckets={buckets}"])
        reader = span_reader.build_span_reader(cfg.model)

        # Traced once for any lengths, as training and evaluation trace (core/tracing.py): a per-shape trace would
        # time a retrace whenever a batch's longest row differs from the last one's.
        signature = [{k: tf.TensorSpec([None, None, None], tf.int32) for k in timed[0]}]

        @tf.function(input_signature=signature)
        def train(x):
            with tf.GradientTape() as tape:
                out = reader(x, training=True)
                loss = tf.reduce_sum(tf.where(out["span_mask"], out["span_logits"], 0.0)) * 1e-6
            return tape.gradient(loss, reader.trainable_variables)

        @tf.function(input_signature=signature)
        def forward(x):
            return reader(x, training=False)["span_logits"]

        for name, fn in (("fine-tuning step (forward + backward)", train), ("evaluation (forward)", forward)):
            fn(timed[0])
            start = time.perf_counter()
            for batch in timed[1:]:
                fn(batch)
            seconds = (time.perf_counter() - start) / args.repeats
            rates[label, name] = args.questions / seconds
            print(f"{label}: {name}: {seconds:.2f} s per batch = {args.questions / seconds:.2f} questions/s",
                  flush=True)
    if args.static and max(args.buckets) > 1:  # the most length groups against static padding
        grouped = f"length_buckets {max(args.buckets)}"
        (train_before, train_after), (eval_before, eval_after) = (
            (rates["static padding", name], rates[grouped, name])
            for name in ("fine-tuning step (forward + backward)", "evaluation (forward)"))
        faster = min(train_after / train_before, eval_after / eval_before)
        result_records.write(
            "speed-reader-length-buckets", area="Speed and memory", order=60,
            verdict="holds" if faster > 1 else "negative",
            claim=f"Reading rows in length groups instead of padding each to {seq} wordpieces multiplies the span "
                  f"reader's questions per second by at least {faster:.1f}.",
            figure=f"{args.questions} questions × {args.beam} blocks, {max(args.buckets)} groups vs static padding: "
                   f"fine-tuning {train_before:.2f} → {train_after:.2f} questions/s, evaluation "
                   f"{eval_before:.2f} → {eval_after:.2f} questions/s")
    return 0


def _batch(rows: np.ndarray, width: int, questions: int, beam: int, rng: np.random.Generator) -> dict:
    """Reader inputs ``[questions, beam, width]`` whose rows have the lengths ``rows`` (random wordpieces)."""
    mask = (np.arange(width)[None] < rows[:, None]).astype(np.int32)
    ids = mask * rng.integers(1000, 20000, mask.shape).astype(np.int32)
    types = mask * (np.arange(width)[None] > 13).astype(np.int32)
    shape = [questions, beam, width]
    return {"input_word_ids": tf.constant(ids.reshape(shape)), "input_mask": tf.constant(mask.reshape(shape)),
            "input_type_ids": tf.constant(types.reshape(shape))}


if __name__ == "__main__":
    sys.exit(main())
