"""Layer normalization (Ba et al., 2016) as one oneDNN kernel on CPU, at BERT's ε = 1e-12.

Every BERT of REALM (Guu et al., 2020, §3.2) normalizes its embeddings and each layer's two residual sums:
13 layer norms in MiniLM, each a pass over ``[batch, seq_len, width]``. Keras' ``LayerNormalization`` has two ways
to compute one. Its "fused" way reshapes the input to ``[1, batch * seq_len, width, 1]`` and calls
``FusedBatchNormV3`` in training mode, which grappler's remapper rewrites into oneDNN's ``_MklLayerNorm`` in an
inference graph. Keras takes that way only for ε ≥ 1.001e-5, because cuDNN raises smaller ε to its minimum.
BERT's ε is 1e-12, so Keras takes its other way: ``tf.nn.moments`` and ``tf.nn.batch_normalization``, eight
elementwise passes, three of them broadcasting a ``[batch, seq_len, 1]`` factor to the full width, where
``_MklLayerNorm`` is one pass (``docs/performance.md``).

TensorFlow's CPU kernels (``FusedBatchNormV3`` and ``_MklLayerNorm``) use the ε they are given, so on a machine
without a GPU :class:`FusedLayerNormalization` takes the fused way at any ε. Where a GPU is visible it keeps
Keras' choice. Weights, names and results (to float rounding) are Keras'.
"""
from __future__ import annotations

import functools

import tensorflow as tf
import tf_keras


@functools.lru_cache(maxsize=None)
def _gpu_visible() -> bool:
    return bool(tf.config.list_logical_devices("GPU"))


@tf_keras.utils.register_keras_serializable(package="realm_tf")
class FusedLayerNormalization(tf_keras.layers.LayerNormalization):
    """``tf_keras.layers.LayerNormalization`` that computes with ``FusedBatchNormV3`` (one oneDNN
    ``_MklLayerNorm`` at inference) for any ε when no GPU is visible. Same arguments, weights and config."""

    def _fused_can_be_used(self, ndims: int) -> bool:
        if _gpu_visible():
            return super()._fused_can_be_used(ndims)
        axis = sorted(self.axis)
        contiguous_last = axis[-1] == ndims - 1 and axis[-1] - axis[0] == len(axis) - 1
        return contiguous_last and self.dtype == "float32"
