"""Salient-span pre-training examples and ICT examples on the whole bundled corpus (issue #3).

Makes knowledge-corpus blocks from ``data/open_qa/passages.jsonl.gz`` with ``beam_jobs/preprocess_corpus``
(or, when that job is not there, a minimal in-script packing with ``realm_tf/data/block_packer``), then runs
``beam_jobs/generate_pretraining_data`` (REALM §3.4 salient span masking) and ``beam_jobs/generate_ict_data``
(Inverse Cloze Task, Lee et al. 2019) on them with the DirectRunner, and prints:

* pre-training: blocks, queries, examples, the share of salient-span vs random-fallback masking, the label
  distribution of the masked spans, why candidate spans were rejected, mean masked wordpieces, examples/s;
* ICT: examples, the share whose sentence was removed from the context (target 0.9), examples/s.

Usage: python benchmarks/pretraining_data_stats.py [--config configs/minilm.yaml] [--workdir DIR] [--limit N]
       [--in_script_blocks]
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import realm_tf  # noqa: E402,F401  pylint: disable=wrong-import-position
from beam_jobs import generate_ict_data  # noqa: E402  pylint: disable=wrong-import-position
from beam_jobs import generate_pretraining_data  # noqa: E402  pylint: disable=wrong-import-position
from realm_tf import config as config_lib  # noqa: E402  pylint: disable=wrong-import-position
from realm_tf.data import inverse_cloze_task as ict  # noqa: E402  pylint: disable=wrong-import-position
from realm_tf.data import salient_span_masking  # noqa: E402  pylint: disable=wrong-import-position

import result_records  # noqa: E402  pylint: disable=wrong-import-position  (benchmarks/)

_REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
_PASSAGES = os.path.join(_REPO, "data", "open_qa", "passages.jsonl.gz")


def _make_blocks(passages: str, output: str, config_path: str, limit: int, in_script: bool) -> str:
    """Writes block TFRecords to ``output``; returns how they were made."""
    if limit:
        subset = os.path.join(output + "-input", "passages.jsonl.gz")
        os.makedirs(os.path.dirname(subset), exist_ok=True)
        with gzip.open(passages, "rt", encoding="utf-8") as f, gzip.open(subset, "wt", encoding="utf-8") as g:
            for i, line in zip(range(limit), f):
                g.write(line)
        passages = subset
    if not in_script and importlib.util.find_spec("beam_jobs.preprocess_corpus") is not None:
        from beam_jobs import preprocess_corpus  # pylint: disable=import-outside-toplevel

        preprocess_corpus.run(["--input", passages, "--output", output, "--config", config_path])
        return "beam_jobs/preprocess_corpus"
    _pack_in_script(passages, output, config_lib.load_config(config_path))
    return "in-script BlockPacker packing"


def _pack_in_script(passages: str, output: str, cfg: config_lib.ExperimentConfig) -> None:
    """Minimal stand-in for preprocess_corpus: sentence split, tokenize, greedy packing, one shard."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from realm_tf.data import block_packer  # pylint: disable=import-outside-toplevel
    from realm_tf.data import example_schemas as es  # pylint: disable=import-outside-toplevel
    from realm_tf.data import sentence_splitter  # pylint: disable=import-outside-toplevel
    from realm_tf.data import tokenized_text  # pylint: disable=import-outside-toplevel
    from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel

    tok = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, lower_case=cfg.model.lower_case)
    packer = block_packer.BlockPacker(cfg.data.max_block_length)
    splitter = sentence_splitter.SentenceSplitter()
    with gzip.open(passages, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    os.makedirs(output, exist_ok=True)
    block_id = 0
    with tf.io.TFRecordWriter(os.path.join(output, "blocks-00000-of-00001.tfrecord")) as writer:
        for doc in docs:
            (body,) = tokenized_text.TokenizedText.from_batch(tok, [doc["text"]])
            title_ids = tok(tf.constant([doc["title"]]))[0].numpy().tolist()[:packer.max_title_length]
            ranges = body.sentence_ranges(splitter.split(doc["text"]))
            starts = [[not body.continuation[i] for i in range(a, b)] for a, b in ranges]
            for index, segments in enumerate(packer.pack(len(title_ids), starts)):
                first = ranges[segments[0].sentence][0] + segments[0].start
                end = ranges[segments[-1].sentence][0] + segments[-1].end
                piece = body.slice(first, end)
                text = piece.text  # the exact substring of the body these wordpieces cover
                writer.write(es.to_example({
                    es.BLOCK_ID: block_id, es.UID: es.block_uid(doc["title"], text), es.DOC_ID: str(doc["id"]),
                    es.BLOCK_INDEX: index, es.TITLE: doc["title"], es.TEXT: text, es.TITLE_IDS: title_ids,
                    es.BODY_IDS: list(piece.ids)}))
                block_id += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=os.path.join(_REPO, "configs", "minilm.yaml"))
    parser.add_argument("--workdir", default="", help="where blocks and examples go (default: a temp dir)")
    parser.add_argument("--limit", type=int, default=0, help="first N passages only (0: all)")
    parser.add_argument("--in_script_blocks", action="store_true",
                        help="pack blocks in this script even when beam_jobs/preprocess_corpus exists")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="pretraining_data_stats-")
    blocks_dir = os.path.join(workdir, "blocks")

    started = time.perf_counter()
    how = _make_blocks(_PASSAGES, blocks_dir, args.config, args.limit, args.in_script_blocks)
    blocks_seconds = time.perf_counter() - started
    common = ["--config", args.config, "--input", os.path.join(blocks_dir, "blocks-*.tfrecord")]

    started = time.perf_counter()
    pre = generate_pretraining_data.run([*common, "--output", os.path.join(workdir, "pretraining")])
    pre_seconds = time.perf_counter() - started
    started = time.perf_counter()
    ict_manifest = generate_ict_data.run([*common, "--output", os.path.join(workdir, "ict")])
    ict_seconds = time.perf_counter() - started

    c = pre["counts"]
    examples = c.get(generate_pretraining_data.EXAMPLES, 0)
    salient = c.get(generate_pretraining_data.SALIENT, 0)
    fallback = c.get(generate_pretraining_data.RANDOM_FALLBACK, 0)
    labels = {k[len(generate_pretraining_data.LABEL_PREFIX):]: v for k, v in c.items()
              if k.startswith(generate_pretraining_data.LABEL_PREFIX)}
    cfg = config_lib.load_config(args.config)
    print(f"\n=== pretraining_data_stats: {args.config}, query <= {cfg.model.query_seq_length - 2} wordpieces, "
          f"blocks <= {cfg.data.max_block_length}, annotator={cfg.data.salient_span_annotator}, "
          f"max_span_wordpieces={pre['max_span_wordpieces']}, DirectRunner, {os.cpu_count()} CPUs")
    print(f"blocks: {c.get(generate_pretraining_data.BLOCKS, 0)} ({how}, {blocks_seconds:.1f}s)")
    print("salient-span pre-training examples")
    print(f"  queries                      {c.get(generate_pretraining_data.QUERIES, 0):>8}"
          f"   (truncated long sentences: {c.get(generate_pretraining_data.TRUNCATED, 0)})")
    print(f"  examples                     {examples:>8}")
    print(f"  salient span masking         {salient:>8}   {salient / max(examples, 1):.3f}")
    print(f"  random fallback              {fallback:>8}   {fallback / max(examples, 1):.3f}")
    print(f"  dropped (no span, no fallback) {c.get(generate_pretraining_data.NO_SPAN_DROPPED, 0):>6}")
    for label, n in sorted(labels.items()):
        print(f"  masked span label {label:<10} {n:>8}   {n / max(salient, 1):.3f} of salient")
    print(f"  candidate spans found        {c.get(generate_pretraining_data.SPANS_FOUND, 0):>8}   "
          f"({c.get(generate_pretraining_data.SPANS_FOUND, 0) / max(c.get('queries', 1), 1):.2f} per query)")
    for reason in (salient_span_masking.SKIPPED_TOO_LONG, salient_span_masking.SKIPPED_WHOLE_QUERY,
                   salient_span_masking.SKIPPED_NO_PIECES):
        print(f"  {reason:<28} {c.get(reason, 0):>8}")
    print(f"  mean masked wordpieces       {c.get('masked_wordpieces', 0) / max(examples, 1):>8.2f}   (salient: "
          f"{c.get('salient_masked_wordpieces', 0) / max(salient, 1):.2f}, random: "
          f"{(c.get('masked_wordpieces', 0) - c.get('salient_masked_wordpieces', 0)) / max(fallback, 1):.2f})")
    print(f"  job wall time                {pre_seconds:>8.1f}s  -> {examples / pre_seconds:.0f} examples/s")
    ic = ict_manifest["counts"]
    ict_examples = ic.get(generate_ict_data.EXAMPLES, 0)
    removed = ic.get(ict.REMOVED, 0)
    print("ICT examples")
    print(f"  sentences                    {ic.get(ict.SENTENCES, 0):>8}")
    print(f"  examples                     {ict_examples:>8}")
    print(f"  sentence removed             {removed:>8}   {removed / max(ict_examples, 1):.3f} "
          f"(target {cfg.data.ict_remove_probability})")
    print(f"  skipped (sentence = body)    {ic.get(ict.SKIPPED_WHOLE_BODY, 0):>8}")
    print(f"  query truncated              {ic.get(ict.QUERY_TRUNCATED, 0):>8}")
    print(f"  body_ids mismatches          {ic.get(generate_ict_data.BODY_IDS_MISMATCH, 0):>8}")
    print(f"  job wall time                {ict_seconds:>8.1f}s  -> {ict_examples / ict_seconds:.0f} examples/s")
    print(f"outputs under {workdir}")
    if not args.limit:  # the whole corpus only
        share = salient / max(examples, 1)
        result_records.write(
            "data-pretraining-examples", area="Data pipeline", order=30,
            claim=f"{share:.0%} of pre-training queries get a salient span to mask; the rest fall back to whole-word "
                  "random masking.",
            figure=f"{examples:,} examples: {share:.1%} salient span, {fallback / max(examples, 1):.1%} random "
                   f"fallback, {c.get(generate_pretraining_data.NO_SPAN_DROPPED, 0):,} dropped; "
                   f"{examples / pre_seconds:.0f} examples/s; ICT: {ict_examples:,} examples at "
                   f"{ict_examples / ict_seconds:.0f} examples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
