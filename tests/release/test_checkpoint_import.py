"""TF1 REALM / ORQA checkpoints, written with tf.compat.v1 under the original names, imported into our Keras networks:
the imported embedder, span reader and MLM head compute what the original graphs compute (numpy references, and
ORQA's own span-scoring layers run in a TF1 graph) to 1e-5; a renamed, missing, extra or mis-shaped variable fails
with its name; nothing is skipped silently."""
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf.models import knowledge_augmented_encoder
from realm_tf.models import span_reader
from realm_tf.networks import bert_encoder
from realm_tf.networks import embedder as embedder_lib
from realm_tf.release import checkpoint_import as ckpt_import

sys.path.insert(0, os.path.dirname(__file__))
import original_realm_release as release  # noqa: E402  (next to this file; tests are not a package)

D = release.DIMS
ENCODER = config.EncoderConfig(vocab_size=D["vocab"], hidden_size=D["hidden"], num_layers=D["layers"],
                               num_attention_heads=D["heads"], intermediate_size=D["intermediate"],
                               hidden_act="gelu_new", max_position_embeddings=D["positions"], dropout_rate=0.0,
                               attention_dropout_rate=0.0)
REALM_EMBEDDER = "module/module/"  # gs://realm-data/cc_news_pretrained/embedder: projection here, BERT one deeper


