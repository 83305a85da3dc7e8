"""RETRO's decoder (Borgeaud et al., 2021, §2.4): causal in the tokens, causal in the neighbours (chunk c's
neighbours reach only positions from the last token of chunk c on), retrieval off = CCA adds nothing."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf.retro import retro_decoder

M, K, R, N = 4, 2, 6, 16  # chunk length, neighbours, neighbour length, sequence length: 4 chunks


def _model(retro_layers=(2, 3)):
    model = retro_decoder.RetroDecoder(vocab_size=50, sequence_length=N, chunk_length=M, neighbour_length=R,
                                       num_layers=3, width=16, num_heads=2, intermediate_size=32,
                                       retro_layers=retro_layers, encoder_layers=2, dropout_rate=0.0)
    return model


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(1, 50, size=[2, N]).astype(np.int32),
            "neighbour_ids": rng.integers(1, 50, size=[2, N // M, K, R]).astype(np.int32),
            "neighbour_mask": np.ones([2, N // M, K, R], bool)}


def test_paper_rule_for_the_retro_layers():
    assert retro_decoder.default_retro_layers(12) == (6, 9, 12)
    assert retro_decoder.default_retro_layers(6) == (3, 6)
    assert retro_decoder.default_retro_layers(2) == (1,)


def test_logits_never_see_later_tokens():
    model, inputs = _model(), _inputs()
    base = model(inputs)["logits"].numpy()  # [2, N, 50]
    assert base.shape == (2, N, 50)
    for t in (3, 9, 15):
        changed = {**inputs, "input_ids": inputs["input_ids"].copy()}
        changed["input_ids"][:, t] = (changed["input_ids"][:, t] % 49) + 1
        out = model(changed)["logits"].numpy()
        np.testing.assert_allclose(out[:, :t], base[:, :t], atol=1e-5)
        assert np.abs(out[:, t:] - base[:, t:]).max() > 1e-6


def test_neighbours_of_chunk_c_reach_only_positions_from_its_last_token():
    model, inputs = _model(), _inputs()
    base = model(inputs)["logits"].numpy()
    for c in range(N // M):
        changed = {**inputs, "neighbour_ids": inputs["neighbour_ids"].copy()}
        changed["neighbour_ids"][:, c] = (changed["neighbour_ids"][:, c] % 49) + 1
        out = model(changed)["logits"].numpy()
        first = (c + 1) * M - 1  # the last token of chunk c: it has seen all of chunk c
        np.testing.assert_allclose(out[:, :first], base[:, :first], atol=1e-5)
        if first < N:
            assert np.abs(out[:, first] - base[:, first]).max() > 1e-6
    # the first m - 1 tokens attend no neighbours at all
    masked = {**inputs, "neighbour_mask": np.zeros_like(inputs["neighbour_mask"])}
    np.testing.assert_allclose(model(masked)["logits"].numpy()[:, :M - 1], base[:, :M - 1], atol=1e-5)


def test_retrieval_off_ignores_the_neighbour_tokens_and_the_baseline_has_no_retro_weights():
    model, inputs = _model(), _inputs()
    off = {**inputs, "neighbour_mask": np.zeros_like(inputs["neighbour_mask"])}
    other = {**off, "neighbour_ids": _inputs(seed=1)["neighbour_ids"]}
    np.testing.assert_allclose(model(off)["logits"].numpy(), model(other)["logits"].numpy(), atol=1e-6)
    baseline = _model(retro_layers=())
    outputs = baseline({"input_ids": inputs["input_ids"]})
    assert outputs["logits"].shape == (2, N, 50) and outputs["knn_keys"].shape == (2, N, 16)
    names = [v.name for v in baseline.trainable_variables]
    assert not any("cca" in n or "neighbour_encoder" in n for n in names)
    assert any("cca" in v.name for v in model.trainable_variables)
    # tied embeddings: no output projection besides the token embedding matrix
    assert sum(v.shape == (50, 16) for v in baseline.trainable_variables) == 1


def test_knn_keys_are_the_final_ffw_input():
    model, inputs = _model(), _inputs()
    outputs = model(inputs)
    keys = outputs["knn_keys"].numpy()  # [2, N, 16]: LayerNorm'd, so zero mean and unit variance per token
    np.testing.assert_allclose(keys.mean(-1), 0.0, atol=1e-4)


def test_config_builds_retro_and_its_baseline():
    cfg = config.load_config("configs/tiny.yaml", ["retro.sequence_length=16", "retro.chunk_length=4",
                                                   "retro.continuation_length=4", "retro.decoder_layers=4",
                                                   "retro.decoder_width=16", "retro.decoder_heads=2",
                                                   "retro.decoder_intermediate=32"])
    assert retro_decoder.build_retro_decoder(cfg).retro_layers == (2,)
    assert retro_decoder.build_retro_decoder(cfg, retrieval=False).retro_layers == ()
    with pytest.raises(config.ConfigError, match="multiple of retro.chunk_length"):
        config.load_config("configs/tiny.yaml", ["retro.sequence_length=18", "retro.chunk_length=4"])
    tf.keras.backend.clear_session()
