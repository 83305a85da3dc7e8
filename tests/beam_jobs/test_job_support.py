"""Beam job support: protobuf record parsing and Beam counters."""
import os
import pickle

import apache_beam as beam
import pytest
import tensorflow as tf
from apache_beam.testing import test_pipeline

from beam_jobs import job_support
from realm_tf.data import example_schemas as es


def test_counters_are_read_back_by_name():
    p = test_pipeline.TestPipeline()
    _ = (p | beam.Create([1, 2, 3]) | beam.Map(lambda x: job_support.count("test", "items", x))
         | beam.Map(lambda _: job_support.count("test", "zero", 0)))
    result = p.run()
    result.wait_until_finish()
    assert job_support.read_counters(result, "test") == {"items": 6}


def test_parse_example_follows_the_schema():
    record = es.to_example({es.QUERY_TEXT: "héllo", es.QUERY_IDS: [1, 2], es.MASK_POSITIONS: [1],
                            es.TARGET_IDS: [2], es.SOURCE_UID: b"abc", es.SOURCE_BLOCK_ID: 4,
                            es.MASKING: b"salient"})
    row = job_support.parse_example(record, es.pretraining_feature_spec())
    assert row == {es.QUERY_TEXT: "héllo".encode(), es.QUERY_IDS: [1, 2], es.MASK_POSITIONS: [1],
                   es.TARGET_IDS: [2], es.SOURCE_UID: b"abc", es.SOURCE_BLOCK_ID: 4, es.MASKING: b"salient",
                   es.SPAN_LABEL: b""}  # the schema's default for an absent span label
    parsed = tf.io.parse_example(tf.constant([record]), es.pretraining_feature_spec())
    assert parsed[es.QUERY_IDS][0].numpy().tolist() == row[es.QUERY_IDS]


def test_progress_reports_counts_percentage_and_extra_at_most_every_interval(capsys):
    progress = job_support.Progress("embed_blocks", "blocks", total=8, interval=3600.0, stage="embed")
    progress.update(3, failed=1)
    progress.update(1)
    assert capsys.readouterr().err == ""  # the interval has not passed
    progress.flush()
    line = capsys.readouterr().err.strip()
    assert line.startswith("embed_blocks [embed, pid ") and "4/8 blocks (50%), ETA" in line
    assert line.endswith(", 1 failed") and "blocks/s" in line
    progress.flush()
    assert capsys.readouterr().err == ""  # nothing new to report
    silent = job_support.Progress("preprocess", "lines", total=None, interval=0.0)
    silent.update(5)
    silent.flush()
    assert capsys.readouterr().err == "" and silent.done == 5


class _CountingDoFn(job_support.ReportingDoFn):
    def process(self, element):
        self.progress.update(1)
        yield element


def test_the_copies_of_a_reporting_dofn_in_one_process_count_into_one_progress():
    """A runner's worker threads each deserialize their own copy of a DoFn; the progress line must count the
    process's elements, not one copy's (with 2 worker threads each copy would print 50% at the end)."""
    fn = _CountingDoFn("embed_blocks", "blocks", total=10, interval=0.0)
    first, second = pickle.loads(pickle.dumps(fn)), pickle.loads(pickle.dumps(fn))
    first.setup()
    second.setup()
    for _ in range(4):
        list(first.process("x"))
    for _ in range(6):
        list(second.process("x"))
    assert first.progress is second.progress and first.progress.done == 10
    other = _CountingDoFn("embed_blocks", "blocks", total=10, interval=0.0)  # another pipeline's DoFn
    other.setup()
    assert other.progress is not first.progress and other.progress.done == 0


def test_prepare_output_removes_the_manifest_and_matching_shards_only(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("manifest.json", "ict-00000-of-00002.tfrecord", "ict-00001-of-00002.tfrecord", "notes.txt"):
        (out / name).write_text("x")
    job_support.prepare_output(str(out), "ict-*.tfrecord")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    job_support.prepare_output(str(tmp_path / "new" / "dir"), "ict-*.tfrecord")
    assert (tmp_path / "new" / "dir").is_dir()


class _EchoJob(job_support.BeamJob):
    """A job whose run returns what it was given."""

    name = "echo"

    def add_args(self, parser):
        parser.add_argument("--input", action="append", required=True)
        parser.add_argument("--num_shards", type=int, default=0)
        parser.add_argument("--set", dest="overrides", action="append", default=[])

    def run_with_args(self, args, beam_args):
        return vars(args), beam_args


def test_a_job_called_from_python_gets_what_its_command_line_would_parse():
    job = _EchoJob()
    called = job.call(["--runner=DirectRunner"], input=["a.jsonl"], overrides=["x.y=1"])
    parsed = job.run(["--input", "a.jsonl", "--set", "x.y=1", "--runner=DirectRunner"])
    assert called == parsed == ({"input": ["a.jsonl"], "num_shards": 0, "overrides": ["x.y=1"]},
                                ["--runner=DirectRunner"])
    assert job.call(input=["b"])[0]["overrides"] == [] and job.call(input=["c"])[0]["overrides"] is not \
        job.call(input=["d"])[0]["overrides"]  # defaults are fresh each call
    with pytest.raises(TypeError, match=r"unknown arguments \['output'\].*missing required arguments \['input'\]"):
        job.call(output="x")


def test_a_scratch_directory_left_by_a_job_that_died_is_removed_by_the_next(tmp_path):
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    host = socket.gethostname()
    left = tmp_path / f".embeddings-7-0123456789ab-{dead}@{host}"
    left.mkdir()
    (left / "embeddings-00000-of-00001.tfrecord").write_bytes(b"x")
    live = tmp_path / f".embeddings-7-0123456789ab-{os.getpid()}@{host}"
    live.mkdir()
    other = tmp_path / f".keys-0123456789ab-{dead}@{host}"  # another prefix: not this job's
    other.mkdir()
    path = job_support.scratch_directory(str(tmp_path), "embeddings-7")
    assert not left.exists() and live.exists() and other.exists()
    name = os.path.basename(path)
    assert name.startswith(".embeddings-7-") and name.endswith(f"-{os.getpid()}@{host}") and not os.path.exists(path)