def _inputs(batch: int = 3, length: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    """Packed BERT inputs with padding: row i has ``length - 3 * i`` real positions, two segments."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, D["vocab"], size=[batch, length]).astype(np.int32)
    mask = np.zeros([batch, length], np.int32)
    types = np.zeros([batch, length], np.int32)
    for i in range(batch):
        n = length - 3 * i
        mask[i, :n] = 1
        types[i, n // 2:n] = 1
        ids[i, n:] = 0
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}


def _embedder(layer_norm_epsilon: float = 1e-12) -> embedder_lib.Embedder:
    model = embedder_lib.Embedder(bert_encoder.build_bert_encoder(ENCODER), projection_size=16, pooling="pooled",
                                  layer_norm_epsilon=layer_norm_epsilon)
    model({k: tf.constant(v) for k, v in _inputs(1, 2).items()})
    return model


def _reader() -> span_reader.SpanReader:
    cfg = config.ModelConfig(encoder=ENCODER, span_hidden_size=8, max_span_width=3, span_layer_norm=True,
                             reader_length_buckets=1)
    return span_reader.build_span_reader(cfg, restore=False)


@pytest.fixture(scope="module")
def realm_embedder(tmp_path_factory):
    """REALM's pre-trained embedder module: BERT at module/module/module/bert, projection at module/module/."""
    root = tmp_path_factory.mktemp("embedder")
    variables = release.embedder_variables(np.random.default_rng(0), REALM_EMBEDDER)
    return release.write_hub_module(str(root / "embedder"), variables), variables


@pytest.fixture(scope="module")
def orqa_model(tmp_path_factory):
    """A fine-tuned ORQA model (orqa_nq_model_from_realm): the retriever module at the top (module/module/module/...),
    the reader in variable_scope("reader") with its span scorer created by ORQA's own TF1 layer calls, saved during
    training (Adam slots, global_step) in export/best_default/checkpoint/."""
    root = tmp_path_factory.mktemp("orqa")
    rng = np.random.default_rng(1)
    variables = {**release.embedder_variables(rng, "module/" + REALM_EMBEDDER),
                 **release.bert_variables(rng, "reader/module/"), **release.mlm_variables(rng, "reader/module/")}
    inputs = _inputs(2, 14, seed=3)
    inputs["input_type_ids"][:, 3:] = inputs["input_mask"][:, 3:]  # [CLS] q q [SEP] | block ... [SEP] [PAD]...
    sequence, _ = release.bert(variables, "reader/module/", *(inputs[k] for k in bert_encoder.INPUT_KEYS))
    starts, ends = np.array([3, 3, 4, 6, 8, 5], np.int32), np.array([3, 5, 6, 6, 9, 7], np.int32)  # in both blocks
    written = release.write_checkpoint(
        str(root / "model" / "export" / "best_default" / "checkpoint" / "model.ckpt-300"), variables,
        training_state=True, build=release.orqa_span_scorer_graph(span_hidden=8),
        feed=lambda: {"reader_token_emb": sequence.astype(np.float32), "reader_starts": starts, "reader_ends": ends})
    return str(root / "model"), written, inputs, sequence, (starts, ends)


def test_realm_embedder_matches_the_original_graph(realm_embedder):
    path, variables = realm_embedder
    imp = ckpt_import.Tf1CheckpointImport(path)
    assert imp.path == os.path.join(path, "variables", "variables")  # a TF-Hub module's weights
    scope, layer_norm = ckpt_import.embedder_scope(imp)
    assert (scope, layer_norm) == (REALM_EMBEDDER, "LayerNorm")
    assert ckpt_import.encoder_config(imp, scope + "module/", D["heads"]) == config.EncoderConfig(
        vocab_size=D["vocab"], hidden_size=D["hidden"], num_layers=D["layers"], num_attention_heads=D["heads"],
        intermediate_size=D["intermediate"], hidden_act="gelu_new", max_position_embeddings=D["positions"])
    model = _embedder(ckpt_import.LAYER_NORM_EPSILON[layer_norm])
    ckpt_import.add_embedder(imp, model, scope, layer_norm)
    report = imp.apply([model])
    inputs = _inputs()
    got = model({k: tf.constant(v) for k, v in inputs.items()}).numpy()  # [3, 16]
    want = release.embed(variables, scope, "LayerNorm", 1e-12, *(inputs[k] for k in bert_encoder.INPUT_KEYS))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert np.abs(want[0] - want[1]).max() > 0.1  # the rows differ: padding and ids matter
    # Every variable was consumed or is declared unused with its reason: the BERT module's MLM head.
    assert set(report["ignored"]) == {n for n in variables if n.startswith(scope + "module/cls/predictions/")}
    assert all("pre-training heads" in reason for reason in report["ignored"].values())
    assert len({s for sources in report["assigned"].values() for s in sources}) + len(report["ignored"]) == len(
        variables)


def test_orqa_ict_layout_keras_layer_norm(tmp_path):
    """ORQA's open-source ict_model.module_fn: BERT module at module/bert, dense, and Keras' layer_normalization
    (ε = 1e-3, which the import must keep)."""
    variables = release.embedder_variables(np.random.default_rng(2), "", layer_norm="layer_normalization")
    variables = {k: v for k, v in variables.items() if "cls/predictions" not in k}
    path = release.write_hub_module(str(tmp_path / "ict"), variables)
    imp = ckpt_import.Tf1CheckpointImport(path)
    scope, layer_norm = ckpt_import.embedder_scope(imp)
    assert (scope, layer_norm, ckpt_import.LAYER_NORM_EPSILON[layer_norm]) == ("", "layer_normalization", 1e-3)
    model = _embedder(1e-3)
    ckpt_import.add_embedder(imp, model, scope, layer_norm)
    assert imp.apply([model])["ignored"] == {}
    inputs = _inputs(seed=5)
    got = model({k: tf.constant(v) for k, v in inputs.items()}).numpy()
    want = release.embed(variables, "", "layer_normalization", 1e-3, *(inputs[k] for k in bert_encoder.INPUT_KEYS))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    wrong_eps = release.embed(variables, "", "layer_normalization", 1e-12,
                              *(inputs[k] for k in bert_encoder.INPUT_KEYS))
    assert np.abs(wrong_eps - want).max() > 1e-4  # the test can tell the two epsilons apart


def test_orqa_reader_span_scores_match_the_original_graph(orqa_model):
    path, written, inputs, sequence, (starts, ends) = orqa_model
    imp = ckpt_import.Tf1CheckpointImport(path)
    assert imp.path.endswith(os.path.join("export", "best_default", "checkpoint", "model.ckpt-300"))
    assert written["outputs"]["layer_norm_epsilon"] == pytest.approx(1e-3)  # Keras' default, as in ORQA
    assert {"reader/dense/kernel", "reader/dense_1/kernel", "reader/layer_normalization/gamma"} <= set(imp.shapes)
    reader = _reader()
    ckpt_import.add_bert(imp, reader.encoder, ckpt_import.bert_scope(imp, r"reader/(?:module/)+"))
    ckpt_import.add_orqa_span_scorer(imp, reader.span_hidden, reader.span_layer_norm, reader.span_logit)
    imp.ignore("^reader/module/cls/", "the reader's BERT module's pre-training heads")
    imp.ignore("^module/", "the retriever (imported into another network)")
    report = imp.apply([reader])
    values = written["values"]
    # BERT outputs first: our reader's encoder against the numpy BERT.
    got_sequence = reader.encoder({k: tf.constant(v) for k, v in inputs.items()})["sequence_output"].numpy()
    for row, n in enumerate(inputs["input_mask"].sum(1)):
        np.testing.assert_allclose(got_sequence[row, :n], sequence[row, :n], atol=1e-5, rtol=0)
    # Span scores: ours (every valid span) against numpy's and ORQA's TF1 graph's for the same (start, end).
    out = reader({k: tf.constant(v[:, None, :]) for k, v in inputs.items()})  # [batch 2, 1 block, 14]
    width = 3
    index = starts * width + (ends - starts)  # our span enumeration: start * max_span_width + width - 1
    ours = out["span_logits"].numpy()[:, 0, index]  # [2, 6]
    assert out["span_mask"].numpy()[:, 0, index].all()
    want = release.orqa_span_logits(values, sequence, starts, ends)
    # The encoder's rounding (within 1e-5 above) goes through the span MLP: relative tolerance as well.
    np.testing.assert_allclose(ours, want, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(written["outputs"]["reader_logits"], want, atol=1e-5, rtol=0)
    assert np.abs(want - want.mean()).max() > 0.1
    # The optimizer's state and the global step are left, each with its reason; nothing else.
    ignored = report["ignored"]
    assert "global_step" in ignored and "reader/dense/kernel/adam_m" in ignored
    assert not [n for n in imp.names if n not in ignored and not any(n in s for s in report["assigned"].values())]


def test_knowledge_augmented_encoder_matches_bert_mlm(tmp_path):
    """REALM's cc_news_pretrained/bert: BERT and its MLM head (tanh GELU in the transform, tied output embedding)."""
    rng = np.random.default_rng(4)
    variables = {**release.bert_variables(rng, ""), **release.mlm_variables(rng, "")}
    path = release.write_hub_module(str(tmp_path / "bert"), variables)
    imp = ckpt_import.Tf1CheckpointImport(path)
    scope = ckpt_import.bert_scope(imp)
    model = knowledge_augmented_encoder.build_knowledge_augmented_encoder(
        config.ModelConfig(encoder=ckpt_import.encoder_config(imp, scope, D["heads"])), restore=False)
    ckpt_import.add_bert(imp, model.encoder, scope)
    ckpt_import.add_masked_lm(imp, model.masked_lm, scope)
    assert imp.apply([model])["ignored"] == {}
    inputs = _inputs(seed=6)
    positions = np.array([[1, 4], [2, 3], [0, 5]], np.int32)
    got = model({**{k: tf.constant(v) for k, v in inputs.items()}, "masked_positions": tf.constant(positions)})
    sequence, _ = release.bert(variables, "", *(inputs[k] for k in bert_encoder.INPUT_KEYS))
    want = release.mlm_logits(variables, "", sequence, positions)
    np.testing.assert_allclose(got["mlm_logits"].numpy(), want, atol=1e-5, rtol=0)


def _broken_copy(tmp_path, variables: dict, mutate) -> str:
    variables = dict(variables)
    mutate(variables)
    return release.write_hub_module(str(tmp_path / "broken"), variables)


def _import_embedder(path: str) -> None:
    imp = ckpt_import.Tf1CheckpointImport(path)
    model = _embedder()
    ckpt_import.add_embedder(imp, model, REALM_EMBEDDER, "LayerNorm")
    imp.apply([model])


def test_a_renamed_variable_fails_with_both_names(realm_embedder, tmp_path):
    _, variables = realm_embedder
    name = "module/module/module/bert/encoder/layer_1/attention/self/key/kernel"
    path = _broken_copy(tmp_path, variables, lambda v: v.update({name + "_renamed": v.pop(name)}))
    with pytest.raises(ckpt_import.WeightImportError) as e:
        _import_embedder(path)
    message = str(e.value)
    assert f"missing checkpoint variable '{name}' [32, 32]" in message
    assert f"checkpoint variable '{name}_renamed' [32, 32] is not consumed" in message
    assert message.startswith(os.path.join(path, "variables", "variables"))


def test_a_missing_variable_fails_with_its_name(realm_embedder, tmp_path):
    _, variables = realm_embedder
    path = _broken_copy(tmp_path, variables, lambda v: v.pop("module/module/LayerNorm/gamma"))
    with pytest.raises(ckpt_import.WeightImportError, match=r"missing checkpoint variable 'module/module/LayerNorm/"
                                                            r"gamma' \[16\] \(for \S*/layer_norm/gamma"):
        _import_embedder(path)


def test_an_unexpected_or_misshaped_variable_fails(realm_embedder, tmp_path):
    _, variables = realm_embedder
    extra = {"module/module/extra_head/kernel": np.ones([2, 2], np.float32)}
    path = _broken_copy(tmp_path, variables, lambda v: v.update(extra))
    with pytest.raises(ckpt_import.WeightImportError,
                       match=r"checkpoint variable 'module/module/extra_head/kernel' \[2, 2\] is not consumed"):
        _import_embedder(path)
    path = _broken_copy(tmp_path / "b", variables, lambda v: v.update(
        {"module/module/dense/bias": np.ones([15], np.float32)}))
    with pytest.raises(ckpt_import.WeightImportError,
                       match=r"'module/module/dense/bias' has shape \[15\], expected \[16\]"):
        _import_embedder(path)


def test_a_model_variable_without_source_is_named(realm_embedder):
    path, _ = realm_embedder
    imp = ckpt_import.Tf1CheckpointImport(path)
    model = _embedder()
    ckpt_import.add_bert(imp, model.encoder, REALM_EMBEDDER + "module/")  # the projection is never declared
    before = model.encoder.weights[0].numpy()
    with pytest.raises(ckpt_import.WeightImportError) as e:
        imp.apply([model])
    assert re.search(r"model variable \S*/projection/kernel:0 has no source", str(e.value))
    assert "checkpoint variable 'module/module/dense/kernel' [32, 16] is not consumed" in str(e.value)
    np.testing.assert_array_equal(model.encoder.weights[0].numpy(), before)  # nothing was assigned


def test_checkpoint_locations(tmp_path, realm_embedder):
    path, _ = realm_embedder
    assert ckpt_import.checkpoint_prefix(path + "/") == os.path.join(path, "variables", "variables")
    runs = tmp_path / "orqa" / "export" / "best_default" / "checkpoint"
    for step in (9, 120):
        release.write_checkpoint(str(runs / f"model.ckpt-{step}"), {"w": np.zeros([1], np.float32)})
    assert ckpt_import.checkpoint_prefix(str(tmp_path / "orqa")) == str(runs / "model.ckpt-120")
    with pytest.raises(ckpt_import.WeightImportError, match="no TF checkpoint"):
        ckpt_import.checkpoint_prefix(str(tmp_path / "nothing"))
