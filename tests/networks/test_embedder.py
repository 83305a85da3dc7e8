"""Embedder (Embed_input / Embed_doc): [CLS] or mean pooling -> projection -> LayerNorm, vs numpy."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import config
from realm_tf.networks import bert_encoder
from realm_tf.networks import embedder


@pytest.fixture(scope="module")
def tiny_encoder():
    cfg = config.load_config("configs/tiny.yaml").model.encoder
    return bert_encoder.build_bert_encoder(cfg)


def _inputs():
    ids = tf.constant([[101, 2054, 2003, 102, 0, 0], [101, 7592, 2088, 999, 1010, 102]], tf.int32)
    return {"input_word_ids": ids, "input_mask": tf.cast(ids > 0, tf.int32), "input_type_ids": tf.zeros_like(ids)}


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_embedding_matches_numpy(tiny_encoder, pooling):
    model = embedder.Embedder(tiny_encoder, projection_size=16, pooling=pooling)
    inputs = _inputs()
    got = model(inputs).numpy()  # [2, 16]
    seq = tiny_encoder(inputs)["sequence_output"].numpy()
    mask = inputs["input_mask"].numpy()[..., None]
    pooled = seq[:, 0] if pooling == "cls" else (seq * mask).sum(1) / mask.sum(1)
    kernel, bias = model.projection.kernel.numpy(), model.projection.bias.numpy()
    h = pooled @ kernel + bias
    gamma, beta = model.layer_norm.gamma.numpy(), model.layer_norm.beta.numpy()
    want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-12) * gamma + beta
    assert got.shape == (2, 16)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_gradients_reach_encoder_and_projection(tiny_encoder):
    model = embedder.Embedder(tiny_encoder, projection_size=16)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(_inputs(), training=True)[:, 0])
    grads = tape.gradient(loss, model.trainable_variables)
    names = [v.name for v, g in zip(model.trainable_variables, grads) if g is not None and tf.reduce_any(g != 0)]
    assert any("projection" in n for n in names) and any("transformer/layer_1" in n for n in names)


def test_get_config_round_trip(tiny_encoder):
    model = embedder.Embedder(tiny_encoder, projection_size=16, pooling="mean", name="doc")
    clone = embedder.Embedder.from_config(model.get_config(),
                                          custom_objects={"Text>BertEncoderV2": type(tiny_encoder)})
    assert clone.get_config()["pooling"] == "mean" and clone.get_config()["projection_size"] == 16
    assert clone(_inputs()).shape == (2, 16)
    with pytest.raises(ValueError, match="pooling"):
        embedder.Embedder(tiny_encoder, pooling="max")
    assert isinstance(clone, tf_keras.Model)
