"""kNN-LM (Khandelwal et al. 2020, eq. 2-3) against float64 numpy, and RETRO's §2.6 overlap measure against
brute force over all substrings."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.retro import knn_lm

VOCAB = 11


def _numpy_knn(distances, tokens, vocab, temperature):
    """p_kNN row by row: exp(−d / T) summed per token, normalised."""
    out = np.zeros((distances.shape[0], vocab))
    for q in range(distances.shape[0]):
        scores = np.exp(-(distances[q] - distances[q].min()) / temperature)  # shift: same ratios, no underflow
        for score, token in zip(scores, tokens[q]):
            out[q, token] += score
        out[q] /= scores.sum()
    return out


def _case(seed, queries=6, neighbours=5):
    rng = np.random.default_rng(seed)
    distances = rng.gamma(2.0, 20.0, size=(queries, neighbours))  # squared L2 distances: positive, spread
    tokens = rng.integers(0, VOCAB - 3, size=(queries, neighbours))  # the last 3 tokens are never retrieved
    tokens[0] = 4  # every neighbour of the first query holds the same token
    return distances, tokens


@pytest.mark.parametrize("temperature", [1.0, 10.0, 100.0])
def test_knn_distribution_matches_numpy(temperature):
    for seed in range(3):
        distances, tokens = _case(seed)
        got = knn_lm.knn_distribution(tf.constant(distances, tf.float32), tf.constant(tokens, tf.int32), VOCAB,
                                      temperature).numpy()
        want = _numpy_knn(distances, tokens, VOCAB, temperature)
        assert got.shape == (6, VOCAB) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-6)
        np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
        np.testing.assert_array_equal(got[:, VOCAB - 3:], 0.0)  # never retrieved
        np.testing.assert_allclose(got[0, 4], 1.0, atol=1e-6)
        if temperature >= 100.0:
            assert (got[1:].max(-1) < 0.99).all()  # a high temperature spreads the other rows over tokens
    # A higher temperature flattens the distribution (entropy grows).
    distances, tokens = _case(0)
    entropy = []
    for t in (1.0, 10.0, 1000.0):
        p = knn_lm.knn_distribution(distances, tokens, VOCAB, t).numpy()[1:]
        entropy.append(-(p * np.log(np.where(p > 0, p, 1))).sum())
    assert entropy[0] < entropy[1] < entropy[2]
    with pytest.raises(ValueError, match="temperature"):
        knn_lm.knn_distribution(distances, tokens, VOCAB, 0.0)


def test_knn_distribution_in_a_graph_with_unknown_queries():
    fn = tf.function(lambda d, t: knn_lm.knn_distribution(d, t, VOCAB, 5.0),
                     input_signature=[tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None, None], tf.int64)])
    for queries, neighbours in ((6, 5), (2, 9)):
        distances, tokens = _case(queries, queries, neighbours)
        np.testing.assert_allclose(fn(distances, tokens).numpy(), _numpy_knn(distances, tokens, VOCAB, 5.0),
                                   atol=1e-6)


@pytest.mark.parametrize("lam", [0.0, 0.25, 1.0])
def test_interpolate_log_probs_matches_numpy(lam):
    rng = np.random.default_rng(int(lam * 4))
    distances, tokens = _case(1)
    knn = knn_lm.knn_distribution(distances, tokens, VOCAB, 10.0)  # zeros in the last three columns
    logits = rng.normal(scale=4.0, size=(6, VOCAB))
    lm_log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))  # [6, VOCAB]
    got = knn_lm.interpolate_log_probs(tf.constant(lm_log_probs, tf.float32), knn, lam).numpy()
    with np.errstate(divide="ignore"):
        want = np.log(lam * knn.numpy().astype(np.float64) + (1 - lam) * np.exp(lm_log_probs))
    assert got.shape == (6, VOCAB) and got.dtype == np.float32
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_allclose(got[finite], want[finite], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-5)  # still a distribution
    if lam == 1.0:
        assert not finite[:, VOCAB - 3:].any()  # p = p_kNN: never-retrieved tokens have probability 0
    else:
        assert finite.all()
    if lam == 0.0:
        np.testing.assert_allclose(got, lm_log_probs, atol=1e-6)


def test_interpolation_is_stable_and_has_finite_gradients():
    # p_LM far below float32's smallest normal: log space keeps it, a direct log(λ p_kNN + (1 − λ) p_LM) would not.
    lm_log_probs = tf.constant([[-200.0, -1e-30, -150.0]])
    knn = tf.constant([[0.0, 0.5, 0.5]])
    with tf.GradientTape() as tape:
        tape.watch([lm_log_probs, knn])
        out = knn_lm.interpolate_log_probs(lm_log_probs, knn, 0.25)
        total = tf.reduce_sum(out)
    np.testing.assert_allclose(out.numpy()[0, 0], np.log(0.75) - 200.0, rtol=1e-6)
    np.testing.assert_allclose(out.numpy()[0, 2], np.log(0.25 * 0.5), rtol=1e-6)
    grads = tape.gradient(total, [lm_log_probs, knn])
    assert all(np.isfinite(g.numpy()).all() for g in grads)
    np.testing.assert_allclose(grads[0].numpy()[0, 0], 1.0, rtol=1e-6)  # only p_LM holds token 0
    np.testing.assert_allclose(grads[1].numpy()[0, 2], 0.25 / (0.25 * 0.5), rtol=1e-5)  # λ / p(y)
    with pytest.raises(ValueError, match="lam"):
        knn_lm.interpolate_log_probs(lm_log_probs, knn, 1.5)


def _brute_force_lcs(a, b):
    """Longest common contiguous run: every substring of ``a`` against every substring of ``b``."""
    best = 0
    for i, j in itertools.combinations(range(len(a) + 1), 2):
        for k, l in itertools.combinations(range(len(b) + 1), 2):
            if j - i == l - k and list(a[i:j]) == list(b[k:l]):
                best = max(best, j - i)
    return best


def test_longest_common_substring_matches_brute_force():
    rng = np.random.default_rng(0)
    lengths = set()
    for _ in range(150):
        a = rng.integers(0, 3, size=rng.integers(0, 10)).tolist()
        b = rng.integers(0, 3, size=rng.integers(0, 10)).tolist()
        if rng.random() < 0.3 and len(a) > 2:  # plant a longer shared run
            start = rng.integers(0, len(a) - 1)
            b = b[:3] + a[start:] + b[3:]
        got = knn_lm.longest_common_substring(a, b)
        assert got == _brute_force_lcs(a, b) == knn_lm.longest_common_substring(b, a), (a, b)
        lengths.add(got)
    assert {0, 1, 2, 3, 4} <= lengths  # the cases cover short and long runs
    assert knn_lm.longest_common_substring([1, 2, 3, 9, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]) == 4
    assert knn_lm.longest_common_substring([1, 2], [2, 1]) == 1  # a common subsequence is not enough
    assert knn_lm.longest_common_substring([1, 3, 2], [1, 2]) == 1


def test_chunk_overlap_ratio():
    chunk = [5, 6, 7, 8, 9, 10, 11, 12]
    neighbours = [[1, 5, 6, 2], [0, 7, 8, 9, 10, 3], [12, 11, 10]]  # runs of 2, 4 and 1
    assert knn_lm.chunk_overlap_ratio(chunk, neighbours) == 0.5
    assert knn_lm.chunk_overlap_ratio(chunk, neighbours + [chunk + [1, 2]]) == 1.0  # a verbatim copy
    assert knn_lm.chunk_overlap_ratio(chunk, [[1, 2], [3]]) == 0.0
    assert knn_lm.chunk_overlap_ratio(chunk, []) == 0.0
    assert knn_lm.chunk_overlap_ratio([], neighbours) == 0.0
    rng = np.random.default_rng(1)
    for _ in range(20):
        c = rng.integers(0, 4, size=4).tolist()
        ns = [rng.integers(0, 4, size=8).tolist() for _ in range(3)]
        assert knn_lm.chunk_overlap_ratio(c, ns) == max(_brute_force_lcs(c, n) for n in ns) / 4


def test_a_short_last_chunk_is_measured_against_its_own_length():
    # A document's last chunk of 3 tokens (m = 64) copied verbatim from the database is fully leaked: r = 1,
    # not 3/64; half of it copied is r = 2/3 (the numpy reference: the brute-force LCS over its own length).
    last = [7, 8, 9]
    assert knn_lm.chunk_overlap_ratio(last, [[1] * 30 + last + [2] * 30]) == 1.0
    assert knn_lm.chunk_overlap_ratio(last, [[0, 7, 8, 4]]) == pytest.approx(2 / 3)
    rng = np.random.default_rng(2)
    for _ in range(20):
        c = rng.integers(0, 3, size=int(rng.integers(1, 6))).tolist()
        ns = [rng.integers(0, 3, size=10).tolist() for _ in range(2)]
        assert knn_lm.chunk_overlap_ratio(c, ns) == max(_brute_force_lcs(c, n) for n in ns) / len(c)


@pytest.mark.parametrize("temperature", [0.5, 7.0])
def test_knn_target_probs_is_the_distribution_at_the_target(temperature):
    distances, tokens = _case(3)
    distances[1, 2] = np.inf  # a missing neighbour weighs nothing
    targets = np.array([4, tokens[1, 0], VOCAB - 1, tokens[3, 4], tokens[4, 1], 0])
    expected = _numpy_knn(np.where(np.isinf(distances), 1e9, distances), tokens, VOCAB, temperature)
    got = knn_lm.knn_target_probs(distances, tokens, targets, temperature).numpy()
    np.testing.assert_allclose(got, expected[np.arange(len(targets)), targets], rtol=1e-6, atol=1e-12)
    assert got[0] == pytest.approx(1.0) and got[2] == 0.0
