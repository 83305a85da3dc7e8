"""corpus_versions: version 0 is the directory preprocess wrote; updates are numbered versions beside it, the
newest complete one current; numbering, recognising a version from a pattern, pruning, a new version 0."""
import os

from realm_tf import artifacts
from realm_tf.data import corpus_versions


def _version(blocks_dir, version, complete=True):
    path = corpus_versions.version_dir(str(blocks_dir), version)
    os.makedirs(path)
    if complete:
        artifacts.write_marker(path, artifacts.JOB_MANIFEST, {"version": version})
    return path


def test_without_updates_the_directory_itself_is_current(tmp_path):
    blocks = str(tmp_path / "blocks")
    assert corpus_versions.current_version(blocks) == 0 and corpus_versions.current_dir(blocks) == blocks
    assert corpus_versions.current_pattern(blocks) == os.path.join(blocks, "blocks-*.tfrecord*")
    assert corpus_versions.next_version(blocks) == 1
    assert corpus_versions.version_of(blocks, f"{blocks}/blocks-*.tfrecord") == 0


def test_the_newest_complete_update_is_current_and_numbers_go_past_every_directory(tmp_path):
    blocks = tmp_path / "blocks"
    one = _version(blocks, 1)
    _version(blocks, 2)
    _version(blocks, 3, complete=False)  # left by a killed update: never current, its number never reused
    os.makedirs(blocks / "versions" / ".staging-0000000004-abc")
    assert one == str(blocks / "versions" / "0000000001")
    assert corpus_versions.update_versions(str(blocks)) == [1, 2] and corpus_versions.current_version(str(blocks)) == 2
    assert corpus_versions.next_version(str(blocks)) == 4
    assert corpus_versions.version_of(str(blocks), f"{one}/blocks-*.tfrecord") == 1
    assert corpus_versions.version_of(str(blocks), f"{tmp_path}/elsewhere/blocks-*.tfrecord") is None
    relative = os.path.relpath(one, os.getcwd())  # the same directory, written another way
    assert corpus_versions.version_of(str(blocks), os.path.join(relative, "blocks-*")) == 1


def test_prune_keeps_versions_in_use_and_the_newest_and_preprocess_discards_updates(tmp_path):
    blocks = tmp_path / "blocks"
    for version in (1, 2, 3, 4):
        _version(blocks, version)
    assert corpus_versions.prune(str(blocks), keep={2}) == [1, 3]
    assert corpus_versions.update_versions(str(blocks)) == [2, 4]
    assert corpus_versions.discard_updates(str(blocks)) and not (blocks / "versions").exists()
    assert not corpus_versions.discard_updates(str(blocks)) and corpus_versions.current_version(str(blocks)) == 0
