"""artifacts: a staged directory appears complete (marker last) or not at all; listing and pruning."""
import hashlib
import json
import logging
import os
import pathlib
import re

import numpy as np
import pytest

from realm_tf import artifacts
from realm_tf import errors


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
    marker = artifacts.read_marker(str(final), artifacts.INDEX)
    assert marker == {"version": 4,
                      "files": {"payload.bin": {"bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}}}
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


@pytest.mark.parametrize("where", ["body", "no_metadata", "commit", "exchange"])
def test_a_failure_leaves_no_trace_and_keeps_what_was_there(tmp_path, monkeypatch, where):
    old = tmp_path / "7"
    with artifacts.staged(str(old), artifacts.RETRIEVER_EXPORT) as staging:
        staging.metadata = {"step": 7, "old": True}
    if where == "commit":  # where directories cannot be swapped in one step: moved aside, then committed
        monkeypatch.setattr(artifacts, "exchange", lambda *a: False)
        monkeypatch.setattr(artifacts, "commit", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    if where == "exchange":
        monkeypatch.setattr(artifacts, "exchange", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
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
    assert artifacts.read_marker(final, artifacts.OPEN_QA_EXPORT) == {"n": 3, "files": {}}
    os.remove(os.path.join(final, artifacts.OPEN_QA_EXPORT))  # a crash left it without its marker
    with pytest.raises(FileNotFoundError, match="not a complete serving export"):
        artifacts.read_marker(final, artifacts.OPEN_QA_EXPORT, "serving export")
    with artifacts.staged(final, artifacts.OPEN_QA_EXPORT) as staging:
        staging.metadata = {"n": 4}
    assert json.loads(open(os.path.join(final, artifacts.OPEN_QA_EXPORT)).read()) == {"n": 4, "files": {}}


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


def _published(root, name="3"):
    """A version holding a top-level file and a nested one, with its checksums in the marker."""
    with artifacts.staged(str(root / name), artifacts.INDEX) as staging:
        os.makedirs(os.path.join(staging.path, "searcher"))
        with open(os.path.join(staging.path, "embeddings.npy"), "wb") as f:
            f.write(bytes(range(256)) * 40)
        with open(os.path.join(staging.path, "searcher", "tree.bin"), "wb") as f:
            f.write(b"tree" * 100)
        os.makedirs(os.path.join(staging.path, "assets"))
        with open(os.path.join(staging.path, "assets", "block_records-000000"), "wb") as f:
            f.write(b"record" * 100)
        staging.metadata = {"version": int(name)}
    return root / name


def test_the_marker_lists_every_file_with_its_size_and_sha256(tmp_path):
    version = _published(tmp_path)
    files = json.loads((version / "index.json").read_text())["files"]
    assert sorted(files) == [os.path.join("assets", "block_records-000000"), "embeddings.npy",
                             os.path.join("searcher", "tree.bin")]
    for relative, expected in files.items():  # against hashlib on the bytes on disk
        data = (version / relative).read_bytes()
        assert expected == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert artifacts.verify(str(version)) == [(str(version), [])]
    assert artifacts.verify(str(tmp_path)) == [(str(version), [])]  # a directory of versions: each one


@pytest.mark.parametrize("damage, found_on_load", [("truncate", True), ("delete", True), ("flip", True),
                                                    ("flip_large", False), ("flip_records", False),
                                                    ("truncate_records", True)])
def test_a_damaged_file_is_named_on_load_or_by_verify(tmp_path, monkeypatch, damage, found_on_load):
    version = _published(tmp_path)
    if damage == "flip_large":  # a file above the load-time digest bound: its size is checked, its digest by verify
        monkeypatch.setattr(artifacts, "LOAD_DIGEST_BYTES", (version / "searcher" / "tree.bin").stat().st_size - 1)
    path = version / "searcher" / "tree.bin"
    if damage.endswith("_records"):  # block records (small, but read on demand): sizes on load, digests by verify
        path = version / "assets" / "block_records-000000"
        damage = damage.split("_")[0]
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:50])
    elif damage == "delete":
        path.unlink()
    else:  # one flipped bit: same size, so only the digest finds it
        data = bytearray(path.read_bytes())
        data[17] ^= 0x01
        path.write_bytes(bytes(data))
    if found_on_load:  # the check on every load: presence, sizes, and the digests of small files
        with pytest.raises(errors.UserError, match=re.escape(str(path))) as raised:
            artifacts.read_marker(str(version), artifacts.INDEX, "index version")
        assert "index version is damaged" in str(raised.value) and "delete" in str(raised.value)
    else:
        assert artifacts.read_marker(str(version), artifacts.INDEX)["version"] == 3
    [(where, problems)] = artifacts.verify(str(version))
    assert where == str(version) and len(problems) == 1 and problems[0].startswith(str(path))
    assert {"truncate": "truncated", "delete": "missing", "flip": "corrupted",
            "flip_large": "corrupted"}[damage] in problems[0]


def test_verify_reports_a_marker_without_checksums_and_refuses_a_directory_without_artifacts(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "index.json").write_text(json.dumps({"version": 1}))
    [(_, problems)] = artifacts.verify(str(tmp_path / "old"))
    assert "without checksums" in problems[0]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no artifact here"):
        artifacts.verify(str(tmp_path / "empty"))


def test_a_dead_writers_leftovers_are_cleaned_and_its_aside_put_back(tmp_path):
    """What a SIGKILLed writer leaves beside ``final``: its staging directory (removed by the next writer) and,
    killed between moving the published directory aside and committing the new one, the old directory aside
    (put back when ``final`` is missing). A live writer's staging directory is left alone."""
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # a pid that no longer runs
    host = socket.gethostname()
    final = tmp_path / "out"
    stale = tmp_path / f".staging-out-0123456789ab-{dead}@{host}"
    aside = tmp_path / f".replaced-out-0123456789ab-{dead}@{host}"
    live = tmp_path / f".staging-out-0123456789ab-{os.getpid()}@{host}"
    other_host = tmp_path / f".staging-out-0123456789ab-{dead}@not-{host}"
    for directory in (stale, aside, live, other_host):
        directory.mkdir()
    (aside / "a.txt").write_text("old")
    artifacts.write_marker(str(aside), artifacts.JOB_MANIFEST, {"v": 1})
    done = artifacts.recover(str(final), artifacts.JOB_MANIFEST)
    assert (final / "a.txt").read_text() == "old" and not aside.exists()  # the published version is back
    assert not stale.exists() and live.exists() and other_host.exists()
    assert len(done) == 2
    # the next writer cleans up first, then publishes
    stale.mkdir()
    with artifacts.staged(str(final), artifacts.JOB_MANIFEST, replace=True) as staging:
        (pathlib.Path(staging.path) / "a.txt").write_text("new")
        staging.metadata = {"v": 2}
    assert (final / "a.txt").read_text() == "new" and not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", live.name, other_host.name])


def test_a_job_output_is_replaced_whole_or_not_at_all(tmp_path):
    """``marker_written``: the body writes the marker (a Beam job's manifest); a body that fails leaves the
    previous output as it was, and one that does not write its marker publishes nothing."""
    final = tmp_path / "blocks"
    with artifacts.staged(str(final), artifacts.JOB_MANIFEST, marker_written=True) as staging:
        (pathlib.Path(staging.path) / "blocks-0.tfrecord").write_text("v1")
        artifacts.write_marker(staging.path, artifacts.JOB_MANIFEST, {"v": 1})
    with pytest.raises(RuntimeError):
        with artifacts.staged(str(final), artifacts.JOB_MANIFEST, replace=True, marker_written=True) as staging:
            (pathlib.Path(staging.path) / "blocks-0.tfrecord").write_text("half")
            raise RuntimeError("the pipeline failed")
    with pytest.raises(ValueError, match="did not write its manifest.json"):
        with artifacts.staged(str(final), artifacts.JOB_MANIFEST, replace=True, marker_written=True) as staging:
            (pathlib.Path(staging.path) / "blocks-0.tfrecord").write_text("no manifest")
    assert (final / "blocks-0.tfrecord").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocks"]


def test_a_replacement_swaps_the_directories_in_one_step(tmp_path):
    """Where the system can (Linux renameat2), the published directory and its replacement trade places in one
    atomic step, so a reader finds one or the other at every moment; the old one is then removed."""
    final = tmp_path / "out"
    final.mkdir()
    (final / "a.txt").write_text("old")
    other = tmp_path / "new"
    other.mkdir()
    (other / "a.txt").write_text("new")
    assert artifacts.exchange(str(other), str(final))  # this machine's Linux and file system can
    assert (final / "a.txt").read_text() == "new" and (other / "a.txt").read_text() == "old"
    with artifacts.staged(str(final), artifacts.JOB_MANIFEST, replace=True) as staging:
        (pathlib.Path(staging.path) / "a.txt").write_text("newer")
        staging.metadata = {"v": 3}
    assert (final / "a.txt").read_text() == "newer" and sorted(p.name for p in tmp_path.iterdir()) == ["new", "out"]


def test_a_nested_artifact_is_left_to_its_own_marker(tmp_path):
    """An artifact holding another (an imported run with its blocks and index versions): the outer marker lists
    only its own files; the inner one lists and checks its files."""
    with artifacts.staged(str(tmp_path / "run"), artifacts.REALM_IMPORT) as staging:
        (pathlib.Path(staging.path) / "params.yaml").write_text("model: {}\n")
        _published(pathlib.Path(staging.path) / "index", name="0")
        staging.metadata = {"kind": "embedder"}
    outer = json.loads((tmp_path / "run" / "import.json").read_text())["files"]
    assert sorted(outer) == ["params.yaml"]
    inner = json.loads((tmp_path / "run" / "index" / "0" / "index.json").read_text())["files"]
    assert sorted(inner) == [os.path.join("assets", "block_records-000000"), "embeddings.npy",
                             os.path.join("searcher", "tree.bin")]
    assert artifacts.verify(str(tmp_path / "run")) == [(str(tmp_path / "run"), [])]


def test_a_numbered_version_without_its_marker_above_the_newest_complete_one_is_named(tmp_path, caplog):
    _published(tmp_path, name="1")
    (tmp_path / "2").mkdir()  # a version whose marker was lost (or a copy not finished)
    (tmp_path / "0").mkdir()  # older than the newest complete one: not worth a word
    with caplog.at_level(logging.WARNING):
        skipped = artifacts.warn_incomplete_versions(str(tmp_path), artifacts.INDEX, "index version")
    assert skipped == [str(tmp_path / "2")]
    assert any(str(tmp_path / "2") in r.getMessage() and "skipped" in r.getMessage() and str(tmp_path / "1")
               in r.getMessage() for r in caplog.records)
    assert artifacts.warn_incomplete_versions(str(tmp_path / "missing"), artifacts.INDEX, "index version") == []


def _resident_kib(path):
    """KiB of ``path``'s mappings resident in this process (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0]:  # a mapping's header line
                inside = fields[-1] == path
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_drop_pages_finds_the_map_behind_a_view_and_empties_it(tmp_path):
    path = str(tmp_path / "matrix.npy")
    np.save(path, np.random.default_rng(0).normal(size=[4096, 256]).astype(np.float32))  # 4 MiB
    mapped = np.load(path, mmap_mode="r")
    view = np.ascontiguousarray(mapped, dtype=np.float32)  # a plain ndarray view: no _mmap of its own
    assert not isinstance(view, np.memmap) and float(view.sum()) != 0.0  # every page read
    assert _resident_kib(os.path.realpath(path)) > 3000
    artifacts.drop_mapped_pages(view)
    assert _resident_kib(os.path.realpath(path)) < 100
    np.testing.assert_array_equal(view[-1], np.load(path)[-1])  # read again from the page cache
    artifacts.drop_mapped_pages(np.zeros([3]))  # not a map: nothing to do
