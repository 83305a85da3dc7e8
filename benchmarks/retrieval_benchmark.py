"""Retrieval accuracy@k and gold-block recall@k on the held-out split of the bundled questions.

Compares retrievers over the same blocks (REALM §4.1 corpus format, from ``beam_jobs/preprocess_corpus``):
dense retrievers given as retriever SavedModel exports (``embed_query`` / ``embed_block``; search is
exact, so the figures measure the embeddings, not the ANN), and BM25 (``bm25s``) as the classic baseline.

    python benchmarks/retrieval_benchmark.py --blocks runs/bench/blocks \\
        --dense zero_shot_cls=runs/bench/export_cls/0 --bm25

Block embeddings are cached per export in ``--cache_dir``, or read from a published index version with
``--dense NAME=EXPORT_DIR,INDEX_VERSION_DIR`` (questions embedded by the export, blocks taken from the version's
``embeddings.npy``: e.g. a fine-tuned query tower over the frozen document embeddings it was trained against, as in
ORQA; the version must cover the same blocks). Only dev questions are used: those with
``question_split.is_dev(id, --dev_fraction)`` (the split every realm_tf job holds out).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402,F401  (registers the tokenizer ops of the SavedModel)
import tqdm  # noqa: E402

from realm_tf.data import example_schemas  # noqa: E402
from realm_tf.data import question_split  # noqa: E402
from realm_tf.export import retriever_export  # noqa: E402
from realm_tf.index import bm25_retriever  # noqa: E402
from realm_tf.index import brute_force_index  # noqa: E402
from realm_tf.index import index_publisher  # noqa: E402
from realm_tf.tasks import qa_metrics  # noqa: E402

import result_records  # noqa: E402  (benchmarks/)


def read_blocks(blocks_dir: str) -> dict[str, list]:
    files = sorted(tf.io.gfile.glob(os.path.join(blocks_dir, "blocks-*.tfrecord*")))
    if not files:
        raise FileNotFoundError(f"no blocks-*.tfrecord in {blocks_dir}")
    spec = {k: example_schemas.block_feature_spec()[k] for k in
            (example_schemas.BLOCK_ID, example_schemas.TITLE, example_schemas.TEXT, example_schemas.DOC_ID)}
    rows: dict[int, tuple[str, str, str]] = {}
    for batch in tf.data.TFRecordDataset(files).batch(1024).map(lambda s: tf.io.parse_example(s, spec)):
        for i, t, x, d in zip(*(batch[k].numpy() for k in (example_schemas.BLOCK_ID, example_schemas.TITLE,
                                                            example_schemas.TEXT, example_schemas.DOC_ID))):
            rows[int(i)] = (t.decode(), x.decode(), d.decode())
    if sorted(rows) != list(range(len(rows))):
        raise ValueError(f"{blocks_dir}: block ids are not dense 0..{len(rows) - 1}")
    return {"title": [rows[i][0] for i in range(len(rows))], "text": [rows[i][1] for i in range(len(rows))],
            "doc_id": [rows[i][2] for i in range(len(rows))]}


def read_dev_questions(path: str, dev_fraction: float) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        questions = [json.loads(line) for line in f]
    return [q for q in questions if question_split.is_dev(q["id"], dev_fraction)]


def embed_blocks(export_path: str, model: tf.Module, blocks: dict[str, list], batch_size: int,
                 cache_dir: str) -> np.ndarray:
    meta = retriever_export.read_export_metadata(export_path)
    key = hashlib.sha1(f"{os.path.abspath(export_path)}|{meta['exported_at']}|{len(blocks['text'])}".encode())
    cache = os.path.join(cache_dir, f"blocks-{key.hexdigest()[:16]}.npy")
    if os.path.exists(cache):
        return np.load(cache, allow_pickle=False)
    fn = model.signatures["embed_block"]
    order = np.argsort([len(t) + len(x) for t, x in zip(blocks["title"], blocks["text"])])  # similar lengths
    out = np.zeros([len(order), meta["embedding_dim"]], np.float32)
    start = time.time()
    for i in tqdm.trange(0, len(order), batch_size, desc=f"embed {os.path.basename(export_path)}", mininterval=10):
        rows = order[i:i + batch_size]
        out[rows] = fn(title=tf.constant([blocks["title"][r] for r in rows]),
                       text=tf.constant([blocks["text"][r] for r in rows]))["embedding"].numpy()
    print(f"embedded {len(order)} blocks in {time.time() - start:.0f}s "
          f"({len(order) / (time.time() - start):.1f} blocks/s)", flush=True)
    os.makedirs(cache_dir, exist_ok=True)
    np.save(cache, out, allow_pickle=False)
    return out


def embed_questions(model: tf.Module, questions: list[dict]) -> np.ndarray:
    fn = model.signatures["embed_query"]
    return np.concatenate([fn(text=tf.constant([q["question"] for q in questions[i:i + 64]]))["embedding"].numpy()
                           for i in range(0, len(questions), 64)])  # [num_questions, dim]


def dense_retrieve(queries: np.ndarray, block_embeddings: np.ndarray, k: int) -> np.ndarray:
    """Exact MIPS (BruteForceIndex): top-k rows by inner product, best first. ``queries`` [num_questions, dim]."""
    index = brute_force_index.BruteForceIndex()
    index.build(block_embeddings)
    return index.search_batched(queries, k)[0]


def scann_retrieve(queries: np.ndarray, block_embeddings: np.ndarray, k: int) -> tuple[np.ndarray, dict]:
    """The same search through ScannIndex with IndexConfig's defaults scaled to the corpus."""
    from realm_tf import config
    from realm_tf.index import scann_index

    index = scann_index.ScannIndex(config.IndexConfig(num_neighbors=k))
    index.build(block_embeddings)
    rows, _ = index.search_batched(queries, k)
    return rows, index.params


