"""A Keras ``EinsumDense`` computed as one 2-D matmul, bias and activation that oneDNN runs as a single kernel.

A BERT layer (Devlin et al., 2019; every tower of REALM, Guu et al., 2020, §3.2) has six dense projections: query,
key, value and attention output, and the feed-forward network's two. tf-models and Keras write each as an
``EinsumDense``: ``tf.einsum`` of the activations with the kernel, then ``+ bias``, then (the feed-forward's
first) the GELU, each its own op and its own pass over a ``[batch, seq_len, width]`` tensor. Every one of these
projections contracts the input's trailing axes with the kernel's leading ones, so it is also a plain
``[rows, in] × [in, out]`` matmul of the flattened tensors. Written as ``MatMul → BiasAdd → activation``,
TensorFlow's graph optimizer (grappler's remapper) fuses the three into one oneDNN matmul whose bias and GELU are
applied as the result is written (``docs/performance.md``).

The weights keep ``EinsumDense``'s shapes and names: only ``call`` differs, and only in the order of the float
operations.
"""
from __future__ import annotations

import functools
import re

import tensorflow as tf
import tf_keras


class MatmulEinsumDense(tf_keras.layers.EinsumDense):
    """``tf_keras.layers.EinsumDense`` as ``MatMul → BiasAdd → activation`` on flattened tensors.

    Takes ``EinsumDense``'s arguments. The flat form is used when the equation has the shape
    ``<free><contracted>,<contracted><out>-><free><out>`` (no ellipsis; the contracted axes trailing in the
    input and leading in the kernel, in the same order) and the bias, if any, spans every ``<out>`` axis; any
    other equation is computed by ``EinsumDense`` itself.
    """

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        """``inputs`` ``[*free, *contracted]`` → ``[*free, *out]``."""
        split = _flat_split(self.equation, self.bias_axes if self.bias is not None else None)
        if split is None:
            return super().call(inputs)
        contracted, out = split
        kernel_shape = self.kernel.shape
        fan_in = kernel_shape[:contracted].num_elements()
        out_shape = kernel_shape[contracted:].as_list()
        fan_out = kernel_shape[contracted:].num_elements()
        free_shape = tf.shape(inputs)[:inputs.shape.rank - contracted]  # [*free]
        flat = tf.reshape(inputs, [-1, fan_in])  # [rows, fan_in]
        outputs = tf.matmul(flat, tf.reshape(self.kernel, [fan_in, fan_out]))  # [rows, fan_out]
        if self.bias is not None:
            outputs = tf.nn.bias_add(outputs, tf.reshape(self.bias, [fan_out]))  # [rows, fan_out]
        if self.activation is not None:
            outputs = self.activation(outputs)  # [rows, fan_out]
        outputs = tf.reshape(outputs, tf.concat([free_shape, out_shape], axis=0))  # [*free, *out]
        static = inputs.shape[:inputs.shape.rank - contracted].concatenate(out_shape)
        return tf.ensure_shape(outputs, static)


@functools.lru_cache(maxsize=None)  # a few equations per model, parsed once, not at every call
def _flat_split(equation: str, bias_axes: str | None) -> tuple[int, int] | None:
    """``(number of contracted axes, number of out axes)`` when ``equation`` (with ``bias_axes``) is a flat
    matmul as :class:`MatmulEinsumDense` describes, else None."""
    match = re.fullmatch(r"([a-zA-Z]+),([a-zA-Z]+)->([a-zA-Z]+)", equation)
    if match is None:
        return None
    source, kernel, output = match.groups()
    contracted = "".join(c for c in source if c in kernel)
    free, out = source[:len(source) - len(contracted)], kernel[len(contracted):]
    if (not contracted or source != free + contracted or kernel != contracted + out or output != free + out
            or set(free) & set(kernel)):
        return None
    if bias_axes is not None and bias_axes != out:
        return None
    return len(contracted), len(out)
