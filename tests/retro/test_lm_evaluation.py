"""Bits-per-byte by leakage threshold (RETRO §2.6) against a direct numpy computation."""
import numpy as np

from realm_tf.retro import lm_evaluation


def _scores(seed: int, num_chunks: int, num_tokens: int):
    """Random token scores: ``(scores, chunk_ids, log_probs, num_bytes)``."""
    rng = np.random.default_rng(seed)
    chunk_ids = rng.integers(0, num_chunks, size=num_tokens)
    log_probs = -rng.gamma(2.0, 1.0, size=num_tokens)
    num_bytes = rng.integers(1, 9, size=num_tokens)
    return (lm_evaluation.TokenScores(chunk_ids, np.zeros(num_tokens, np.int32), log_probs, num_bytes), chunk_ids,
            log_probs, num_bytes)


def test_bits_per_byte_keeps_the_chunks_at_or_below_each_alpha():
    scores, chunk_ids, log_probs, num_bytes = _scores(0, 6, 200)
    overlaps = {0: 0.0, 1: 0.1, 2: 0.125, 3: 0.3, 4: 0.9, 5: 1.0}
    got = lm_evaluation.bits_per_byte_by_alpha(scores, overlaps, (0.0, 0.125, 0.5, 1.0))
    for alpha, (bpb, count) in got.items():
        keep = np.array([overlaps[c] <= alpha for c in chunk_ids])
        assert count == len({c for c in chunk_ids if overlaps[c] <= alpha})
        np.testing.assert_allclose(bpb, -log_probs[keep].sum() / (np.log(2) * num_bytes[keep].sum()))
    assert np.isnan(lm_evaluation.bits_per_byte_by_alpha(scores, {c: 0.5 for c in range(6)}, (0.0,))[0.0][0])


def test_bits_per_byte_by_bucket_keeps_the_chunks_between_consecutive_alphas():
    scores, chunk_ids, log_probs, num_bytes = _scores(1, 7, 300)
    overlaps = {0: 0.0, 1: 0.1, 2: 0.125, 3: 0.3, 4: 0.5, 5: 0.9, 6: 1.0}
    got = lm_evaluation.bits_per_byte_by_bucket(scores, overlaps, (0.0, 0.125, 0.5, 1.0))
    assert list(got) == ["0", "(0, 0.125]", "(0.125, 0.5]", "(0.5, 1]"]
    members = {"0": {0}, "(0, 0.125]": {1, 2}, "(0.125, 0.5]": {3, 4}, "(0.5, 1]": {5, 6}}
    for bucket, (bpb, count) in got.items():
        keep = np.isin(chunk_ids, list(members[bucket]))
        assert count == len(members[bucket])
        np.testing.assert_allclose(bpb, -log_probs[keep].sum() / (np.log(2) * num_bytes[keep].sum()))
    # the buckets partition the chunks: their NLL and bytes add up to the α = 1 figure
    assert sum(count for _, count in got.values()) == 7
