"""KnowledgeCorpus: exact MIPS vs numpy, and answers cut from the original title / body text by byte offsets,
including body spans far past the end of all titles (the last block's)."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf.data import block_store
from realm_tf.data import knowledge_corpus
from realm_tf.layers import bert_tokenizer

TITLES = ["Alpha", "Beta Gamma", "Delta"]
TEXTS = ["The river flows North into the sea.", "Many cities line the long coast of the island.",
         "A very long body: " + " ".join(f"word{i}" for i in range(60)) + " and finally The End."]


@pytest.fixture(scope="module")
def corpus():
    tokenizer = bert_tokenizer.BertTokenizer(config.load_config("configs/tiny.yaml").model.vocab_file)
    titles = tokenizer(tf.constant(TITLES)).to_list()
    bodies = tokenizer(tf.constant(TEXTS)).to_list()
    blocks = block_store.BlockStore(titles, bodies, ["a", "b", "c"], TITLES, TEXTS)
    embeddings = np.random.default_rng(0).normal(size=[3, 4]).astype(np.float32)
    return knowledge_corpus.KnowledgeCorpus(embeddings, blocks, tokenizer), tokenizer, embeddings, bodies


def test_search_is_exact_mips(corpus):
    kc, _, embeddings, _ = corpus
    queries = np.random.default_rng(1).normal(size=[5, 4]).astype(np.float32)
    scores, ids = kc.search(tf.constant(queries), 2)
    expected = np.argsort(-(queries @ embeddings.T), axis=1)[:, :2]
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ embeddings.T, expected, 1), rtol=1e-5)


def test_span_text_cuts_title_and_body_spans_from_the_original_text(corpus):
    kc, tokenizer, _, bodies = corpus
    last_body = bodies[2]
    end_pieces = tokenizer(tf.constant(["The End"])).to_list()[0]
    first = next(i for i in range(len(last_body)) if last_body[i:i + len(end_pieces)] == end_pieces)
    assert first > sum(len(t) for t in tokenizer(tf.constant(TITLES)).to_list())  # past every title wordpiece
    north = tokenizer(tf.constant(["north"])).to_list()[0]
    north_at = bodies[0].index(north[0])
    text = kc.span_text(tf.constant([2, 1, 0]), tf.constant([False, True, False]),
                        tf.constant([first, 0, north_at]), tf.constant([first + len(end_pieces) - 1, 1,
                                                                         north_at + len(north) - 1]))
    assert [t.decode() for t in text.numpy()] == ["The End", "Beta Gamma", "North"]
