"""Serving under load, with a hot swap: N concurrent clients of the Answerer for a bounded time while a new
version is published and swapped in (TF Serving's "latest" version policy).

Each client sends a seeded mix of requests: questions from the workspace's question file, empty questions,
100 KB questions, invalid UTF-8, and batches of 1 to 256 questions. Half-way through each setting a new complete
version appears under the model base path (staged, then renamed in under its number) and
``Answerer.refresh()`` loads it beside the served one and swaps; every answer carries the version that gave it.
Reported per setting: requests and questions answered, QPS, p50/p99 latency per request, errors, swaps, and
whether every answer came from a complete version. Threads share one Answerer; processes (the GIL aside) each
load their own.

The model is the tiny workspace of ``benchmarks/crash_matrix.py`` (``<crash>/base/served``): the figures measure
the serving path (Python, signature call, swap), not a large model. Resumable per setting::

    .venv/bin/python benchmarks/serving_load.py --out runs/bench/serving_load \
        --workspace runs/bench/crash_matrix/base --seconds 30
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import machine_reference  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

#: (clients, processes): threads share one Answerer in one process; processes each run clients // processes.
SETTINGS = ((1, 1), (4, 1), (16, 1), (8, 2))


def requests(questions: list[str], seed: int):
    """An endless seeded mix of requests (lists of questions, str or bytes)."""
    rng = random.Random(seed)
    while True:
        kind = rng.random()
        if kind < 0.55:
            yield [rng.choice(questions)]
        elif kind < 0.65:
            yield [""]
        elif kind < 0.72:
            yield ["why " * 25_000]  # 100 KB
        elif kind < 0.80:
            yield [b"\xff\xfe who \xc3\x28 wrote " + rng.choice(questions).encode()]
        else:
            yield [rng.choice(questions) for _ in range(rng.choice((2, 8, 32, 256)))]


def client(served: Any, questions: list[str], seed: int, until: float, out: list[dict[str, Any]]) -> None:
    """Sends requests until ``until`` (monotonic); appends one row per request."""
    for batch in requests(questions, seed):
        if time.monotonic() >= until:
            return
        start = time.monotonic()
        try:
            answers = served.ask_batch(batch)
            out.append({"seconds": time.monotonic() - start, "questions": len(batch), "error": "",
                        "versions": sorted({a.served_by for a in answers}),
                        "ok": len(answers) == len(batch) and all(0.0 <= a.score <= 1.0 + 1e-6 for a in answers)})
        except Exception as e:  # pylint: disable=broad-except  # every failure is counted
            out.append({"seconds": time.monotonic() - start, "questions": len(batch),
                        "error": f"{type(e).__name__}: {e}"[:200], "versions": [], "ok": False})


def publish(base: str, source: str, number: int) -> str:
    """A new complete version ``<base>/<number>``: copied under a staging name, then renamed in."""
    staging = os.path.join(base, f".staging-{number}")
    shutil.copytree(source, staging)
    final = os.path.join(base, str(number))
    os.rename(staging, final)
    return final


def run_process(base: str, questions: list[str], clients: int, seconds: float, seed: int, swap: bool,
                queue: Any = None) -> dict[str, Any]:
    """``clients`` threads on one Answerer for ``seconds``; with ``swap`` a new version is published and
    refreshed half-way (the other processes refresh to it as well)."""
    from realm_tf.serving import answerer  # pylint: disable=import-outside-toplevel

    served = answerer.Answerer(base)
    served.warm_up()  # as TF Serving does before a version takes traffic: first calls are not measured
    rows: list[dict[str, Any]] = []
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=client, args=(served, questions, seed * 100 + i, until, rows))
               for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(seconds / 2)
    if swap:
        newest = max(int(n) for n in os.listdir(base) if n.isdigit())
        publish(base, os.path.join(base, str(newest)), newest + 1)
    swapped = served.refresh()
    while not swapped and time.monotonic() < until:  # the other processes look again, as a server's poll would
        time.sleep(0.2)
        swapped = served.refresh()
    for thread in threads:
        thread.join()
    result = {"rows": rows, "swaps": int(swapped)}
    if queue is not None:
        queue.put(result)
    return result


def run_setting(workspace: str, out: str, clients: int, processes: int, seconds: float) -> dict[str, Any]:
    """One setting on a fresh base path holding the workspace's served model as version 1."""
    base = os.path.join(out, f"served_{clients}x{processes}")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    shutil.copytree(os.path.join(workspace, "served"), os.path.join(base, "1"))
    with open(os.path.join(workspace, "questions.jsonl"), encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f if line.strip()]
    if processes == 1:
        results = [run_process(base, questions, clients, seconds, 0, True)]
    else:
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        workers = [context.Process(target=run_process, args=(base, questions, clients // processes, seconds, p,
                                                             p == 0, queue)) for p in range(processes)]
        for worker in workers:
            worker.start()
        results = [queue.get() for _ in workers]
        for worker in workers:
            worker.join()
    wall = seconds  # the clients' window (loading and warm-up before it are not counted)
    rows = [r for result in results for r in result["rows"]]
    complete = {os.path.join(base, n) for n in os.listdir(base)
                if n.isdigit() and os.path.exists(os.path.join(base, n, "realm_qa.json"))}
    latencies = sorted(r["seconds"] for r in rows)
    answered = [r for r in rows if not r["error"]]
    return {"clients": clients, "processes": processes, "seconds": wall, "requests": len(rows),
            "questions": sum(r["questions"] for r in answered),
            "qps": round(sum(r["questions"] for r in answered) / wall, 2),
            "requests_per_second": round(len(rows) / wall, 2),
            "p50_ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
            "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 1)
            if latencies else None,
            "errors": sum(bool(r["error"]) for r in rows), "bad_answers": sum(not r["ok"] for r in answered),
            "first_errors": sorted({r["error"] for r in rows if r["error"]})[:3],
            "swaps": sum(result["swaps"] for result in results),
            "versions_seen": sorted({v for r in rows for v in r["versions"]}),
            "from_incomplete_version": sum(any(v not in complete for v in r["versions"]) for r in answered)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", default="runs/bench/serving_load")
    parser.add_argument("--workspace", default="runs/bench/crash_matrix/base",
                        help="a demo workspace (its served/ and questions.jsonl)")
    parser.add_argument("--seconds", type=float, default=30.0, help="per setting")
    args = parser.parse_args()
    out = args.out.rstrip("/")
    stage = stages.Stages(out)
    reference = stage("sgemm_reference", machine_reference.sgemm_gflops)
    table = [stage(f"load_{c}x{p}_{args.seconds:g}s", lambda c=c, p=p: run_setting(args.workspace, out, c, p,
                                                                                   args.seconds))
             for c, p in SETTINGS]
    print(f"\n== serving under load with a hot swap (tiny model; numpy sgemm {reference:.1f} GFLOP/s) ==")
    print("| clients | processes | requests | questions/s | requests/s | p50 ms | p99 ms | errors | swaps | "
          "answers from an incomplete version |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in table:
        print(f"| {r['clients']} | {r['processes']} | {r['requests']} | {r['qps']} | {r['requests_per_second']} | "
              f"{r['p50_ms']} | {r['p99_ms']} | {r['errors']} | {r['swaps']} | {r['from_incomplete_version']} |")
    print("\nstage minutes: " + stage.minutes())
    errors = sum(r["errors"] + r["bad_answers"] for r in table)
    incomplete = sum(r["from_incomplete_version"] for r in table)
    swaps_missed = sum(r["swaps"] < r["processes"] for r in table)
    result_records.write(
        "serving-load", area="Crash consistency and load", order=20,
        verdict="holds" if errors == 0 and incomplete == 0 and swaps_missed == 0 else "open",
        claim="The Answerer serves concurrent clients (threads, and processes) a mix of valid, empty, 100 KB, "
              "invalid-UTF-8 and 1-256-question requests through a hot swap to a new version with no error and "
              "no answer from an incomplete version",
        figure="; ".join(f"{r['clients']} clients x {r['processes']} process(es): {r['qps']} questions/s, "
                         f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, {r['errors']} errors, {r['swaps']} swaps"
                         for r in table) + f" (tiny model, {args.seconds:g} s per setting; numpy sgemm "
                                           f"{reference:.1f} GFLOP/s)")
    return 0 if errors == 0 and incomplete == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
