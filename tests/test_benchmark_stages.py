"""Benchmark stages (``benchmarks/benchmark_stages.py``): a kept stage's result outlives its run directory, so a run
on a new machine goes on from the repository's copy instead of running the stage again."""
import gzip
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import benchmark_stages as stages  # noqa: E402  (benchmarks/)


def _never():
    raise AssertionError("a kept stage ran again")


def test_a_kept_result_is_read_by_a_run_on_another_machine(tmp_path):
    kept = tmp_path / "kept"
    first = stages.Stages(str(tmp_path / "machine_a"), kept_dir=str(kept))
    assert first("eval_x", lambda: {"bpb": 1.25, "docs": [1, 2]}, kept=True) == {"bpb": 1.25, "docs": [1, 2]}
    assert first("scratch", lambda: 7) == 7  # not kept: only in the run directory
    entry = stages.read_kept(str(kept / "eval_x.json.gz"))
    assert entry["result"] == {"bpb": 1.25, "docs": [1, 2]} and entry["stage"] == "eval_x"
    assert entry["commit"] and "vCPU" in entry["machine"] and entry["minutes"] >= 0
    assert sorted(p.name for p in kept.iterdir()) == ["eval_x.json.gz"]

    second = stages.Stages(str(tmp_path / "machine_b"), kept_dir=str(kept))  # a new run directory
    assert second.is_kept("eval_x") and not second.is_kept("scratch")
    assert second("eval_x", _never, kept=True) == {"bpb": 1.25, "docs": [1, 2]}
    assert second.result("eval_x") == {"bpb": 1.25, "docs": [1, 2]}
    assert second("scratch", lambda: 8) == 8  # what was not kept runs again


def test_a_run_without_a_kept_directory_keeps_nothing_and_says_so(tmp_path):
    plain = stages.Stages(str(tmp_path / "run"))
    assert plain("a", lambda: 1) == 1 and not plain.is_kept("a")
    with pytest.raises(ValueError, match="'b' is kept, but Stages was given no kept_dir"):
        plain("b", lambda: 2, kept=True)


def test_a_damaged_kept_result_names_its_file(tmp_path):
    path = tmp_path / "eval_y.json.gz"
    path.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="eval_y.json.gz: not a kept stage result"):
        stages.read_kept(str(path))
    with gzip.open(path, "wt") as f:
        json.dump({"stage": "eval_y", "result": 1}, f)
    with pytest.raises(ValueError, match=r"lacks \['commit', 'date', 'machine', 'minutes'\]"):
        stages.read_kept(str(path))
