"""Throughput of the corpus -> blocks Beam job (REALM §4.1 knowledge corpus; beam_jobs/preprocess_corpus).

Preprocesses the whole bundled corpus (``data/open_qa/passages.jsonl.gz``, 10,163 Wikipedia passages) into
blocks of at most 288 wordpieces with the MiniLM vocabulary on the DirectRunner, once single-process and once
with ``--direct_num_workers=2 --direct_running_mode=multi_processing``, and prints documents/s and blocks/s
(wall time of the whole job: pipeline start-up, reading, tokenizing, packing, writing, manifest).

Usage: python benchmarks/preprocess_throughput.py [--input GLOB] [--max_block_length 288]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import realm_tf  # noqa: F401,E402  pylint: disable=wrong-import-position

# isort: split
import apache_beam as beam  # noqa: E402  pylint: disable=wrong-import-position

from beam_jobs import preprocess_corpus  # noqa: E402  pylint: disable=wrong-import-position
from realm_tf.data import job_manifest  # noqa: E402  pylint: disable=wrong-import-position

import result_records  # noqa: E402  pylint: disable=wrong-import-position  (benchmarks/)

_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data", "open_qa",
                       "passages.jsonl.gz")
_MODES = [
    ("DirectRunner, 1 process", []),
    ("DirectRunner, 2 workers multi_processing", ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]),
]


def _run(corpus: str, max_block_length: int, beam_args: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as output:
        argv = ["--input", corpus, "--output", output, "--set", f"data.max_block_length={max_block_length}",
                "--progress-interval", "0", *beam_args]
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            preprocess_corpus.run(argv)
        seconds = time.perf_counter() - start
        return seconds, job_manifest.read_manifest(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--input", default=os.path.normpath(_CORPUS))
    parser.add_argument("--max_block_length", type=int, default=288)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    print(f"corpus: {os.path.relpath(args.input)}; max_block_length={args.max_block_length}; "
          f"Beam {beam.__version__}; Python {platform.python_version()}; {os.cpu_count()} CPUs; "
          "load average at start: {:.1f}".format(load_start))
    print(f"{'mode':<42} {'documents':>9} {'blocks':>7} {'seconds':>8} {'docs/s':>8} {'blocks/s':>9}")
    timings: list[float] = []  # seconds of each mode of _MODES
    for name, beam_args in _MODES:
        seconds, manifest = _run(args.input, args.max_block_length, beam_args)
        timings.append(seconds)
        documents, blocks = manifest["documents"], manifest["blocks"]
        print(f"{name:<42} {documents:>9,} {blocks:>7,} {seconds:>8.1f} {documents / seconds:>8.0f} "
              f"{blocks / seconds:>9.0f}", flush=True)
    print(f"input lines {manifest['input_lines']:,}, duplicates merged {manifest['duplicates_merged']:,}, "
          f"dead letters {manifest['dead_letters_total']:,} {manifest['dead_letters']}")
    print("load average (1/5/15 min) at the end: {:.1f} {:.1f} {:.1f} (other processes share the CPUs)"
          .format(*os.getloadavg()))
    single, workers = timings
    result_records.write(
        "data-preprocess-throughput", area="Data pipeline", order=10, verdict="holds" if single < 60 else "negative",
        claim=f"The Beam preprocessing job cuts the whole bundled corpus into {args.max_block_length}-wordpiece blocks "
              f"in seconds; multi_processing workers are {'slower' if workers > single else 'faster'} at this size.",
        figure=f"{documents:,} documents → {blocks:,} blocks in {single:.1f} s ({blocks / single:.0f} blocks/s), "
               f"1 process on a {os.cpu_count()}-CPU machine (load ~{load_start:.0f}); 2 multi_processing workers "
               f"{workers:.1f} s")


if __name__ == "__main__":
    main()
