"""index_publisher: staging + index.json last + atomic rename, immutable versions, keep-N garbage collection."""
import json
import logging
import os

import numpy as np
import pytest

from realm_tf import artifacts
from realm_tf import errors
from realm_tf.index import brute_force_index
from realm_tf.index import index_publisher

META = {"vocab_hash": "vocab-1", "export_step": 500}


def _index(seed=0, num=40, dim=8):
    embeddings = np.random.default_rng(seed).normal(size=(num, dim)).astype(np.float32)
    index = brute_force_index.BruteForceIndex()
    index.build(embeddings)
    return embeddings, index


def _entries(path):
    return sorted(os.listdir(path))


def test_publish_writes_a_complete_version_and_no_staging_remains(tmp_path):
    embeddings, index = _index()
    path = index_publisher.publish(str(tmp_path), 7, embeddings, index, {**META, "embed_seconds": 1.5}, 3)
    assert path == str(tmp_path / "0000000007")
    assert _entries(tmp_path) == ["0000000007"]  # the staging directory became the version
    assert _entries(path) == ["embeddings.npy", "index.json", "searcher"]
    np.testing.assert_array_equal(np.load(os.path.join(path, "embeddings.npy"), allow_pickle=False), embeddings)
    meta = json.loads((tmp_path / "0000000007" / "index.json").read_text())
    assert meta["version"] == 7 and meta["kind"] == "brute_force"
    assert (meta["num_blocks"], meta["dim"]) == (40, 8)
    assert (meta["vocab_hash"], meta["export_step"], meta["embed_seconds"]) == ("vocab-1", 500, 1.5)
    assert meta["index"]["kind"] == "brute_force" and meta["write_seconds"] >= 0
    loaded = brute_force_index.BruteForceIndex.load(os.path.join(path, meta["searcher"]))
    np.testing.assert_array_equal(loaded.embeddings, embeddings)
    assert index_publisher.complete_versions(str(tmp_path)) == [7]


def test_index_json_is_written_last_inside_staging_before_the_rename(tmp_path, monkeypatch):
    embeddings, index = _index()
    seen = {}
    real_write = artifacts.write_marker

    def spy(directory, marker, content):
        assert marker == "index.json"
        seen["staging"] = os.path.basename(directory)
        seen["files"] = _entries(directory)
        seen["searcher"] = _entries(os.path.join(directory, "searcher"))
        seen["visible"] = _entries(tmp_path)
        real_write(directory, marker, content)

    monkeypatch.setattr(artifacts, "write_marker", spy)
    index_publisher.publish(str(tmp_path), 3, embeddings, index, META, 3)
    assert seen["staging"].startswith(".staging-0000000003-")
    assert seen["files"] == ["embeddings.npy", "searcher"] and "embeddings.npy" in seen["searcher"]
    assert seen["visible"] == [seen["staging"]]  # nothing under a version name before index.json exists


@pytest.mark.parametrize("where", ["save", "index_json", "commit"])
def test_a_failed_publish_leaves_no_version_and_no_staging(tmp_path, monkeypatch, where):
    embeddings, index = _index()
    index_publisher.publish(str(tmp_path), 1, embeddings, index, META, 3)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    if where == "save":
        monkeypatch.setattr(index, "save", boom)
    elif where == "index_json":
        monkeypatch.setattr(artifacts, "write_marker", boom)
    else:
        monkeypatch.setattr(artifacts, "commit", boom)
    with pytest.raises(OSError, match="disk full"):
        index_publisher.publish(str(tmp_path), 2, embeddings, index, META, 3)
    assert _entries(tmp_path) == ["0000000001"]
    assert index_publisher.complete_versions(str(tmp_path)) == [1]


def test_complete_versions_ignores_staging_and_versions_without_index_json(tmp_path):
    embeddings, index = _index()
    index_publisher.publish(str(tmp_path), 2, embeddings, index, META, 5)
    (tmp_path / ".staging-0000000009-abc").mkdir()
    (tmp_path / ".staging-0000000009-abc" / "index.json").write_text("{}")  # crashed before the rename
    (tmp_path / "0000000008").mkdir()  # non-atomic filesystem: crashed before index.json
    (tmp_path / "0000000008" / "embeddings.npy").write_bytes(b"partial")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "index.json").write_text("{}")
    assert index_publisher.complete_versions(str(tmp_path)) == [2]
    assert index_publisher.complete_versions(str(tmp_path / "missing")) == []


def test_keeps_the_newest_versions_and_never_the_one_just_published(tmp_path):
    embeddings, index = _index()
    for v in range(1, 6):
        index_publisher.publish(str(tmp_path), v, embeddings, index, META, 2)
    assert index_publisher.complete_versions(str(tmp_path)) == [4, 5]
    (tmp_path / ".staging-0000000006-x").mkdir()  # a publish in progress: not garbage-collected
    index_publisher.publish(str(tmp_path), 3, embeddings, index, META, 2)  # late, older version
    assert index_publisher.complete_versions(str(tmp_path)) == [3, 4, 5]
    index_publisher.publish(str(tmp_path), 10, embeddings, index, META, 1)
    assert index_publisher.complete_versions(str(tmp_path)) == [10]
    assert _entries(tmp_path) == [".staging-0000000006-x", "0000000010"]


