"""Inverted dropout (Srivastava et al., 2014) decided on 16 random bits per element, as BERT applies it to its
hidden states and attention probabilities (Devlin et al., 2019; every REALM tower, Guu et al., 2020, §3.2).

``tf.nn.dropout`` (inside Keras' ``Dropout``) draws one 32-bit Philox number per element, converts it to a float,
compares it with the rate and selects between the scaled input and a broadcast zero, in the forward pass and again
in the backward one. Here a 32-bit draw decides two elements: its two 16-bit halves are compared as integers with
``round(rate · 2¹⁶)``, and the 0/1 mask is multiplied in. The draws are raw Philox bits
(``tf.random.stateless_uniform`` with no range, keyed by one stateful draw per call, so every call draws anew), not
integers reduced to a range. An element is kept with probability ``1 − round(rate · 2¹⁶) / 2¹⁶`` and kept
elements are scaled by the inverse of exactly that (:func:`keep_scale`, rounded to the compute dtype as
``tf.nn.dropout``'s scale is), so the expectation is the input's. Measured against ``tf.nn.dropout`` by
``benchmarks/dropout_speed.py``.

:class:`IntegerDropout` is Keras' ``Dropout`` with this mask where ``training`` is a Python flag and the layer
has no ``noise_shape`` or seed; otherwise it is Keras' ``Dropout`` itself.
"""
from __future__ import annotations

import numbers

import tensorflow as tf
import tf_keras

#: Bits that decide one element.
DROPOUT_BITS = 16

_LEVELS = 1 << DROPOUT_BITS


def threshold(rate: float) -> int:
    """The 16-bit value below which an element is dropped: ``round(rate · 2¹⁶)``."""
    return int(round(rate * _LEVELS))


def keep_scale(rate: float) -> float:
    """The factor kept elements are multiplied by: the inverse of the exact keep probability."""
    return _LEVELS / (_LEVELS - threshold(rate))


def keep_mask(shape: tf.Tensor, rate: float, dtype: tf.dtypes.DType) -> tf.Tensor:
    """A ``dtype`` tensor of ``shape`` (``int32[rank]``): 1 with probability ``1 − threshold(rate) / 2¹⁶``, else 0,
    each element independent of the others."""
    pairs = (shape[-1] + 1) // 2  # two 16-bit halves per 32-bit draw along the last axis
    key = tf.random.uniform([2], minval=-(1 << 62), maxval=1 << 62, dtype=tf.int64)  # int64[2]
    bits = tf.random.stateless_uniform(tf.concat([shape[:-1], [pairs]], 0), key, minval=None, maxval=None,
                                       dtype=tf.uint32)  # [*shape[:-1], ceil(shape[-1] / 2)]
    halves = tf.bitcast(bits, tf.uint16)  # [*shape[:-1], ceil(shape[-1] / 2), 2]
    halves = tf.reshape(halves, tf.concat([shape[:-1], [2 * pairs]], 0))[..., :shape[-1]]  # [*shape]
    return tf.cast(halves >= tf.constant(threshold(rate), tf.uint16), dtype)  # [*shape]


def dropout(inputs: tf.Tensor, rate: float) -> tf.Tensor:
    """``inputs`` (any shape) with each element zeroed with probability ``rate`` and the rest scaled by
    :func:`keep_scale`."""
    mask = keep_mask(tf.shape(inputs), rate, inputs.dtype)  # [*inputs.shape]
    return inputs * (mask * tf.constant(keep_scale(rate), inputs.dtype))


@tf_keras.utils.register_keras_serializable(package="realm_tf")
class IntegerDropout(tf_keras.layers.Dropout):
    """``tf_keras.layers.Dropout`` deciding each element on 16 random bits (:func:`dropout`). Same arguments and
    config as ``Dropout``; no state."""

    def call(self, inputs: tf.Tensor, training: bool | tf.Tensor | None = None) -> tf.Tensor:
        """``inputs`` ``[...]`` → ``[...]``, dropped when ``training``."""
        fast = (isinstance(training, bool) and self.noise_shape is None and self.seed is None
                and isinstance(self.rate, numbers.Real) and 0.0 < self.rate < 1.0)
        if not fast:  # a symbolic flag, the learning phase, a noise shape, a seed, or no dropout: Keras decides
            return super().call(inputs, training=training)
        return dropout(inputs, float(self.rate)) if training else tf.identity(inputs)
