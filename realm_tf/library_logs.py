"""Where the library's status messages go: module loggers under ``realm_tf`` and ``beam_jobs``, shown on stderr.

Library code logs (``logger = logging.getLogger(__name__)``) and never prints; the programs that own a terminal
(``realm-tf``, ``python -m beam_jobs.<job>``) call :func:`show_on_stderr` once, so that the library's INFO
messages (what a stage read, where it wrote, when the input pipeline moved to a new index version) appear on
stderr without the INFO chatter of other libraries. Progress bars (tqdm, ``job_support.Progress``) are displays,
not messages, and write to stderr themselves.
"""
from __future__ import annotations

import logging
import sys

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
