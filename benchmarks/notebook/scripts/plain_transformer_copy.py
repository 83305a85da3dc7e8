"""A transformer written outside realm_tf, on the copy probe's content task: is the plateau the task's or ours?

A plain 2 × 64 transformer (tf_keras ``MultiHeadAttention``, learned positions, tied output embedding), pre-LN by
default or post-LN as BERT, trained on ``encoder_copy_probe.make_batch(..., "content", ...)`` batches: batch 32,
2 masked tokens, Adam 1e-3, seed 0. Only the probe's batches are shared with realm_tf.

    .venv/bin/python benchmarks/notebook/scripts/plain_transformer_copy.py VOCAB STEPS [post]
"""
from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # benchmarks/
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import encoder_copy_probe as probe  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

X_LEN, Z_LEN, WIDTH, LAYERS = 20, 60, 64, 2


class PlainTransformer(tf_keras.Model):
    """Embeddings, ``LAYERS`` attention + feed-forward blocks, and logits over the vocabulary at the masks."""

    def __init__(self, vocab: int, post_ln: bool):
        super().__init__()
        init = tf_keras.initializers.TruncatedNormal(stddev=0.02)
        self.post_ln = post_ln
        self.words = tf_keras.layers.Embedding(vocab, WIDTH, embeddings_initializer=init)
        self.positions = self.add_weight(name="positions", shape=(X_LEN + Z_LEN + 3, WIDTH), initializer=init)
        self.types = self.add_weight(name="types", shape=(2, WIDTH), initializer=init)
        self.blocks = [(tf_keras.layers.LayerNormalization(), tf_keras.layers.MultiHeadAttention(2, WIDTH // 2),
                        tf_keras.layers.LayerNormalization(), tf_keras.layers.Dense(4 * WIDTH, activation="gelu"),
                        tf_keras.layers.Dense(WIDTH)) for _ in range(LAYERS)]
        self.final = tf_keras.layers.LayerNormalization()

    def call(self, f: dict[str, tf.Tensor]) -> tf.Tensor:
        h = self.words(f["input_word_ids"]) + self.positions[None] + tf.gather(self.types, f["input_type_ids"])
        for norm1, attention, norm2, up, down in self.blocks:
            if self.post_ln:
                h = norm1(h + attention(h, h))
                h = norm2(h + down(up(h)))
            else:
                a = norm1(h)
                h = h + attention(a, a)
                h = h + down(up(norm2(h)))
        masked = tf.gather(self.final(h), f["masked_positions"], batch_dims=1)  # [batch, masked, width]
        return tf.matmul(masked, self.words.embeddings, transpose_b=True)  # [batch, masked, vocab]


def main() -> int:
    vocab, steps, post_ln = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["post"]
    tf_keras.utils.set_random_seed(0)
    model, optimizer, rng = PlainTransformer(vocab, post_ln), tf_keras.optimizers.Adam(1e-3), np.random.default_rng(0)
    model(probe.make_batch(rng, "content", 2, vocab, X_LEN, Z_LEN, 2)[0])

    @tf.function(jit_compile=True)
    def step(features: dict[str, tf.Tensor], targets: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            logits = model(features)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        correct = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), targets)
        return loss, tf.reduce_mean(tf.cast(correct, tf.float32))

    start = time.time()
    for number in range(1, steps + 1):
        loss, accuracy = step(*probe.make_batch(rng, "content", 32, vocab, X_LEN, Z_LEN, 2))
        if number % 500 == 0:
            print(f"step {number}: loss {float(loss):.3f}, copy accuracy {float(accuracy):.3f} "
                  f"({time.time() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
