"""Retriever SavedModel: same embeddings in a fresh process without realm_tf, atomic versioned exports."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf.export import retriever_export
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_retriever

QUERIES = ["who wrote the lyrics of he ain't heavy he's my brother", "when did the 1973 oil crisis begin", "x"]
TITLES = ["1973 oil crisis", "Wild card (sports)", "Syndactyly"]
TEXTS = ["The 1973 oil crisis began in October 1973 when the members of OAPEC proclaimed an oil embargo.",
         "A wild card is a team that qualifies for the playoffs without winning its division. " * 12,
         "webbed toes"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    cfg = config.load_config("configs/tiny.yaml", [f"refresh.export_dir={tmp}", "refresh.keep_exports=1"])
    model = knowledge_retriever.build_knowledge_retriever(cfg.model)
    tok = bert_tokenizer.BertTokenizer(cfg.model.vocab_file)
    path = retriever_export.export_retriever(model, cfg, step=7, tokenizer=tok)
    return cfg, model, tok, path


def _keras_embeddings(cfg, model, tok):
    q = model.embed_queries(tok.pack_single(tok(tf.constant(QUERIES)), cfg.model.query_seq_length)).numpy()
    d = model.embed_blocks(tok.join_bert(tok(tf.constant(TITLES)), tok(tf.constant(TEXTS)),
                                         cfg.model.block_seq_length)).numpy()
    return q, d


def test_fresh_process_without_realm_tf_gives_same_embeddings(exported, tmp_path):
    cfg, model, tok, path = exported
    # Already-packed ids (REALM's masked queries), padded further than needed: same embeddings as the text.
    PACKED = {k: v.numpy().tolist() for k, v in tok.pack_single(tok(tf.constant(QUERIES)), 40).items()}
    script = f"""
import json, sys
import numpy as np, tensorflow as tf, tensorflow_text  # noqa: F401  (registers the tokenizer ops)
assert not any(m.startswith("realm_tf") for m in sys.modules)
m = tf.saved_model.load({path!r})
q = m.signatures["embed_query"](text=tf.constant({QUERIES!r}))["embedding"].numpy()
d = m.signatures["embed_block"](title=tf.constant({TITLES!r}), text=tf.constant({TEXTS!r}))["embedding"].numpy()
packed = {{k: tf.constant(v) for k, v in {PACKED!r}.items()}}
qi = m.signatures["embed_query_ids"](**packed)["embedding"].numpy()
assert not any(m.startswith("realm_tf") for m in sys.modules)
np.save({str(tmp_path / 'q.npy')!r}, q); np.save({str(tmp_path / 'd.npy')!r}, d)
np.save({str(tmp_path / 'qi.npy')!r}, qi)
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    q, d = _keras_embeddings(cfg, model, tok)
    assert np.abs(np.load(tmp_path / "q.npy") - q).max() <= 1e-5
    assert np.abs(np.load(tmp_path / "d.npy") - d).max() <= 1e-5
    assert np.abs(np.load(tmp_path / "qi.npy") - q).max() <= 1e-5


def test_export_metadata_and_listing(exported):
    cfg, _, tok, path = exported
    assert os.path.basename(path) == "7"
    meta = retriever_export.read_export_metadata(path)
    assert meta["step"] == 7 and meta["embedding_dim"] == cfg.model.projection_size
    assert meta["vocab_hash"] == tok.vocab_hash and meta["config_hash"] == config.config_hash(cfg)
    export_dir = os.path.dirname(path)
    os.makedirs(os.path.join(export_dir, ".staging-9-abc"))  # a crashed export: not listed
    os.makedirs(os.path.join(export_dir, "8"))  # no export.json: not complete, not listed
    assert retriever_export.list_exports(export_dir) == [7]
    with pytest.raises(FileNotFoundError, match="not a complete retriever export"):
        retriever_export.read_export_metadata(os.path.join(export_dir, "8"))


def test_keeps_newest_exports(exported):
    cfg, model, tok, path = exported
    retriever_export.export_retriever(model, cfg, step=10, tokenizer=tok)
    assert retriever_export.list_exports(os.path.dirname(path)) == [10]  # keep_exports=1
    assert not any(n.startswith(".staging") and n != ".staging-9-abc" for n in os.listdir(os.path.dirname(path)))


def test_a_later_export_of_the_same_towers_carries_their_new_weights(tmp_path):
    """The export module (and its traced signatures) is reused for every export of one retriever: each save must
    still write the weights the towers hold at that moment."""
    cfg = config.load_config("configs/tiny.yaml", [f"refresh.export_dir={tmp_path}", "refresh.keep_exports=2"])
    model = knowledge_retriever.build_knowledge_retriever(cfg.model)
    tok = bert_tokenizer.BertTokenizer(cfg.model.vocab_file)
    first = retriever_export.export_retriever(model, cfg, step=1, tokenizer=tok)
    before = _keras_embeddings(cfg, model, tok)
    rng = np.random.default_rng(0)
    model.set_weights([w + rng.normal(0.0, 0.05, w.shape).astype(w.dtype) for w in model.get_weights()])
    second = retriever_export.export_retriever(model, cfg, step=2, tokenizer=tok)
    after = _keras_embeddings(cfg, model, tok)
    assert np.abs(before[0] - after[0]).max() > 1e-2  # the towers did change
    for path, (q, d) in ((first, before), (second, after)):
        loaded = tf.saved_model.load(path)
        got_q = loaded.signatures["embed_query"](text=tf.constant(QUERIES))["embedding"].numpy()
        got_d = loaded.signatures["embed_block"](title=tf.constant(TITLES), text=tf.constant(TEXTS))["embedding"]
        assert np.abs(got_q - q).max() <= 1e-5 and np.abs(got_d.numpy() - d).max() <= 1e-5, path
