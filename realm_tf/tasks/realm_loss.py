"""REALM's pre-training objective: the marginal likelihood over retrieved documents (Guu et al., 2020, eq. (3)).

    p(y | x) = Σ_{z ∈ top-k} p(y | z, x) p(z | x),     loss = −log p(y | x)

log p(z|x) is a softmax over the k candidates' scores f(x, z) (candidate 0 is the null document ∅);
log p(y|z,x) sums the masked-LM log-likelihoods of all masked wordpieces of x given z. The gradient
rewards retrievals that raise p(y|z,x) above the candidates' average (§3.3). Two diagnostics come with it:
**retrieval utility** log p(y|x) − log p(y|∅,x) (§3.4, "RU") and the accuracy of the marginal prediction.
"""
from __future__ import annotations

import tensorflow as tf


def realm_marginal_loss(retrieval_logits: tf.Tensor, mlm_logits: tf.Tensor, target_ids: tf.Tensor,
                        target_weights: tf.Tensor) -> dict[str, tf.Tensor]:
    """Per-example REALM loss and diagnostics.

    Args:
      retrieval_logits: ``[batch, num_candidates]`` f(x, z) for the k candidates (index 0 = null document).
      mlm_logits: ``[batch, num_candidates, num_masked, vocab]`` reader logits at the masked positions.
      target_ids: ``int [batch, num_masked]`` original wordpieces at the masked positions.
      target_weights: ``[batch, num_masked]`` 1 for a real masked position, 0 for padding.

    Returns (each ``[batch]``): ``loss`` = −log p(y|x), ``log_marginal`` = log p(y|x),
    ``retrieval_utility`` = log p(y|x) − log p(y|∅,x), ``log_p_null`` = log p(y|∅,x),
    ``mlm_correct`` (masked wordpieces the marginal prediction gets right) and ``mlm_count``.
    """
    log_p_z = tf.nn.log_softmax(retrieval_logits, axis=-1)  # [batch, num_cand]
    log_probs = tf.nn.log_softmax(mlm_logits, axis=-1)  # [batch, num_cand, num_masked, vocab]
    num_candidates = tf.shape(mlm_logits)[1]
    targets = tf.tile(tf.expand_dims(tf.cast(target_ids, tf.int32), 1), [1, num_candidates, 1])  # [b, k, m]
    log_p_tokens = tf.gather(log_probs, targets, axis=-1, batch_dims=3)  # [batch, num_cand, num_masked]
    weights = tf.cast(target_weights, log_p_tokens.dtype)[:, None, :]  # [batch, 1, num_masked]
    log_p_y = tf.reduce_sum(log_p_tokens * weights, axis=-1)  # [batch, num_cand]: log p(y | z, x)
    log_marginal = tf.reduce_logsumexp(log_p_z + log_p_y, axis=-1)  # [batch]: log p(y | x)
    # Marginal token prediction: argmax_v Σ_z p(z|x) p(y_j = v | z, x).
    marginal_token_probs = tf.einsum("bk,bkmv->bmv", tf.exp(log_p_z), tf.exp(log_probs))  # [batch, masked, vocab]
    predicted = tf.argmax(marginal_token_probs, axis=-1, output_type=tf.int32)  # [batch, num_masked]
    real = tf.cast(target_weights, tf.float32)  # [batch, num_masked]
    correct = tf.cast(tf.equal(predicted, tf.cast(target_ids, tf.int32)), tf.float32) * real
    return {
        "loss": -log_marginal,
        "log_marginal": log_marginal,
        "log_p_null": log_p_y[:, 0],
        "retrieval_utility": log_marginal - log_p_y[:, 0],
        "mlm_correct": tf.reduce_sum(correct, axis=-1),
        "mlm_count": tf.reduce_sum(real, axis=-1),
    }
