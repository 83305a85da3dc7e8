"""Each setting of a benchmark in a process of its own (issue #20).

TensorFlow reads its allocator and thread settings (``TF_CPU_ALLOCATOR_USE_BFC``, ``TF_NUM_INTEROP_THREADS``) when
it starts, so a benchmark comparing them runs itself again per setting: the child prints one ``RESULT {json}``
line (:func:`emit`) and the parent reads it back (:func:`run`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

PREFIX = "RESULT "


def emit(result: dict) -> None:
    """The child's side: prints ``result`` as the line :func:`run` looks for."""
    print(PREFIX + json.dumps(result), flush=True)


def run(command: list[str], env: dict[str, str], label: str) -> dict:
    """Runs ``command`` with ``env`` added to this environment and returns the result it emitted; exits with the
    child's stderr tail, naming ``label``, when it failed or emitted nothing."""
    out = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith(PREFIX)]
    if out.returncode != 0 or not lines:
        print(out.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{label}: exit {out.returncode}")
    return json.loads(lines[-1][len(PREFIX):])
