"""A BERT layer (tf-models' ``TransformerEncoderBlock``) with head-major attention and fused projections.

``TransformerEncoderBlock`` makes its ``tf_keras.layers.MultiHeadAttention`` and its feed-forward network's two
``EinsumDense`` layers in ``build``. This block turns the attention layer, before it has any weights, into a
:class:`realm_tf.layers.head_major_attention.HeadMajorAttention`, whose attention products are batched matmuls
instead of einsums, and the two dense layers into
:class:`realm_tf.layers.matmul_einsum_dense.MatmulEinsumDense`, with the GELU moved into the first, so that each
is one oneDNN matmul with its bias and activation fused, its layer norms into
:class:`realm_tf.layers.fused_layer_normalization.FusedLayerNormalization`, one oneDNN kernel each at BERT's
ε = 1e-12, and its dropouts into :class:`realm_tf.layers.integer_dropout.IntegerDropout` (16 random bits per
element). The layer objects stay the ones the block made (the subclasses add methods, no state), so the
variables, their names, their order and the checkpoint keys are the block's own, and so is every output up to
float rounding (in training, with other dropout masks).
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras
from official.nlp.modeling import layers

from realm_tf.layers import fused_layer_normalization
from realm_tf.layers import head_major_attention
from realm_tf.layers import integer_dropout
from realm_tf.layers import matmul_einsum_dense


@tf_keras.utils.register_keras_serializable(package="realm_tf")
class HeadMajorEncoderBlock(layers.TransformerEncoderBlock):
    """``layers.TransformerEncoderBlock`` (Vaswani et al., 2017; BERT's layer) with head-major attention products.

    Takes ``TransformerEncoderBlock``'s arguments. Blocks configured for block-sparse or multi-query attention
    keep their own attention layer.
    """

    def build(self, input_shape: tf.TensorShape | list[tf.TensorShape]) -> None:
        super().build(input_shape)
        if type(self._attention_layer) is tf_keras.layers.MultiHeadAttention:  # pylint: disable=unidiomatic-typecheck
            # Not built yet (Keras' attention builds at its first call).
            self._attention_layer.__class__ = head_major_attention.HeadMajorAttention
        for dense in (self._intermediate_dense, self._output_dense):
            if type(dense) is tf_keras.layers.EinsumDense:  # pylint: disable=unidiomatic-typecheck
                dense.__class__ = matmul_einsum_dense.MatmulEinsumDense
        activation = self._intermediate_activation_layer
        if (isinstance(self._intermediate_dense, matmul_einsum_dense.MatmulEinsumDense)
                and activation.compute_dtype == self._intermediate_dense.compute_dtype):
            # The activation applied inside the dense, right after its bias, so that oneDNN fuses all three. Under
            # mixed_bfloat16 tf-models computes it in float32, and it stays where it is.
            self._intermediate_dense.activation = activation.activation
            activation.activation = tf_keras.activations.linear
        for norm in (self._attention_layer_norm, self._output_layer_norm):
            if type(norm) is tf_keras.layers.LayerNormalization:  # pylint: disable=unidiomatic-typecheck
                norm.__class__ = fused_layer_normalization.FusedLayerNormalization  # not built yet; no new state
        for dropout in (self._attention_dropout, self._inner_dropout_layer, self._output_dropout):
            if type(dropout) is tf_keras.layers.Dropout:  # pylint: disable=unidiomatic-typecheck
                dropout.__class__ = integer_dropout.IntegerDropout  # only `call` differs; no state
