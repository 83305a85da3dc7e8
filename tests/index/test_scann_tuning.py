"""index.target_recall: search settings measured at build time, exact neighbours against numpy, the choice
recorded, kept through save/load and used by the pybind and TF-op searchers alike."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf.index import in_graph_scann
from realm_tf.index import scann_index
from realm_tf.index import scann_tuning


def _clustered(num, centers, rng, noise=0.5):
    return (centers[rng.integers(0, len(centers), num)] + noise * rng.normal(size=(num, centers.shape[1]))
            ).astype(np.float32)


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(1)
    centers = rng.normal(size=(100, 64))
    return _clustered(20_000, centers, rng), _clustered(300, centers, rng)  # [20000, 64], [300, 64]


@pytest.fixture(scope="module")
def tuned(corpus):
    embeddings, _ = corpus
    index = scann_index.ScannIndex(config.IndexConfig(num_neighbors=10, num_leaves=141, target_recall=0.97,
                                                      tuning_queries=300))
    index.build(embeddings)
    return index


def _exact(embeddings, queries, k):
    return np.argsort(-(queries @ embeddings.T), axis=1, kind="stable")[:, :k]


def _recall(rows, exact_rows):
    return np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(rows, exact_rows)])


def test_exact_neighbours_match_a_full_numpy_sort_across_chunks(corpus):
    embeddings, queries = corpus
    got = scann_tuning.exact_neighbours(embeddings[:5000], queries[:50], 10, chunk=777)  # 7 chunks to merge
    np.testing.assert_array_equal(got, _exact(embeddings[:5000], queries[:50], 10))
    assert scann_tuning.recall_at_k(got, got) == 1.0
    assert scann_tuning.recall_at_k(got[:, ::-1], got) == 1.0  # order does not matter, membership does
    assert scann_tuning.recall_at_k(np.roll(got, 1, axis=0), got) < 0.5


def test_the_fastest_setting_reaching_the_target_is_chosen_and_holds_on_new_queries(corpus, tuned):
    embeddings, queries = corpus
    tuning = tuned.params["tuning"]
    assert tuning["target_recall"] == 0.97 and tuning["num_queries"] == 300 and tuning["recall_k"] == 10
    meeting = [t for t in tuning["tried"] if t[3] is not None]  # timed: only settings that reached the target
    assert meeting and all(t[2] >= 0.97 - 1e-4 for t in meeting)
    assert all(t[2] < 0.97 + 1e-4 for t in tuning["tried"] if t[3] is None)
    if tuned.params["mode"] == "tree_ah":
        leaves, reorder = tuned.params["num_leaves_to_search"], tuned.params["reorder_num_neighbors"]
        assert [leaves, reorder] in [t[:2] for t in meeting]
        assert tuning["qps"] == max(t[3] for t in meeting) > tuning["brute_force_qps"]
        assert 1 <= leaves <= 141 and tuning["recall"] >= 0.97
    else:  # exact search measured faster than every setting that reached the target
        assert tuning["brute_force_qps"] >= max([t[3] for t in meeting], default=0.0)
    # On queries it never saw, the chosen setting keeps (about) the target recall.
    rows, _ = tuned.search_batched(queries, 10)
    assert _recall(rows, _exact(embeddings, queries, 10)) >= 0.95


def test_leaves_below_the_tuned_setting_miss_the_target(corpus, tuned):
    """The bisection found the *fewest* leaves: one grid step fewer (same depth) falls short, as measured."""
    assert tuned.params["mode"] == "tree_ah" and tuned.params["num_leaves_to_search"] > 1  # 20k clustered rows
    leaves, reorder = tuned.params["num_leaves_to_search"], tuned.params["reorder_num_neighbors"]
    tried = {(t[0], t[1]): t[2] for t in tuned.params["tuning"]["tried"]}
    smaller = [n for (n, r) in tried if r == reorder and n < leaves]
    assert smaller and tried[(max(smaller), reorder)] < 0.97


def test_tuned_settings_survive_save_load_and_drive_the_tf_op_searcher(corpus, tuned, tmp_path):
    _, queries = corpus
    tuned.save(str(tmp_path / "searcher"))
    loaded = scann_index.ScannIndex.load(str(tmp_path / "searcher"))
    assert loaded.params == tuned.params
    rows, scores = loaded.search_batched(queries, 10)
    want_rows, want_scores = tuned.search_batched(queries, 10)
    np.testing.assert_array_equal(rows, want_rows)
    in_graph = in_graph_scann.InGraphScannSearcher(str(tmp_path / "searcher"))
    graph_scores, graph_rows = in_graph.search(tf.constant(queries), 10)
    np.testing.assert_array_equal(graph_rows.numpy(), want_rows)
    np.testing.assert_allclose(graph_scores.numpy(), want_scores, rtol=1e-5, atol=1e-5)


def test_search_settings_scale_the_tuned_depth_with_k():
    tuned = {"mode": "tree_ah", "num_leaves_to_search": 7, "reorder_num_neighbors": 40, "tuning": {"recall_k": 10}}
    assert scann_index.search_settings(tuned, 10, 10_000) == (7, 40)
    assert scann_index.search_settings(tuned, 5, 10_000) == (7, 40)
    assert scann_index.search_settings(tuned, 100, 10_000) == (7, 400)
    assert scann_index.search_settings(tuned, 100, 300) == (7, 300)
    # Never fewer re-ordered candidates than the results asked for (an int8 index asks ScaNN for 4k).
    assert scann_index.search_settings(tuned, 10, 10_000, 60) == (7, 60)
    assert scann_index.search_settings(tuned, 10, 10_000, 20) == (7, 40)
    untuned = {"mode": "tree_ah", "num_leaves_to_search": 16, "reorder_num_neighbors": 100}
    assert scann_index.search_settings(untuned, 10, 10_000) == (16, 100)
    assert scann_index.search_settings(untuned, 50, 10_000) == (16, 200)
    assert scann_index.search_settings({"mode": "brute_force"}, 10, 10_000) == (None, None)


def test_small_corpora_get_a_tree_to_compare_only_when_tuning():
    tuning = config.IndexConfig(target_recall=0.99)
    assert scann_index.resolve_params(5_000, 64, tuning)["mode"] == "tree_ah"
    assert scann_index.resolve_params(5_000, 64, config.IndexConfig())["mode"] == "brute_force"
    assert scann_index.resolve_params(scann_tuning.MIN_TREE_BLOCKS - 1, 64, tuning)["mode"] == "brute_force"


def test_target_recall_out_of_range_names_the_key():
    with pytest.raises(config.ConfigError, match="index.target_recall"):
        config.load_config("configs/tiny.yaml", ["index.target_recall=1.5"])
    with pytest.raises(ValueError, match="target_recall"):
        scann_tuning.SearchTuner(0.0)


def test_an_int8_index_is_tuned_on_its_exactly_re_scored_results(corpus):
    embeddings, queries = corpus
    index = scann_index.ScannIndex(config.IndexConfig(num_neighbors=10, num_leaves=141, target_recall=0.97,
                                                      tuning_queries=300, reorder_dtype="int8"))
    index.build(embeddings)
    tuning = index.params["tuning"]
    assert index.params["mode"] == "tree_ah", tuning  # 20k x 64: the tree is faster than a full scan
    assert tuning["recall"] >= 0.97
    rows, _ = index.search_batched(queries, 10)  # new queries: the measured recall holds (within sampling)
    assert _recall(rows, _exact(embeddings, queries, 10)) >= 0.95


def test_leave_one_out_drops_the_query_s_own_row_wherever_it_is():
    rows = np.array([[7, 1, 2, 3], [4, 5, 7, 6], [1, 2, 3, 4]])
    np.testing.assert_array_equal(scann_tuning.leave_one_out(rows, np.array([7, 7, 9]), 3),
                                  [[1, 2, 3], [4, 5, 6], [1, 2, 3]])
