"""Quiet starts: other libraries' known-harmless start-up messages are dropped where they are emitted (Python
loggers, TensorFlow's native stderr), everything else still shows, and ``--verbose`` keeps them all."""
import logging
import os
import subprocess
import sys

from realm_tf import library_logs

NOISE = ("failed call to cuInit", "Failed to import GCSFileSystem", "apitools not found",
         "oneDNN supports DT_INT64 only on platforms with AVX-512", "Resource module is not available")


def test_native_lines_are_filtered_by_pattern_and_the_rest_is_written(capfd):
    with library_logs.native_stderr_filtered(library_logs.NATIVE_NOISE):
        os.write(2, b"E cuda_platform.cc:51] failed call to cuInit: UNKNOWN ERROR (303)\n")
        os.write(2, b"a real error\n")
        os.write(2, b"I onednn] oneDNN supports DT_INT64 only on platforms with AVX-512. Falling back\n")
    assert capfd.readouterr().err == "a real error\n"
    os.write(2, b"after\n")  # file descriptor 2 is back
    assert capfd.readouterr().err == "after\n"


def test_python_noise_is_dropped_from_its_logger_only(caplog):
    library_logs.quiet_known_noise(find_devices=False)
    with caplog.at_level(logging.WARNING):
        logging.getLogger("apache_beam.io.filesystems").warning("Failed to import GCSFileSystem; skipped")
        logging.getLogger("apache_beam.io.filesystems").warning("a real filesystem warning")
        logging.warning("apitools not found, and bigquery client libraries are not available")
        logging.warning("Resource module is not available for current platform, memory usage cannot be fetched.")
        logging.warning("something else on the root logger")
    assert [r.getMessage() for r in caplog.records] == ["a real filesystem warning",
                                                        "something else on the root logger"]


def _stderr_of(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-m", "realm_tf.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_command_that_runs_tensorflow_and_beam_prints_none_of_the_known_noise(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": 1, "title": "Paris", "text": "Paris is the capital of France."}\n')
    err = _stderr_of("preprocess", "--config", "configs/tiny.yaml", "--input", str(corpus),
                     "--output", str(tmp_path / "blocks"))
    assert "1 documents" in err or "documents:" in err  # the command's own report is there
    for line in NOISE:
        assert line not in err, err


def test_a_beam_job_run_as_a_module_prints_none_of_beams_import_messages():
    """Beam writes them while ``apache_beam`` is imported: the package drops them before any job imports it."""
    env = {k: v for k, v in os.environ.items() if k != library_logs.VERBOSE_VARIABLE}
    done = subprocess.run([sys.executable, "-m", "beam_jobs.generate_ict_data", "--help"], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
    for line in NOISE:
        assert line not in done.stderr, done.stderr
    verbose = subprocess.run([sys.executable, "-c", "import beam_jobs.job_support"], capture_output=True, text=True,
                             env={**env, library_logs.VERBOSE_VARIABLE: "1"}, timeout=300, check=False)
    assert "GCSFileSystem" in verbose.stderr, verbose.stderr  # the positive control: Beam does write it


def test_the_environment_variable_keeps_everything(monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "filters", [])
    monkeypatch.setenv(library_logs.VERBOSE_VARIABLE, "1")
    library_logs.quiet_known_noise(find_devices=False)
    assert root.filters == []
    monkeypatch.setenv(library_logs.VERBOSE_VARIABLE, "0")
    library_logs.quiet_known_noise(find_devices=False)
    assert len(root.filters) == 1

