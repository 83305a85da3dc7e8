"""kNN-LM's datastore (Khandelwal et al., 2020): L2 neighbours through an inner-product index, against brute force."""
import numpy as np

from realm_tf import config
from realm_tf.index import brute_force_index
from realm_tf.index import index_publisher
from realm_tf.index import scann_index
from realm_tf.retro import knn_datastore


def _brute_force(keys, values, queries, k):
    d = ((queries[:, None, :] - keys[None]) ** 2).sum(-1)  # [q, N]
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, 1), values[order]


def test_inner_product_on_augmented_keys_ranks_as_l2_and_distances_are_exact(tmp_path):
    rng = np.random.default_rng(0)
    keys = (rng.normal(size=[500, 12]) * rng.uniform(0.2, 3.0, size=[500, 1])).astype(np.float32)  # unequal norms
    values = rng.integers(0, 50, size=500).astype(np.int32)
    queries = rng.normal(size=[20, 12]).astype(np.float32)
    augmented = knn_datastore.augment_keys(keys)
    index = brute_force_index.BruteForceIndex()
    index.build(augmented)
    index_publisher.publish(str(tmp_path), 0, augmented, index, {"vocab_hash": "v", "export_step": 0}, 1,
                            arrays={knn_datastore.VALUES_NPY: values})
    store = knn_datastore.KnnDatastore.load(str(tmp_path), "brute_force")
    distances, tokens = store.search(queries, 7)
    want_d, want_t = _brute_force(keys.astype(np.float64), values, queries.astype(np.float64), 7)
    np.testing.assert_allclose(distances, want_d, rtol=1e-4)
    np.testing.assert_array_equal(tokens, want_t)
    # plain MIPS on the raw keys would rank differently: the augmentation is what makes it L2
    raw = np.argsort(-(queries @ keys.T), axis=1)[:, :7]
    assert not np.array_equal(values[raw], want_t)


def test_scann_datastore_finds_most_true_neighbours():
    rng = np.random.default_rng(1)
    keys = rng.normal(size=[3000, 16]).astype(np.float32)
    values = np.arange(3000, dtype=np.int32)
    queries = keys[:50] + 0.01 * rng.normal(size=[50, 16]).astype(np.float32)
    augmented = knn_datastore.augment_keys(keys)
    index = scann_index.ScannIndex(config.IndexConfig(num_neighbors=10))
    index.build(augmented)
    _, tokens = knn_datastore.KnnDatastore(index, augmented, values).search(queries, 10)
    assert (tokens[:, 0] == np.arange(50)).mean() >= 0.9  # each query's own (perturbed) key is nearest
