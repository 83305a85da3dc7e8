"""BERT over a batch of rows in groups of similar length, each group padded only to its own longest row.

REALM's BERTs read rows of very different lengths: blocks of the bundled corpus have a median of 133 wordpieces
and a 99th percentile of 288, and join_BERT(x, z) adds the query's. A batch padded to its longest row spends
most of its FLOPs on padding, which attention masks out and which therefore changes no output. Sorting the
``rows`` by length and reading them in ``num_buckets`` groups, each cut to its own longest row, gives the same
outputs up to float rounding for a fraction of the work (issues #15 §2 and #20). The groups are fixed in number
(not in length), so the function is traced once for any lengths, on CPU and GPU; TPUs need static shapes and
use one group with ``data.static_padding``.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras

from realm_tf.networks import bert_encoder


def encode(encoder: tf_keras.layers.Layer, inputs: dict[str, tf.Tensor], num_buckets: int,
           training: bool | None = None) -> dict[str, tf.Tensor]:
    """Runs ``encoder`` on ``inputs`` (each ``int32[rows, seq_len]``) in ``num_buckets`` length groups.

    Args:
      encoder: a BERT network (tf-models' ``BertEncoderV2``) taking :data:`bert_encoder.INPUT_KEYS` and returning
        ``sequence_output`` and ``pooled_output``.
      inputs: at least :data:`bert_encoder.INPUT_KEYS`; a row's length is the number of ones in its
        ``input_mask``, which must be a prefix of the row (as the packers write it).
      num_buckets: groups of ``ceil(rows / num_buckets)`` rows, shortest first; 1 calls ``encoder`` once on the
        whole batch, unchanged.
      training: passed to ``encoder``.

    Returns:
      ``sequence_output`` ``[rows, seq_len, hidden]`` in the input's row order, zeros at positions past the
      longest row of a row's group (padding, masked out of attention in every case), and ``pooled_output``
      ``[rows, hidden]``.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets={num_buckets}: must be at least 1")
    flat = {k: inputs[k] for k in bert_encoder.INPUT_KEYS}  # each [rows, seq_len]
    if num_buckets == 1:
        outputs = encoder(flat, training=training)
        return {"sequence_output": outputs["sequence_output"], "pooled_output": outputs["pooled_output"]}
    seq_len = tf.shape(flat["input_word_ids"])[1]
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(flat["input_mask"], 0), tf.int32), axis=-1)  # [rows]
    rows = tf.shape(lengths)[0]
    order = tf.argsort(lengths, stable=True)  # [rows]: shortest first
    size = (rows + num_buckets - 1) // num_buckets
    hidden = encoder.get_config()["hidden_size"]
    dtype = encoder.compute_dtype
    sequences, pooled = [], []
    for group in range(num_buckets):
        members = order[group * size:(group + 1) * size]  # [group_rows] (empty past the end)

        def read(members: tf.Tensor = members) -> tuple[tf.Tensor, tf.Tensor]:
            longest = tf.maximum(tf.reduce_max(tf.gather(lengths, members)), 1)
            part = {k: tf.gather(v, members)[:, :longest] for k, v in flat.items()}  # [group_rows, longest]
            out = encoder(part, training=training)
            sequence = tf.pad(out["sequence_output"],
                              [[0, 0], [0, seq_len - longest], [0, 0]])  # [group_rows, seq_len, hidden]
            return sequence, out["pooled_output"]  # [group_rows, hidden]

        def nothing() -> tuple[tf.Tensor, tf.Tensor]:
            return tf.zeros([0, seq_len, hidden], dtype), tf.zeros([0, hidden], dtype)

        sequence, pool = tf.cond(tf.size(members) > 0, read, nothing)
        sequences.append(sequence)
        pooled.append(pool)
    restore = tf.math.invert_permutation(order)  # [rows]: from length order back to the input's
    return {"sequence_output": tf.gather(tf.concat(sequences, axis=0), restore),  # [rows, seq_len, hidden]
            "pooled_output": tf.gather(tf.concat(pooled, axis=0), restore)}  # [rows, hidden]
