"""MatmulEinsumDense (issue #20): the projections of a BERT layer as one flat matmul, bias and activation give
EinsumDense's outputs and gradients (against numpy's einsum), with EinsumDense's weights; other equations fall
back to EinsumDense."""
import math

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf.layers import matmul_einsum_dense

# (equation, output_shape, bias_axes, input shape): BERT's query/key/value, attention output, feed-forward.
CASES = [("abc,cde->abde", (None, 3, 4), "de", (2, 5, 6)),
         ("abcd,cde->abe", (None, 6), "e", (2, 5, 3, 4)),
         ("abc,cd->abd", (None, 7), "d", (2, 5, 6)),
         ("abc,cd->abd", (None, 7), None, (2, 5, 6))]


def _pair(equation, output_shape, bias_axes, input_shape, activation=None):
    rng = np.random.default_rng(0)
    kwargs = dict(output_shape=output_shape, bias_axes=bias_axes, activation=activation)
    ours = matmul_einsum_dense.MatmulEinsumDense(equation, **kwargs)
    theirs = tf_keras.layers.EinsumDense(equation, **kwargs)
    inputs = tf.constant(rng.normal(size=input_shape).astype(np.float32))
    ours(inputs)
    theirs(inputs)
    theirs.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in theirs.weights])
    ours.set_weights(theirs.get_weights())
    return ours, theirs, inputs


@pytest.mark.parametrize("equation,output_shape,bias_axes,input_shape", CASES)
def test_matches_numpy_einsum(equation, output_shape, bias_axes, input_shape):
    ours, _, inputs = _pair(equation, output_shape, bias_axes, input_shape, activation="gelu")
    weights = [w.astype(np.float64) for w in ours.get_weights()]
    pre = np.einsum(equation, inputs.numpy().astype(np.float64), weights[0])
    if bias_axes:
        pre = pre + weights[1]
    expected = 0.5 * pre * (1 + np.vectorize(math.erf)(pre / np.sqrt(2)))
    out = ours(inputs)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("equation,output_shape,bias_axes,input_shape", CASES)
def test_flat_matmul_with_einsum_dense_gradients(equation, output_shape, bias_axes, input_shape):
    ours, theirs, inputs = _pair(equation, output_shape, bias_axes, input_shape)
    graph = tf.function(ours).get_concrete_function(tf.TensorSpec([None, *input_shape[1:]])).graph
    types = {op.type for op in graph.get_operations()}
    assert "MatMul" in types and "Einsum" not in types
    grads = []
    for layer in (ours, theirs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            loss = tf.reduce_sum(tf.sin(layer(inputs)))
        grads.append(tape.gradient(loss, [inputs] + layer.trainable_weights))
    assert [(w.name, w.shape) for w in ours.weights] == [(w.name.replace("einsum_dense", "matmul_einsum_dense"),
                                                         w.shape) for w in theirs.weights]
    for a, b in zip(*grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)


def test_other_equations_fall_back_to_einsum():
    # the contracted axis is not the input's last: not a flat matmul
    ours, theirs, inputs = _pair("abc,bd->acd", (6, 7), "d", (2, 5, 6))
    graph = tf.function(ours).get_concrete_function(inputs).graph
    assert "Einsum" in {op.type for op in graph.get_operations()}
    np.testing.assert_allclose(ours(inputs).numpy(), theirs(inputs).numpy(), rtol=1e-5, atol=1e-5)
    # a bias over part of the output axes only
    assert matmul_einsum_dense._flat_split("abc,cde->abde", "e") is None
    assert matmul_einsum_dense._flat_split("abc,cde->abde", "de") == (1, 2)
    assert matmul_einsum_dense._flat_split("...b,bc->...c", "c") is None
