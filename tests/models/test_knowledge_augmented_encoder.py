"""Knowledge-augmented encoder: MLM logits vs a numpy head over the encoder output, tied embeddings."""
import numpy as np
import tensorflow as tf

from realm_tf import config
from realm_tf.models import knowledge_augmented_encoder


def test_mlm_logits_match_numpy_and_output_embedding_is_tied():
    cfg = config.load_config("configs/tiny.yaml").model
    model = knowledge_augmented_encoder.build_knowledge_augmented_encoder(cfg)
    rng = np.random.default_rng(0)
    ids = tf.constant(rng.integers(1000, 5000, size=(2, 10)), tf.int32)
    positions = tf.constant([[1, 4, 0], [9, 2, 2]], tf.int32)
    out = model({"input_word_ids": ids, "input_mask": tf.ones_like(ids), "input_type_ids": tf.zeros_like(ids),
                 "masked_positions": positions})
    seq = out["sequence_output"].numpy()
    head = model.masked_lm
    table = model.encoder.get_embedding_table().numpy()  # [vocab, hidden]
    gathered = np.stack([seq[b, positions.numpy()[b]] for b in range(2)])  # [2, 3, hidden]
    h = gathered @ head.dense.kernel.numpy() + head.dense.bias.numpy()
    h = 0.5 * h * (1 + np.vectorize(__import__("math").erf)(h / np.sqrt(2)))  # exact GELU
    mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    h = (h - mu) / np.sqrt(var + 1e-12) * head.layer_norm.gamma.numpy() + head.layer_norm.beta.numpy()
    want = h @ table.T + head.bias.numpy()
    assert out["mlm_logits"].shape == (2, 3, cfg.encoder.vocab_size)
    np.testing.assert_allclose(out["mlm_logits"].numpy(), want, atol=2e-4, rtol=1e-4)
    # The output embedding is the input word embedding (one variable, not a copy).
    assert any(v is model.encoder.get_embedding_table() for v in model.trainable_variables)
    assert sum(tuple(v.shape) == table.shape for v in model.trainable_variables) == 1
