"""Where a BERT forward pass loses time on CPU, piece by piece: Keras' / tf-models' way against realm_tf's (issue #20).

Every REALM tower is a BERT (Guu et al., 2020, §3.2). This times, at one batch of MiniLM's shapes (``--batch``
rows of ``--length`` wordpieces, 12 heads of 32, width 384, feed-forward 1,536), in one process:

1. the attention products softmax(Q Kᵀ / √d + mask) V, each layer's own ``_compute_attention`` on the same
   projected Q, K, V: Keras' ``MultiHeadAttention`` (two ``tf.einsum`` over ``[batch, seq_len, heads,
   head_size]``) against ``HeadMajorAttention`` (Q, K, V transposed to ``[batch, heads, seq_len, head_size]``,
   two ``tf.matmul``, the scale and mask fused into the first), plain graph and XLA;
2. the feed-forward network as ``EinsumDense`` does it (einsum, ``+ bias``, GELU, einsum, ``+ bias``) against
   ``MatmulEinsumDense``'s (flat ``MatMul → BiasAdd → GELU``, which grappler fuses into one oneDNN kernel), and
   the two matmuls alone;
3. the whole encoder: tf-models' ``BertEncoderV2`` against ``realm_tf``'s ``BertEncoder`` holding the same
   weights, plain graph and XLA (``jit_compile``), with every row's real length drawn between half and all of
   ``--length`` (a mask, as blocks have), and the largest difference of their outputs;

each the best of ``--repeats`` calls after two warm-ups, with ``TF_CPU_ALLOCATOR_USE_BFC=true`` as ``realm-tf``
runs, and numpy's sgemm before and after as the machine's reference (``machine_reference``).

Usage: python benchmarks/bert_kernels.py [--batch 32] [--length 160] [--repeats 10]
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import realm_tf  # noqa: F401,E402  pylint: disable=wrong-import-position,unused-import  (TF env before TF loads)

import machine_reference  # noqa: E402  pylint: disable=wrong-import-position  (benchmarks/machine_reference.py)

# isort: split
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position
import tensorflow as tf  # noqa: E402  pylint: disable=wrong-import-position
import tf_keras  # noqa: E402  pylint: disable=wrong-import-position
from official.nlp.modeling import networks  # noqa: E402  pylint: disable=wrong-import-position

from realm_tf import config as config_lib  # noqa: E402  pylint: disable=wrong-import-position
from realm_tf.layers import head_major_attention  # noqa: E402  pylint: disable=wrong-import-position
from realm_tf.networks import bert_encoder  # noqa: E402  pylint: disable=wrong-import-position

import result_records  # noqa: E402  pylint: disable=wrong-import-position  (benchmarks/)


def best_seconds(function, repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``function`` (its result read back to numpy), after two warm-ups."""
    return machine_reference.best_seconds(lambda: _read(function()), repeats, warmups=2)


def _read(outputs):
    return tf.nest.map_structure(lambda t: t.numpy(), outputs)


