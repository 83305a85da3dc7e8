"""IndexLoader: newest complete version, refusal of mismatches, fail-safe refresh, consistent hot swaps."""
import os
import shutil
import threading
import time

import numpy as np
import pytest

from realm_tf import errors
from realm_tf.index import brute_force_index
from realm_tf.index import index_loader
from realm_tf.index import index_publisher
from realm_tf.index import scann_index

N, DIM = 64, 16
BASE = np.random.default_rng(0).normal(size=(N, DIM)).astype(np.float32)  # [N, DIM]
QUERIES = np.random.default_rng(1).normal(size=(8, DIM)).astype(np.float32)  # [8, DIM]
_REF_SCORES = QUERIES @ BASE.T  # [8, N]
REF_ROWS = np.argsort(-_REF_SCORES, axis=1)[:, :5]  # [8, 5] top-5 of the base matrix
REF_SCORES = np.take_along_axis(_REF_SCORES, REF_ROWS, axis=1)  # [8, 5]


def _embeddings(version):
    """Version v: row i holds (v+1) * BASE[i - v], so its top rows are shifted by v and its scores scaled by v+1.

    Every result therefore identifies the version it came from, rows and scores independently.
    """
    return ((version + 1) * np.roll(BASE, version, axis=0)).astype(np.float32)


def _consistent(result):
    v = result.version
    return (np.array_equal(result.rows, (REF_ROWS + v) % N)
            and np.allclose(result.scores, (v + 1) * REF_SCORES, rtol=1e-4, atol=1e-4))


def _publish(index_dir, version, keep=10, vocab_hash="vocab-1", dim=DIM):
    embeddings = _embeddings(version)[:, :dim]
    index = brute_force_index.BruteForceIndex()
    index.build(embeddings)
    return index_publisher.publish(str(index_dir), version, embeddings, index,
                                   {"vocab_hash": vocab_hash, "export_step": 100 * version}, keep)


def _loader(index_dir, **kwargs):
    return index_loader.IndexLoader(str(index_dir), expected_dim=DIM, expected_vocab_hash="vocab-1",
                                    kind="brute_force", **kwargs)


def test_loads_the_newest_complete_version_ignoring_staging_and_incomplete_ones(tmp_path):
    _publish(tmp_path, 1)
    v2 = _publish(tmp_path, 2)
    # A crash after index.json but before the rename: full content, staging name.
    shutil.copytree(v2, tmp_path / ".staging-0000000009-deadbeef")
    # A crash on a filesystem without atomic rename: version name, everything but index.json.
    shutil.copytree(v2, tmp_path / "0000000008")
    os.remove(tmp_path / "0000000008" / "index.json")
    loader = _loader(tmp_path)
    assert loader.version == 2 and loader.failed_loads == 0
    result = loader.search_batched(QUERIES, 5)
    assert result.version == 2 and result.directory == v2 and _consistent(result)
    version, index, meta = loader.current()
    assert (version, index.num_blocks, meta["export_step"]) == (2, N, 200)
    assert loader.maybe_refresh() is False  # nothing newer
    _publish(tmp_path, 3)
    assert loader.maybe_refresh() is True and loader.version == 3
    assert _consistent(loader.search_batched(QUERIES, 5)) and loader.swaps == 2


@pytest.mark.parametrize("field,kwargs", [("dim", {"dim": 8}), ("vocab_hash", {"vocab_hash": "other"})])
def test_refuses_a_mismatched_index_naming_its_directory(tmp_path, field, kwargs):
    path = _publish(tmp_path, 4, **kwargs)
    with pytest.raises(index_loader.IndexMismatchError, match=field) as e:
        _loader(tmp_path)
    assert path in str(e.value) and isinstance(e.value, errors.UserError)


def test_refuses_another_kind(tmp_path):
    path = _publish(tmp_path, 1)
    with pytest.raises(index_loader.IndexMismatchError, match="kind") as e:
        index_loader.IndexLoader(str(tmp_path), DIM, "vocab-1", kind="scann")
    assert path in str(e.value)


def test_a_bad_new_version_keeps_the_old_one_in_service(tmp_path):
    _publish(tmp_path, 1)
    loader = _loader(tmp_path)
    bad = _publish(tmp_path, 2, vocab_hash="other")  # mismatch: refused, not retried
    assert loader.maybe_refresh() is False
    assert loader.version == 1 and loader.failed_loads == 1
    assert isinstance(loader.last_error, index_loader.IndexMismatchError) and bad in str(loader.last_error)
    assert loader.last_failed_directory == bad
    corrupt = _publish(tmp_path, 3)  # complete, but its searcher is damaged
    os.remove(os.path.join(corrupt, "searcher", "embeddings.npy"))
    assert loader.maybe_refresh() is False and loader.version == 1 and loader.failed_loads == 2
    assert loader.maybe_refresh() is False and loader.failed_loads == 2  # failed versions are not retried
    assert _consistent(loader.search_batched(QUERIES, 5))
    _publish(tmp_path, 4)
    assert loader.maybe_refresh() is True and loader.version == 4


def test_falls_back_to_an_older_loadable_version_at_start(tmp_path):
    _publish(tmp_path, 1)
    corrupt = _publish(tmp_path, 2)
    (tmp_path / "0000000002" / "searcher" / "brute_force_index.json").write_text("{not json")
    loader = _loader(tmp_path)
    assert loader.version == 1 and loader.failed_loads == 1 and loader.last_failed_directory == corrupt


