"""RETRO chunked cross-attention (§2.4, App. A): the causal chunk shift, masking, and the attention itself
against a float64 numpy reference that reads the layer's own weights."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.retro import chunked_cross_attention

BATCH, NUM_CHUNKS, M, K, R, D, HEADS, HEAD_SIZE = 2, 3, 4, 2, 8, 16, 2, 8
N = NUM_CHUNKS * M


def _layer(use_relative_bias=True, seed=0):
    """A built CCA layer whose weights (biases and relative bias included) are all random and non-zero."""
    layer = chunked_cross_attention.ChunkedCrossAttention(HEADS, HEAD_SIZE, M, R,
                                                          use_relative_bias=use_relative_bias)
    hidden, neighbours, _ = _inputs(seed)
    layer(hidden, neighbours)
    rng = np.random.default_rng(100 + seed)
    layer.set_weights([rng.normal(scale=0.5, size=w.shape).astype(np.float32) for w in layer.get_weights()])
    return layer


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(BATCH, N, D)).astype(np.float32)  # [batch, n, d]
    neighbours = rng.normal(size=(BATCH, NUM_CHUNKS, K, R, D)).astype(np.float32)  # [batch, chunks, k, r, d]
    mask = rng.random((BATCH, NUM_CHUNKS, K, R)) < 0.7  # [batch, chunks, k, r]
    mask[0, 1] = False  # a chunk with no neighbour token at all
    mask[1, 0, 1] = False  # an empty neighbour next to a real one
    mask[1, 2] = True
    return hidden, neighbours, mask


def _run(layer, hidden, neighbours, mask=None):
    args = [tf.constant(hidden), tf.constant(neighbours)]
    return layer(*args, neighbour_mask=None if mask is None else tf.constant(mask)).numpy()


def _attending_chunk(position):
    """The attending chunk of token ``position`` (None: one of the first m - 1 tokens) and its row in it."""
    if position < M - 1:
        return None, None
    return (position - (M - 1)) // M, (position - (M - 1)) % M


def _numpy_cca(layer, hidden, neighbours, mask, use_relative_bias):
    """Per attending chunk: softmax(Q Kᵀ / √head_size + B) V over the masked k * r neighbour tokens."""
    names = [w.name.split("/")[-1].split(":")[0] for w in layer.weights]
    w = {name: value.astype(np.float64) for name, value in zip(names, layer.get_weights())}
    hidden, neighbours = hidden.astype(np.float64), neighbours.astype(np.float64)
    out = np.zeros_like(hidden)  # [batch, n, d]
    for b in range(BATCH):
        for u in range(NUM_CHUNKS):
            positions = [p for p in range(u * M + M - 1, u * M + 2 * M - 1) if p < N]  # at most m tokens
            rows = hidden[b, positions]  # [<= m, d]
            memory = neighbours[b, u].reshape(K * R, D)  # [k * r, d]
            valid = mask[b, u].reshape(K * R)  # [k * r]
            if not valid.any():
                continue  # nothing to attend: the output stays zero
            total = np.zeros((len(positions), D))
            for h in range(HEADS):
                q = rows @ w["query_kernel"][:, h] + w["query_bias"][h]  # [<= m, head_size]
                key = memory @ w["key_kernel"][:, h] + w["key_bias"][h]  # [k * r, head_size]
                value = memory @ w["value_kernel"][:, h] + w["value_bias"][h]  # [k * r, head_size]
                logits = q @ key.T / np.sqrt(HEAD_SIZE)  # [<= m, k * r]
                if use_relative_bias:
                    for i in range(len(positions)):
                        for j in range(K * R):
                            distance = (M - 1 + i) - (j % R)  # from neighbour token j to query i
                            logits[i, j] += w["relative_bias"][h, distance - (M - R)]
                logits = np.where(valid, logits, -np.inf)
                probs = np.exp(logits - logits.max(-1, keepdims=True))
                probs /= probs.sum(-1, keepdims=True)  # [<= m, k * r]
                total += probs @ value @ w["output_kernel"][h]  # [<= m, d]
            out[b, positions] = total + w["output_bias"]
    return out


@pytest.mark.parametrize("use_relative_bias", [True, False])
def test_matches_numpy_reference(use_relative_bias):
    layer = _layer(use_relative_bias)
    assert len(layer.get_weights()) == (9 if use_relative_bias else 8)
    if use_relative_bias:
        assert layer.relative_bias.shape == (HEADS, M + R - 1)
    for seed in range(2):
        hidden, neighbours, mask = _inputs(seed)
        got = _run(layer, hidden, neighbours, mask)
        assert got.shape == (BATCH, N, D) and got.dtype == np.float32
        want = _numpy_cca(layer, hidden, neighbours, mask, use_relative_bias)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
        assert np.abs(want[:, M - 1:]).max() > 0.1  # the comparison is not of zeros
        # Without a mask every neighbour token is attended.
        np.testing.assert_allclose(_run(layer, hidden, neighbours),
                                   _numpy_cca(layer, hidden, neighbours, np.ones_like(mask), use_relative_bias),
                                   atol=1e-5, rtol=1e-5)


def test_relative_bias_changes_the_output():
    with_bias = _layer(True)
    without = _layer(False)
    without.set_weights(with_bias.get_weights()[:8])
    hidden, neighbours, mask = _inputs()
    assert np.abs(_run(with_bias, hidden, neighbours, mask) - _run(without, hidden, neighbours, mask)).max() > 1e-3


def test_each_token_sees_exactly_its_attending_chunks_neighbours():
    layer = _layer()
    hidden, neighbours, _ = _inputs()
    base = _run(layer, hidden, neighbours)
    np.testing.assert_array_equal(base[:, :M - 1], 0.0)  # the first m - 1 tokens attend nothing
    rng = np.random.default_rng(7)
    for u in range(NUM_CHUNKS):
        changed = neighbours.copy()
        changed[:, u] = rng.normal(size=changed[:, u].shape)
        diff = np.abs(_run(layer, hidden, changed) - base).max(axis=(0, 2))  # [n]
        for t in range(N):
            chunk = t // M
            # Token t of chunk c reads chunk c - 1's neighbours; the chunk's last token reads chunk c's own.
            reads = chunk if t % M == M - 1 else chunk - 1
            assert reads == _attending_chunk(t)[0] or (reads == -1 and _attending_chunk(t)[0] is None)
            if reads == u:
                assert diff[t] > 1e-4, (u, t)
            else:
                assert diff[t] == 0.0, (u, t)  # bitwise: later (and earlier) chunks' neighbours do not leak
    # The last token of every chunk depends on its own chunk's neighbours.
    for c in range(NUM_CHUNKS):
        changed = neighbours.copy()
        changed[:, c] += 1.0
        assert np.abs(_run(layer, hidden, changed)[:, c * M + M - 1] - base[:, c * M + M - 1]).min() > 1e-4


def test_output_at_a_token_depends_on_that_token_only():
    layer = _layer()
    hidden, neighbours, _ = _inputs()
    base = _run(layer, hidden, neighbours)
    for s in range(N):
        changed = hidden.copy()
        changed[:, s] += 3.0
        diff = np.abs(_run(layer, changed, neighbours) - base).max(axis=(0, 2))  # [n]
        assert (diff[:s] == 0).all() and (diff[s + 1:] == 0).all(), s  # no future (or past) token leaks in
        assert diff[s] == 0.0 if s < M - 1 else diff[s] > 1e-4, s


def test_masking():
    layer = _layer()
    hidden, neighbours, mask = _inputs()
    base = _run(layer, hidden, neighbours, mask)
    # Chunk 1 of example 0 has no neighbour token: its attending chunk gives exact, finite zeros.
    assert np.isfinite(base).all()
    np.testing.assert_array_equal(base[0, M + M - 1:2 * M + M - 1], 0.0)
    assert np.abs(base[1, M + M - 1:2 * M + M - 1]).min() > 0  # the other example's chunk 1 is not masked
    # Masked tokens' embeddings are never read, however large.
    noisy = neighbours.copy()
    noisy[~mask] = np.random.default_rng(3).normal(scale=1e3, size=((~mask).sum(), D))
    np.testing.assert_allclose(_run(layer, hidden, noisy, mask), base, atol=1e-6)
    assert np.abs(_run(layer, hidden, noisy) - base).max() > 1e-2  # ...but they are read without the mask
    # Everything masked: zeros everywhere, and finite gradients.
    nothing = np.zeros_like(mask)
    np.testing.assert_array_equal(_run(layer, hidden, neighbours, nothing), 0.0)
    h, e = tf.constant(hidden), tf.constant(neighbours)
    with tf.GradientTape() as tape:
        tape.watch([h, e])
        loss = tf.reduce_sum(layer(h, e, neighbour_mask=tf.constant(mask)) ** 2)
    grads = tape.gradient(loss, [h, e] + layer.trainable_variables)
    assert all(np.isfinite(g.numpy()).all() for g in grads)
    assert np.abs(grads[1].numpy()[~mask]).max() == 0.0  # no gradient into masked tokens
    assert np.abs(grads[1].numpy()[mask]).max() > 0.0


def test_get_config_round_trip_and_graph_with_unknown_shapes():
    layer = _layer()
    config = layer.get_config()
    assert (config["chunk_length"], config["neighbour_length"], config["num_heads"]) == (M, R, HEADS)
    clone = chunked_cross_attention.ChunkedCrossAttention.from_config(config)
    hidden, neighbours, mask = _inputs()
    clone(tf.constant(hidden), tf.constant(neighbours))
    clone.set_weights(layer.get_weights())
    assert clone.get_config() == config
    want = _run(layer, hidden, neighbours, mask)
    np.testing.assert_allclose(_run(clone, hidden, neighbours, mask), want, atol=1e-6)

    graph = tf.function(lambda h, e, mk: layer(h, e, neighbour_mask=mk), input_signature=[
        tf.TensorSpec([None, None, D]), tf.TensorSpec([None, None, None, R, D]),
        tf.TensorSpec([None, None, None, R], tf.bool)])
    np.testing.assert_allclose(graph(hidden, neighbours, mask).numpy(), want, atol=1e-5)
    short = (hidden[:1, :2 * M], neighbours[:1, :2, :1], mask[:1, :2, :1])  # fewer chunks and neighbours
    np.testing.assert_allclose(graph(*short).numpy(), _run(layer, *short), atol=1e-5)
    with pytest.raises(ValueError, match="num_chunks"):
        layer(tf.constant(hidden[:, :N - 1]), tf.constant(neighbours))
    with pytest.raises(ValueError, match="chunk_length"):
        chunked_cross_attention.ChunkedCrossAttention(HEADS, HEAD_SIZE, 0, R)
