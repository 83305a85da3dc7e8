"""RETRO (Borgeaud et al., 2021) and kNN-LM (Khandelwal et al., 2020) on the bundled passages (issue #18):
bits-per-byte on held-out documents with and without retrieval, by leakage threshold α (RETRO §2.6), next to
training throughput, the chunk database's build time and size, and retrieval latency per chunk.

Stages (each recorded in ``<out>/stages.json`` when it completes and skipped on a rerun; a training stage killed
midway resumes from its checkpoint, so the script continues in a later session; on a new machine it first runs
``realm-tf preprocess`` and ``build-chunk-database``):

1. ``database``: the chunk database (``retro.chunks_dir``; built if its manifest is missing): counts, build time
   (from its manifest), size on disk of the chunks and of the index version;
2. ``baseline``: ``realm-tf train-retro --baseline`` (the decoder without RETRO blocks) for ``--steps``;
3. ``retro``: ``realm-tf train-retro``: the same decoder with RETRO blocks, same data order, same steps;
4. ``retro_fit``: ``train-retro`` with ``retro.retro_fit_from`` = the baseline, ``--fit_steps`` (RETRO §4.2);
5. ``knn_datastore``: ``realm-tf build-knn-datastore`` from the baseline (kNN-LM's keys and next tokens);
6. ``eval_*``: ``realm-tf evaluate-lm --split test`` for each model and database (``train_only``: training
   documents' chunks only; ``all_but_own``: every chunk but the evaluated document's own); kNN-LM's λ and T are
   tuned on the validation split inside ``evaluate-lm``;
7. ``latency``: retrieval per chunk (frozen-BERT embedding + ScaNN search, as in generation; stored-key search, as
   in training) and the time to search every training chunk's neighbours once (the input pipeline's table);
8. ``generate``: ``realm-tf generate`` for three prompts, with the neighbours that conditioned each chunk.

    nohup .venv/bin/python benchmarks/retro_benchmark.py --out runs/bench/retro > runs/bench/retro.log 2>&1 &
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import numpy as np  # noqa: E402

from realm_tf import config as config_lib  # noqa: E402
from realm_tf.index import index_publisher  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)
import scalar_windows  # noqa: E402  (benchmarks/)

ALPHAS = ("0.0", "0.125", "0.25", "0.5", "1.0")  # the keys of evaluate-lm's JSON (α <= these)
PROMPTS = ("The Eiffel Tower is a wrought-iron lattice tower in Paris. It was designed by",
           "The 2008 Summer Olympics were held in Beijing, China. The games",
           "Photosynthesis is the process by which plants")


def disk_bytes(path: str) -> int:
    """Bytes of the files under ``path``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def database_facts(manifest_path: str, index_dir: str) -> dict[str, Any]:
    """Counts, build time (from the chunk database's manifest) and bytes on disk of the database and its index."""
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    index_path = index_publisher.version_dir(index_dir, manifest["index_version"])
    return {"chunks": manifest["num_chunks"], "documents": manifest["counts"]["documents_chunked"],
            "tokens": manifest["counts"]["tokens_chunked"], "build_seconds": manifest["seconds"],
            "chunks_bytes": disk_bytes(os.path.dirname(manifest_path)), "index_bytes": disk_bytes(index_path)}


def training_scalars(model_dir: str) -> dict[str, float]:
    """Means over a finished run of its TensorBoard throughput (past the first window, which includes tracing),
    and its last windows' training bits-per-byte."""
    scalars = scalar_windows.read_scalars(os.path.join(model_dir, "train"))
    out = {}
    for tag in ("tokens_per_second", "steps_per_second"):
        values = [v for _, v in sorted(scalars.get(tag, {}).items())][1:]
        out[tag] = float(np.mean(values)) if values else float("nan")
    last = [v for _, v in sorted(scalars.get("bits_per_byte", {}).items())][-10:]
    out["train_bits_per_byte_last_windows"] = float(np.mean(last)) if last else float("nan")
    return out


