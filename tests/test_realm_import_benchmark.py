"""The verdict of the REALM-scale memory model (``benchmarks/realm_import_benchmark.py``) is computed from its
goals, not written by hand: each goal, missed alone, turns it from "holds" to "open"."""
import copy
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import realm_import_benchmark as bench  # noqa: E402  (benchmarks/)

FIT = [250_000, 500_000, 1_000_000]


def _point(blocks, rss_mib, p50=13.0, recall=0.992):
    stage = {"peak_rss_mib": rss_mib, "seconds": blocks / 1e4}
    return {"import": stage, "export": stage, "ask": {**stage, "end_rss_mib": rss_mib},
            "latency_ms": {"p50": p50, "p99": 2 * p50}, "recall_at_10": recall, "served_mib": {"scann": blocks / 5e3}}


def _fixture():
    # Every stage 1,000 MiB + 400 bytes a block: 13.35M blocks ~6.4 GB, under every goal.
    measured = {n: _point(n, round(1000 + 400 * n / 2 ** 20)) for n in (*FIT, 2_000_000, 4_000_000)}
    return measured, bench.report_model(measured, 13_353_718, FIT)


def test_every_goal_met_is_an_empty_list():
    measured, model = _fixture()
    assert bench.missed_goals(measured, model, FIT) == []


def test_each_goal_missed_alone_is_named():
    measured, model = _fixture()
    heavy = copy.deepcopy(model)
    heavy["import"]["target_gb"] = 16.7
    assert bench.missed_goals(measured, heavy, FIT) == ["import ~16.7 GB > 16 GB"]
    off = copy.deepcopy(measured)
    off[4_000_000]["export"] = {**off[4_000_000]["export"], "peak_rss_mib": 5000}  # the model 40% low at 4M
    assert [m.split(" model")[0] for m in bench.missed_goals(off, model, FIT)] == ["export"]
    low = copy.deepcopy(measured)
    low[500_000]["recall_at_10"] = 0.985
    assert bench.missed_goals(low, model, FIT) == ["recall@10 0.985 at 500,000"]
    slow = copy.deepcopy(measured)
    slow[4_000_000]["latency_ms"]["p50"] = 140.0
    assert bench.missed_goals(slow, model, FIT) == ["batch-1 p50 140.0 ms at 4,000,000"]
    assert bench.missed_goals(measured, model, [*FIT, 2_000_000, 4_000_000]) == ["no held-out size checks the model"]