def bm25_retrieve(questions: list[dict], blocks: dict[str, list], k: int) -> np.ndarray:
    retriever = bm25_retriever.Bm25Retriever(blocks["title"], blocks["text"])
    rows, _ = retriever.search([q["question"] for q in questions], k)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", required=True, help="output dir of beam_jobs/preprocess_corpus")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--dev_fraction", type=float, default=0.1)
    parser.add_argument("--dense", action="append", default=[], metavar="NAME=EXPORT_DIR[,INDEX_VERSION_DIR]",
                        help="a retriever export to evaluate (repeatable); with an index version, its block "
                             "embeddings instead of embedding the blocks with the export")
    parser.add_argument("--bm25", action="store_true", help="also evaluate BM25 (bm25s)")
    parser.add_argument("--scann", action="store_true",
                        help="also search each dense retriever through ScannIndex; print its recall@10 vs exact")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--cache_dir", default="runs/bench/cache")
    parser.add_argument("--max_k", type=int, default=100)
    args = parser.parse_args(argv)

    blocks = read_blocks(args.blocks)
    questions = read_dev_questions(args.questions, args.dev_fraction)
    matcher = qa_metrics.AnswerMatcher(blocks["text"])
    answers = [q["answers"] for q in questions]
    gold = [q.get("gold_passage_ids", []) for q in questions]
    print(f"{len(blocks['text'])} blocks, {len(questions)} dev questions (dev_fraction={args.dev_fraction})")
    results = []
    if args.bm25:
        start = time.time()
        rows = bm25_retrieve(questions, blocks, args.max_k)
        results.append(("bm25", rows, time.time() - start))
    for spec in args.dense:
        name, _, paths = spec.partition("=")
        path, _, version_dir = paths.partition(",")
        start = time.time()
        model = tf.saved_model.load(path)
        if version_dir:
            emb = index_publisher.read_embeddings(version_dir)  # [num_blocks, dim]
            if len(emb) != len(blocks["text"]):
                raise ValueError(f"{version_dir}: {len(emb)} block embeddings for {len(blocks['text'])} blocks in "
                                 f"{args.blocks}")
        else:
            emb = embed_blocks(path, model, blocks, args.batch_size, args.cache_dir)
        queries = embed_questions(model, questions)
        rows = dense_retrieve(queries, emb, args.max_k)
        results.append((name, rows, time.time() - start))
        if args.scann:
            start = time.time()
            scann_rows, params = scann_retrieve(queries, emb, args.max_k)
            recall = np.mean([len(set(a[:10]) & set(b[:10])) / 10 for a, b in zip(scann_rows, rows)])
            print(f"{name}: ScaNN {params} recall@10 vs exact {recall:.4f}")
            results.append((name + "+scann", scann_rows, time.time() - start))
    ks = [k for k in qa_metrics.DEFAULT_KS if k <= args.max_k]
    header = f"{'retriever':<22}" + "".join(f"{'acc@' + str(k):>9}" for k in ks) + \
        "".join(f"{'gold@' + str(k):>9}" for k in ks) + f"{'seconds':>9}"
    print(header)
    scores: dict[str, dict[str, float]] = {}  # retriever -> its metrics
    for name, rows, seconds in results:
        m = scores[name] = qa_metrics.qa_metrics(rows, matcher, answers, blocks["doc_id"], gold, ks)
        print(f"{name:<22}" + "".join(f"{m[f'accuracy@{k}']:>9.3f}" for k in ks)
              + "".join(f"{m[f'gold_recall@{k}']:>9.3f}" for k in ks) + f"{seconds:>9.0f}", flush=True)
    exact = [name for name in scores if not name.endswith("+scann")]
    # The record: the last dense retriever given, against the others (a --scann run measures the index instead).
    if exact and exact[-1] != "bm25" and args.max_k >= 20 and not args.scann:
        measured, others = exact[-1], exact[:-1]

        def accuracies(name: str) -> str:
            return " / ".join(f"{scores[name][f'accuracy@{k}']:.3f}" for k in (1, 5, 20))

        best = (all(scores[measured]["accuracy@1"] > scores[o]["accuracy@1"] for o in others) if others
                else scores[measured]["accuracy@1"] > 0.5)
        result_records.write(
            "retrieval-accuracy-dev", area="Retrieval and the MIPS index", order=10,
            verdict="holds" if best else "negative",
            claim=f"The {measured} retriever puts a block holding the answer first for "
                  + (f"more dev questions than {', '.join(others)}." if others else "most dev questions."),
            figure=f"{len(questions)} dev questions, {len(blocks['text']):,} blocks: acc@1 "
                   f"{scores[measured]['accuracy@1']:.3f}, acc@5 {scores[measured]['accuracy@5']:.3f}, acc@20 "
                   f"{scores[measured]['accuracy@20']:.3f}"
                   + (f" ({'; '.join(f'{o} {accuracies(o)}' for o in others)})" if others else ""))


if __name__ == "__main__":
    main()
