"""HeadMajorEncoderBlock (issue #20): tf-models' TransformerEncoderBlock with HeadMajorAttention keeps the
block's variables (names and order) and outputs, in inference and with gradients."""
import numpy as np
import tensorflow as tf
from official.nlp.modeling import layers

from realm_tf.layers import head_major_attention
from realm_tf.layers import head_major_encoder_block


def _pair(**kwargs):
    args = dict(num_attention_heads=4, inner_dim=24, inner_activation="gelu", **kwargs)
    ours = head_major_encoder_block.HeadMajorEncoderBlock(name="block", **args)
    theirs = layers.TransformerEncoderBlock(name="block", **args)
    inputs = _inputs()
    ours(inputs)
    theirs(inputs)
    rng = np.random.default_rng(0)
    theirs.set_weights([rng.normal(scale=0.3, size=w.shape).astype(np.float32) for w in theirs.weights])
    ours.set_weights(theirs.get_weights())
    return ours, theirs


def _inputs():
    rng = np.random.default_rng(1)
    hidden = tf.constant(rng.normal(size=(2, 6, 16)).astype(np.float32))  # [batch, seq_len, width]
    mask = tf.constant(np.arange(6)[None, None, :] < np.array([6, 2])[:, None, None], tf.float32)  # [b, t, s]
    return [hidden, tf.broadcast_to(mask, (2, 6, 6))]


def test_attention_is_head_major_and_variables_unchanged():
    ours, theirs = _pair()
    assert type(ours._attention_layer) is head_major_attention.HeadMajorAttention
    assert [(w.name, w.shape) for w in ours.weights] == [(w.name, w.shape) for w in theirs.weights]


def test_outputs_and_gradients_match_the_block():
    ours, theirs = _pair()
    inputs = _inputs()
    np.testing.assert_allclose(ours(inputs).numpy(), theirs(inputs).numpy(), rtol=1e-5, atol=1e-5)
    grads = []
    for block in (ours, theirs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(block(inputs, training=False)))
        grads.append(tape.gradient(loss, block.trainable_weights))
    for a, b in zip(*grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_multi_query_blocks_keep_their_attention():
    ours, theirs = _pair(num_kv_heads=1)
    assert type(ours._attention_layer) is type(theirs._attention_layer)
    np.testing.assert_allclose(ours(_inputs()).numpy(), theirs(_inputs()).numpy(), rtol=1e-5, atol=1e-5)
