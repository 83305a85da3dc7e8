"""Where the library's status messages go: module loggers under ``realm_tf`` and ``beam_jobs``, shown on stderr.

Library code logs (``logger = logging.getLogger(__name__)``) and never prints; the programs that own a terminal
(``realm-tf``, ``python -m beam_jobs.<job>``) call :func:`show_on_stderr` once, so that the library's INFO
messages (what a stage read, where it wrote, when the input pipeline moved to a new index version) appear on
stderr without the INFO chatter of other libraries. Progress bars (tqdm, ``job_support.Progress``) are displays,
not messages, and write to stderr themselves.

They also call :func:`quiet_known_noise`: messages other libraries print on every start that are known to be
harmless and read like failures (a CUDA build of TensorFlow on a machine without a GPU, Beam without its Google
Cloud extras) are dropped where they are emitted, and a real CUDA device is reported in one line instead.
``--verbose`` keeps everything.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from typing import Iterator, Sequence

logger = logging.getLogger(__name__)

#: The environment variable that keeps every start-up message (``1``), for programs without a ``--verbose`` flag
#: (``python -m beam_jobs.<job>``, whose flags are Beam's).
VERBOSE_VARIABLE = "REALM_TF_VERBOSE"

#: Python log messages of other libraries dropped by :func:`quiet_known_noise`: ``(logger, message prefix)``.
#: Beam logs both when its optional Google Cloud dependencies (the ``[gcp]`` extra) are not installed.
PYTHON_NOISE = (
    ("apache_beam.io.filesystems", "Failed to import GCSFileSystem"),
    ("", "apitools not found"),  # the root logger
    # RunInference's memory report, when its optional model manager cannot be imported (the resource module is
    # there): logged on the root logger of each worker that loads a model
    ("", "Resource module is not available for current platform"),
)
#: Lines TensorFlow's native code writes to stderr while it looks for devices: a CUDA build finding no driver or
#: no GPU, and oneDNN's note that int64 kernels need AVX-512 (an optimisation it skips, not an error).
NATIVE_NOISE = (
    re.compile(r"failed call to cuInit"),
    re.compile(r"oneDNN supports DT_INT64 only on platforms with AVX-512"),
)


class _DropPrefixes(logging.Filter):
    """Drops records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: Sequence[str]) -> None:
        super().__init__()
        self.prefixes = tuple(prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


@contextlib.contextmanager
def native_stderr_filtered(drop: Sequence[re.Pattern[str]]) -> Iterator[None]:
    """Runs the block with file descriptor 2 (where native code writes) going to a temporary file, then writes
    its lines to stderr, except those matching a pattern of ``drop``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not any(pattern.search(line) for pattern in drop):
                    sys.stderr.write(line)
            sys.stderr.flush()


def quiet_known_noise(verbose: bool = False, find_devices: bool = True) -> None:
    """Drops :data:`PYTHON_NOISE` from the loggers that emit it, and (``find_devices``) imports TensorFlow and
    lists its devices with :data:`NATIVE_NOISE` dropped from what its native code prints, logging the CUDA
    devices it finds in one line. ``verbose`` (or :data:`VERBOSE_VARIABLE` set to 1): changes nothing, everything
    is shown."""
    if verbose or os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0"):
        return
    by_logger: dict[str, list[str]] = {}
    for name, prefix in PYTHON_NOISE:
        by_logger.setdefault(name, []).append(prefix)
    for name, prefixes in by_logger.items():
        target = logging.getLogger(name or None)
        if not any(isinstance(f, _DropPrefixes) for f in target.filters):
            target.addFilter(_DropPrefixes(prefixes))
    if find_devices:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel  (only programs that run it pay for it)

        with native_stderr_filtered(NATIVE_NOISE):
            gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            logger.info("CUDA devices: %s", ", ".join(device.name for device in gpus))

LIBRARY_LOGGERS = ("realm_tf", "beam_jobs")


class _CurrentStderrHandler(logging.StreamHandler):
    """A StreamHandler on whatever ``sys.stderr`` is when a record is written, so that a redirected or captured
    stderr (a test's ``capsys``, a notebook) gets the messages too."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler assigns it once; reads always go to the current sys.stderr
        del value


def show_on_stderr(level: int = logging.INFO) -> None:
    """Shows the library loggers' messages of ``level`` and above on stderr, once (idempotent).

    They do not propagate to the root logger: Beam configures a root handler of its own, which would print them a
    second time.
    """
    handler = _CurrentStderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, _CurrentStderrHandler) for h in logger.handlers):
            logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
