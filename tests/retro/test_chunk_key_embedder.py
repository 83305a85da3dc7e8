"""The frozen chunk-key BERT of RETRO (Borgeaud et al., 2021, §2.3) against numpy: the unit-norm mean of the
chunk tokens' states, [CLS] and [SEP] and padding left out."""
import numpy as np
import pytest

from realm_tf import config
from realm_tf import errors
from realm_tf.retro import chunk_key_embedder


def test_key_is_the_unit_mean_of_the_chunk_tokens_states(tiny_bert_checkpoint):
    cfg = config.load_config("configs/tiny.yaml", [f"retro.embedder_checkpoint={tiny_bert_checkpoint}"])
    model = chunk_key_embedder.build_chunk_key_embedder(cfg)
    assert not model.trainable
    chunks = [[2054, 2003, 1996], [7592], [2023, 2003, 1037, 2936, 3793]]
    inputs = chunk_key_embedder.pack_chunks(chunks, cls_id=101, sep_id=102)
    assert inputs["input_word_ids"].tolist()[1] == [101, 7592, 102, 0, 0, 0, 0]
    keys = model(inputs).numpy()  # [3, hidden]
    states = model.encoder(inputs, training=False)["sequence_output"].numpy()  # [3, len, hidden]
    for row, tokens in enumerate(chunks):
        mean = states[row, 1:1 + len(tokens)].mean(axis=0)
        np.testing.assert_allclose(keys[row], mean / np.linalg.norm(mean), atol=1e-5)
    # Padding changes nothing: the same chunk alone in its batch gets the same key.
    alone = model(chunk_key_embedder.pack_chunks(chunks[1:2], 101, 102)).numpy()
    np.testing.assert_allclose(alone[0], keys[1], atol=1e-5)
    # Frozen and restored: another build (another worker) keys the chunks alike.
    again = chunk_key_embedder.build_chunk_key_embedder(cfg)
    np.testing.assert_allclose(again(inputs).numpy(), keys, atol=1e-6)


def test_a_random_bert_is_refused():
    with pytest.raises(errors.UserError, match="retro.embedder_checkpoint"):
        chunk_key_embedder.build_chunk_key_embedder(config.load_config("configs/tiny.yaml"))
