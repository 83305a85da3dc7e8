"""Resumable benchmark stages: each stage's result is kept in ``<out>/stages.json`` when it completes and a rerun
skips it, so a long benchmark continues where it stopped (a stage killed midway resumes from its own
checkpoints, if it has any). Also ``cli``: one ``realm-tf`` command in a child process, as a user runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

from realm_tf import config as config_lib


def cli(args: list[str], capture: bool = False) -> str:
    """Runs ``realm-tf ARGS`` in a child process (its own TensorFlow runtime); its stdout if ``capture``."""
    print("$ realm-tf " + " ".join(args), flush=True)
    done = subprocess.run([sys.executable, "-m", "realm_tf.cli", *args], check=True, text=True,
                          stdout=subprocess.PIPE if capture else None)
    return done.stdout if capture else ""


class Stages:
    """The stages of one benchmark run directory ``out``."""

    def __init__(self, out: str) -> None:
        os.makedirs(out, exist_ok=True)
        self.path = os.path.join(out, "stages.json")
        self.state: dict[str, Any] = {}
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                self.state = json.load(f)

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``'s result, run now or read from an earlier run (JSON-serialisable)."""
        if name in self.state:
            print(f"== {name}: done before ({self.state[name]['minutes']:.1f} min), skipped", flush=True)
            return self.state[name].get("result")
        print(f"== {name}", flush=True)
        start = time.time()
        result = fn()
        self.state[name] = {"minutes": (time.time() - start) / 60, "result": result}
        config_lib.atomic_write_text(self.path, json.dumps(self.state, indent=2) + "\n")
        return result

    def result(self, name: str) -> Any:
        return self.state[name].get("result")

    def minutes(self) -> str:
        return ", ".join(f"{k} {v['minutes']:.1f}" for k, v in self.state.items())
