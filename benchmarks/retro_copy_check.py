"""Can our RETRO decoder learn to use its neighbours at all? A synthetic copy task that only retrieval can solve.

Sequences are uniformly random tokens, so a decoder alone cannot beat log2(V) bits per token. Each chunk u's
first neighbour is its own text followed by its true continuation, chunk u + 1 (the value RETRO stores, §2.3);
the second neighbour is a random distractor of the same shape. Under the causal shift (§2.4), the targets of chunk
u ≥ 1 are then readable from the neighbours of chunk u − 1. A RETRO decoder whose chunked cross-attention, causal
shift and neighbour encoder work learns to copy them: its bits per token on chunks ≥ 1 fall towards 0, while the
first chunk (no neighbours) and the baseline stay at log2(V). With the neighbours masked ("retrieval off") or
taken from another sequence, the trained model is back at log2(V). Held-out sequences are fresh random draws.

    .venv/bin/python benchmarks/retro_copy_check.py [--steps 400]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from realm_tf.retro import retro_decoder  # noqa: E402

import result_records  # noqa: E402  (benchmarks/)


def make_batch(rng: np.random.Generator, batch: int, chunks: int, m: int, vocab: int) -> dict[str, np.ndarray]:
    """Random sequences ``[batch, chunks * m]`` (tokens 1..vocab-1) with neighbours ``[batch, chunks, 2, 2m]``:
    neighbour 0 = the chunk and its continuation (padding after the last chunk), neighbour 1 = random."""
    ids = rng.integers(1, vocab, size=[batch, (chunks + 1) * m]).astype(np.int32)  # one chunk past the end
    per_chunk = ids.reshape(batch, chunks + 1, m)  # [b, c + 1, m]
    true = np.concatenate([per_chunk[:, :-1], per_chunk[:, 1:]], axis=-1)  # [b, c, 2m]
    distractor = rng.integers(1, vocab, size=true.shape).astype(np.int32)  # [b, c, 2m]
    return {"input_ids": ids[:, :chunks * m], "next": ids[:, 1:chunks * m + 1],
            "neighbour_ids": np.stack([true, distractor], axis=2),  # [b, c, 2, 2m]
            "neighbour_mask": np.ones([batch, chunks, 2, 2 * m], bool)}


def bits(model: tf_keras.Model, batch: dict[str, np.ndarray], m: int) -> tuple[float, float]:
    """Bits per token of the first chunk's targets and of the later chunks' targets (the last position, whose
    target lies past the sequence, is not scored)."""
    features = {k: batch[k] for k in ("input_ids", "neighbour_ids", "neighbour_mask")}
    logits = model(features, training=False)["logits"]  # [b, n, V]
    nll = tf.keras.losses.sparse_categorical_crossentropy(batch["next"], logits, from_logits=True).numpy()  # [b, n]
    target_chunk = (np.arange(nll.shape[1]) + 1) // m  # [n]: chunk of each target
    first, later = nll[:, target_chunk == 0], nll[:, (target_chunk >= 1) & (np.arange(nll.shape[1]) < nll.shape[1] - 1)]
    return float(first.mean() / math.log(2)), float(later.mean() / math.log(2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--chunk_length", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    m, c, vocab = args.chunk_length, args.chunks, args.vocab
    tf.keras.utils.set_random_seed(args.seed)
    results = {}
    for name, layers in (("baseline", ()), ("RETRO", retro_decoder.default_retro_layers(args.layers))):
        model = retro_decoder.RetroDecoder(vocab, c * m, m, 2 * m, args.layers, args.width, 4, 2 * args.width,
                                           retro_layers=layers, encoder_layers=2)
        optimizer = tf_keras.optimizers.Adam(args.learning_rate)

        @tf.function
        def step(features, targets, model=model, optimizer=optimizer):
            with tf.GradientTape() as tape:
                logits = model(features, training=True)["logits"][:, :-1]  # [b, n - 1, V]
                loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
                    targets[:, :-1], logits, from_logits=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        rng = np.random.default_rng(args.seed)
        started = time.perf_counter()
        for s in range(1, args.steps + 1):
            batch = make_batch(rng, args.batch, c, m, vocab)
            loss = step({k: batch[k] for k in ("input_ids", "neighbour_ids", "neighbour_mask")}, batch["next"])
            if s % max(args.steps // 8, 1) == 0:
                print(f"{name} step {s}: train loss {float(loss) / math.log(2):.3f} bits/token", flush=True)
        seconds = time.perf_counter() - started
        held_out = make_batch(np.random.default_rng(args.seed + 1), 256, c, m, vocab)
        rows = {"neighbours": bits(model, held_out, m)}
        if layers:
            off = dict(held_out, neighbour_mask=np.zeros_like(held_out["neighbour_mask"]))
            rows["retrieval off"] = bits(model, off, m)
            shuffled = dict(held_out, neighbour_ids=np.roll(held_out["neighbour_ids"], 1, axis=0))
            rows["another sequence's neighbours"] = bits(model, shuffled, m)
        results[name] = (rows, seconds)
    print(f"\n== copy check: random tokens (V = {vocab}, log2(V - 1) = {math.log2(vocab - 1):.3f} bits), "
          f"{c} chunks of m = {m}, decoder {args.layers} x {args.width}, {args.steps} steps of {args.batch}; "
          f"held-out bits per token ==")
    print(f"{'model, neighbours':<46}{'chunk 0 targets':>16}{'chunks >= 1':>14}")
    for name, (rows, seconds) in results.items():
        for label, (first, later) in rows.items():
            print(f"{name + ', ' + label:<46}{first:>16.3f}{later:>14.3f}")
        print(f"{'':<4}({name} trained in {seconds:.0f} s)")
    retro = {label: later for label, (_, later) in results["RETRO"][0].items()}  # bits per token on chunks >= 1
    baseline, other = results["baseline"][0]["neighbours"][1], retro["another sequence's neighbours"]
    result_records.write(
        "retro-copy-check", area="RETRO and kNN-LM", order=30,
        verdict="holds" if retro["neighbours"] < baseline / 2 else "negative",
        claim="The RETRO decoder can learn to copy through chunked cross-attention when every chunk's neighbour holds "
              "its continuation.",
        figure=f"random tokens, chunks ≥ 1, held out: {retro['neighbours']:.3f} bits/token with neighbours vs "
               f"{baseline:.3f} baseline, {retro['retrieval off']:.3f} retrieval off, "
               f"{other:.3f} with another sequence's neighbours")
    return 0


if __name__ == "__main__":
    sys.exit(main())
