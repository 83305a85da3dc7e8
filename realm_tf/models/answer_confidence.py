"""The confidence of an Open-QA answer: a calibrated probability that it is right.

The span probability of :meth:`OpenQaModel.decode` (ORQA/REALM's answer score) is the answer's share of the
probability mass over all spans of the k blocks read, not the probability of being right. Platt scaling (Platt,
1999) and temperature scaling (Guo et al., 2017) map it through a monotone function: they can fix its calibration
but not its ranking. Selective QA ranks better with a small model over several signals the reader already
computes (Kamath et al., 2020, "Selective Question Answering under Domain Shift"; Jiang et al., 2021, "How Can
We Know When Language Models Know?"). :func:`answer_features` computes them in the graph, for each decoded answer:

* ``answer_logit``: log(p / (1 − p)) of the answer's probability p (its group's, with span aggregation);
* ``block_log_prior``: log p(z | x) of the block the answer was read from (the retriever's softmax over the k);
* ``span_margin``: log p of the best span minus that of the second best, over every span of the k blocks;
* ``block_margin``: f(x, z)/τ of the answer's block minus the best other block's (negative when a lower-ranked
  block answered);
* ``span_length``: the answer's length in wordpieces;
* ``agreement``: the share of the k blocks whose own best span is the same answer (SQuAD-normalised), the
  agreement signal of evidence aggregation (Wang et al., 2018).

:class:`AnswerCalibrator` maps them to ``confidence`` = σ(wᵀ (f − μ) / s + b): a logistic regression, fitted by
:mod:`realm_tf.tasks.answer_calibration` on held-out questions. Its parameters are non-trainable weights, so an
export carries them in its graph. Unfitted, it is the identity on the span probability (w selects
``answer_logit``): ``confidence`` then equals ``score``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf
import tf_keras

#: The features of :func:`answer_features`, in the order of their last axis.
FEATURES = ("answer_logit", "block_log_prior", "span_margin", "block_margin", "span_length", "agreement")
#: |answer_logit| is clipped here: a float32 probability of 1 has no finite logit.
MAX_LOGIT = 20.0


def answer_logit(probability: tf.Tensor) -> tf.Tensor:
    """log(p / (1 − p)), clipped to ±:data:`MAX_LOGIT` (p of any shape)."""
    p = tf.clip_by_value(tf.cast(probability, tf.float32), 1e-9, 1.0)
    return tf.clip_by_value(tf.math.log(p) - tf.math.log1p(-tf.minimum(p, 1.0 - 1e-7)), -MAX_LOGIT, MAX_LOGIT)


def answer_features(score: tf.Tensor, retrieval_logits: tf.Tensor, top_log_probs: tf.Tensor, block: tf.Tensor,
                    span_length: tf.Tensor, same_answer: tf.Tensor, block_valid: tf.Tensor) -> tf.Tensor:
    """``float32[batch, len(FEATURES)]``, the features of the module docstring.

    Args:
      score: ``[batch]`` the answer's probability.
      retrieval_logits: ``[batch, k]`` f(x, z)/τ of the blocks read.
      top_log_probs: ``[batch, n]`` the best spans' log-probabilities, best first (n ≥ 1; a missing second
        span counts as a margin of :data:`MAX_LOGIT`).
      block: ``int32[batch]`` the answer's position among the k blocks.
      span_length: ``int32[batch]`` the answer's wordpieces.
      same_answer: ``bool[batch, k]`` whether each block's best span is the answer.
      block_valid: ``bool[batch, k]`` whether each block has any span that could be an answer.
    """
    retrieval_logits = tf.cast(retrieval_logits, tf.float32)
    k = tf.shape(retrieval_logits)[1]
    prior = tf.nn.log_softmax(retrieval_logits, axis=-1)  # [batch, k]
    block_prior = tf.gather(prior, block, batch_dims=1)  # [batch]
    own = tf.one_hot(block, k, on_value=True, off_value=False)  # [batch, k]
    others = tf.where(own, tf.float32.min, retrieval_logits)  # [batch, k]
    block_margin = tf.where(k > 1, tf.gather(retrieval_logits, block, batch_dims=1) - tf.reduce_max(others, -1),
                            0.0)  # [batch]
    top_log_probs = tf.cast(top_log_probs, tf.float32)
    second = tf.cond(tf.shape(top_log_probs)[1] > 1, lambda: top_log_probs[:, 1],
                     lambda: top_log_probs[:, 0] - MAX_LOGIT)  # [batch]
    span_margin = tf.minimum(top_log_probs[:, 0] - second, MAX_LOGIT)  # [batch]
    valid = tf.cast(block_valid, tf.float32)  # [batch, k]
    agreement = tf.math.divide_no_nan(tf.reduce_sum(tf.cast(same_answer, tf.float32) * valid, -1),
                                      tf.reduce_sum(valid, -1))  # [batch]
    return tf.stack([answer_logit(score), block_prior, span_margin, block_margin,
                     tf.cast(span_length, tf.float32), agreement], axis=-1)  # [batch, num_features]


class AnswerCalibrator(tf_keras.layers.Layer):
    """``confidence`` = σ(wᵀ (f − μ) / s + b) over :data:`FEATURES` (``[batch, F]`` → ``[batch]``).

    The parameters are non-trainable weights (saved with an export); :meth:`set_parameters` loads a fit of
    :mod:`realm_tf.tasks.answer_calibration`. Built unfitted, it returns σ(answer_logit): the span probability.
    """

    def __init__(self, num_features: int = len(FEATURES), **kwargs: Any):
        super().__init__(**kwargs)
        self.num_features = num_features
        self.mean = self.add_weight("feature_mean", [num_features], initializer="zeros", trainable=False)
        self.scale = self.add_weight("feature_scale", [num_features], initializer="ones", trainable=False)
        identity = np.eye(num_features, 1, dtype=np.float32)[:, 0]  # [F]: answer_logit alone
        self.weights_ = self.add_weight("weights", [num_features], trainable=False,
                                        initializer=tf_keras.initializers.Constant(identity))
        self.bias = self.add_weight("bias", [], initializer="zeros", trainable=False)

    def set_parameters(self, parameters: Mapping[str, Sequence[float] | float]) -> None:
        """Loads ``{"mean", "scale", "weights": [F], "bias": float}`` (a fit's parameters)."""
        for variable, key in ((self.mean, "mean"), (self.scale, "scale"), (self.weights_, "weights")):
            value = np.asarray(parameters[key], np.float32)
            if value.shape != (self.num_features,):
                raise ValueError(f"calibrator {key}: {value.shape[0] if value.ndim else 0} values for "
                                 f"{self.num_features} features")
            variable.assign(value)
        self.bias.assign(float(parameters["bias"]))

    def call(self, features: tf.Tensor) -> tf.Tensor:
        standard = (tf.cast(features, tf.float32) - self.mean) / self.scale  # [batch, F]
        return tf.sigmoid(tf.linalg.matvec(standard, self.weights_) + self.bias)  # [batch]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_features": self.num_features}
