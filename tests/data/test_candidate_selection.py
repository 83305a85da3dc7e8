"""Candidate selection: the null document first; the source block never a candidate, even when it ranks first."""
import numpy as np
import pytest

from realm_tf.data import candidate_selection
from realm_tf.index import brute_force_index


def _setup(num_blocks=30, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    blocks = rng.normal(size=(num_blocks, dim)).astype(np.float32)
    uids = [f"uid{i}" for i in range(num_blocks)]
    if num_blocks > 7:
        uids[7] = uids[3]  # two blocks with the same content (same uid) are excluded together
    index = brute_force_index.BruteForceIndex()
    index.build(blocks)
    calls = []

    def search(queries, k):
        calls.append(k)
        rows, scores = index.search_batched(queries, k)
        return rows, scores, 42

    return blocks, uids, search, calls


def test_null_first_and_source_excluded_although_it_ranks_first():
    blocks, uids, search, _ = _setup()
    queries = blocks[[3, 5, 11]] * 10.0  # each query's own source block is its exact top-1
    selector = candidate_selection.CandidateSelector(search, uids, num_candidates=8)
    candidates, version, excluded = selector.select(queries, [uids[3], uids[5], uids[11]])
    assert candidates.shape == (3, 8) and version == 42
    assert (candidates[:, 0] == candidate_selection.NULL_BLOCK).all()
    for row, source in zip(candidates, [uids[3], uids[5], uids[11]]):
        assert all(uids[b] != source for b in row[1:])
    assert 3 not in candidates[0] and 7 not in candidates[0]  # both blocks of uid3
    assert excluded >= 3
    # The rest is the exact top-7 among the allowed blocks, in score order (numpy brute force).
    for q, row, source in zip(queries, candidates, [uids[3], uids[5], uids[11]]):
        scores = blocks @ q
        allowed = [b for b in np.argsort(-scores) if uids[b] != source]
        assert list(row[1:]) == allowed[:7]


def test_searches_again_when_exclusions_eat_the_margin():
    blocks, uids, search, calls = _setup(num_blocks=40)
    uids = ["same"] * 10 + uids[10:]  # ten blocks share the source uid and all rank high
    query = blocks[:10].sum(0, keepdims=True) * 10
    selector = candidate_selection.CandidateSelector(search, uids, num_candidates=4, search_margin=1)
    candidates, _, _ = selector.select(query, ["same"])
    assert all(uids[b] != "same" for b in candidates[0, 1:]) and len(calls) >= 2


def test_too_small_an_index_is_a_clear_error():
    blocks, uids, search, _ = _setup(num_blocks=4)
    selector = candidate_selection.CandidateSelector(search, ["a", "a", "b", "c"], num_candidates=4)
    with pytest.raises(ValueError, match="not enough"):
        selector.select(blocks[:1], ["a"])


def test_kept_source_blocks_stay_where_the_search_ranked_them():
    blocks, uids, search, _ = _setup()
    queries = blocks[[3, 5, 11]] * 10.0  # each query's own source block ranks high
    sources = [uids[3], uids[5], uids[11]]
    selector = candidate_selection.CandidateSelector(search, uids, num_candidates=8)
    candidates, _, excluded = selector.select(queries, sources, keep_source=[True, False, True])
    for q, row, source, keep in zip(queries, candidates, sources, [True, False, True]):
        ranked = [b for b in np.argsort(-(blocks @ q)) if keep or uids[b] != source]  # numpy brute force
        assert list(row[1:]) == ranked[:7]
        assert (source in {uids[b] for b in row[1:]}) == keep
    assert excluded == 1  # only the second query's source was dropped
    with pytest.raises(ValueError, match="keep_source"):
        selector.select(queries, sources, keep_source=[True])


def test_a_forced_source_block_is_candidate_one_even_where_the_search_would_not_rank_it():
    blocks, uids, search, _ = _setup()
    queries = -blocks[[3, 5, 11]] * 10.0  # each source block ranks near the bottom
    sources = [uids[3], uids[5], uids[11]]
    selector = candidate_selection.CandidateSelector(search, uids, num_candidates=6)
    candidates, _, _ = selector.select(queries, sources, keep_source=[True, True, False], force_blocks=[3, -1, 11])
    for q, row, source, forced, keep in zip(queries, candidates, sources, [3, -1, 11], [True, True, False]):
        ranked = [b for b in np.argsort(-(blocks @ q)) if uids[b] != source or (keep and forced < 0)]
        assert list(row[1:]) == ([forced] + ranked[:4] if forced >= 0 else ranked[:5])  # numpy brute force
    assert candidates[0, 1] == 3 and 7 not in candidates[0]  # the source's other copy is not read twice
    with pytest.raises(ValueError, match="force_blocks"):
        selector.select(queries, sources, force_blocks=[3])
    with pytest.raises(IndexError, match="30 blocks"):
        selector.select(queries, sources, force_blocks=[3, 30, -1])
