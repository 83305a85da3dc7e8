"""Inverted dropout on 16 random bits per element: its keep rate and scale against the binomial and the exact
inverse keep probability, its gradient, independent draws, and Keras' Dropout where the fast path does not apply."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import config
from realm_tf.layers import integer_dropout
from realm_tf.networks import bert_encoder


@pytest.mark.parametrize("rate", [0.1, 0.5])
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("last", [64, 63])  # an odd last axis takes the halves of a last, partly used draw
def test_dropout_keeps_the_expectation_and_passes_gradients_through_its_mask(rate, dtype, last):
    """Each element zeroed with probability ``rate`` (a binomial test over 500k elements), the rest scaled by the
    inverse of the exact keep probability; the gradient is the same mask times the same scale."""
    x = tf.cast(tf.random.stateless_uniform([4, 6, 330, last], [1, 2], 0.5, 1.5), dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = integer_dropout.dropout(x, rate)
        weights = tf.cast(tf.reshape(tf.range(tf.size(x)) % 7, x.shape), dtype)
        loss = tf.reduce_sum(tf.cast(y * weights, tf.float32))
    grad = tape.gradient(loss, x).numpy().astype(np.float64)
    x64, y64 = x.numpy().astype(np.float64), y.numpy().astype(np.float64)
    kept = y64 != 0
    threshold = round(rate * 65536)
    assert integer_dropout.threshold(rate) == threshold
    p_keep = (65536 - threshold) / 65536
    assert abs(kept.mean() - p_keep) < 5 * np.sqrt(p_keep * (1 - p_keep) / kept.size), (kept.mean(), p_keep)
    scale = np.float64(tf.cast(65536 / (65536 - threshold), dtype).numpy())
    tolerance = 1e-2 if dtype == tf.bfloat16 else 1e-6
    np.testing.assert_allclose(y64[kept], x64[kept] * scale, rtol=tolerance)
    np.testing.assert_array_equal(grad == 0, ~kept | (weights.numpy() == 0))
    np.testing.assert_allclose(grad[kept], (weights.numpy().astype(np.float64) * scale)[kept], rtol=tolerance)
    # Neighbouring rows are independent draws: they agree at a position with probability p² + (1 - p)², not 1
    # (as rows sharing their draws would).
    rows = kept.reshape(-1, last)
    agree = (rows[1:] == rows[:-1]).mean()
    assert abs(agree - (p_keep ** 2 + (1 - p_keep) ** 2)) < 0.01, agree


def test_every_call_draws_a_new_mask():
    x = tf.ones([64, 128])
    step = tf.function(lambda: integer_dropout.dropout(x, 0.5))
    first, second = step().numpy() != 0, step().numpy() != 0
    assert 0.4 < (first == second).mean() < 0.6  # independent masks agree half the time at rate 0.5


def _op_types(function, *args):
    graph = tf.function(function).get_concrete_function(*args).graph
    return {op.type for op in graph.get_operations()}


def test_the_layer_takes_the_mask_for_a_python_flag_and_keras_dropout_otherwise():
    x = tf.ones([8, 16])
    layer = integer_dropout.IntegerDropout(0.25)
    assert "StatelessRandomUniformFullIntV2" in _op_types(lambda t: layer(t, training=True), x)
    assert "RandomUniform" not in _op_types(lambda t: layer(t, training=True), x)
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    symbolic = tf.function(lambda t, flag: layer(t, training=flag))
    np.testing.assert_array_equal(symbolic(x, tf.constant(False)).numpy(), x.numpy())
    assert (symbolic(x, tf.constant(True)).numpy() == 0).any()  # Keras' Dropout ran
    for keras_only in (integer_dropout.IntegerDropout(0.25, noise_shape=[8, 1]),
                       integer_dropout.IntegerDropout(0.25, seed=3)):
        types = _op_types(lambda t, layer=keras_only: layer(t, training=True), x)
        assert "StatelessRandomUniformFullIntV2" not in types
    without_name = lambda c: {k: v for k, v in c.items() if k != "name"}  # noqa: E731
    assert without_name(layer.get_config()) == without_name(tf_keras.layers.Dropout(0.25).get_config())
    restored = tf_keras.layers.deserialize(tf_keras.layers.serialize(layer))
    assert type(restored) is integer_dropout.IntegerDropout and restored.rate == 0.25


def test_bert_trains_with_integer_dropout_everywhere():
    """The encoder's embedding, attention-output and feed-forward dropouts and its attention probabilities all
    draw 16-bit masks: a training pass holds no float uniform draw; inference holds no draw at all."""
    cfg = config.load_config("configs/tiny.yaml", ["model.encoder.dropout_rate=0.1",
                                                   "model.encoder.attention_dropout_rate=0.1"])
    encoder = bert_encoder.build_bert_encoder(cfg.model.encoder)
    inputs = {"input_word_ids": tf.ones([2, 12], tf.int32), "input_mask": tf.ones([2, 12], tf.int32),
              "input_type_ids": tf.zeros([2, 12], tf.int32)}
    encoder(inputs)
    layers = list(encoder._flatten_layers())  # pylint: disable=protected-access
    # The attention layers keep Keras' own dropout layer for a symbolic training flag only (their probabilities are
    # dropped by head_major_attention otherwise).
    fallback = {id(layer._dropout_layer) for layer in layers  # pylint: disable=protected-access
                if isinstance(layer, tf_keras.layers.MultiHeadAttention)}
    dropouts = [layer for layer in layers if isinstance(layer, tf_keras.layers.Dropout) and id(layer) not in fallback]
    assert len(dropouts) == 1 + 3 * cfg.model.encoder.num_layers  # embeddings; attention output, inner, output
    assert all(type(layer) is integer_dropout.IntegerDropout for layer in dropouts)

    def forward(training):
        def call(word_ids, mask, type_ids):
            return encoder({"input_word_ids": word_ids, "input_mask": mask, "input_type_ids": type_ids},
                           training=training)["sequence_output"]
        return call

    training = _op_types(forward(True), *inputs.values())
    assert "StatelessRandomUniformFullIntV2" in training and "RandomUniform" not in training
    assert not {"StatelessRandomUniformFullIntV2", "RandomUniform", "RandomUniformInt"} & _op_types(
        forward(False), *inputs.values())

