"""Can the knowledge-augmented encoder, trained from scratch, learn to copy a masked span from its document?

REALM's reader predicts a masked span of x by reading join_BERT(x, z) (Guu et al., 2020, §3.2); where z holds the
span verbatim, the prediction is a copy. Copying needs the reader to find, for the masked position in x, the
position of z whose neighbours match the mask's neighbours, and to output the token there: a content-addressed
lookup (the "induction head" of Olsson et al., 2022). This probe isolates that from the pipeline: synthetic
batches of random tokens, x a window of z with ``--masked`` tokens masked, the same ``KnowledgeAugmentedEncoder``
and tied masked-LM head that REALM pre-training trains, and the masked-LM loss on z alone.

``--task content``: the window sits at a random offset of z and the mask at a random position of x, so only a
content-addressed lookup copies. ``--task position``: both fixed, so a positional rule copies (the positive
control: the model and its gradients can learn to copy at all). ``--task shift``: the window fixed, the mask at
random, so the span sits a fixed distance after the mask (a relative-position rule copies).

    .venv/bin/python benchmarks/encoder_copy_probe.py --task content --encoder 2x64 --steps 2000
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # before TensorFlow loads (tf-models' Keras)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from realm_tf import config as config_lib  # noqa: E402
from realm_tf.models import knowledge_augmented_encoder  # noqa: E402

import realm_copy_control  # noqa: E402  (benchmarks/)

CLS, SEP, MASK, FIRST_WORD = 2, 3, 4, 10


def make_batch(rng: np.random.Generator, task: str, batch: int, vocab: int, x_len: int, z_len: int,
               masked: int, scattered: bool = False) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``(features, targets)``: [CLS] x [SEP] z [SEP], x a window of z with ``masked`` tokens masked.

    The masked tokens are one span of x, or (``scattered``) single tokens at every other position of x's interior.
    """
    z = rng.integers(FIRST_WORD, vocab, size=(batch, z_len))  # [batch, z_len]
    offsets = rng.integers(0, z_len - x_len, size=batch) if task == "content" else np.full(batch, 5)
    x = np.stack([z[i, o:o + x_len] for i, o in enumerate(offsets)])  # [batch, x_len]
    if scattered:  # single tokens, each with unmasked neighbours: 1, 3, 5, ... of x, a random subset
        odd = np.arange(1, x_len - 1, 2)
        columns = np.sort(np.stack([rng.choice(odd, masked, replace=False) for _ in range(batch)]), 1)
    else:
        starts = rng.integers(1, x_len - masked - 1, size=batch) if task != "position" else np.full(batch, 3)
        columns = starts[:, None] + np.arange(masked)[None, :]  # [batch, masked]
    targets = np.take_along_axis(x, columns, axis=1)  # [batch, masked]
    np.put_along_axis(x, columns, MASK, axis=1)
    ids = np.concatenate([np.full((batch, 1), CLS), x, np.full((batch, 1), SEP), z, np.full((batch, 1), SEP)], 1)
    types = np.concatenate([np.zeros((batch, x_len + 2)), np.ones((batch, z_len + 1))], 1)
    features = {"input_word_ids": tf.constant(ids, tf.int32), "input_mask": tf.ones(ids.shape, tf.int32),
                "input_type_ids": tf.constant(types, tf.int32), "masked_positions": tf.constant(columns + 1, tf.int32)}
    return features, tf.constant(targets, tf.int32)


class PreviousTokenInputs(tf_keras.layers.Layer):
    """Word embeddings plus a learned embedding of each position's previous token (zeros at position 0)."""

    def __init__(self, vocab: int, width: int, **kwargs):
        super().__init__(**kwargs)
        self.table = self.add_weight(name="previous", shape=(vocab, width),
                                     initializer=tf_keras.initializers.TruncatedNormal(stddev=0.02))

    def call(self, encoder: tf_keras.layers.Layer, ids: tf.Tensor) -> tf.Tensor:
        words = tf.gather(encoder.get_embedding_table(), ids)  # [batch, len, width]
        before = tf.gather(self.table, ids[:, :-1])  # [batch, len - 1, width]
        return words + tf.pad(before, [[0, 0], [1, 0], [0, 0]])


def start_sinusoidal(model: tf_keras.Model) -> None:
    """Sets the position-embedding table to sinusoids scaled to the word embeddings' standard deviation."""
    table = next(v for v in model.variables if "position_embedding" in v.name)  # [positions, width]
    words = next(v for v in model.variables if "word_embeddings" in v.name)  # [vocab, width]
    positions, width = table.shape
    angles = np.arange(positions)[:, None] / 10000.0 ** (np.arange(0, width, 2)[None, :] / width)
    sinusoids = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)[:, :width]  # RMS 1/sqrt(2)
    table.assign(sinusoids * float(tf.math.reduce_std(words)) * np.sqrt(2.0))


