"""REALM's 13,353,718 blocks on paper, from what was measured here (issue #20, "Scale, measured and on paper").

Reads the ``SUMMARY`` lines that ``benchmarks/index_benchmark.py`` prints (one run per corpus size), fits the
index build time and memory linearly in the number of blocks (least squares over the runs), and extrapolates
them to REALM's English Wikipedia (13,353,718 blocks of 288 wordpieces, Guu et al. 2020 §4.2). Then the
refresh loop of §3.4 at that size: the trainer's export, Embed_doc over every block on ``N`` embedding workers
(each as fast as this machine: ``--worker-useful-gflops``, the useful GFLOP/s ``embed_throughput.py`` measured
for ``beam_jobs/embed_blocks``), the index build and the publish. Embedding a 288-wordpiece block costs
``L·(2n(4H² + 2HI) + 4n²H)`` FLOPs: MiniLM (6 × 384) and BERT-base (12 × 768, REALM's Embed_doc) are both
given. The off-policy delay is the refresh time divided by the trainer's seconds per step.

    .venv/bin/python benchmarks/scale_plan.py --index-log /tmp/index_1m.log --index-log /tmp/index_2m.log \\
        --index-log /tmp/index_4m.log --worker-useful-gflops 65 --export-seconds 23 --step-seconds 9.5
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

REALM_BLOCKS = 13_353_718
MODELS = {"MiniLM (6 x 384)": (6, 384, 1536), "BERT-base (12 x 768)": (12, 768, 3072)}


def block_flops(layers: int, hidden: int, intermediate: int, n: int = 288) -> float:
    return layers * (2 * n * (4 * hidden ** 2 + 2 * hidden * intermediate) + 4 * n * n * hidden)


def read_summaries(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            rows += [json.loads(line.split("SUMMARY ", 1)[1]) for line in f if line.startswith("SUMMARY ")]
    if not rows:
        raise SystemExit(f"no SUMMARY line in {paths}: run benchmarks/index_benchmark.py first")
    return sorted(rows, key=lambda r: r["num_blocks"])


def linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of y ≈ a + b·x; a line through the origin when there is one point."""
    if len(x) == 1:
        return 0.0, float(y[0] / x[0])
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-log", action="append", required=True, help="an index_benchmark.py log (repeatable)")
    parser.add_argument("--worker-useful-gflops", type=float, required=True,
                        help="useful GFLOP/s of one embedding worker (embed_throughput.py, this machine: 2 cores)")
    parser.add_argument("--export-seconds", type=float, required=True, help="the trainer's retriever export")
    parser.add_argument("--publish-seconds", type=float, default=5.0, help="copying the version into place")
    parser.add_argument("--step-seconds", type=float, nargs="+", required=True,
                        help="trainer seconds per step for the off-policy delay (e.g. ours; REALM's)")
    parser.add_argument("--workers", type=int, nargs="+", default=[16, 64, 256, 1024])
    args = parser.parse_args()

    rows = read_summaries(args.index_log)
    n = np.array([r["num_blocks"] for r in rows], float)
    print("measured (benchmarks/index_benchmark.py --target-recall 0.99, synthetic clustered 128-d vectors):")
    print(f"{'blocks':>10s} {'build_s':>8s} {'tuning_s':>8s} {'peak_GiB':>8s} {'scann_MiB':>9s} {'B/block':>8s} "
          f"{'TF op qps':>9s} {'single':>7s} {'recall@10':>9s}")
    for r in rows:
        print(f"{r['num_blocks']:10,d} {r['scann_build_s']:8.1f} {r['tuning_s']:8.1f} {r['peak_rss_gib']:8.2f} "
              f"{r['scann_dir_mib']:9.0f} {r['scann_dir_mib'] * 2**20 / r['num_blocks']:8.1f} {r['tf_op_qps']:9.0f} "
              f"{r['tf_op_single_qps']:7.0f} {r['tf_op_recall']:9.4f}")
    build = linear_fit(n, np.array([r["scann_build_s"] for r in rows]))
    peak = linear_fit(n, np.array([r["peak_rss_gib"] for r in rows]))
    disk = linear_fit(n, np.array([r["scann_dir_mib"] for r in rows]))
    at = REALM_BLOCKS
    build_s, peak_gib, disk_mib = (a + b * at for a, b in (build, peak, disk))
    print(f"\nlinear fits (a + b·blocks): build {build[0]:.1f} s + {build[1] * 1e6:.2f} s per 1M blocks; "
          f"peak RSS {peak[0]:.2f} GiB + {peak[1] * 1e6:.3f} GiB per 1M; ScaNN directory {disk[0]:.0f} MiB + "
          f"{disk[1] * 1e6:.0f} MiB per 1M")
    print(f"at REALM's {at:,d} blocks: index build ≈ {build_s / 60:.1f} min on one such machine, peak RSS of "
          f"the build ≈ {peak_gib:.1f} GiB, ScaNN directory ≈ {disk_mib / 1024:.2f} GiB "
          f"({disk[1] * 2**20:.0f} bytes per block: the float32 vectors kept for re-ordering and the AH codes), "
          f"embeddings.npy {at * 128 * 4 / 2**30:.2f} GiB (128-d float32)")

    print(f"\nthe refresh loop at {at:,d} blocks: export {args.export_seconds:.0f} s + Embed_doc on N workers "
          f"(each {args.worker_useful_gflops:.0f} useful GFLOP/s, as one 2-core worker here) + build "
          f"{build_s:.0f} s + publish {args.publish_seconds:.0f} s")
    steps_header = " ".join(f"{'delay@' + format(s, 'g') + 's':>12s}" for s in args.step_seconds)
    for model, (layers, hidden, inter) in MODELS.items():
        flops = block_flops(layers, hidden, inter)
        per_worker = args.worker_useful_gflops * 1e9 / flops
        print(f"{model}: {flops / 1e9:.1f} GFLOP per 288-wordpiece block, {per_worker:.2f} blocks/s per worker")
        print(f"  {'workers':>8s} {'embed_min':>10s} {'refresh_min':>11s} {steps_header}")
        for workers in args.workers:
            embed_s = at / (per_worker * workers)
            total = args.export_seconds + embed_s + build_s + args.publish_seconds
            delays = " ".join(f"{total / s:12,.0f}" for s in args.step_seconds)
            print(f"  {workers:8d} {embed_s / 60:10.1f} {total / 60:11.1f} {delays}")
    print("\n(delay@Ts: off-policy delay in trainer steps when a step takes T seconds; the index a batch searches "
          "is that many steps older than the weights it updates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