def test_nothing_loadable_at_start_names_the_failure(tmp_path):
    corrupt = _publish(tmp_path, 1)
    os.remove(os.path.join(corrupt, "searcher", "embeddings.npy"))
    with pytest.raises(index_loader.IndexNotFoundError, match=corrupt):
        _loader(tmp_path)


def test_no_index_yet(tmp_path):
    with pytest.raises(index_loader.IndexNotFoundError, match=str(tmp_path)):
        _loader(tmp_path)
    loader = _loader(tmp_path, require_index=False)
    assert loader.version is None
    with pytest.raises(index_loader.IndexNotFoundError):
        loader.search_batched(QUERIES, 5)
    _publish(tmp_path, 0)
    assert loader.maybe_refresh() is True and _consistent(loader.search_batched(QUERIES, 5))


def test_refresh_interval_rate_limits_directory_listing(tmp_path):
    _publish(tmp_path, 1)
    loader = _loader(tmp_path, min_refresh_interval_seconds=3600)
    _publish(tmp_path, 2)
    assert loader.maybe_refresh() is False and loader.version == 1


def test_watcher_thread_swaps_and_stops(tmp_path):
    _publish(tmp_path, 1)
    with _loader(tmp_path) as loader:
        thread = loader.start_watcher(interval_seconds=0.01)
        _publish(tmp_path, 2)
        deadline = time.monotonic() + 10
        while loader.version != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loader.version == 2
    assert not thread.is_alive()


def test_a_slow_load_in_the_background_does_not_stall_the_searches(tmp_path, monkeypatch):
    """The input pipeline asks for a refresh between batches: a version that takes 5 s to load loads beside the
    batches, which go on with the version in service, each from one version, until the swap."""
    _publish(tmp_path, 1)
    loader = _loader(tmp_path, min_refresh_interval_seconds=0.0)
    load = loader._load  # pylint: disable=protected-access

    def slow_load(version, path):
        time.sleep(5.0)
        return load(version, path)

    monkeypatch.setattr(loader, "_load", slow_load)
    _publish(tmp_path, 2)
    swaps, start = loader.swaps, time.monotonic()
    assert loader.refresh_in_background() is True
    versions = []
    while loader.version != 2 and time.monotonic() - start < 30:
        asked = time.monotonic()
        loader.refresh_in_background()  # a check already loading: no second one
        result = loader.search_batched(QUERIES, 5)
        assert _consistent(result) and time.monotonic() - asked < 1.0  # no batch waits for the load
        versions.append(result.version)
        time.sleep(0.05)
    assert loader.version == 2 and time.monotonic() - start >= 5.0
    assert versions.count(1) > 20 and loader.swaps == swaps + 1  # the batches went on meanwhile, and it loaded once


def test_scann_index_round_trip_through_publish_and_loader(tmp_path):
    rng = np.random.default_rng(3)
    embeddings = rng.normal(size=(12_000, 32)).astype(np.float32)  # tree + AH path
    index = scann_index.ScannIndex()
    index.build(embeddings)
    index_publisher.publish(str(tmp_path), 5, embeddings, index, {"vocab_hash": "h", "export_step": 9}, 2)
    loader = index_loader.IndexLoader(str(tmp_path), expected_dim=32, expected_vocab_hash="h", kind="scann")
    queries = rng.normal(size=(5, 32)).astype(np.float32)
    result = loader.search_batched(queries, 8)
    rows, scores = index.search_batched(queries, 8)
    assert result.version == 5
    np.testing.assert_array_equal(result.rows, rows)
    np.testing.assert_array_equal(result.scores, scores)


def test_a_swap_during_concurrent_searches_never_returns_a_mixed_result(tmp_path):
    _publish(tmp_path, 0, keep=2)
    loader = _loader(tmp_path)
    last_version = 12
    stop = threading.Event()
    failures, seen = [], []

    def search():
        previous = -1
        while not stop.is_set():
            result = loader.search_batched(QUERIES, 5)
            if not _consistent(result):
                failures.append(("inconsistent", result.version))
            if result.version < previous:
                failures.append(("went back", previous, result.version))
            previous = result.version
            seen.append(result.version)

    def publish():
        for v in range(1, last_version + 1):
            _publish(tmp_path, v, keep=2)  # also garbage-collects versions while they may be in service
            loader.maybe_refresh()

    searchers = [threading.Thread(target=search) for _ in range(4)]
    loader.start_watcher(interval_seconds=0.001)  # a second refresher racing the publisher's own calls
    for t in searchers:
        t.start()
    publisher = threading.Thread(target=publish)
    publisher.start()
    publisher.join(60)
    deadline = time.monotonic() + 5
    # The watcher may hold the refresh while the publisher's last maybe_refresh returns: let it finish its swap.
    while (len(seen) < 200 or loader.version != last_version) and time.monotonic() < deadline:
        loader.maybe_refresh()
        time.sleep(0.01)
    stop.set()
    for t in searchers:
        t.join(10)
    loader.stop()
    assert not failures, failures[:5]
    assert loader.version == last_version and loader.failed_loads == 0
    assert len(set(seen)) >= 3, sorted(set(seen))  # searches really overlapped several swaps
    assert index_publisher.complete_versions(str(tmp_path)) == [last_version - 1, last_version]
