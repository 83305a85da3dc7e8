"""HeadMajorAttention (issue #20): the attention products as batched matmuls give Keras' MultiHeadAttention's
outputs, scores and gradients, and match a float64 numpy softmax(Q Kᵀ / √d + mask) V that reads the layer's
own weights."""
import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf.layers import head_major_attention

BATCH, T, S, D, HEADS, KEY_DIM = 3, 7, 9, 12, 3, 4


def _pair(dropout=0.0, rank=3, **kwargs):
    """A HeadMajorAttention and a Keras MultiHeadAttention, built and holding the same random weights."""
    rng = np.random.default_rng(0)
    query, value = _inputs(rank)
    ours = head_major_attention.HeadMajorAttention(HEADS, KEY_DIM, dropout=dropout, **kwargs)
    keras = tf_keras.layers.MultiHeadAttention(HEADS, KEY_DIM, dropout=dropout, **kwargs)
    for layer in (ours, keras):
        layer(query, value)
    weights = [rng.normal(scale=0.5, size=w.shape).astype(np.float32) for w in keras.get_weights()]
    keras.set_weights(weights)
    ours.set_weights(weights)
    return ours, keras


def _inputs(rank=3):
    rng = np.random.default_rng(1)
    shape = (BATCH, T, D) if rank == 3 else (BATCH, 2, T, D)
    query = tf.constant(rng.normal(size=shape).astype(np.float32))  # [batch, t, d]
    value = tf.constant(rng.normal(size=shape[:-2] + (S, D)).astype(np.float32))  # [batch, s, d]
    return query, value


def _mask():
    """[batch, t, s]: each row attends a prefix of the keys, of a different length per example."""
    lengths = np.array([S, 4, 1])
    return tf.constant(np.broadcast_to(np.arange(S)[None, None, :] < lengths[:, None, None], (BATCH, T, S)))


