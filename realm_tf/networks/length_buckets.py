"""BERT over a batch of rows in groups of similar length, each group padded only to its own longest row.

REALM's BERTs read rows of very different lengths: blocks of the bundled corpus have a median of 133 wordpieces
and a 99th percentile of 288, and join_BERT(x, z) adds the query's. A batch padded to its longest row spends
most of its FLOPs on padding, which attention masks out and which therefore changes no output. Sorting the
``rows`` by length and reading them in ``num_buckets`` groups, each cut to its own longest row, gives the same
outputs up to float rounding for a fraction of the work. The groups are fixed in number
(not in length), so the function is traced once for any lengths, on CPU and GPU; TPUs need static shapes and
use one group with ``data.static_padding``.

With ``compiled`` (``model.compiled_inference``), inference (``training`` false) runs BERT as one XLA program
(``jit_compile``): the layer norms, GELUs, softmaxes and bias additions around the matmuls are fused instead of
being one kernel and one memory pass each, which on CPU is a quarter of BERT's forward time
(``benchmarks/bert_kernels.py``). XLA compiles one program per input shape, so a compiled group's length is rounded up
to a multiple of :data:`LENGTH_MULTIPLE` and every group has the same number of rows (the last one padded with empty
rows): a few programs serve every batch. A training step compiles only with the training section's
``jit_compile``, which requires static padding.

Training rounds every length BERT reads up to a multiple of :data:`LENGTH_MULTIPLE` too. TensorFlow's CPU
kernels (oneDNN) are created for each input shape and kept in a cache per thread, up to 1,024 per kind, so
a few lengths hold fewer of them than every length would (measured in ``docs/performance.md``).
Inference keeps exact lengths (a few more shapes there cost less than the padding).
"""
from __future__ import annotations

import weakref
from typing import Callable

import tensorflow as tf
import tf_keras

from realm_tf.networks import bert_encoder

#: The lengths BERT reads in an XLA program (one program per shape) and in training (oneDNN kernels are cached
#: per shape and thread) are rounded up to a multiple of this.
LENGTH_MULTIPLE = 32

#: The XLA-compiled inference function of each encoder, made once and kept as long as the encoder lives.
_COMPILED: "weakref.WeakKeyDictionary[tf_keras.layers.Layer, tf.types.experimental.GenericFunction]" = (
    weakref.WeakKeyDictionary())


