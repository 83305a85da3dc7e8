"""Block-embedding throughput of REALM's index builder (Guu et al., 2020, §3.4): Beam job vs in-process.

The asynchronous refresh re-embeds every block of the corpus with the latest Embed_doc; its cost is the
document tower's forward pass over ~13M blocks for Wikipedia, so the Beam job must not waste compute around
the model. With the MiniLM config (``configs/minilm.yaml``: 6 layers, 384 wide, 12 heads, FFN 1536,
288-wordpiece blocks; the retriever exported from the init weights with ``retriever_export``) this measures,
on ``--num_blocks`` blocks of the bundled corpus:

1. ``python -m beam_jobs.embed_blocks`` in its own process on the DirectRunner (``--batching length``, batch =
   ``--batch-size``; the job's own default workers and threads, or the job flags after ``--``): wall time of
   the pipeline incl. start-up, SavedModel load and shard writing (``embed_seconds``), and of the whole
   process (Python start-up, imports, assemble + index build + publish added);
2. the same SavedModel's ``embed_block`` signature called in this process with the same batch size (one
   caller, TensorFlow's default threads), over the blocks in file order and again sorted by length (steady
   state: the load and one warm-up batch are not timed);
3. numpy float32 matmul (2048 x 2048 @ 2048 x 2048, best of 5) as the machine's sgemm reference.

**Useful FLOPs** count only real (unpadded) wordpieces: a block of ``n`` wordpieces ([CLS]/[SEP] included,
after REALM's truncation to 288) costs, for ``L`` layers of width ``H``, FFN width ``I``, projection ``P``::

    FLOPs(n) = L * (2 * n * (4*H*H + 2*H*I)  +  4 * n*n * H)  +  2 * H * P
               ^ Q, K, V, output and both FFN     ^ Q.K^T and attention.V     ^ [CLS] projection
               matmuls: 2 FLOPs per parameter     (2*n*H each per token)
               per token

(embedding lookups, LayerNorm, softmax, GELU and biases are not counted). Blocks come from
``beam_jobs/preprocess_corpus`` run on the bundled corpus (the first ``--num_blocks``, renumbered 0..N-1);
if that job fails, from passages packed here with ``realm_tf.data.block_packer`` (whole passage as one
sentence, cut at word boundaries).

Usage: python benchmarks/embed_throughput.py [--num_blocks 800] [--batch-size 16] [--workdir /tmp/embed_bench]
[--set model.compiled_inference=true] [--profile] [-- JOB FLAGS, e.g. --direct_running_mode=multi_processing
--direct_num_workers=2]
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import realm_tf  # noqa: F401  pylint: disable=wrong-import-position,unused-import  (TF env before TF loads)

import machine_reference  # noqa: E402  pylint: disable=wrong-import-position  (benchmarks/machine_reference.py)
import op_profile  # noqa: E402  pylint: disable=wrong-import-position  (benchmarks/op_profile.py)
import result_records  # noqa: E402  pylint: disable=wrong-import-position  (benchmarks/)

# isort: split
import apache_beam as beam  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
import tensorflow as tf  # pylint: disable=wrong-import-position
import tensorflow_text  # noqa: F401  pylint: disable=wrong-import-position,unused-import

from beam_jobs import job_support  # pylint: disable=wrong-import-position
from realm_tf import config as config_lib  # pylint: disable=wrong-import-position
from realm_tf.data import block_packer  # pylint: disable=wrong-import-position
from realm_tf.data import example_schemas  # pylint: disable=wrong-import-position
from realm_tf.export import retriever_export  # pylint: disable=wrong-import-position
from realm_tf.index import index_publisher  # pylint: disable=wrong-import-position
from realm_tf.layers import bert_tokenizer  # pylint: disable=wrong-import-position
from realm_tf.models import knowledge_retriever  # pylint: disable=wrong-import-position

CORPUS = "data/open_qa/passages.jsonl.gz"


def block_flops(n: np.ndarray, enc: config_lib.EncoderConfig, projection: int) -> np.ndarray:
    """Useful FLOPs of embedding blocks of ``n`` real wordpieces (int array) with the formula above."""
    return (machine_reference.bert_row_flops(n, enc.num_layers, enc.hidden_size, enc.intermediate_size)
            + 2.0 * enc.hidden_size * projection)


def matmul_ceiling(enc: config_lib.EncoderConfig, rows: int, repeats: int = 5) -> list[tuple[str, float, float]]:
    """TensorFlow's float32 GFLOP/s on the encoder's dense matmuls for ``rows`` token rows (a batch's wordpieces):
    ``[(shape, GFLOP/s, share of a layer's dense FLOPs)]`` and, last, their FLOP-weighted rate ("all dense"). The
    best any BERT pass with these shapes can do on this machine, before attention and elementwise ops."""
    h, i = enc.hidden_size, enc.intermediate_size
    shapes = [("Q, K, V, output", h, h, 4), ("FFN in", h, i, 1), ("FFN out", i, h, 1)]
    out, total_flops, total_seconds = [], 0.0, 0.0
    for name, k, n, count in shapes:
        a, b = tf.random.normal([rows, k]), tf.random.normal([k, n])
        product = tf.function(tf.linalg.matmul)
        product(a, b).numpy()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(10):
                result = product(a, b)
            result.numpy()
            best = min(best, (time.perf_counter() - start) / 10)
        flops = 2.0 * rows * k * n
        out.append((f"{name} [{rows}x{k}]x[{k}x{n}]", flops / best / 1e9, count * flops))
        total_flops, total_seconds = total_flops + count * flops, total_seconds + count * best
    whole = sum(f for _, _, f in out)
    out = [(name, rate, flops / whole) for name, rate, flops in out]
    return out + [("all dense matmuls of a layer", total_flops / total_seconds / 1e9, 1.0)]


def blocks_from_preprocess(cfg_path: str, workdir: str, num_blocks: int) -> list[tuple[str, str]]:
    """(title, text) of the first ``num_blocks`` blocks (by block_id) written by beam_jobs/preprocess_corpus."""
    from beam_jobs import preprocess_corpus  # pylint: disable=import-outside-toplevel

    out = os.path.join(workdir, "preprocessed")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        preprocess_corpus.run(["--input", CORPUS, "--output", out, "--config", cfg_path, "--progress-interval", "0",
                               "--runner=DirectRunner"])
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "blocks-*.tfrecord"))):
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            row = job_support.parse_example(record, example_schemas.block_feature_spec())
            if row[example_schemas.BLOCK_ID] < num_blocks:
                rows.append((row[example_schemas.BLOCK_ID], row[example_schemas.TITLE].decode(),
                             row[example_schemas.TEXT].decode()))
    rows.sort()
    if len(rows) != num_blocks:
        raise RuntimeError(f"preprocess_corpus gave {len(rows)} of the first {num_blocks} block ids")
    return [(title, text) for _, title, text in rows]


def blocks_from_packer(tok: bert_tokenizer.BertTokenizer, num_blocks: int, max_length: int) -> list[tuple[str, str]]:
    """Passages packed into blocks here: whole body as one sentence, cut at word boundaries."""
    packer = block_packer.BlockPacker(max_length)
    vocab = tok.vocab
    blocks: list[tuple[str, str]] = []
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            body = row["text"].encode("utf-8")
            ids, starts, ends = (t.numpy() for t in (x[0] for x in tok.tokenize_with_offsets(tf.constant([body]))))
            title_length = int(tok(tf.constant([row["title"]])).row_lengths()[0])
            word_starts = [[not vocab[i].startswith("##") for i in ids]]
            for segments in packer.pack(title_length, word_starts):
                seg = segments[0]
                blocks.append((row["title"], body[starts[seg.start]:ends[seg.end - 1]].decode("utf-8")))
                if len(blocks) == num_blocks:
                    return blocks
    return blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_blocks", type=int, default=800)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--workdir", default="/tmp/embed_bench")
    parser.add_argument("--skip_sorted", action="store_true", help="skip the in-process length-sorted pass")
    parser.add_argument("--profile", action="store_true",
                        help="also run the sorted pass under the TensorFlow profiler and print the op types' shares "
                             "(the plain graph's ops; an XLA program is one op to the profiler)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides for the export (e.g. model.compiled_inference=true; use a new "
                             "--workdir per setting: an export found there is reused)")
    parser.add_argument("job_args", nargs="*", metavar="-- JOB_FLAG",
                        help="after --: more flags for the Beam job (its own, or Beam pipeline options)")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    load_start = os.getloadavg()
    cfg = config_lib.load_config(args.config, [f"refresh.export_dir={args.workdir}/export",
                                               f"index.index_dir={args.workdir}/index", *args.overrides])
    enc = cfg.model.encoder
    tok = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, cfg.model.lower_case)
    gflops_sgemm_before = machine_reference.sgemm_gflops()

    # ---- the export (MiniLM init weights) -------------------------------------------------------------
    start = time.time()
    if retriever_export.list_exports(cfg.refresh.export_dir):
        export = os.path.join(cfg.refresh.export_dir, str(retriever_export.list_exports(cfg.refresh.export_dir)[-1]))
    else:
        model = knowledge_retriever.build_knowledge_retriever(cfg.model)
        export = retriever_export.export_retriever(model, cfg, step=0, tokenizer=tok)
        del model
    export_seconds = time.time() - start

    # ---- the blocks -----------------------------------------------------------------------------------
    try:
        pairs = blocks_from_preprocess(args.config, args.workdir, args.num_blocks)
        source = "beam_jobs/preprocess_corpus blocks (first N by block_id)"
    except Exception as e:  # pylint: disable=broad-except
        print(f"preprocess_corpus unavailable ({type(e).__name__}: {e}); packing passages here", file=sys.stderr)
        pairs = blocks_from_packer(tok, args.num_blocks, cfg.model.block_seq_length)
        source = "passages packed with block_packer (one sentence per passage)"
    titles, texts = [p[0] for p in pairs], [p[1] for p in pairs]
    title_len = tok(tf.constant(titles)).row_lengths().numpy()  # [N]
    text_len = tok(tf.constant(texts)).row_lengths().numpy()  # [N]
    lengths = np.minimum(title_len + text_len + 3, cfg.model.block_seq_length)  # [N] real wordpieces per block
    flops = block_flops(lengths, enc, cfg.model.projection_size)  # [N]
    total_gflop = flops.sum() / 1e9

    blocks_dir = os.path.join(args.workdir, "blocks")
    shutil.rmtree(blocks_dir, ignore_errors=True)
    os.makedirs(blocks_dir)
    title_ids = tok(tf.constant(titles)).to_list()
    text_ids = tok(tf.constant(texts)).to_list()
    with tf.io.TFRecordWriter(os.path.join(blocks_dir, "blocks-00000-of-00001.tfrecord")) as writer:
        for i, (title, text) in enumerate(pairs):
            writer.write(example_schemas.to_example({
                example_schemas.BLOCK_ID: i, example_schemas.UID: example_schemas.block_uid(title, text),
                example_schemas.DOC_ID: title, example_schemas.BLOCK_INDEX: 0, example_schemas.TITLE: title,
                example_schemas.TEXT: text, example_schemas.TITLE_IDS: title_ids[i],
                example_schemas.BODY_IDS: text_ids[i]}))
    with open(os.path.join(blocks_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"blocks": len(pairs), "vocab_hash": tok.vocab_hash}, f)

    # ---- 1. the Beam job ------------------------------------------------------------------------------
    shutil.rmtree(cfg.index.index_dir, ignore_errors=True)
    # In its own process, as `python -m beam_jobs.embed_blocks` runs: TensorFlow's thread pools are set where
    # the job first loads the model, which a process that has already run TensorFlow (this one) cannot do.
    start = time.time()
    subprocess.run([sys.executable, "-m", "beam_jobs.embed_blocks", "--config", args.config, "--set",
                    f"index.index_dir={cfg.index.index_dir}", *[f"--set={o}" for o in args.overrides],
                    "--blocks", os.path.join(blocks_dir, "*.tfrecord"), "--export", export,
                    "--min-batch-size", str(args.batch_size), "--max-batch-size", str(args.batch_size),
                    "--progress-interval", "30", "--runner=DirectRunner", *args.job_args], check=True)
    job_total = time.time() - start
    path, summary = index_publisher.newest_version(cfg.index.index_dir, tok.vocab_hash)
    job_embed = summary["embed_seconds"]
    published = index_publisher.read_embeddings(path)  # [N, dim]
    counts = summary["counts"]

    # ---- 2. in-process --------------------------------------------------------------------------------
    loaded = tf.saved_model.load(export)
    embed = loaded.signatures["embed_block"]

    def in_process(order: np.ndarray) -> tuple[float, np.ndarray, int]:
        out = np.zeros_like(published)
        b = args.batch_size
        embed(title=tf.constant(titles[:b]), text=tf.constant(texts[:b]))  # warm-up, untimed
        padded = 0
        start = time.perf_counter()
        for i in range(0, len(order), b):
            idx = order[i:i + b]
            out[idx] = embed(title=tf.constant([titles[j] for j in idx]),
                             text=tf.constant([texts[j] for j in idx]))["embedding"].numpy()
            padded += len(idx) * int(lengths[idx].max())
        return time.perf_counter() - start, out, padded

    file_seconds, file_out, file_padded = in_process(np.arange(len(pairs)))
    sorted_seconds = sorted_padded = None
    if not args.skip_sorted:
        sorted_seconds, sorted_out, sorted_padded = in_process(np.argsort(lengths, kind="stable"))
        assert np.abs(sorted_out - file_out).max() <= 1e-4
    ops = ceiling = None
    if args.profile:
        # The matmuls by the layer they belong to (tf-models' names: query, key, value, attention_output,
        # intermediate, output; self_attention/einsum is Q·Kᵀ and einsum_1 is the probabilities times V).
        ops = op_profile.profile(lambda: in_process(np.argsort(lengths, kind="stable")), top=16, key=lambda name, op: (
            "einsum " + "/".join(name.split("/")[-3:-1]) if op == "_MklEinsum" else op))
        ceiling = matmul_ceiling(enc, int(round(args.batch_size * lengths.mean())))
    max_diff = float(np.abs(published - file_out).max())
    gflops_sgemm_after = machine_reference.sgemm_gflops()
    load_end = os.getloadavg()

    n = len(pairs)

    def row(name: str, seconds: float, padded: int | None) -> str:
        pad = f"{lengths.sum() / padded:9.1%}" if padded else f"{'':>9}"
        return (f"{name:<46}{seconds:9.1f}{n / seconds:10.2f}{total_gflop / seconds:13.1f}{pad}")

    print(f"model: {args.config} {args.overrides} (L={enc.num_layers}, H={enc.hidden_size}, I={enc.intermediate_size}, "
          f"heads={enc.num_attention_heads}, projection={cfg.model.projection_size}), init weights, export "
          f"{'reused' if export_seconds < 5 else f'written in {export_seconds:.0f}s'}")
    print(f"blocks: {n} from {source}; wordpieces per block mean {lengths.mean():.1f}, min {lengths.min()}, "
          f"max {lengths.max()}; useful work {total_gflop:,.0f} GFLOP ({total_gflop / n:.2f} per block)")
    print(f"job: {summary['runner']}, flags {' '.join(args.job_args) or '(defaults)'}; intra-op threads per "
          f"worker {summary['intra_op_threads'] or 'TensorFlow default'}")
    print(f"batch size {args.batch_size}; TF {tf.__version__}, Beam {beam.__version__}, numpy {np.__version__}, "
          f"Python {platform.python_version()}; {os.cpu_count()} CPUs; load average at start "
          f"{load_start[0]:.1f}, at end {load_end[0]:.1f}")
    print(f"{'mode':<46}{'seconds':>9}{'blocks/s':>10}{'useful GFLOP/s':>15}{'real/padded':>12}")
    print(row("Beam job, DirectRunner (embed_seconds)", job_embed, counts.get("padded_wordpieces")))
    print(row("Beam job, whole process (start to publish)", job_total, None))
    print(row("in-process embed_block, file order", file_seconds, file_padded))
    if sorted_seconds is not None:
        print(row("in-process embed_block, sorted by length", sorted_seconds, sorted_padded))
    print(f"numpy sgemm 2048^3 float32 ({machine_reference.sgemm_kernel()}): {gflops_sgemm_before:.1f} GFLOP/s "
          f"before, {gflops_sgemm_after:.1f} after")
    print(f"job / in-process (file order) blocks/s: {file_seconds / job_embed:.2f}x"
          + (f"; job / in-process (sorted): {sorted_seconds / job_embed:.2f}x" if sorted_seconds else ""))
    print(f"job counters: {json.dumps(counts, sort_keys=True)}; job wordpieces == useful wordpieces: "
          f"{counts.get('wordpieces') == int(lengths.sum())}")
    print(f"published index version {summary['version']} ({summary['kind']}, {summary['num_blocks']} x "
          f"{summary['dim']}); max |job - in-process| = {max_diff:.2e}; seconds: embed {job_embed:.1f}, assemble "
          f"{summary['assemble_seconds']:.2f}, build {summary['build_seconds']:.2f}")
    if ops:
        print("op time of one profiled sorted pass, by op type (einsums by layer):\n"
              + op_profile.format_breakdown(ops))
    if ceiling:
        print("TensorFlow float32 matmul at the encoder's shapes (a batch's mean wordpieces as rows), best of 5:")
        for name, rate, share in ceiling:
            print(f"    {name:<42} {rate:7.1f} GFLOP/s ({rate / gflops_sgemm_after:.0%} of sgemm)  "
                  f"{share:5.1%} of the dense FLOPs")
    if not args.job_args:  # the job as it runs by default
        rate = total_gflop / job_embed  # useful GFLOP/s of the Beam job
        sgemm = (gflops_sgemm_before, gflops_sgemm_after)
        low, high = rate / max(sgemm), rate / min(sgemm)
        result_records.write(
            "speed-embedding-throughput", area="Speed and memory", order=10,
            verdict="holds" if low >= 0.75 else "negative",
            claim="Bulk re-embedding of the corpus (the Beam job, its default workers and threads) runs at over three "
                  "quarters of the machine's sgemm rate.",
            figure=f"{n:,} blocks: {rate:.1f} useful GFLOP/s, {low:.1%}-{high:.1%} of the same run's sgemm")


if __name__ == "__main__":
    main()