def _numpy_attention(layer, query, value, mask):
    w = [x.astype(np.float64) for x in layer.get_weights()]  # query, key, value, output: kernel then bias
    q = np.einsum("btd,dnh->btnh", query, w[0]) + w[1]  # [batch, t, heads, key_dim]
    k = np.einsum("bsd,dnh->bsnh", value, w[2]) + w[3]  # [batch, s, heads, key_dim]
    v = np.einsum("bsd,dnh->bsnh", value, w[4]) + w[5]  # [batch, s, heads, key_dim]
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(KEY_DIM)  # [batch, heads, t, s]
    logits = np.where(mask[:, None], logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bnts,bsnh->btnh", probs, v)  # [batch, t, heads, key_dim]
    return np.einsum("btnh,nhd->btd", context, w[6]) + w[7], probs


def _op_types(layer, query, value):
    """The op types of ``layer``'s traced inference graph, with their counts."""
    graph = tf.function(lambda q, v: layer(q, v)).get_concrete_function(query, value).graph
    types = [op.type for op in graph.get_operations()]
    return {t: types.count(t) for t in set(types)}


def test_products_are_batched_matmuls():
    ours, keras = _pair()
    query, value = _inputs()
    ops = _op_types(ours, query, value)
    assert ops.get("BatchMatMulV2") == 2 and ops.get("MatMul") == 4  # the 4 projections: MatmulEinsumDense
    assert "Einsum" not in ops
    assert "BatchMatMulV2" not in _op_types(keras, query, value)


def test_matches_numpy_and_keras():
    ours, keras = _pair()
    query, value = _inputs()
    mask = _mask()
    out, scores = ours(query, value, attention_mask=mask, return_attention_scores=True)
    ref_out, ref_scores = _numpy_attention(ours, query.numpy(), value.numpy(), mask.numpy())
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(scores.numpy(), ref_scores, atol=1e-5)
    keras_out, keras_scores = keras(query, value, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(out.numpy(), keras_out.numpy(), atol=1e-5)
    np.testing.assert_allclose(scores.numpy(), keras_scores.numpy(), atol=1e-6)


def test_gradients_match_keras():
    ours, keras = _pair()
    query, value = _inputs()
    grads = []
    for layer in (ours, keras):
        with tf.GradientTape() as tape:
            tape.watch([query, value])
            loss = tf.reduce_sum(tf.sin(layer(query, value, attention_mask=_mask(), training=True)))
        grads.append(tape.gradient(loss, [query, value] + layer.trainable_weights))
    assert len(grads[0]) == 2 + 8
    for a, b in zip(*grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_dropout_on_probabilities_in_training_only():
    ours, _ = _pair(dropout=0.5)
    query, value = _inputs()
    plain = ours(query, value, training=False).numpy()
    np.testing.assert_allclose(ours(query, value, training=False).numpy(), plain)
    dropped, scores = ours(query, value, training=True, return_attention_scores=True)
    assert np.abs(dropped.numpy() - plain).max() > 1e-2
    np.testing.assert_allclose(scores.numpy().sum(-1), 1.0, rtol=1e-5)  # the probabilities before dropout


def test_attention_dropout_keeps_the_expectation_with_its_scale_after_the_product_with_v():
    """Dropout on the probabilities, its scale applied to the product with V: averaged over many draws, the
    training output is the inference output (each draw zeroes about a tenth of the probabilities)."""
    ours, _ = _pair(dropout=0.1)
    query, value = _inputs()
    plain = ours(query, value, training=False).numpy().astype(np.float64)
    step = tf.function(lambda q, v: ours(q, v, training=True))
    draws = np.stack([step(query, value).numpy() for _ in range(400)]).astype(np.float64)  # [draws, batch, t, d]
    assert np.abs(draws[0] - plain).max() > 1e-2  # a draw differs from the inference output ...
    spread = draws.std(0) / np.sqrt(len(draws))  # ... its mean does not, within 5 standard errors
    assert (np.abs(draws.mean(0) - plain) < 5 * spread + 1e-6).mean() > 0.99


def test_a_symbolic_training_flag_falls_back_to_keras_dropout():
    ours, _ = _pair(dropout=0.5)
    query, value = _inputs()
    types = set(_op_types(lambda q, v: ours(q, v, training=True), query, value))
    # a Python flag: the 16-bit mask from raw Philox bits, not tf.nn.dropout's float draws
    assert "StatelessRandomUniformFullIntV2" in types and "RandomUniform" not in types
    symbolic = tf.function(lambda q, v, t: ours(q, v, training=t))
    plain = ours(query, value, training=False).numpy()
    np.testing.assert_allclose(symbolic(query, value, tf.constant(False)).numpy(), plain)
    assert np.abs(symbolic(query, value, tf.constant(True)).numpy() - plain).max() > 1e-2  # Keras' Dropout ran


def test_other_attention_axes_fall_back_to_keras():
    ours, keras = _pair(rank=4, attention_axes=(2,))
    query, value = _inputs(rank=4)  # [batch, 2, t, d]: attention over axis 2
    assert "BatchMatMulV2" not in _op_types(ours, query, value)
    np.testing.assert_allclose(ours(query, value).numpy(), keras(query, value).numpy(), atol=1e-6)


def test_masked_scores_in_half_precision_match_keras():
    """Under float16 and bfloat16 policies the mask adds what Keras' softmax adds (half float16's minimum in
    float16, -1e9 otherwise): the masked keys get probability 0 and the rest match Keras'."""
    query, value = _inputs()
    for policy in ("mixed_float16", "mixed_bfloat16"):
        ours, keras = _pair(dtype=policy)
        out, scores = ours(query, value, attention_mask=_mask(), return_attention_scores=True)
        want, want_scores = keras(query, value, attention_mask=_mask(), return_attention_scores=True)
        assert scores.dtype == want_scores.dtype != tf.float32
        assert not np.asarray(scores, np.float32)[~np.broadcast_to(_mask().numpy()[:, None], scores.shape)].any()
        np.testing.assert_allclose(np.asarray(scores, np.float32), np.asarray(want_scores, np.float32), atol=2e-2)
        np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), rtol=5e-2, atol=5e-2)
