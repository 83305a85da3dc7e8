"""FusedLayerNormalization (issue #20): Keras' fused layer norm at BERT's ε = 1e-12, checked against a float64
numpy layer norm (with inputs whose variance is small enough that a raised ε would show) and against Keras'
own layer norm (weights, config, gradients)."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf.layers import fused_layer_normalization

WIDTH = 24


def _pair(epsilon=1e-12):
    ours = fused_layer_normalization.FusedLayerNormalization(axis=-1, epsilon=epsilon, name="norm")
    theirs = tf_keras.layers.LayerNormalization(axis=-1, epsilon=epsilon, name="norm")
    rng = np.random.default_rng(0)
    for layer in (ours, theirs):
        layer.build([None, None, WIDTH])
    theirs.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in theirs.weights])
    ours.set_weights(theirs.get_weights())
    return ours, theirs


def _numpy_layer_norm(x, gamma, beta, epsilon):
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def test_takes_the_fused_way_at_bert_epsilon_where_keras_does_not():
    ours, theirs = _pair()
    assert ours._fused and not theirs._fused
    assert [(w.name, w.shape) for w in ours.weights] == [(w.name, w.shape) for w in theirs.weights]
    assert ours.get_config() == theirs.get_config()


@pytest.mark.parametrize("scale", [1.0, 1e-4, 1e-6])
@pytest.mark.parametrize("compiled", [False, True])
def test_matches_numpy_with_the_given_epsilon(scale, compiled):
    ours, _ = _pair()
    x = np.random.default_rng(1).normal(scale=scale, size=(3, 7, WIDTH)).astype(np.float32)  # [batch, seq, width]
    want = _numpy_layer_norm(x, ours.gamma.numpy(), ours.beta.numpy(), 1e-12)
    # ε raised to 1e-5 would shrink the 1e-4 and 1e-6 rows by 30x and more.
    call = tf.function(ours, input_signature=[tf.TensorSpec([None, None, WIDTH])]) if compiled else ours
    np.testing.assert_allclose(call(tf.constant(x)).numpy(), want, rtol=1e-5, atol=1e-5)


def test_gradients_match_keras():
    ours, theirs = _pair()
    x = tf.constant(np.random.default_rng(2).normal(size=(2, 5, WIDTH)).astype(np.float32))
    grads = []
    for layer in (ours, theirs):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.square(layer(x)) * tf.range(WIDTH, dtype=tf.float32))
        grads.append(tape.gradient(loss, [x] + layer.trainable_weights))
    for a, b in zip(*grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)


def test_large_epsilon_and_other_axes_keep_keras_behaviour():
    ours, theirs = _pair(epsilon=1e-3)
    assert ours._fused and theirs._fused
    norm = fused_layer_normalization.FusedLayerNormalization(axis=1, epsilon=1e-12)
    x = np.random.default_rng(3).normal(size=(2, WIDTH, 3)).astype(np.float32)
    got = norm(tf.constant(x)).numpy()
    assert not norm._fused
    want = _numpy_layer_norm(np.moveaxis(x, 1, -1), 1.0, 0.0, 1e-12)
    np.testing.assert_allclose(got, np.moveaxis(want, -1, 1), rtol=1e-5, atol=1e-5)
