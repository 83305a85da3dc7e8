"""BruteForceIndex is exact: it must agree with a numpy argsort over all inner products."""
import numpy as np
import pytest

from realm_tf.index import brute_force_index


def _numpy_top_k(embeddings, queries, k):
    scores = queries.astype(np.float64) @ embeddings.astype(np.float64).T  # [B, N]
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # ties: lower row first
    return order, np.take_along_axis(scores, order, axis=1)


@pytest.mark.parametrize("chunk_size", [7, 64, 1000])  # several chunks, uneven last chunk, one chunk
def test_matches_numpy_reference(chunk_size):
    rng = np.random.default_rng(1)
    embeddings = rng.normal(size=(500, 16)).astype(np.float32)
    queries = rng.normal(size=(33, 16)).astype(np.float32)
    index = brute_force_index.BruteForceIndex(chunk_size=chunk_size)
    index.build(embeddings)
    rows, scores = index.search_batched(queries, 10)
    ref_rows, ref_scores = _numpy_top_k(embeddings, queries, 10)
    assert rows.dtype == np.int64 and scores.dtype == np.float32
    assert rows.shape == scores.shape == (33, 10)
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
    assert index.num_blocks == 500 and index.dim == 16


def test_ties_break_towards_lower_row_across_chunks():
    # Integer vectors make scores exact; many rows share a score, spread over several chunks.
    rng = np.random.default_rng(2)
    embeddings = rng.integers(-2, 3, size=(300, 4)).astype(np.float32)
    queries = rng.integers(-2, 3, size=(20, 4)).astype(np.float32)
    index = brute_force_index.BruteForceIndex(chunk_size=37)
    index.build(embeddings)
    rows, scores = index.search_batched(queries, 25)
    ref_rows, ref_scores = _numpy_top_k(embeddings, queries, 25)
    assert len(np.unique(ref_scores)) < ref_scores.size  # the test really has ties
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_array_equal(scores, ref_scores.astype(np.float32))


def test_k_equal_to_corpus_returns_every_row_and_k_above_is_an_error():
    rng = np.random.default_rng(3)
    embeddings = rng.normal(size=(12, 8)).astype(np.float32)
    index = brute_force_index.BruteForceIndex(chunk_size=5)
    index.build(embeddings)
    rows, _ = index.search_batched(rng.normal(size=(3, 8)), 12)
    assert all(sorted(r) == list(range(12)) for r in rows)
    with pytest.raises(ValueError, match="k=13 exceeds"):
        index.search_batched(rng.normal(size=(3, 8)), 13)
    with pytest.raises(ValueError, match="k must be"):
        index.search_batched(rng.normal(size=(3, 8)), 0)
    with pytest.raises(ValueError, match=r"\[num_queries, 8\]"):
        index.search_batched(rng.normal(size=(3, 9)), 2)


def test_empty_query_batch_and_bad_embeddings():
    index = brute_force_index.BruteForceIndex()
    with pytest.raises(RuntimeError, match="build"):
        index.search_batched(np.zeros([1, 4], np.float32), 1)
    with pytest.raises(ValueError, match="NaN"):
        index.build(np.array([[np.nan, 1.0]], np.float32))
    index.build(np.eye(4, dtype=np.float32))
    rows, scores = index.search_batched(np.zeros([0, 4], np.float32), 2)
    assert rows.shape == scores.shape == (0, 2)


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    embeddings = rng.normal(size=(200, 8)).astype(np.float32)
    queries = rng.normal(size=(10, 8)).astype(np.float32)
    index = brute_force_index.BruteForceIndex(chunk_size=50)
    index.build(embeddings)
    index.save(str(tmp_path / "bf"))
    loaded = brute_force_index.BruteForceIndex.load(str(tmp_path / "bf"))
    assert loaded.chunk_size == 50 and (loaded.num_blocks, loaded.dim) == (200, 8)
    np.testing.assert_array_equal(loaded.embeddings, embeddings)
    for a, b in zip(index.search_batched(queries, 5), loaded.search_batched(queries, 5)):
        np.testing.assert_array_equal(a, b)
