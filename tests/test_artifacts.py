"""artifacts: a staged directory appears complete (marker last) or not at all; listing and pruning."""
import json
import os
import pathlib

import pytest

from realm_tf import artifacts


def _entries(path):
    return sorted(os.listdir(path))


def test_staged_publishes_the_directory_with_its_marker_and_leaves_no_staging(tmp_path):
    final = tmp_path / "0000000004"
    with artifacts.staged(str(final), artifacts.INDEX) as staging:
        assert os.path.basename(staging.path).startswith(".staging-0000000004-")
        (tmp_path / staging.path / "payload.bin").write_bytes(b"abc")
        assert not final.exists()  # nothing visible under the final name while the body runs
        staging.metadata = {"version": 4}
    assert _entries(tmp_path) == ["0000000004"]
    assert _entries(final) == ["index.json", "payload.bin"]
    assert artifacts.read_marker(str(final), artifacts.INDEX) == {"version": 4}
    assert artifacts.complete_versions(str(tmp_path), artifacts.INDEX) == {4: str(final)}


def test_the_marker_is_the_last_file_written(tmp_path, monkeypatch):
    seen = []
    real = artifacts.write_marker

    def spy(directory, marker, content):
        seen.append(_entries(directory))
        real(directory, marker, content)

    monkeypatch.setattr(artifacts, "write_marker", spy)
    with artifacts.staged(str(tmp_path / "1"), artifacts.RETRIEVER_EXPORT) as staging:
        open(os.path.join(staging.path, "saved_model.pb"), "wb").close()
        staging.metadata = {"step": 1}
    assert seen == [["saved_model.pb"]]


@pytest.mark.parametrize("where", ["body", "no_metadata", "commit"])
def test_a_failure_leaves_no_trace_and_keeps_what_was_there(tmp_path, monkeypatch, where):
    old = tmp_path / "7"
    with artifacts.staged(str(old), artifacts.RETRIEVER_EXPORT) as staging:
        staging.metadata = {"step": 7, "old": True}
    if where == "commit":
        monkeypatch.setattr(artifacts, "commit", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises((OSError, ValueError)):
        with artifacts.staged(str(old), artifacts.RETRIEVER_EXPORT, replace=True) as staging:
            if where == "body":
                raise OSError("disk full")
            if where != "no_metadata":
                staging.metadata = {"step": 7}
    assert _entries(tmp_path) == ["7"]
    assert artifacts.read_marker(str(old), artifacts.RETRIEVER_EXPORT)["old"] is True


def test_a_complete_artifact_is_replaced_only_when_asked_and_an_incomplete_one_always(tmp_path):
    final = str(tmp_path / "out")
    with artifacts.staged(final, artifacts.OPEN_QA_EXPORT) as staging:
        staging.metadata = {"n": 1}
    with pytest.raises(FileExistsError, match="already published"):
        with artifacts.staged(final, artifacts.OPEN_QA_EXPORT) as staging:
            staging.metadata = {"n": 2}
    with artifacts.staged(final, artifacts.OPEN_QA_EXPORT, replace=True) as staging:
        staging.metadata = {"n": 3}
    assert artifacts.read_marker(final, artifacts.OPEN_QA_EXPORT) == {"n": 3}
    os.remove(os.path.join(final, artifacts.OPEN_QA_EXPORT))  # a crash left it without its marker
    with pytest.raises(FileNotFoundError, match="not a complete serving export"):
        artifacts.read_marker(final, artifacts.OPEN_QA_EXPORT, "serving export")
    with artifacts.staged(final, artifacts.OPEN_QA_EXPORT) as staging:
        staging.metadata = {"n": 4}
    assert json.loads(open(os.path.join(final, artifacts.OPEN_QA_EXPORT)).read()) == {"n": 4}


def test_versions_list_only_complete_numeric_directories_and_pruning_keeps_the_protected(tmp_path):
    for version in (1, 2, 3, 4):
        with artifacts.staged(str(tmp_path / str(version)), artifacts.RETRIEVER_EXPORT) as staging:
            staging.metadata = {"step": version}
    (tmp_path / "5").mkdir()  # incomplete
    (tmp_path / ".staging-6-abc").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / artifacts.RETRIEVER_EXPORT).write_text("{}")
    assert list(artifacts.complete_versions(str(tmp_path), artifacts.RETRIEVER_EXPORT)) == [1, 2, 3, 4]
    deleted = artifacts.delete_old_versions(str(tmp_path), artifacts.RETRIEVER_EXPORT, keep=2, protect={1})
    assert deleted == [2]
    assert list(artifacts.complete_versions(str(tmp_path), artifacts.RETRIEVER_EXPORT)) == [1, 3, 4]
    assert {"5", ".staging-6-abc", "notes"} <= set(_entries(tmp_path))  # never touched


def test_a_paused_commit_leaves_a_complete_staging_directory_and_no_final_one(tmp_path):
    """``pause_before_commit``: the moment a killed writer leaves behind (marker staged, nothing committed)."""
    import threading
    import time

    final = tmp_path / "0000000007"

    def write():
        with artifacts.staged(str(final), artifacts.INDEX, pause_before_commit=1.5) as staging:
            (pathlib.Path(staging.path) / "data.bin").write_bytes(b"x")
            staging.metadata = {"version": 7}

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.time() + 10
    staged = []
    while not staged and time.time() < deadline:
        staged = [p for p in tmp_path.iterdir() if p.name.startswith(artifacts.STAGING_PREFIX)
                  and (p / artifacts.INDEX).exists()]
        time.sleep(0.05)
    assert staged and not final.exists()  # complete in staging, not yet published
    writer.join()
    assert artifacts.is_complete(str(final), artifacts.INDEX) and not staged[0].exists()


def test_a_model_base_path_serves_its_newest_complete_version(tmp_path):
    """TF Serving's layout: numbered versions under one directory; staging and incomplete ones never count."""
    base = tmp_path / "served"
    assert artifacts.newest_complete(str(base), artifacts.OPEN_QA_EXPORT) is None
    assert artifacts.next_version_dir(str(base), artifacts.OPEN_QA_EXPORT) == str(base / "1")
    for version in ("1", "2"):
        with artifacts.staged(str(base / version), artifacts.OPEN_QA_EXPORT) as staging:
            staging.metadata = {"v": version}
    (base / "3").mkdir()  # a version without its marker (a crash): not served, and its number is taken over
    (base / ".staging-4-abc").mkdir()
    assert artifacts.newest_complete(str(base), artifacts.OPEN_QA_EXPORT) == str(base / "2")
    assert artifacts.newest_complete(str(base / "1"), artifacts.OPEN_QA_EXPORT) == str(base / "1")  # one export
    assert artifacts.next_version_dir(str(base) + "/", artifacts.OPEN_QA_EXPORT) == str(base / "3")
