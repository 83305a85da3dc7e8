"""Projection initialisation (issue #16): principal directions vs numpy's SVD, and an initialised retriever that
computes LayerNorm(Wᵀh) exactly as numpy does and, on the MiniLM import, keeps its 384-d ranking better than a
random projection."""
import json

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf.core import warm_start
from realm_tf.data import block_store
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_retriever
from realm_tf.tasks import projection_init

MINILM = "configs/minilm.yaml"


def test_principal_projection_spans_the_top_singular_vectors():
    rng = np.random.default_rng(0)
    x = rng.normal(size=[500, 12]) @ np.diag(np.linspace(3, 0.1, 12)) @ np.linalg.qr(rng.normal(size=[12, 12]))[0]
    x += 2.0  # a common offset: centring matters
    for centered in (False, True):
        kernel, bias, kept = projection_init.principal_projection(x, 4, centered)
        ref = x - x.mean(0) if centered else x
        _, s, vt = np.linalg.svd(ref, full_matrices=False)
        np.testing.assert_allclose(kernel @ kernel.T, vt[:4].T @ vt[:4], atol=1e-4)  # the same subspace
        np.testing.assert_allclose(kernel.T @ kernel, np.eye(4), atol=1e-5)
        # The all-ones direction of z = Wᵀh (what LayerNorm drops) is the 4th principal direction.
        np.testing.assert_allclose(np.abs(kernel @ np.ones(4) / 2.0), np.abs(vt[3]), atol=1e-4)
        assert kept == pytest.approx((s[:4] ** 2).sum() / (s ** 2).sum(), rel=1e-5)
        np.testing.assert_allclose(bias, -(x.mean(0) if centered else np.zeros(12)) @ kernel, atol=1e-4)
    with pytest.raises(Exception, match="exceeds the pooled width"):
        projection_init.principal_projection(x, 13, False)


def _layer_norm(x):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)


def test_initialised_retriever_keeps_the_full_width_ranking(pretraining_workspace, tmp_path):
    # The real MiniLM import (a random tiny BERT embeds every text alike: no ranking to keep), 384 -> 24.
    overrides = [f"data.blocks_dir={pretraining_workspace}/blocks", "model.projection_size=24"]
    cfg = config.load_config(MINILM, overrides + ["model.projection_init=pca"])
    projection_init.init_retriever(cfg, str(tmp_path / "init"), num_blocks=1000)
    assert json.loads((tmp_path / "init" / "projection.json").read_text())["kind"] == "pca"
    fitted = knowledge_retriever.build_knowledge_retriever(cfg.model)
    warm_start.restore_from_run(str(tmp_path / "init"), retriever=fitted)
    # REALM's random projection (the initialiser a fresh retriever gets) on the same BERTs, for comparison: its
    # embeddings are LayerNorm(h W), computed below in numpy once the fitted tower is shown to compute exactly that.
    projection = fitted.doc_embedder.projection
    matrix = projection.kernel_initializer(projection.kernel.shape).numpy()  # [384, 24]

    blocks = block_store.BlockStore.load(f"{pretraining_workspace}/blocks/blocks-*.tfrecord*")
    tokenizer = bert_tokenizer.BertTokenizer(cfg.model.vocab_file)
    ids = np.arange(len(blocks))
    pooled = projection_init.pooled_block_outputs(fitted, blocks, tokenizer, ids, cfg.model.block_seq_length)
    # The fit used every block (1000 > corpus): its kernel is numpy's on the same pooled outputs.
    kernel, bias, _ = projection_init.principal_projection(pooled, 24, centered=False)
    np.testing.assert_allclose(fitted.doc_embedder.projection.kernel.numpy(), kernel, atol=1e-4)
    np.testing.assert_allclose(fitted.query_embedder.projection.kernel.numpy(), kernel, atol=1e-4)
    packed = tokenizer.join_bert(tf.ragged.constant([blocks.title_ids(b).tolist() for b in ids], tf.int32),
                                 tf.ragged.constant([blocks.body_ids(b).tolist() for b in ids], tf.int32),
                                 cfg.model.block_seq_length, pad_to_seq_length=False)
    embedded = _layer_norm(pooled @ kernel + bias)  # [num_blocks, 24]: what the fitted doc tower computes
    np.testing.assert_allclose(fitted.embed_blocks({k: v[:8] for k, v in packed.items()}).numpy(), embedded[:8],
                               atol=1e-3)

    # Queries: the first half of each block's text as a pseudo-question, searched over all blocks.
    queries = [" ".join(t.split()[: max(len(t.split()) // 2, 1)]) for t in blocks.texts]
    packed_q = tokenizer.pack_single(tokenizer(tf.constant(queries)), cfg.model.query_seq_length, False)
    full_q = fitted.query_embedder.pool(packed_q).numpy()  # [num, hidden]: the unprojected reference
    cosine = lambda a, b: (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1,
                                                                                              keepdims=True)).T
    reference = np.argsort(-cosine(full_q, pooled), axis=1)[:, :5]  # [num, 5]

    def overlap(queries, docs):  # [num, 24] each
        top = np.argsort(-(queries @ docs.T), axis=1)[:, :5]  # f(x, z) ∝ the inner product
        return np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top, reference)])

    fitted_q = _layer_norm(full_q @ kernel + bias)  # [num, 24]: what the fitted query tower computes
    np.testing.assert_allclose(fitted.embed_queries({k: v[:8] for k, v in packed_q.items()}).numpy(), fitted_q[:8],
                               atol=1e-3)
    kept = overlap(fitted_q, embedded)
    lost = overlap(_layer_norm(full_q @ matrix), _layer_norm(pooled @ matrix))
    print(f"top-5 overlap with the full-width cosine ranking: principal {kept:.3f}, random {lost:.3f}")
    assert kept > lost + 0.05, (kept, lost)