def measure_latency(cfg: config_lib.ExperimentConfig, count: int) -> dict[str, Any]:
    """Milliseconds per chunk of retrieval (RETRO's neighbours of one chunk), and the training table's build."""
    from realm_tf.retro import retro_lm  # pylint: disable=import-outside-toplevel

    task = retro_lm.RetroLmTask(cfg)
    retriever = task.retriever
    allowed = task.allowed_chunks("train_only")
    test = np.flatnonzero(task.chunk_splits == "test")[:count]  # [count]
    chunk_length = cfg.retro.chunk_length
    tokens = [task.store.tokens(int(c)) for c in test]
    tokens = [t for t in tokens if len(t) == chunk_length]
    retriever.embed(np.stack(tokens[:2]))  # warm-up (first calls trace)
    started = time.perf_counter()
    for t in tokens:  # generation: one new chunk at a time, embedded then searched
        retriever.nearest(retriever.embed(t[None]), -1, cfg.retro.num_neighbours, allowed)
    one = (time.perf_counter() - started) / len(tokens)
    per_sequence = cfg.retro.sequence_length // chunk_length
    batch = np.stack(tokens[:per_sequence * (len(tokens) // per_sequence)])
    started = time.perf_counter()
    for i in range(0, len(batch), per_sequence):  # a sequence's chunks at once
        retriever.nearest(retriever.embed(batch[i:i + per_sequence]), -1, cfg.retro.num_neighbours, allowed)
    batched = (time.perf_counter() - started) / len(batch)
    started = time.perf_counter()
    retriever.neighbours_of_chunks(test, allowed=allowed)
    stored = (time.perf_counter() - started) / len(test)
    started = time.perf_counter()
    table = task.neighbour_table("train", "train_only")
    table_seconds = time.perf_counter() - started
    return {"embed_and_search_ms_per_chunk_batch1": 1000 * one,
            f"embed_and_search_ms_per_chunk_batch{per_sequence}": 1000 * batched,
            "stored_key_search_ms_per_chunk": 1000 * stored,
            "training_table_chunks": int((table[:, 0] >= 0).sum()), "training_table_seconds": table_seconds,
            "chunks_timed": len(tokens)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", default="runs/bench/retro", help="run directory (models, datastore, results)")
    parser.add_argument("--steps", type=int, default=1000, help="training steps of the baseline and of RETRO")
    parser.add_argument("--fit_steps", type=int, default=250, help="RETRO-fitting steps (paper: a few %% of the "
                                                                   "baseline's)")
    parser.add_argument("--latency_chunks", type=int, default=128)
    args = parser.parse_args()

    out = args.out
    os.makedirs(out, exist_ok=True)
    overrides = [f"retro.knn_dir={out}/knn", f"retro_trainer.steps={args.steps}",
                 "retro_trainer.checkpoint_every_steps=100", "retro_trainer.summary_every_steps=10",
                 *args.overrides]
    cfg = config_lib.load_config(args.config, overrides)
    sets = ["--config", args.config, *sum((["--set", o] for o in overrides), [])]
    retro = cfg.retro
    tokens_per_step = cfg.data.batch_size * retro.sequence_length
    print(f"config: decoder {retro.decoder_layers} layers x {retro.decoder_width} ({retro.decoder_heads} heads, "
          f"ffw {retro.decoder_intermediate}), n {retro.sequence_length}, m {retro.chunk_length}, k "
          f"{retro.num_neighbours}, batch {cfg.data.batch_size} ({tokens_per_step} token positions per step), "
          f"{args.steps} steps (fit {args.fit_steps}), lr {cfg.retro_trainer.learning_rate}, os.cpu_count "
          f"{os.cpu_count()}", flush=True)

    stage = stages.Stages(out)

    manifest_path = os.path.join(retro.chunks_dir, "manifest.json")

    def database() -> dict[str, Any]:
        if not os.path.exists(manifest_path):
            if not os.path.exists(os.path.join(cfg.data.blocks_dir, "manifest.json")):
                stages.cli(["preprocess", *sets, "--input", cfg.data.corpus_pattern, "--output", cfg.data.blocks_dir])
            stages.cli(["build-chunk-database", *sets])
        return database_facts(manifest_path, retro.index_dir)

    stage("database", database)
    db = database_facts(manifest_path, retro.index_dir)  # read again: the database may have been built by hand

    def train(name: str, extra: list[str]) -> dict[str, Any]:
        model_dir = f"{out}/{name}"
        started = time.time()
        stages.cli(["train-retro", *sets, "--set", f"retro_trainer.model_dir={model_dir}", *extra])
        return {"model_dir": model_dir, "wall_seconds": time.time() - started, **training_scalars(model_dir)}

    runs = {"baseline": stage("baseline", lambda: train("baseline", ["--baseline"])),
            "retro": stage("retro", lambda: train("retro", [])),
            "retro_fit": stage("retro_fit", lambda: train("retro_fit", [
                "--set", f"retro.retro_fit_from={out}/baseline", "--set", f"retro_trainer.steps={args.fit_steps}",
                "--set", f"retro_trainer.warmup_steps={max(args.fit_steps // 10, 1)}"]))}
    stage("knn_datastore", lambda: stages.cli(["build-knn-datastore", *sets, "--model-dir", f"{out}/baseline"]))

    def evaluate(name: str, model: str, database_name: str, extra: list[str]) -> dict[str, Any]:
        output = stages.cli(["evaluate-lm", *sets, "--model", f"{out}/{model}", "--split", "test", "--database",
                      database_name, *extra], capture=True)
        print(output, flush=True)
        result = json.loads(output.strip().splitlines()[-1])
        config_lib.atomic_write_text(f"{out}/eval-{name}.json", json.dumps(result, indent=2) + "\n")
        return result

    rows: dict[str, dict[str, Any]] = {}
    for database_name in ("train_only", "all_but_own"):
        suffix = "" if database_name == "train_only" else "_all_but_own"
        found = stage(f"eval_baseline{suffix}", lambda d=database_name: evaluate(
            f"baseline-{d}", "baseline", d, ["--baseline", "--knn"]))
        rows[f"baseline ({database_name})"] = found["bpb"]
        rows[f"baseline + kNN-LM (λ={found['knn_lambda']:g}, T={found['knn_temperature']:g})"
             f" ({database_name})"] = found["knn_bpb"]
        rows[f"RETRO, retrieval on ({database_name})"] = stage(f"eval_retro{suffix}", lambda d=database_name: (
            evaluate(f"retro-{d}", "retro", d, [])))["bpb"]
        if database_name == "train_only":  # no neighbours: the database does not matter but for α
            rows["RETRO, retrieval off"] = stage("eval_retro_off", lambda: evaluate(
                "retro-off", "retro", "train_only", ["--retrieval-off"]))["bpb"]
        rows[f"RETRO-fitted baseline ({database_name})"] = stage(
            f"eval_retro_fit{suffix}", lambda d=database_name: evaluate(f"retro_fit-{d}", "retro_fit", d, []))["bpb"]

    latency = stage("latency", lambda: measure_latency(cfg, args.latency_chunks))
    generated = stage("generate", lambda: stages.cli(
        ["generate", *sets, "--model", f"{out}/retro", "--max-tokens", "64", "--database", "all",
         *sum((["--prompt", p] for p in PROMPTS), [])], capture=True))

    chunks_of = stage.result("eval_retro")["chunks"]
    print(f"\n== RETRO / kNN-LM benchmark: bits-per-byte on the {chunks_of['1.0']} test chunks of held-out "
          f"documents ({stage.result('eval_retro')['bytes']:,} bytes), by leakage α (chunks with overlap "
          f"r(C) <= α; counts under each database) ==")
    print(f"{'model (database)':<58}" + "".join(f"{'α<=' + a:>10}" for a in ALPHAS))
    for name, bpb in rows.items():
        print(f"{name:<58}" + "".join(f"{bpb[a]:>10.4f}" if bpb[a] == bpb[a] else f"{'-':>10}" for a in ALPHAS))
    for d, key in (("train_only", "eval_retro"), ("all_but_own", "eval_retro_all_but_own")):
        print(f"{'chunks at α (' + d + ')':<58}" + "".join(f"{stage.result(key)['chunks'][a]:>10}" for a in ALPHAS))
    for name, run in runs.items():
        print(f"training {name}: {run['tokens_per_second']:.0f} real tokens/s, {run['steps_per_second']:.3f} "
              f"steps/s (TensorBoard means), {run['wall_seconds'] / 60:.1f} min wall; training bpb (last windows) "
              f"{run['train_bits_per_byte_last_windows']:.3f}")
    print(f"chunk database: {db['documents']:,} documents, {db['tokens']:,} tokens -> {db['chunks']:,} chunks; "
          f"build {db['build_seconds']['total'] / 60:.1f} min (pipeline {db['build_seconds']['pipeline']:.0f} s, "
          f"index {db['build_seconds']['index']:.0f} s); on disk: chunks {db['chunks_bytes'] / 2**20:.1f} MiB, "
          f"index version {db['index_bytes'] / 2**20:.1f} MiB")
    print("retrieval latency: " + ", ".join(f"{k} {v:.3g}" for k, v in latency.items()))
    print("kNN-LM datastore: " + f"{stage.result('eval_baseline')['knn_entries']:,} entries, built in "
          f"{stage.state['knn_datastore']['minutes']:.1f} min")
    print("\n" + generated.strip())
    print("stage minutes: " + stage.minutes())

    def bpb(row: dict[str, float], alphas: tuple[str, ...]) -> str:
        return " / ".join(f"{row[a]:.4f}" for a in alphas)

    leakage = ALPHAS[1:]  # α ≤ 0.125 / 0.25 / 0.5 / 1.0
    found = stage.result("eval_baseline")
    baseline, knn = found["bpb"], found["knn_bpb"]
    result_records.write(
        "retro-knn-lm-gain", area="RETRO and kNN-LM", order=10,
        verdict="holds" if all(knn[a] < baseline[a] for a in leakage) else "negative",
        claim="kNN-LM over the baseline's training-set datastore lowers held-out bits per byte at every leakage level "
              "(UTF-8 bytes of the detokenised text).",
        figure=f"{chunks_of['1.0']:,} test chunks, bpb at α ≤ {' / '.join(leakage)}: baseline "
               f"{bpb(baseline, leakage)}; + kNN-LM {bpb(knn, leakage)}")
    ends = ("0.125", "1.0")  # the least leaked chunks, and all
    retro_bpb, off, fitted = (stage.result(key)["bpb"] for key in ("eval_retro", "eval_retro_off", "eval_retro_fit"))
    beats = all(retro_bpb[a] < baseline[a] and retro_bpb[a] < off[a] for a in ends)
    result_records.write(
        "retro-vs-baseline", area="RETRO and kNN-LM", order=20, verdict="holds" if beats else "negative",
        claim=f"RETRO trained {args.steps:,} steps from scratch {'beats' if beats else 'does not beat'} its baseline "
              "and its own retrieval-off score.",
        figure=f"bpb at α ≤ 0.125 / all: RETRO {bpb(retro_bpb, ends)}, retrieval off {bpb(off, ends)}, baseline "
               f"{bpb(baseline, ends)}, RETRO-fitted baseline {bpb(fitted, ends)}")
    per_sequence = cfg.retro.sequence_length // cfg.retro.chunk_length
    batched = latency.get(f"embed_and_search_ms_per_chunk_batch{per_sequence}", float("nan"))
    stored = latency["stored_key_search_ms_per_chunk"]
    training_ms = 1000 / (runs["retro"]["steps_per_second"] * cfg.data.batch_size * per_sequence)  # per chunk
    result_records.write(
        "retro-retrieval-cost", area="RETRO and kNN-LM", order=50,
        verdict="holds" if stored < training_ms / 10 else "negative",
        claim=f"Retrieval is cheap next to the model: a neighbour search over stored keys takes {stored:.3g} ms per "
              f"chunk, against {training_ms:.3g} ms per chunk of RETRO training.",
        figure=f"{stored:.3f} ms per chunk with stored keys; {latency['embed_and_search_ms_per_chunk_batch1']:.1f} ms "
               f"(batch 1) / {batched:.0f} ms (batch {per_sequence}) to embed and search; {db['chunks']:,}-chunk "
               f"database in {db['build_seconds']['total'] / 60:.1f} min; {found['knn_entries']:,}-entry datastore in "
               f"{stage.state['knn_datastore']['minutes']:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
