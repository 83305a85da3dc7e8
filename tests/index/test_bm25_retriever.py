"""BM25 baseline: scores and ranking vs a brute-force numpy Okapi BM25 (Lucene idf, k1 = 1.5, b = 0.75)."""
import collections
import math
import re

import numpy as np
import pytest

from realm_tf.index import bm25_retriever

TITLES = ["Zebra", "Falcon", "Harbour", "Volcano", "Orchard", "Glacier"]
TEXTS = ["zebra stripes savanna herd grazing zebra", "falcon hunting speed dive falcon falcon prey",
         "harbour ships cargo cranes harbour", "volcano lava eruption ash magma crater",
         "orchard apples pears harvest ladder", "glacier ice valley erosion moraine ice ice"]


def reference_scores(query: str, docs: list[str], k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    tokenized = [re.findall(r"\w\w+", d.lower()) for d in docs]
    avgdl = np.mean([len(t) for t in tokenized])
    df = collections.Counter(w for t in tokenized for w in set(t))
    scores = np.zeros(len(docs))
    for word in set(re.findall(r"\w\w+", query.lower())):
        idf = math.log(1 + (len(docs) - df[word] + 0.5) / (df[word] + 0.5))
        for i, t in enumerate(tokenized):
            tf = t.count(word)
            scores[i] += idf * tf / (tf + k1 * (1 - b + b * len(t) / avgdl))
    return scores


@pytest.mark.parametrize("query", ["ice valley", "falcon prey speed", "cargo ships zebra", "magma"])
def test_scores_and_order_match_brute_force_bm25(query):
    retriever = bm25_retriever.Bm25Retriever(TITLES, TEXTS)
    rows, scores = retriever.search([query], k=6)
    expected = reference_scores(query, [f"{t} {x}" for t, x in zip(TITLES, TEXTS)])
    np.testing.assert_allclose(scores[0], expected[rows[0]], rtol=1e-5, atol=1e-6)
    assert np.all(np.diff(scores[0]) <= 1e-7)  # best first
    assert rows[0, 0] == int(np.argmax(expected))


def test_k_is_capped_and_unknown_words_score_zero():
    retriever = bm25_retriever.Bm25Retriever(TITLES, TEXTS)
    rows, scores = retriever.search(["qqq unknown", "harbour"], k=50)
    assert rows.shape == (2, len(TEXTS)) and sorted(rows[0]) == list(range(len(TEXTS)))
    assert np.all(scores[0] == 0) and rows[1, 0] == 2


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="2 titles but 1 texts"):
        bm25_retriever.Bm25Retriever(["a", "b"], ["x"])