def start_identity_ov(model: tf_keras.Model) -> None:
    """Sets every attention layer's value and output maps so that, with the heads summed, they pass the input
    through (W_o W_v = I): a head that attends to one position copies that position's vector, token included."""
    for value in [v for v in model.variables if v.name.endswith("self_attention/value/kernel:0")]:
        width, heads, size = value.shape  # [width, heads, head_size]
        value.assign(np.eye(width, dtype=np.float32).reshape(width, heads, size))
    for output in [v for v in model.variables if v.name.endswith("self_attention/attention_output/kernel:0")]:
        heads, size, width = output.shape  # [heads, head_size, width]
        output.assign(np.eye(width, dtype=np.float32).reshape(heads, size, width))


def start_identity_head(model: tf_keras.Model) -> None:
    """Sets the masked-LM head's transform to the identity, so that a word embedding in the last layer's output
    scores that word (the head's output layer is the tied word embeddings)."""
    dense = next(v for v in model.variables if v.name.endswith("masked_lm/transform/dense/kernel:0"))
    dense.assign(np.eye(dense.shape[0], dtype=np.float32))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--task", choices=("content", "shift", "position"), default="content")
    parser.add_argument("--encoder", default="2x64", help="LxH from scratch")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--learning-rate", dest="learning_rate", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=0, help="linear warm-up steps")
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--masked", type=int, default=2)
    parser.add_argument("--scattered", action="store_true", help="mask single tokens, not one span")
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=32)
    parser.add_argument("--x-len", dest="x_len", type=int, default=20)
    parser.add_argument("--z-len", dest="z_len", type=int, default=60)
    parser.add_argument("--sinusoidal", action="store_true",
                        help="start the position embeddings as sinusoids (Vaswani et al., 2017), at the word "
                             "embeddings' scale, instead of at random")
    parser.add_argument("--previous-token-inputs", dest="previous_token_inputs", action="store_true",
                        help="add to each position's input embedding a learned embedding of the token before it: "
                             "the reader is handed what a previous-token head would compute")
    parser.add_argument("--identity-ov", dest="identity_ov", action="store_true",
                        help="start every attention layer's value and output maps as the identity (heads summed)")
    parser.add_argument("--identity-head", dest="identity_head", action="store_true",
                        help="start the masked-LM head's transform as the identity")
    parser.add_argument("--stages", default="",
                        help="a curriculum instead of --task/--steps: TASK:STEPS items, e.g. shift:2500,content:4000 "
                             "(one model and optimizer throughout)")
    parser.add_argument("--every", type=int, default=250)
    args = parser.parse_args()

    cfg = config_lib.load_config("configs/tiny.yaml", [*realm_copy_control.encoder_overrides(args.encoder),
                                                       f"model.encoder.vocab_size={args.vocab}"])
    width = cfg.model.encoder.hidden_size
    model = knowledge_augmented_encoder.build_knowledge_augmented_encoder(cfg.model)
    if args.sinusoidal:
        start_sinusoidal(model)
    if args.identity_ov:
        start_identity_ov(model)
    if args.identity_head:
        start_identity_head(model)
    rate = tf_keras.optimizers.schedules.PolynomialDecay(args.learning_rate * 1e-3, max(args.warmup, 1),
                                                         args.learning_rate)
    optimizer = tf_keras.optimizers.Adam(rate if args.warmup else args.learning_rate)

    previous = PreviousTokenInputs(args.vocab, width) if args.previous_token_inputs else None

    def forward(features: dict[str, tf.Tensor]) -> tf.Tensor:
        if previous is None:
            return model(features, training=True)["mlm_logits"]
        embedded = {**features, "input_word_embeddings": previous(model.encoder, features["input_word_ids"])}
        sequence = model.encoder(embedded, training=True)["sequence_output"]  # [batch, len, width]
        return model.masked_lm(sequence, masked_positions=features["masked_positions"])

    @tf.function(jit_compile=True)
    def step(features: dict[str, tf.Tensor], targets: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            logits = forward(features)  # [batch, masked, vocab]
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits))
        variables = model.trainable_variables + (previous.trainable_variables if previous is not None else [])
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        correct = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), targets)
        return loss, tf.reduce_mean(tf.cast(correct, tf.float32))

    rng, start = np.random.default_rng(0), time.time()
    print(f"task {args.task}, encoder {args.encoder}, rate {args.learning_rate}, warm-up {args.warmup}; chance "
          f"loss {np.log(args.vocab - FIRST_WORD):.3f}", flush=True)
    stages = [(t, int(n)) for t, n in (item.split(":") for item in args.stages.split(","))] if args.stages \
        else [(args.task, args.steps)]
    number = 0
    for task, steps in stages:
        for _ in range(steps):
            number += 1
            loss, accuracy = step(*make_batch(rng, task, args.batch_size, args.vocab, args.x_len, args.z_len,
                                                args.masked, args.scattered))
            if number % args.every == 0:
                print(f"step {number} ({task}): loss {float(loss):.3f}, copy accuracy {float(accuracy):.3f} "
                      f"({time.time() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
