"""BertEncoder (issue #20): BertEncoderV2 with head-major attention products and fused layer norms keeps
BertEncoderV2's variables (names, order, checkpoint keys), config and outputs."""
import numpy as np
import tensorflow as tf
import tf_keras
from official.nlp.modeling import networks

from realm_tf import config as config_lib
from realm_tf.layers import fused_layer_normalization
from realm_tf.layers import head_major_attention
from realm_tf.layers import head_major_encoder_block
from realm_tf.networks import bert_encoder

CFG = config_lib.EncoderConfig(vocab_size=60, hidden_size=32, num_layers=2, num_attention_heads=4,
                               intermediate_size=48, max_position_embeddings=40)


def _inputs(batch=3, seq_len=11, seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.array([seq_len, 5, 1])[:batch]
    mask = (np.arange(seq_len)[None] < lengths[:, None]).astype(np.int32)  # [batch, seq_len]
    return {"input_word_ids": tf.constant(rng.integers(1, 60, (batch, seq_len)) * mask, tf.int32),
            "input_mask": tf.constant(mask),
            "input_type_ids": tf.constant((np.arange(seq_len)[None] >= 3) * mask, tf.int32)}, mask


def _pair():
    ours = bert_encoder.build_bert_encoder(CFG)
    theirs = networks.BertEncoderV2(**ours.get_config(), name="bert")
    inputs, _ = _inputs()
    ours(inputs)
    theirs(inputs)
    return ours, theirs


def test_layers_are_head_major():
    ours, _ = _pair()
    assert isinstance(ours, networks.BertEncoderV2)
    for block in ours.transformer_layers:
        assert isinstance(block, head_major_encoder_block.HeadMajorEncoderBlock)
        assert isinstance(block._attention_layer, head_major_attention.HeadMajorAttention)
        assert isinstance(block._attention_layer_norm, fused_layer_normalization.FusedLayerNormalization)
        assert isinstance(block._output_layer_norm, fused_layer_normalization.FusedLayerNormalization)
    assert isinstance(ours._embedding_norm_layer, fused_layer_normalization.FusedLayerNormalization)


def test_same_variables_and_outputs_as_bert_encoder_v2():
    ours, theirs = _pair()
    assert [(w.name, w.shape) for w in ours.weights] == [(w.name, w.shape) for w in theirs.weights]
    rng = np.random.default_rng(1)
    theirs.set_weights([rng.normal(scale=0.3, size=w.shape).astype(np.float32) for w in theirs.weights])
    ours.set_weights(theirs.get_weights())
    inputs, mask = _inputs()
    a, b = ours(inputs, training=False), theirs(inputs, training=False)
    real = mask.astype(bool)
    np.testing.assert_allclose(a["sequence_output"].numpy()[real], b["sequence_output"].numpy()[real],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a["pooled_output"].numpy(), b["pooled_output"].numpy(), rtol=1e-5, atol=1e-5)


def test_reads_bert_encoder_v2_checkpoints(tmp_path):
    ours, theirs = _pair()
    path = tf.train.Checkpoint(encoder=theirs).save(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(encoder=ours).restore(path).assert_existing_objects_matched().assert_consumed()
    for a, b in zip(ours.weights, theirs.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_config_round_trip_keeps_the_class():
    ours, _ = _pair()
    restored = tf_keras.layers.deserialize(tf_keras.layers.serialize(ours))
    assert type(restored) is bert_encoder.BertEncoder
    assert restored.get_config() == ours.get_config()
