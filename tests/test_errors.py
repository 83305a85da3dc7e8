"""realm_tf/errors: a full disk is recognised wherever the error comes from, and the CLI says what to do."""
import errno
import os
import resource
import shutil
import subprocess
import sys

import pytest

from realm_tf import errors


def test_a_full_disk_is_recognised_through_the_errors_it_was_raised_from():
    assert errors.disk_full(OSError(errno.ENOSPC, "No space left on device", "/x/blocks-0.tfrecord"))
    assert errors.disk_full(OSError(errno.EFBIG, "File too large"))
    try:
        try:
            raise OSError(errno.EFBIG, "File too large", "/x/part")
        except OSError as inner:
            raise RuntimeError("the pipeline failed") from inner
    except RuntimeError as outer:
        assert "File too large" in errors.disk_full(outer)
    assert errors.disk_full(RuntimeError("Beam: ... tensorflow.python.framework.errors_impl.UnknownError: "
                                         "/x/y; No space left on device\nmore")) \
        == "Beam: ... tensorflow.python.framework.errors_impl.UnknownError: /x/y; No space left on device"
    assert errors.disk_full(OSError(errno.ENOENT, "No such file")) == ""
    assert errors.disk_full(ValueError("bad value")) == ""


@pytest.mark.slow
def test_preprocess_on_a_full_disk_fails_cleanly_and_keeps_the_previous_corpus(pretraining_workspace, tmp_path):
    """Under a file-size limit (the disk full for the job's first big file) preprocess exits 2 and its last
    word says what to do; the corpus it was replacing is untouched and nothing is left beside it."""
    corpus = os.path.join(pretraining_workspace, "corpus.jsonl")
    output = tmp_path / "blocks"
    argv = [sys.executable, "-m", "realm_tf.cli", "preprocess", "--config", "configs/tiny.yaml", "--input", corpus,
            "--output", str(output), "--overwrite", "--progress-interval", "0"]
    shutil.copytree(os.path.join(pretraining_workspace, "blocks"), output)  # a corpus preprocess wrote before
    before = {p.name: p.read_bytes() for p in output.iterdir()}

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))

    full = subprocess.run(argv, capture_output=True, text=True, preexec_fn=limit, check=False)  # noqa: PLW1509
    assert full.returncode == 2, full.stderr[-2000:]
    last = full.stderr.strip().splitlines()[-1]  # the last word is ours, not a traceback (Beam logs its worker's)
    assert last.startswith("realm-tf preprocess: error: the disk is full") and "run the same command again" in last
    assert {p.name: p.read_bytes() for p in output.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocks"]