def compiled_forward(encoder: tf_keras.layers.Layer) -> tf.types.experimental.GenericFunction:
    """``encoder``'s inference pass (``training=False``) as one XLA program per input shape: a function of
    :data:`bert_encoder.INPUT_KEYS` (each ``int32[rows, len]``) returning ``sequence_output`` ``[rows, len,
    hidden]`` and ``pooled_output`` ``[rows, hidden]``."""
    function = _COMPILED.get(encoder)
    if function is None:
        owner = weakref.ref(encoder)  # the cached function must not keep its (weak) key alive

        def forward(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            outputs = owner()(inputs, training=False)
            return {"sequence_output": outputs["sequence_output"], "pooled_output": outputs["pooled_output"]}

        function = tf.function(forward, jit_compile=True, autograph=False, reduce_retracing=True)
        _COMPILED[encoder] = function
    return function


def encode(encoder: tf_keras.layers.Layer, inputs: dict[str, tf.Tensor], num_buckets: int,
           training: bool | None = None, compiled: bool = False) -> dict[str, tf.Tensor]:
    """Runs ``encoder`` on ``inputs`` (each ``int32[rows, seq_len]``) in ``num_buckets`` length groups.

    Args:
      encoder: a BERT network (tf-models' ``BertEncoderV2``) taking :data:`bert_encoder.INPUT_KEYS` and returning
        ``sequence_output`` and ``pooled_output``.
      inputs: at least :data:`bert_encoder.INPUT_KEYS`; a row's length is the number of ones in its
        ``input_mask``, which must be a prefix of the row (as the packers write it).
      num_buckets: groups of ``ceil(rows / num_buckets)`` rows, shortest first; 1 calls ``encoder`` once on the
        whole batch (in training, its length padded to a multiple of :data:`LENGTH_MULTIPLE`).
      training: passed to ``encoder``; when true, each group's length is rounded up to a multiple of
        :data:`LENGTH_MULTIPLE` (with zeros: mask 0, outside attention) and the outputs cut back.
      compiled: when not ``training``, each group is read by :func:`compiled_forward` (XLA), its length rounded
        up to a multiple of :data:`LENGTH_MULTIPLE` and its rows to the groups' common size.

    Returns (float32 whatever the encoder's compute precision):
      ``sequence_output`` ``[rows, seq_len, hidden]`` in the input's row order, zeros at positions past the
      longest row of a row's group (padding, masked out of attention in every case), and ``pooled_output``
      ``[rows, hidden]``.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets={num_buckets}: must be at least 1")
    flat = {k: inputs[k] for k in bert_encoder.INPUT_KEYS}  # each [rows, seq_len]
    compiled = compiled and not training
    seq_len = tf.shape(flat["input_word_ids"])[1]
    encoder_config = encoder.get_config()
    limit = encoder_config.get("max_sequence_length", seq_len)  # BERT's positions: no padding past the last

    def plain(part: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return encoder(part, training=training)

    def forward(part: dict[str, tf.Tensor], longest: tf.Tensor) -> dict[str, tf.Tensor]:
        """BERT on ``part`` (each ``[part_rows, longest]``): compiled, padded in training, else as it is."""
        if compiled:
            return _read_padded(compiled_forward(encoder), part, longest, size, limit)
        if training:
            return _read_padded(plain, part, longest, tf.shape(part["input_word_ids"])[0], limit)
        return plain(part)

    if num_buckets == 1 and not compiled:
        outputs = forward(flat, seq_len)
        return {"sequence_output": _float32(outputs["sequence_output"]),
                "pooled_output": _float32(outputs["pooled_output"])}
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(flat["input_mask"], 0), tf.int32), axis=-1)  # [rows]
    rows = tf.shape(lengths)[0]
    order = tf.argsort(lengths, stable=True)  # [rows]: shortest first
    size = (rows + num_buckets - 1) // num_buckets
    sequences, pooled = _encode_groups(forward, flat, lengths, order, size, num_buckets,
                                       encoder_config["hidden_size"])
    restore = tf.math.invert_permutation(order)  # [rows]: from length order back to the input's
    return {"sequence_output": tf.gather(tf.concat(sequences, axis=0), restore),  # [rows, seq_len, hidden]
            "pooled_output": tf.gather(tf.concat(pooled, axis=0), restore)}  # [rows, hidden]


def _encode_groups(forward: Callable[[dict[str, tf.Tensor], tf.Tensor], dict[str, tf.Tensor]],
                   flat: dict[str, tf.Tensor], lengths: tf.Tensor, order: tf.Tensor, size: tf.Tensor,
                   num_buckets: int, hidden: int) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """Each group of ``size`` rows of ``order`` (shortest first) read by ``forward`` cut to its longest row; the
    sequence outputs ``[group_rows, seq_len, hidden]`` padded back to ``seq_len`` and the pooled outputs
    ``[group_rows, hidden]``, in length order (an empty group past the end reads nothing)."""
    seq_len = tf.shape(flat["input_word_ids"])[1]
    sequences, pooled = [], []
    for group in range(num_buckets):
        members = order[group * size:(group + 1) * size]  # [group_rows] (empty past the end)

        def read(members: tf.Tensor = members) -> tuple[tf.Tensor, tf.Tensor]:
            longest = tf.maximum(tf.reduce_max(tf.gather(lengths, members)), 1)
            part = {k: tf.gather(v, members)[:, :longest] for k, v in flat.items()}  # [group_rows, longest]
            out = forward(part, longest)
            sequence = tf.pad(out["sequence_output"],
                              [[0, 0], [0, seq_len - longest], [0, 0]])  # [group_rows, seq_len, hidden]
            return _float32(sequence), _float32(out["pooled_output"])  # [group_rows, hidden]

        def nothing() -> tuple[tf.Tensor, tf.Tensor]:
            return tf.zeros([0, seq_len, hidden], tf.float32), tf.zeros([0, hidden], tf.float32)

        sequence, pool = tf.cond(tf.size(members) > 0, read, nothing)
        sequences.append(sequence)
        pooled.append(pool)
    return sequences, pooled


def rounded_length(length: tf.Tensor, limit: int | tf.Tensor) -> tf.Tensor:
    """``length`` rounded up to a multiple of :data:`LENGTH_MULTIPLE`, but not past ``limit`` (never below
    ``length``)."""
    multiple = LENGTH_MULTIPLE
    return tf.maximum(tf.minimum((length + multiple - 1) // multiple * multiple, limit), length)


def pad_to_multiple(inputs: dict[str, tf.Tensor], limit: int) -> dict[str, tf.Tensor]:
    """``inputs`` (each ``int32[rows, len]``, packed BERT inputs) padded with zeros (mask 0) to
    :func:`rounded_length` ``(len, limit)``: a training step's batch in one of ``limit / LENGTH_MULTIPLE``
    shapes (see the module docstring)."""
    length = tf.shape(inputs["input_word_ids"])[1]
    padding = [[0, 0], [0, rounded_length(length, limit) - length]]
    return {k: tf.pad(v, padding) for k, v in inputs.items()}  # each [rows, rounded length]


def _float32(tensor: tf.Tensor) -> tf.Tensor:
    """BERT's output in float32 whatever its compute precision (``mixed_bfloat16`` training computes in bfloat16;
    its last LayerNorm may return either), so that every group, and every consumer, sees one dtype."""
    return tf.cast(tensor, tf.float32)


def _read_padded(forward: Callable[[dict[str, tf.Tensor]], dict[str, tf.Tensor]], part: dict[str, tf.Tensor],
                 longest: tf.Tensor, size: tf.Tensor, limit: int | tf.Tensor) -> dict[str, tf.Tensor]:
    """``forward`` (BERT) of one group (each ``int32[group_rows, longest]``), padded with zeros (mask 0: outside
    attention) to ``[size, longest rounded up to LENGTH_MULTIPLE]`` (at most ``limit``, BERT's positions, unless
    ``longest`` is more) and cut back to ``sequence_output`` ``[group_rows, longest, hidden]`` and
    ``pooled_output`` ``[group_rows, hidden]``."""
    group_rows = tf.shape(part["input_word_ids"])[0]
    padded_length = rounded_length(longest, limit)
    padding = [[0, size - group_rows], [0, padded_length - longest]]
    out = forward({k: tf.pad(v, padding) for k, v in part.items()})  # [size, padded, hidden]
    return {"sequence_output": out["sequence_output"][:group_rows, :longest],  # [group_rows, longest, hidden]
            "pooled_output": out["pooled_output"][:group_rows]}  # [group_rows, hidden]
