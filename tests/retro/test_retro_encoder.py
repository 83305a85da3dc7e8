"""RETRO neighbour encoder (§2.4): shapes, conditioning on the retrieving chunk only, per-neighbour
encoding, key masking, config and graph mode."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.retro import retro_encoder

BATCH, NUM_CHUNKS, M, K, R, D = 2, 3, 4, 2, 8, 16


def _encoder(**kwargs):
    encoder = retro_encoder.RetroEncoder(num_heads=2, head_size=8, intermediate_size=32, neighbour_length=R,
                                         **kwargs)
    neighbours, chunk_hidden, _ = _inputs()
    encoder(neighbours, chunk_hidden)
    return encoder


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    neighbours = rng.normal(size=(BATCH, NUM_CHUNKS, K, R, D)).astype(np.float32)  # [batch, chunks, k, r, d]
    chunk_hidden = rng.normal(size=(BATCH, NUM_CHUNKS, M, D)).astype(np.float32)  # [batch, chunks, m, d]
    mask = rng.random((BATCH, NUM_CHUNKS, K, R)) < 0.7  # [batch, chunks, k, r]
    mask[..., 0] = True  # every neighbour has a real token
    mask[0, 2, 1] = False  # ...but one, which is empty
    return neighbours, chunk_hidden, mask


def _run(encoder, neighbours, chunk_hidden, mask=None):
    return encoder(tf.constant(neighbours), tf.constant(chunk_hidden),
                   neighbour_mask=None if mask is None else tf.constant(mask)).numpy()


@pytest.fixture(scope="module")
def encoder():
    return _encoder()


def test_output_shape_and_layers(encoder):
    neighbours, chunk_hidden, mask = _inputs()
    out = _run(encoder, neighbours, chunk_hidden, mask)
    assert out.shape == (BATCH, NUM_CHUNKS, K, R, D) and out.dtype == np.float32 and np.isfinite(out).all()
    names = {v.name for v in encoder.trainable_variables}
    assert any("layer_0/cross_attention/" in n for n in names)  # RETRO: cross-attention in the first layer only
    assert not any("layer_1/cross_attention" in n for n in names) and any("layer_1/" in n for n in names)
    assert encoder.position_embeddings.shape == (R, D)
    # The final LayerNorm (initialised to scale 1, offset 0): every token's features have mean 0, variance ~1.
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.var(-1), 1.0, atol=1e-3)


def test_chunk_c_is_conditioned_on_the_activations_of_chunk_c_only(encoder):
    neighbours, chunk_hidden, mask = _inputs()
    base = _run(encoder, neighbours, chunk_hidden, mask)
    for c in range(NUM_CHUNKS):
        changed = chunk_hidden.copy()
        changed[:, c] = np.random.default_rng(c).normal(size=changed[:, c].shape)
        diff = np.abs(_run(encoder, neighbours, changed, mask) - base).max(axis=(0, 2, 3, 4))  # [num_chunks]
        assert diff[c] > 1e-3, c
        assert (np.delete(diff, c) == 0.0).all(), (c, diff)
    # Without a cross-attention layer the decoder activations are not read at all.
    unconditioned = _encoder(cross_attention_layers=())
    plain = _run(unconditioned, neighbours, chunk_hidden, mask)
    np.testing.assert_array_equal(_run(unconditioned, neighbours, chunk_hidden + 1.0, mask), plain)


def test_neighbours_are_encoded_separately(encoder):
    neighbours, chunk_hidden, mask = _inputs()
    base = _run(encoder, neighbours, chunk_hidden, mask)
    changed = neighbours.copy()
    changed[1, 1, 0] = np.random.default_rng(9).normal(size=(R, D))  # one neighbour of one chunk
    diff = np.abs(_run(encoder, changed, chunk_hidden, mask) - base).max(axis=(3, 4))  # [batch, chunks, k]
    assert diff[1, 1, 0] > 1e-3
    diff[1, 1, 0] = 0.0
    np.testing.assert_array_equal(diff, 0.0)


def test_masked_tokens_do_not_affect_real_ones(encoder):
    neighbours, chunk_hidden, mask = _inputs()
    base = _run(encoder, neighbours, chunk_hidden, mask)
    noisy = neighbours.copy()
    noisy[~mask] = np.random.default_rng(5).normal(scale=100.0, size=((~mask).sum(), D))
    out = _run(encoder, noisy, chunk_hidden, mask)
    assert np.isfinite(out).all()  # the empty neighbour (no real token) too
    np.testing.assert_allclose(out[mask], base[mask], atol=1e-5)
    assert np.abs(out[~mask] - base[~mask]).max() > 1e-2  # the masked positions themselves did change
    # Without the mask they are attended, and change the real tokens too.
    assert np.abs(_run(encoder, noisy, chunk_hidden)[mask] - base[mask]).max() > 1e-3


def test_positions_matter(encoder):
    """Self-attention alone is permutation-equivariant: the position embeddings break that."""
    neighbours, chunk_hidden, _ = _inputs()
    order = np.roll(np.arange(R), 3)
    out = _run(encoder, neighbours, chunk_hidden)
    permuted = _run(encoder, neighbours[:, :, :, order], chunk_hidden)
    assert np.abs(permuted - out[:, :, :, order]).max() > 1e-3


def test_get_config_round_trip_graph_and_gradients(encoder):
    config = encoder.get_config()
    assert config["cross_attention_layers"] == [0] and config["num_layers"] == 2
    clone = retro_encoder.RetroEncoder.from_config(config)
    neighbours, chunk_hidden, mask = _inputs()
    _run(clone, neighbours, chunk_hidden)
    clone.set_weights(encoder.get_weights())
    assert clone.get_config() == config
    want = _run(encoder, neighbours, chunk_hidden, mask)
    np.testing.assert_allclose(_run(clone, neighbours, chunk_hidden, mask), want, atol=1e-6)

    graph = tf.function(lambda e, h, mk: encoder(e, h, neighbour_mask=mk), input_signature=[
        tf.TensorSpec([None, None, None, R, D]), tf.TensorSpec([None, None, None, D]),
        tf.TensorSpec([None, None, None, R], tf.bool)])
    np.testing.assert_allclose(graph(neighbours, chunk_hidden, mask).numpy(), want, atol=1e-5)
    short = (neighbours[:1, :2, :1], chunk_hidden[:1, :2], mask[:1, :2, :1])
    np.testing.assert_allclose(graph(*short).numpy(), _run(encoder, *short), atol=1e-5)

    h = tf.constant(chunk_hidden)
    with tf.GradientTape() as tape:
        tape.watch(h)
        loss = tf.reduce_sum(encoder(tf.constant(neighbours), h, neighbour_mask=tf.constant(mask),
                                     training=True) ** 3)
    grads = tape.gradient(loss, [h] + encoder.trainable_variables)
    assert all(g is not None and np.isfinite(g.numpy()).all() for g in grads)
    assert np.abs(grads[0].numpy()).max() > 0  # differentiable in the decoder activations (§2.4)
    with pytest.raises(ValueError, match="cross_attention_layers"):
        retro_encoder.RetroEncoder(2, 8, 32, R, num_layers=2, cross_attention_layers=(2,))
