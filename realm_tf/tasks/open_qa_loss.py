"""The Open-QA fine-tuning objective of ORQA (Lee et al., 2019, §4-5) used by REALM (Guu et al., 2020, §3.2).

For the k retrieved blocks z with retrieval scores S_retr(z, x) and the reader's span scores S_read(z, s, x):

* **retriever** ("early update", ORQA §5): p(z | x) = softmax_z S_retr(z, x) and
      L_retr = −log Σ_{z ∋ answer} p(z | x);
* **reader** (ORQA's full update; REALM p(y | x) = Σ_z p(y | z, x) p(z | x)): a softmax over every valid
  (block, span) pair of the joint score S(z, s) = S_retr(z, x) + S_read(z, s, x), and
      L_read = −log Σ_{(z, s): TEXT(s) = answer} p(z, s | x)
             = logsumexp_{valid (z, s)} S(z, s) − logsumexp_{answer (z, s)} S(z, s).

An example without any answer span among its blocks has nothing to learn from: both terms are 0 for it (and
give no gradient) and it is flagged by ``has_answer_block`` / ``has_answer_span``. Masking replaces scores
by a large finite negative value, so an all-masked row stays finite (no −inf − (−inf) = NaN).
"""
from __future__ import annotations

import tensorflow as tf

# Masked scores: exp() of it relative to any real score is 0 in float32, while it stays finite.
_MASKED = -1e9


def open_qa_marginal_loss(retrieval_logits: tf.Tensor, span_logits: tf.Tensor, span_mask: tf.Tensor,
                          answer_span_mask: tf.Tensor) -> dict[str, tf.Tensor]:
    """Per-example ORQA/REALM Open-QA loss, its parts and the joint prediction.

    Args:
      retrieval_logits: ``[batch, k]`` S_retr(z, x) of the k read blocks.
      span_logits: ``[batch, k, num_spans]`` S_read(z, s, x) (values at invalid spans are ignored).
      span_mask: ``bool[batch, k, num_spans]`` the reader's valid candidate spans.
      answer_span_mask: ``bool[batch, k, num_spans]`` spans whose text is an answer (intersected with
        ``span_mask``).

    Returns (each ``[batch]``): ``loss`` = ``retriever_loss`` + ``reader_loss``; ``has_answer_block`` and
    ``has_answer_span`` (float 0/1: some block, resp. some valid span, holds an answer; the two agree since
    a block "has the answer" when one of its spans is one); ``predicted_block`` and ``predicted_span``
    (``int32``, the argmax of the joint score over valid (block, span) pairs; ``predicted_span`` indexes
    ``num_spans``).
    """
    retrieval_logits = tf.cast(retrieval_logits, tf.float32)  # [batch, k]
    span_logits = tf.cast(span_logits, tf.float32)  # [batch, k, num_spans]
    valid = tf.cast(span_mask, tf.bool)  # [batch, k, num_spans]
    answer = tf.logical_and(tf.cast(answer_span_mask, tf.bool), valid)  # [batch, k, num_spans]
    masked = tf.constant(_MASKED, tf.float32)

    # Retriever: −log of the retrieval probability mass on blocks holding an answer span.
    block_has_answer = tf.reduce_any(answer, axis=-1)  # [batch, k]
    has_answer_block = tf.reduce_any(block_has_answer, axis=-1)  # [batch]
    log_p_block = tf.nn.log_softmax(retrieval_logits, axis=-1)  # [batch, k]
    log_p_answer_blocks = tf.reduce_logsumexp(tf.where(block_has_answer, log_p_block, masked), axis=-1)  # [batch]
    retriever_loss = tf.where(has_answer_block, -log_p_answer_blocks, 0.0)  # [batch]

    # Reader: softmax over all valid (block, span) pairs of S_retr + S_read; mass on the answer spans.
    num_blocks, num_spans = tf.shape(span_logits)[1], tf.shape(span_logits)[2]
    joint = retrieval_logits[:, :, None] + span_logits  # [batch, k, num_spans]
    joint = tf.reshape(joint, [-1, num_blocks * num_spans])  # [batch, k * num_spans]
    valid_flat = tf.reshape(valid, tf.shape(joint))  # [batch, k * num_spans]
    answer_flat = tf.reshape(answer, tf.shape(joint))  # [batch, k * num_spans]
    valid_joint = tf.where(valid_flat, joint, masked)  # [batch, k * num_spans]
    log_normaliser = tf.reduce_logsumexp(valid_joint, axis=-1)  # [batch]
    log_answer = tf.reduce_logsumexp(tf.where(answer_flat, joint, masked), axis=-1)  # [batch]
    has_answer_span = tf.reduce_any(answer_flat, axis=-1)  # [batch]
    reader_loss = tf.where(has_answer_span, log_normaliser - log_answer, 0.0)  # [batch]

    best = tf.argmax(valid_joint, axis=-1, output_type=tf.int32)  # [batch] index into k * num_spans
    return {
        "loss": retriever_loss + reader_loss,
        "retriever_loss": retriever_loss,
        "reader_loss": reader_loss,
        "has_answer_block": tf.cast(has_answer_block, tf.float32),
        "has_answer_span": tf.cast(has_answer_span, tf.float32),
        "predicted_block": best // num_spans,
        "predicted_span": best % num_spans,
    }