def test_versions_are_immutable_but_an_incomplete_one_is_replaced(tmp_path):
    embeddings, index = _index()
    index_publisher.publish(str(tmp_path), 1, embeddings, index, META, 3)
    with pytest.raises(index_publisher.IndexVersionExistsError, match="0000000001") as e:
        index_publisher.publish(str(tmp_path), 1, embeddings, index, META, 3)
    assert isinstance(e.value, errors.UserError)
    (tmp_path / "0000000002").mkdir()
    (tmp_path / "0000000002" / "junk").write_text("left by a crash")
    index_publisher.publish(str(tmp_path), 2, embeddings, index, META, 3)
    assert _entries(tmp_path / "0000000002") == ["embeddings.npy", "index.json", "searcher"]


def test_bad_arguments_write_nothing(tmp_path):
    embeddings, index = _index()
    cases = [({"export_step": 1}, "vocab_hash"), ({"vocab_hash": "v"}, "export_step"),
             ({**META, "version": 3}, "set by publish"), ({**META, "x": object()}, "serializable")]
    for metadata, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            index_publisher.publish(str(tmp_path), 1, embeddings, index, metadata, 3)
    with pytest.raises(ValueError, match="embeddings are"):
        index_publisher.publish(str(tmp_path), 1, embeddings[:10], index, META, 3)
    with pytest.raises(ValueError, match="version"):
        index_publisher.publish(str(tmp_path), -1, embeddings, index, META, 3)
    with pytest.raises(ValueError, match="keep_versions"):
        index_publisher.publish(str(tmp_path), 1, embeddings, index, META, 0)
    assert not os.path.exists(tmp_path) or _entries(tmp_path) == []


def test_an_export_after_corpus_updates_gets_the_version_after_theirs(tmp_path):
    """Versions are export steps, except corpus updates (the next number, the same export): a later export must
    still be the newest version, and a version built from that very export is left to publish() to refuse."""
    embeddings, index = _index()
    root = str(tmp_path)
    assert index_publisher.version_for_export(root, 5) == 5  # nothing published yet
    index_publisher.publish(root, 5, embeddings, index, {**META, "export_step": 5}, 9)
    assert index_publisher.version_for_export(root, 5) == 5  # built from step 5 already: publish() refuses it
    assert index_publisher.version_for_export(root, 3) == 3  # an older export behind a newer one, as before
    for update in (6, 7):  # two corpus updates of export 5
        index_publisher.publish(root, update, embeddings, index, {**META, "export_step": 5, "corpus_version": 2}, 9)
    assert index_publisher.version_for_export(root, 6) == 8  # step 6 is taken by an update of step 5
    assert index_publisher.version_for_export(root, 7) == 8
    assert index_publisher.version_for_export(root, 20) == 20
    meta = index_publisher.read_index_json(index_publisher.version_dir(root, 7))
    assert (index_publisher.export_step(meta), index_publisher.corpus_version(meta)) == (5, 2)
    assert index_publisher.corpus_version({"version": 1}) == 0  # versions from before corpus versions: version 0
    assert [m["version"] for m in index_publisher.published_metadata(root)] == [5, 6, 7]


def test_a_truncated_embeddings_file_is_named_with_what_to_do(tmp_path):
    embeddings, index = _index()
    path = index_publisher.publish(str(tmp_path), 1, embeddings, index, META, 3)
    np.testing.assert_array_equal(index_publisher.read_embeddings(path), embeddings)
    file = os.path.join(path, index_publisher.EMBEDDINGS_NPY)
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) - 17)
    # index.json lists each file's size: the truncation is named on load, before numpy reads the file
    with pytest.raises(errors.UserError, match=r"embeddings\.npy: \d+ bytes where \d+ were written \(truncated.*"
                                               r"damaged.*delete"):
        index_publisher.read_embeddings(path)
    marker = os.path.join(path, "index.json")  # a version published without the file list: numpy's error, named
    with open(marker, encoding="utf-8") as f:
        meta = json.load(f)
    del meta["files"]
    with open(marker, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    with pytest.raises(errors.UserError, match=r"embeddings\.npy: cannot be read .*damaged.*delete"):
        index_publisher.read_embeddings(path)


def test_a_garbled_index_json_is_named_with_what_to_do(tmp_path):
    embeddings, index = _index()
    path = index_publisher.publish(str(tmp_path), 1, embeddings, index, META, 3)
    with open(os.path.join(path, "index.json"), "w", encoding="utf-8") as f:
        f.write('{"version": 1, "kind": ')  # torn mid-write
    with pytest.raises(errors.UserError, match=r"index\.json: not valid JSON .*damaged.*previous complete version"):
        index_publisher.newest_version(str(tmp_path), META["vocab_hash"])
    with open(os.path.join(path, "index.json"), "w", encoding="utf-8") as f:
        f.write("[1, 2]")
    with pytest.raises(errors.UserError, match=r"index\.json: not a JSON object"):
        index_publisher.read_index_json(path)


def test_a_version_that_lost_its_index_json_is_named_and_the_previous_one_used(tmp_path, caplog):
    embeddings, index = _index()
    index_publisher.publish(str(tmp_path), 1, embeddings, index, META, 3)
    newer = index_publisher.publish(str(tmp_path), 2, embeddings, index, META, 3)
    os.remove(os.path.join(newer, "index.json"))
    with caplog.at_level(logging.WARNING):
        path, meta = index_publisher.newest_version(str(tmp_path), META["vocab_hash"])
    assert meta["version"] == 1 and path == index_publisher.version_dir(str(tmp_path), 1)
    assert any(newer in r.getMessage() and "no index.json" in r.getMessage() for r in caplog.records)
