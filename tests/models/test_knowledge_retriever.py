"""Knowledge retriever: relevance scores vs a numpy reference, in-batch scores, weight sharing."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf.models import knowledge_retriever


@pytest.fixture(scope="module")
def cfg():
    return config.load_config("configs/tiny.yaml").model


def _packed(rng, shape, vocab=1000):
    ids = rng.integers(1000, 1000 + vocab, size=shape).astype(np.int32)
    lengths = rng.integers(3, shape[-1] + 1, size=shape[:-1])
    mask = (np.arange(shape[-1]) < lengths[..., None]).astype(np.int32)
    return {"input_word_ids": tf.constant(ids * mask), "input_mask": tf.constant(mask),
            "input_type_ids": tf.zeros(shape, tf.int32)}


def test_candidate_scores_match_numpy(cfg):
    rng = np.random.default_rng(0)
    model = knowledge_retriever.build_knowledge_retriever(cfg)
    query, cands = _packed(rng, (3, 12)), _packed(rng, (3, 4, 20))
    out = model({**{"query_" + k: v for k, v in query.items()}, **{"candidates_" + k: v for k, v in cands.items()}})
    assert out["retrieval_logits"].shape == (3, 4) and out["candidate_embeddings"].shape == (3, 4, 16)
    # Independent reference: embed every candidate on its own and take inner products in numpy.
    q = model.embed_queries(query).numpy()
    for b in range(3):
        single = {k: v[b] for k, v in cands.items()}  # [4, 20]
        d = model.embed_blocks(single).numpy()
        np.testing.assert_allclose(out["retrieval_logits"].numpy()[b], d @ q[b], rtol=1e-5, atol=1e-4)
    assert not model.shares_embedders
    assert len({id(v) for v in model.query_embedder.weights} & {id(v) for v in model.doc_embedder.weights}) == 0


def test_in_batch_scores_and_shared_towers(cfg):
    rng = np.random.default_rng(1)
    shared = knowledge_retriever.build_knowledge_retriever(
        config.apply_override(config.ExperimentConfig(model=cfg), "model.share_embedders=true").model)
    assert shared.shares_embedders
    query, blocks = _packed(rng, (5, 10)), _packed(rng, (5, 24))
    out = shared.in_batch_scores(query, blocks)
    q, d = shared.embed_queries(query).numpy(), shared.embed_blocks(blocks).numpy()
    np.testing.assert_allclose(out["retrieval_logits"].numpy(), q @ d.T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(q, d[:0].reshape(0, 16).sum() + q)  # same function for both towers
    same = shared.embed_queries(blocks).numpy()
    np.testing.assert_allclose(same, d, atol=1e-6)


def test_separate_towers_start_from_the_same_projection(cfg):
    rng = np.random.default_rng(2)
    minilm = config.load_config("configs/minilm.yaml").model
    model = knowledge_retriever.build_knowledge_retriever(minilm)
    assert not model.shares_embedders
    np.testing.assert_array_equal(model.query_embedder.projection.kernel.numpy(),
                                  model.doc_embedder.projection.kernel.numpy())
    # Same pre-trained BERT in both towers + same projection: identical embeddings at initialisation.
    packed = _packed(rng, (3, 12))
    np.testing.assert_allclose(model.embed_queries(packed).numpy(), model.embed_blocks(packed).numpy(), atol=1e-5)


def test_temperature_divides_every_score_and_survives_get_config(cfg):
    rng = np.random.default_rng(3)
    warm = config.apply_override(config.ExperimentConfig(model=cfg), "model.retrieval_temperature=4.0").model
    model = knowledge_retriever.build_knowledge_retriever(warm)
    query, cands = _packed(rng, (2, 12)), _packed(rng, (2, 3, 20))
    out = model({**{"query_" + k: v for k, v in query.items()}, **{"candidates_" + k: v for k, v in cands.items()}})
    q = model.embed_queries(query).numpy()
    for b in range(2):
        d = model.embed_blocks({k: v[b] for k, v in cands.items()}).numpy()
        np.testing.assert_allclose(out["retrieval_logits"].numpy()[b], d @ q[b] / 4.0, rtol=1e-5, atol=1e-5)
    blocks = {k: v[:, 0] for k, v in cands.items()}
    in_batch = model.in_batch_scores(query, blocks)["retrieval_logits"].numpy()
    np.testing.assert_allclose(in_batch, q @ model.embed_blocks(blocks).numpy().T / 4.0, rtol=1e-5, atol=1e-5)
    assert knowledge_retriever.KnowledgeRetriever.from_config(model.get_config()).temperature == 4.0
    with pytest.raises(ValueError, match="temperature"):
        knowledge_retriever.KnowledgeRetriever(model.query_embedder, model.doc_embedder, temperature=0.0)
