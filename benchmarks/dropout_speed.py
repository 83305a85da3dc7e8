"""What BERT's dropout costs a training step on CPU: Keras' ``tf.nn.dropout`` against 16-bit integer masks.

Every REALM tower trains with BERT's dropouts (Devlin et al., 2019): on the embeddings, on each layer's attention
output and feed-forward output, and on the attention probabilities. ``tf.nn.dropout`` draws a 32-bit float per
element and selects; :mod:`realm_tf.layers.integer_dropout` decides each element on 16 random bits and multiplies by
the mask, with the attention's scale applied to the product with V. This times, in one process, interleaved:

1. one dropout forward and backward on a ``[batch, length, 384]`` hidden state, and on ``[batch, 12, length,
   length]`` attention probabilities followed by their product with V (``[batch, 12, length, 32]``);
2. a whole training step of a MiniLM-shaped encoder (6 layers, width 384, random weights; forward, backward and
   Adam) on ``[batch, length]`` rows, with realm_tf's dropouts and with Keras' (the same layers, their dropout
   calls routed to Keras' ``Dropout`` and ``tf.nn.dropout`` in this process only);

in float32 and in mixed bfloat16, each the best of ``--repeats`` rounds, with numpy's sgemm before and after as the
machine's reference (``machine_reference``).

Usage: python benchmarks/dropout_speed.py [--batch 8] [--length 320] [--repeats 7]
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import realm_tf  # noqa: F401,E402  pylint: disable=wrong-import-position,unused-import  (TF env before TF loads)

import machine_reference  # noqa: E402  pylint: disable=wrong-import-position  (benchmarks/machine_reference.py)

# isort: split
import tensorflow as tf  # noqa: E402  pylint: disable=wrong-import-position
import tf_keras  # noqa: E402  pylint: disable=wrong-import-position

from realm_tf import config as config_lib  # noqa: E402  pylint: disable=wrong-import-position
from realm_tf.layers import head_major_attention  # noqa: E402  pylint: disable=wrong-import-position
from realm_tf.layers import integer_dropout  # noqa: E402  pylint: disable=wrong-import-position
from realm_tf.networks import bert_encoder  # noqa: E402  pylint: disable=wrong-import-position

import result_records  # noqa: E402  pylint: disable=wrong-import-position  (benchmarks/)

RATE = 0.1


def _keras_product(probabilities: tf.Tensor, value: tf.Tensor, rate: float) -> tf.Tensor:
    return tf.matmul(tf.nn.dropout(probabilities, rate), value)


INTEGER_CALL = integer_dropout.IntegerDropout.call
INTEGER_PRODUCT = head_major_attention._dropped_product  # pylint: disable=protected-access


def use(arm: str) -> None:
    """Routes every dropout of this process through realm_tf's masks (``"integer"``) or Keras' (``"keras"``)."""
    keras = arm == "keras"
    integer_dropout.IntegerDropout.call = tf_keras.layers.Dropout.call if keras else INTEGER_CALL
    head_major_attention._dropped_product = (  # pylint: disable=protected-access
        _keras_product if keras else INTEGER_PRODUCT)


def kernel_steps(batch: int, length: int, dtype: tf.dtypes.DType) -> dict[tuple[str, str], Any]:
    """``{(piece, arm): traced forward-and-backward}`` for the two dropouts of a BERT layer."""
    hidden = tf.cast(tf.random.uniform([batch, length, 384]), dtype)  # [batch, length, width]
    probabilities = tf.cast(tf.random.uniform([batch, 12, length, length]), dtype)  # [batch, heads, length, length]
    value = tf.cast(tf.random.normal([batch, 12, length, 32]), dtype)  # [batch, heads, length, head_size]
    pieces = {
        ("hidden", "keras"): lambda: tf.nn.dropout(hidden, RATE),
        ("hidden", "integer"): lambda: integer_dropout.dropout(hidden, RATE),
        ("attention", "keras"): lambda: _keras_product(probabilities, value, RATE),
        ("attention", "integer"): lambda: INTEGER_PRODUCT(probabilities, value, RATE),
    }

    def backward(forward):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                tape.watch([hidden, probabilities, value])
                loss = tf.reduce_sum(tf.cast(forward(), tf.float32))
            return [g for g in tape.gradient(loss, [hidden, probabilities, value]) if g is not None]
        return step
    return {key: backward(forward) for key, forward in pieces.items()}


def encoder_step(batch: int, length: int, arm: str):
    """A training step of a MiniLM-shaped encoder whose dropouts go through ``arm``; the encoder builds at its first
    call, in the global Keras policy of then."""
    cfg = config_lib.load_config("configs/minilm.yaml")
    encoder = bert_encoder.build_bert_encoder(cfg.model.encoder)  # in the global policy, set by the caller
    optimizer = tf_keras.optimizers.Adam(1e-5)
    inputs = {"input_word_ids": tf.random.uniform([batch, length], 1, 30000, tf.int32),
              "input_mask": tf.ones([batch, length], tf.int32), "input_type_ids": tf.zeros([batch, length], tf.int32)}

    @tf.function
    def step():
        use(arm)  # at trace time: this function's graph holds the arm's dropouts
        with tf.GradientTape() as tape:
            output = encoder(inputs, training=True)["sequence_output"]  # [batch, length, width]
            loss = tf.reduce_mean(tf.square(tf.cast(output, tf.float32)))
        variables = encoder.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss
    return step


def interleaved_best(functions: dict, repeats: int) -> dict:
    """The best of ``repeats`` rounds per function, the functions taking turns within each round."""
    for function in functions.values():
        function(), function()
    best = {key: float("inf") for key in functions}
    for _ in range(repeats):
        for key, function in functions.items():
            best[key] = min(best[key], machine_reference.best_seconds(
                lambda f=function: tf.nest.map_structure(lambda t: t.numpy(), f()), 1, warmups=0))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    sgemm_before = machine_reference.sgemm_gflops()
    rows, steps = [], {}
    for precision, dtype in (("float32", tf.float32), ("mixed_bfloat16", tf.bfloat16)):
        kernels = interleaved_best(kernel_steps(args.batch, args.length, dtype), args.repeats)
        for piece in ("hidden", "attention"):
            rows.append(f"{precision:15s} {piece:9s} dropout fwd+bwd: Keras {kernels[piece, 'keras'] * 1e3:7.2f} ms, "
                        f"16-bit masks {kernels[piece, 'integer'] * 1e3:7.2f} ms")
        tf_keras.mixed_precision.set_global_policy(precision)
        functions = {arm: encoder_step(args.batch, args.length, arm) for arm in ("keras", "integer")}
        best = interleaved_best(functions, args.repeats)  # its warm-up calls build the encoders in the policy
        tf_keras.mixed_precision.set_global_policy("float32")
        steps[precision] = best
        rows.append(f"{precision:15s} encoder training step: Keras' dropouts {best['keras'] * 1e3:7.1f} ms, "
                    f"16-bit masks {best['integer'] * 1e3:7.1f} ms ({best['keras'] / best['integer']:.2f}x)")
    use("integer")
    sgemm_after = machine_reference.sgemm_gflops()
    print("\n".join(rows))
    print(f"numpy sgemm 2048^3 float32 ({machine_reference.sgemm_kernel()}): {sgemm_before:.1f} GFLOP/s before, "
          f"{sgemm_after:.1f} after")
    speedup = {p: s["keras"] / s["integer"] for p, s in steps.items()}
    result_records.write(
        "speed-dropout-masks", area="Speed and memory", order=52,
        verdict="holds" if min(speedup.values()) > 1.0 else "negative",
        claim="BERT's dropouts as 16-bit integer masks (realm_tf.layers.integer_dropout) make a MiniLM-shaped "
              "training step faster than Keras' tf.nn.dropout, in float32 and in mixed bfloat16.",
        figure=f"{args.batch} x {args.length}, best of {args.repeats} interleaved rounds: "
               + "; ".join(f"{p} {s['keras'] * 1e3:.0f} -> {s['integer'] * 1e3:.0f} ms ({speedup[p]:.2f}x)"
                           for p, s in steps.items())
               + f"; sgemm {sgemm_before:.1f} / {sgemm_after:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
