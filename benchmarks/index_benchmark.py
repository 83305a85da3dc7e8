"""MIPS index benchmark: ScaNN vs exact brute force (REALM §3.4; ScaNN, Guo et al. 2020).

REALM searches Embed_doc(z) for the top-k blocks of every query at every training step, so the index's
throughput bounds the trainer's and its recall bounds how often the true top-k reaches the model. On
synthetic clustered vectors (``--num-blocks`` x ``--dim``, Gaussian clusters around ``--clusters`` random
centres, like block embeddings of a topical corpus) this reports, for ScannIndex (IndexConfig defaults,
scaled to the corpus), ScaNN's TF-op searcher loaded from the same saved directory, and BruteForceIndex:

* build time and resident-memory growth of the build;
* batched QPS (one ``search_batched`` call over ``--num-queries`` queries) and single-query QPS;
* recall@10 against BruteForceIndex.

With ``--target-recall 0.99`` the ScaNN index chooses its leaves to search and re-ordering depth by measuring
them at build time (``index.target_recall``, :mod:`realm_tf.index.scann_tuning`); its build_s includes that.

Usage: python benchmarks/index_benchmark.py [--num-blocks 1000000] [--dim 128] [--num-queries 1000]
       [--target-recall 0.99]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import realm_tf  # noqa: E402,F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)

# isort: split
import numpy as np  # pylint: disable=wrong-import-position
import tensorflow as tf  # pylint: disable=wrong-import-position

from realm_tf import config  # pylint: disable=wrong-import-position
from realm_tf.index import brute_force_index  # pylint: disable=wrong-import-position
from realm_tf.index import scann_index  # pylint: disable=wrong-import-position

import result_records  # pylint: disable=wrong-import-position  (benchmarks/)


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _clustered(num: int, centers: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
    out = np.empty([num, centers.shape[1]], np.float32)
    step = 100_000
    for i in range(0, num, step):  # chunked, so float64 temporaries stay small
        n = min(step, num - i)
        out[i:i + n] = centers[rng.integers(0, len(centers), n)] + noise * rng.standard_normal(
            (n, centers.shape[1]), dtype=np.float32)
    return out


def _recall(rows: np.ndarray, exact_rows: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(rows, exact_rows)]))


def _time(fn, repeat: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-blocks", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--noise", type=float, default=0.5)
    parser.add_argument("--num-queries", type=int, default=1000)
    parser.add_argument("--single-queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--target-recall", type=float, default=0.0,
                        help="index.target_recall: search settings measured at build time (0: fixed rules)")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    centers = rng.standard_normal((args.clusters, args.dim), dtype=np.float32)
    embeddings = _clustered(args.num_blocks, centers, rng, args.noise)  # [N, dim]
    queries = _clustered(args.num_queries, centers, rng, args.noise)  # [Q, dim]
    k = args.k
    print(f"corpus: {args.num_blocks} x {args.dim} float32 ({embeddings.nbytes / 2**20:.0f} MiB), "
          f"{args.clusters} Gaussian clusters (noise {args.noise}); {args.num_queries} queries; k={k}; "
          f"{os.cpu_count()} CPUs; TF {tf.__version__}")

    results = []

    # ---- exact -----------------------------------------------------------------------------------------
    rss = _rss_mb()
    exact = brute_force_index.BruteForceIndex()
    exact.build(embeddings)
    bf_mem = _rss_mb() - rss
    exact.search_batched(queries[:4], k)  # warm-up
    start = time.perf_counter()
    exact_rows, _ = exact.search_batched(queries, k)
    bf_batch = time.perf_counter() - start
    n_single = min(args.single_queries, 50)  # ~0.1 s per exact query on 1M x 128
    bf_single = _time(lambda: [exact.search_batched(queries[i:i + 1], k) for i in range(n_single)]) / n_single
    results.append(("BruteForceIndex (TF matmul+top_k)", exact.build_seconds, bf_mem,
                    args.num_queries / bf_batch, 1.0 / bf_single, 1.0))

    # ---- ScaNN -----------------------------------------------------------------------------------------
    rss = _rss_mb()
    index = scann_index.ScannIndex(config.IndexConfig(target_recall=args.target_recall))
    index.build(embeddings)
    scann_mem = _rss_mb() - rss
    tuning = index.params.get("tuning")
    print(f"ScaNN params: { {k: v for k, v in index.params.items() if k != 'tuning'} }")
    if tuning:
        print(f"tuning: { {k: v for k, v in tuning.items() if k != 'tried'} }")
        print("tried [leaves, reorder, recall on the sampled vectors, qps]: " + str(tuning["tried"]))
    index.search_batched(queries[:4], k)
    start = time.perf_counter()
    rows, _ = index.search_batched(queries, k)  # multi-threaded batch search
    sc_batch = time.perf_counter() - start
    n_single = args.single_queries
    sc_single = _time(lambda: [index.search_batched(queries[i:i + 1], k) for i in range(n_single)]) / n_single
    results.append(("ScannIndex (pybind)", index.build_seconds, scann_mem, args.num_queries / sc_batch,
                     1.0 / sc_single, _recall(rows, exact_rows)))

    # ---- ScaNN TF op, from the same saved directory --------------------------------------------------------
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        index.save(tmp)
        save_seconds = time.perf_counter() - start
        size_mb = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)) / 2**20
        rss = _rss_mb()
        start = time.perf_counter()
        tf_searcher = scann_index.load_tf_searcher(tmp)
        tf_load = time.perf_counter() - start
        tf_mem = _rss_mb() - rss
    leaves, pre = scann_index.search_settings(index.params, k, args.num_blocks)  # as ScannIndex searches

    @tf.function(input_signature=[tf.TensorSpec([None, args.dim], tf.float32)])
    def tf_search(q):
        return tf_searcher.search_batched_parallel(q, final_num_neighbors=k, pre_reorder_num_neighbors=pre,
                                                   leaves_to_search=leaves)

    tf_search(tf.constant(queries[:4]))
    q_tensor = tf.constant(queries)
    start = time.perf_counter()
    tf_rows, _ = tf_search(q_tensor)
    tf_batch = time.perf_counter() - start
    singles = [tf.constant(queries[i:i + 1]) for i in range(n_single)]
    tf_single = _time(lambda: [tf_search(s) for s in singles]) / n_single
    results.append(("ScaNN TF op (load_tf_searcher)", tf_load, tf_mem, args.num_queries / tf_batch,
                    1.0 / tf_single, _recall(tf_rows.numpy(), exact_rows)))

    print(f"ScaNN saved directory: {size_mb:.0f} MiB, save {save_seconds:.1f} s")
    print(f"{'index':36s} {'build_s':>8s} {'mem_MiB':>8s} {'batch_qps':>10s} {'single_qps':>10s} "
          f"{'recall@' + str(k):>9s}")
    for name, build_s, mem, batch_qps, single_qps, recall in results:
        print(f"{name:36s} {build_s:8.1f} {mem:8.0f} {batch_qps:10.1f} {single_qps:10.1f} {recall:9.4f}")
    print("(TF op row: build_s is the load time from the saved directory, mem_MiB the RSS growth of loading)")
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS of this process {peak_gb:.2f} GiB; ScaNN directory {size_mb * 2**20 / args.num_blocks:.1f} "
          f"bytes per block (embeddings {4 * args.dim} bytes per block in index_dir/<version>/embeddings.npy)")
    # One line for benchmarks/scale_plan.py.
    print("SUMMARY " + json.dumps({
        "num_blocks": args.num_blocks, "dim": args.dim, "peak_rss_gib": peak_gb, "scann_dir_mib": size_mb,
        "scann_build_s": index.build_seconds, "tuning_s": (tuning or {}).get("seconds", 0.0),
        "tf_op_qps": results[2][3], "tf_op_single_qps": results[2][4], "tf_op_recall": results[2][5],
        "pybind_qps": results[1][3]}))
    if args.target_recall > 0 and args.num_blocks == 1_000_000:  # the million-vector record (not a scaling run)
        recall = min(results[1][5], results[2][5])
        tuning_s = (tuning or {}).get("seconds", 0.0)
        result_records.write(
            "retrieval-scann-target-recall", area="Retrieval and the MIPS index", order=40,
            verdict="holds" if recall >= args.target_recall and index.build_seconds < 60 else "negative",
            claim=f"ScaNN's search settings tuned to a target recall give fast search at recall@{k} ≥ "
                  f"{args.target_recall:g} on a million vectors, with a build under a minute.",
            figure=f"{args.num_blocks / 1e6:g}M × {args.dim} synthetic: TF op {results[2][3] / 1e3:.1f}k QPS batched, "
                   f"pybind {results[1][3] / 1e3:.1f}k, single-query {results[1][4] / 1e3:.1f}k; recall@{k} "
                   f"{recall:.4f} on new queries; build {index.build_seconds:.1f} s incl. {tuning_s:.1f} s tuning")


if __name__ == "__main__":
    main()