def _row(name: str, seconds: float, flops: float) -> str:
    return f"    {name:58s} {seconds * 1e3:8.2f} ms {flops / seconds / 1e9:7.1f} GFLOP/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    cfg = config_lib.load_config(args.config).model.encoder
    batch, length, width = args.batch, args.length, cfg.hidden_size
    heads, inner = cfg.num_attention_heads, cfg.intermediate_size
    head_size = width // heads
    rng = np.random.default_rng(0)
    sgemm_before = machine_reference.sgemm_gflops()
    print(f"{args.config}: batch {batch} x {length} wordpieces, width {width}, {heads} heads of {head_size}, "
          f"feed-forward {inner}; TF {tf.__version__}; {os.cpu_count()} CPUs; BFC "
          f"{os.environ['TF_CPU_ALLOCATOR_USE_BFC']}")

    # 1. The attention products: each layer's own `_compute_attention` on projected Q, K, V.
    q, k, v = (tf.constant(rng.standard_normal((batch, length, heads, head_size), dtype=np.float32))
               for _ in range(3))  # each [batch, seq_len, heads, head_size]
    lengths = rng.integers(length // 2, length + 1, batch)
    attention_mask = tf.constant(np.broadcast_to(np.arange(length)[None, None, :] < lengths[:, None, None],
                                                 (batch, length, length)))  # [batch, seq_len, seq_len]
    attention_layers = {"Keras' einsums": tf_keras.layers.MultiHeadAttention(heads, head_size),
                        "head-major matmuls": head_major_attention.HeadMajorAttention(heads, head_size)}
    flops = 4.0 * batch * heads * length * length * head_size
    print("attention products, softmax(Q Kᵀ/√d + mask) V (useful FLOPs: the two products):")
    results = {}
    for name, layer in attention_layers.items():
        layer(tf.zeros((1, 1, width)), tf.zeros((1, 1, width)))  # builds its projections and einsum equations
        for jit in (False, True):
            attend = layer._compute_attention  # pylint: disable=protected-access
            compiled = tf.function(lambda f=attend: f(q, k, v, attention_mask)[0], jit_compile=jit)
            results[name, jit] = _read(compiled())
            print(_row(f"{name}, {'XLA' if jit else 'plain graph'}", best_seconds(compiled, args.repeats), flops))
    difference = np.abs(results["head-major matmuls", False] - results["Keras' einsums", False]).max()
    print(f"    max |head-major - einsum| = {difference:.2e}")

    # 2. The feed-forward network.
    x = tf.constant(rng.standard_normal((batch, length, width), dtype=np.float32))  # [batch, seq_len, width]
    w_in = tf.constant(rng.standard_normal((width, inner), dtype=np.float32) * 0.05)
    b_in = tf.constant(rng.standard_normal(inner, dtype=np.float32))
    w_out = tf.constant(rng.standard_normal((inner, width), dtype=np.float32) * 0.05)
    b_out = tf.constant(rng.standard_normal(width, dtype=np.float32))

    def einsum_ffn():
        hidden = tf.nn.gelu(tf.einsum("abc,cd->abd", x, w_in) + b_in, approximate=False)
        return tf.einsum("abc,cd->abd", hidden, w_out) + b_out

    def flat_ffn():
        hidden = tf.nn.gelu(tf.nn.bias_add(tf.matmul(tf.reshape(x, [-1, width]), w_in), b_in), approximate=False)
        return tf.reshape(tf.nn.bias_add(tf.matmul(hidden, w_out), b_out), [batch, length, width])

    def matmuls_only():
        return tf.matmul(tf.matmul(tf.reshape(x, [-1, width]), w_in), w_out)

    flops = 4.0 * batch * length * width * inner
    print("feed-forward network, GELU(x W1 + b1) W2 + b2:")
    for name, function, jit in (("EinsumDense (einsum, + bias, GELU), plain graph", einsum_ffn, False),
                                ("EinsumDense, XLA", einsum_ffn, True),
                                ("MatmulEinsumDense (MatMul → BiasAdd → GELU), plain graph", flat_ffn, False),
                                ("the two matmuls alone", matmuls_only, False)):
        print(_row(name, best_seconds(tf.function(function, jit_compile=jit), args.repeats), flops))

    # 3. The whole encoder.
    ours = bert_encoder.build_bert_encoder(cfg)
    theirs = networks.BertEncoderV2(**ours.get_config(), name="bert")
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)  # [batch, seq_len]
    inputs = {"input_word_ids": tf.constant(rng.integers(1000, 20000, (batch, length)) * mask, tf.int32),
              "input_mask": tf.constant(mask), "input_type_ids": tf.zeros((batch, length), tf.int32)}
    ours(inputs)
    theirs(inputs)
    theirs.set_weights(ours.get_weights())
    useful = float(machine_reference.bert_row_flops(lengths, cfg.num_layers, width, inner).sum())
    print(f"whole encoder, {cfg.num_layers} layers, rows of {lengths.min()}-{lengths.max()} real wordpieces "
          f"(useful FLOPs: real wordpieces only, {useful / 1e9:.1f} GFLOP):")
    signature = {key: tf.TensorSpec([None, None], tf.int32) for key in inputs}
    outputs = {}
    encoder_seconds: dict[tuple[str, bool], float] = {}  # (encoder, XLA) -> best seconds
    for name, encoder in (("tf-models' BertEncoderV2", theirs), ("realm_tf's BertEncoder", ours)):
        for jit in (False, True):
            # Batch and length unknown to the graph, as in the embedder's and the served SavedModels.
            graph = tf.function(lambda packed, e=encoder: e(packed, training=False)["sequence_output"],
                                jit_compile=jit, input_signature=[signature])
            forward = functools.partial(graph, inputs)
            outputs[name, jit] = _read(forward())
            encoder_seconds[name, jit] = best_seconds(forward, args.repeats)
            print(_row(f"{name}, {'XLA' if jit else 'plain graph'}", encoder_seconds[name, jit], useful))
    real = mask.astype(bool)
    difference = np.abs(outputs["realm_tf's BertEncoder", False] - outputs["tf-models' BertEncoderV2", False])
    print(f"    max |BertEncoder - BertEncoderV2| over real wordpieces = {difference[real].max():.2e}")
    sgemm_after = machine_reference.sgemm_gflops()
    print(f"numpy sgemm 2048^3 float32 ({machine_reference.sgemm_kernel()}): {sgemm_before:.1f} GFLOP/s before, "
          f"{sgemm_after:.1f} after")
    ms = {key: 1e3 * seconds for key, seconds in encoder_seconds.items()}
    (ours_plain, ours_xla), (theirs_plain, theirs_xla) = (
        (ms[name, False], ms[name, True]) for name in ("realm_tf's BertEncoder", "tf-models' BertEncoderV2"))
    faster = ours_plain < theirs_plain
    result_records.write(
        "speed-bert-encoder-kernels", area="Speed and memory", order=50, verdict="holds" if faster else "negative",
        claim="realm_tf's BertEncoder (head-major attention, fused MatMul-BiasAdd-GELU, oneDNN layer norms) is "
              f"{'faster' if faster else 'not faster'} than tf-models' BertEncoderV2 with the same weights.",
        figure=f"{cfg.num_layers}-layer encoder, width {width}, {batch} × {length}: {ours_plain:.2f} ms "
               f"({useful / ours_plain / 1e6:.1f} GFLOP/s) vs {theirs_plain:.2f} ms "
               f"({useful / theirs_plain / 1e6:.1f} GFLOP/s); sgemm {sgemm_before:.1f} / {sgemm_after:.1f} GFLOP/s")
    pays = ours_xla < ours_plain
    result_records.write(
        "speed-xla-inference", area="Speed and memory", order=80, verdict="holds" if pays else "negative",
        claim=f"Compiling realm_tf's encoder for inference with XLA {'pays' if pays else 'does not pay'} against its "
              "plain graph (model.compiled_inference).",
        figure=f"{batch} × {length}: realm_tf's encoder {ours_xla:.2f} ms under XLA vs {ours_plain:.2f} ms plain "
               f"graph; tf-models' {theirs_xla:.2f} ms vs {theirs_plain:.2f} ms")


if __name__ == "__main__":
    main()
