"""Batch-1 latency of the served Open-QA model: p50 / p99 per export and process setting, with the op breakdown.

Issue #20. Each ``--export NAME=DIR`` (an ``export`` SavedModel directory, or a ``--base-path`` with numbered
versions: the newest is served) is loaded by :class:`realm_tf.serving.answerer.Answerer` in a process of its
own for each ``--env NAME=VAR=VALUE[,VAR=VALUE]`` setting (TensorFlow reads its allocator and thread settings
when it starts), warmed up with 3 questions, then asked ``--count`` held-out questions one at a time (tokenize,
embed the question, search, read ``model.reader_beam_size`` blocks, decode: the whole request is one graph). The
numpy sgemm rate (``machine_reference``: the cores' own kernel) is measured in the same run as the machine's
reference. ``--profile`` prints the op types
with the largest share of op time over 10 more requests.

``--cold N`` times instead the first N questions of a fresh process, one at a time, right after the load: with
``--replay`` after :meth:`Answerer.warm_up` has replayed the export's TF Serving warm-up records (what TF Serving
does before a version takes traffic), without it as they come. Point ``TF_XLA_FLAGS`` at an empty cache with
``--env`` to see a first start.

    .venv/bin/python benchmarks/serving_latency.py --questions runs/demo/questions.jsonl \\
        --export demo=runs/demo/export --env default= --env tf_default_allocator=TF_CPU_ALLOCATOR_USE_BFC=false
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine_reference  # noqa: E402  (benchmarks/machine_reference.py)
import op_profile  # noqa: E402  (benchmarks/op_profile.py)
import result_records  # noqa: E402  (benchmarks/)
import setting_runs  # noqa: E402  (benchmarks/setting_runs.py)


def _questions(path: str, count: int) -> list[str]:
    from realm_tf.data import questions

    return [q.question for q in questions.read_questions(path)][-count:]


def run_child(args: argparse.Namespace) -> dict:
    import numpy as np

    import realm_tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
    from realm_tf import process_settings

    process_settings.apply()
    from realm_tf.serving import answerer

    if args.cold:
        return cold_start(args, answerer)
    questions = _questions(args.questions, args.count + 3)
    sgemm = machine_reference.sgemm_gflops()
    model = answerer.Answerer(args.child_export)
    for question in questions[:3]:
        model.ask(question)  # the first calls allocate; the graph is already traced in the SavedModel
    usage = resource.getrusage(resource.RUSAGE_SELF)
    latencies = []
    for question in questions[3:]:
        start = time.perf_counter()
        model.ask(question)
        latencies.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_SELF)
    ms = 1000 * np.asarray(latencies)
    result = {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "mean": float(ms.mean()),
              "requests": len(ms), "sgemm": [sgemm, machine_reference.sgemm_gflops()],
              "kernel": machine_reference.sgemm_kernel(),
              "user_ms": 1000 * (after.ru_utime - usage.ru_utime) / len(ms),
              "system_ms": 1000 * (after.ru_stime - usage.ru_stime) / len(ms),
              "minor_faults": (after.ru_minflt - usage.ru_minflt) / len(ms), "max_rss_gb": after.ru_maxrss / 1e6}
    if args.profile:
        result["ops"] = op_profile.profile(lambda: [model.ask(q) for q in questions[3:13]], args.top_ops)
    return result


def cold_start(args: argparse.Namespace, answerer: Any) -> dict:
    """Milliseconds of the load, of the warm-up replay (``--replay``) and of each of the first ``--cold``
    questions."""
    import numpy as np

    questions = _questions(args.questions, args.cold)
    start = time.perf_counter()
    model = answerer.Answerer(args.child_export)
    load_ms = 1000 * (time.perf_counter() - start)
    start = time.perf_counter()
    replayed = model.warm_up() if args.replay else 0
    warmup_ms = 1000 * (time.perf_counter() - start)
    latencies = []
    for question in questions:
        start = time.perf_counter()
        model.ask(question)
        latencies.append(1000 * (time.perf_counter() - start))
    ms = np.asarray(latencies)
    return {"load_ms": load_ms, "replayed": replayed, "warmup_ms": warmup_ms, "first_ms": float(ms[0]),
            "p50": float(np.percentile(ms, 50)), "max": float(ms.max()), "requests": len(ms),
            "over_500_ms": int((ms > 500).sum())}


def _parse_env(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition("=")
    env = {}
    for item in filter(None, assignments.split(",")):
        key, _, value = item.partition("=")
        env[key] = value
    return name, env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", action="append", default=[], metavar="NAME=DIR",
                        help="an export to time (repeatable)")
    parser.add_argument("--questions", required=True, help="questions JSONL ({question, answers})")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VAR=VALUE[,VAR=VALUE]",
                        help="a process setting (repeatable; 'default=' for realm-tf's own)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top-ops", type=int, default=10)
    parser.add_argument("--cold", type=int, default=0, metavar="N",
                        help="time the first N questions of a fresh process instead (see --replay)")
    parser.add_argument("--replay", action="store_true",
                        help="with --cold: replay the export's TF Serving warm-up records first")
    parser.add_argument("--child-export", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_export:
        setting_runs.emit(run_child(args))
        return 0
    envs = [_parse_env(e) for e in (args.env or ["default="])]
    if args.cold:
        print(f"the first {args.cold} batch-1 requests of a fresh process, "
              f"{'after replaying the warm-up records' if args.replay else 'no warm-up'}; questions: the last of "
              f"{args.questions}; os.cpu_count {os.cpu_count()}", flush=True)
    else:
        print(f"{args.count} batch-1 requests after 3 warm-ups; questions: the last of {args.questions}; "
              f"os.cpu_count {os.cpu_count()}", flush=True)
    own: tuple[str, dict] | None = None  # the last export's latency under realm-tf's own settings
    for export in args.export:
        name, _, path = export.partition("=")
        for env_name, env in envs:
            command = [sys.executable, os.path.abspath(__file__), "--child-export", path, "--questions", args.questions,
                       "--count", str(args.count), "--top-ops", str(args.top_ops), "--cold", str(args.cold)] + (
                           ["--profile"] if args.profile else []) + (["--replay"] if args.replay else [])
            r = setting_runs.run(command, env, f"{name} / {env_name}")
            if args.cold:
                print(f"{name:14s} {env_name:22s} load {r['load_ms']:6.0f} ms, warm-up {r['replayed']} requests "
                      f"{r['warmup_ms']:6.0f} ms; first {r['requests']} questions: first {r['first_ms']:5.0f} ms, "
                      f"p50 {r['p50']:5.0f} ms, max {r['max']:5.0f} ms, {r['over_500_ms']} over 500 ms", flush=True)
                continue
            print(f"{name:14s} {env_name:22s} p50 {r['p50']:6.0f} ms  p99 {r['p99']:6.0f} ms  "
                  f"mean {r['mean']:6.0f} ms  CPU/request user {r['user_ms']:.0f} ms system {r['system_ms']:.0f} ms; "
                  f"faults/request {r['minor_faults']:,.0f}; max RSS {r['max_rss_gb']:.2f} GB; "
                  f"sgemm {r['sgemm'][0]:.0f}/{r['sgemm'][1]:.0f} GFLOP/s ({r['kernel']}) {env or ''}", flush=True)
            if r.get("ops"):
                print(op_profile.format_breakdown(r["ops"]), flush=True)
            if not env:
                own = name, r
    if own is not None:
        name, r = own
        result_records.write(
            "speed-serving-latency", area="Speed and memory", order=30,
            verdict="holds" if r["p50"] <= 200 and r["p99"] <= 400 else "negative",
            claim="The exported Open-QA SavedModel (tokenizer, ScaNN and reader in one graph) answers one question "
                  "inside the 200 ms p50 / 400 ms p99 goal.",
            figure=f"batch 1, {r['requests']} requests, export {name}: p50 {r['p50']:.0f} ms, p99 {r['p99']:.0f} ms, "
                   f"mean {r['mean']:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
