"""beam_jobs/build_chunk_database: RETRO's chunk database (Borgeaud et al., 2021, §2.3) from REALM blocks."""
import json
import os

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.testing import test_pipeline
from apache_beam.testing import util as beam_testing

from beam_jobs import build_chunk_database
from realm_tf import cli
from realm_tf import config
from realm_tf import library_logs
from realm_tf.data import example_schemas
from realm_tf.index import brute_force_index
from realm_tf.index import index_publisher
from realm_tf.retro import chunk_key_embedder
from realm_tf.retro import retro_chunks

TINY = "configs/tiny.yaml"


def _block(doc_id, block_index, body_ids):
    return example_schemas.to_example({
        example_schemas.BLOCK_ID: 0, example_schemas.UID: f"{doc_id}-{block_index}", example_schemas.DOC_ID: doc_id,
        example_schemas.BLOCK_INDEX: block_index, example_schemas.TITLE: "t", example_schemas.TEXT: "x",
        example_schemas.TITLE_IDS: [1], example_schemas.BODY_IDS: body_ids})


def test_documents_become_dense_chunks_and_bad_input_dead_letters():
    records = [_block("a", 1, [15, 16, 17]), _block("a", 0, [10, 11, 12, 13, 14]),  # a: 8 tokens, blocks unordered
               _block("b", 0, [20, 21]),  # b: 2 tokens
               _block("dup", 0, [1]), _block("dup", 0, [2]),  # two blocks at one position
               _block("empty", 0, []),  # no tokens
               b"not a tf.Example"]
    expected = {}
    for doc_id, tokens in (("a", list(range(10, 18))), ("b", [20, 21])):
        expected[doc_id] = retro_chunks.chunk_document(doc_id, tokens, 3, 2).chunks
    order = sorted(expected, key=retro_chunks.doc_key)  # ids follow SHA1(doc_id), then chunk_index
    numbered = [(i, c) for i, c in enumerate(c for d in order for c in expected[d])]
    with test_pipeline.TestPipeline() as p:
        out = p | beam.Create(records) | build_chunk_database.ChunkDocuments(3, 2)
        beam_testing.assert_that(out["chunks"], beam_testing.equal_to(numbered), label="Chunks")
        beam_testing.assert_that(
            out["dead_letters"] | beam.Map(lambda d: (d["reason"], d.get("doc_id"), d["blocks"])),
            beam_testing.equal_to([("duplicate_block_index", "dup", 2), ("no_tokens", "empty", 1),
                                   ("unparseable_block", None, 1)]), label="DeadLetters")
    assert sorted(len(c.tokens) for _, c in numbered) == [2, 2, 3, 3]  # a: 3 + 3 + 2, b: 2


def test_counts_that_do_not_add_up_are_refused():
    good = {"blocks_read": 5, "blocks_chunked": 3, "dead_letters.no_tokens": 2, "tokens_chunked": 9,
            "tokens_in_chunks": 9, "chunks": 3, "keys_embedded": 3}
    build_chunk_database.check_counts(good)
    with pytest.raises(RuntimeError, match="5 blocks read != 3 chunked"):
        build_chunk_database.check_counts({**good, "dead_letters.no_tokens": 1})
    with pytest.raises(RuntimeError, match="tokens in chunks"):
        build_chunk_database.check_counts({**good, "tokens_in_chunks": 8})
    with pytest.raises(RuntimeError, match="keys"):
        build_chunk_database.check_counts({**good, "keys_embedded": 2})


def test_job_publishes_chunks_keys_and_an_index_over_the_workspace_blocks(tmp_path, pretraining_workspace,
                                                                          parse_records, tiny_bert_checkpoint, capsys,
                                                                          progress_totals, portable_runner):
    sets = [f"data.blocks_dir={pretraining_workspace}/blocks", f"retro.chunks_dir={tmp_path}/chunks",
            f"retro.index_dir={tmp_path}/index", "retro.chunk_length=16", "retro.continuation_length=16",
            "index.kind=brute_force", f"retro.embedder_checkpoint={tiny_bert_checkpoint}"]
    library_logs.show_on_stderr()  # as the command line shows the job's log lines
    build_chunk_database.JOB.call(config=TINY, overrides=sets)
    assert "build_chunk_database:" in capsys.readouterr().err
    manifest = json.loads((tmp_path / "chunks" / "manifest.json").read_text())
    counts = manifest["counts"]
    spec = example_schemas.block_feature_spec()
    block_rows = parse_records(
        [r for f in sorted((pretraining_workspace / "blocks").glob("blocks-*.tfrecord*"))
         for r in tf.data.TFRecordDataset(str(f)).as_numpy_iterator()],
        {k: spec[k] for k in (example_schemas.DOC_ID, example_schemas.BLOCK_INDEX, example_schemas.BODY_IDS)})
    assert counts["blocks_read"] == len(block_rows) == counts["blocks_chunked"]  # the workspace has no bad blocks
    # Brute force: every document's body tokens, in block order, are the chunks' tokens.
    by_doc = {}
    for r in block_rows:
        by_doc.setdefault(r["doc_id"].decode(), []).append((r["block_index"], r["body_ids"]))
    streams = {d: [t for _, ids in sorted(b) for t in ids] for d, b in by_doc.items()}
    files = sorted((tmp_path / "chunks").glob("chunks-*.tfrecord"))
    rows = parse_records([r for f in files for r in tf.data.TFRecordDataset(str(f)).as_numpy_iterator()],
                         example_schemas.chunk_feature_spec())
    rows.sort(key=lambda r: r["chunk_id"])
    assert [r["chunk_id"] for r in rows] == list(range(manifest["num_chunks"])) and counts["chunks"] == len(rows)
    rebuilt = {}
    for r in rows:
        rebuilt.setdefault(r["doc_id"].decode(), []).append((r["chunk_index"], r["tokens"], r["continuation"]))
    assert set(rebuilt) == set(streams)
    for doc_id, chunks in rebuilt.items():
        chunks.sort()
        stream = streams[doc_id]
        assert [t for _, tokens, _ in chunks for t in tokens] == stream
        for index, tokens, continuation in chunks:
            assert continuation == stream[16 * index + 16:16 * index + 32]
    assert counts["tokens_chunked"] == sum(map(len, streams.values()))
    # The published index: one unit-norm key per chunk, equal to the frozen BERT's key of that chunk.
    versions = index_publisher.complete_versions(str(tmp_path / "index"))
    assert versions == [0] and manifest["index_version"] == 0
    keys = np.load(os.path.join(index_publisher.version_dir(str(tmp_path / "index"), 0), "embeddings.npy"))
    cfg = config.load_config(TINY, sets)
    assert keys.shape == (len(rows), cfg.model.encoder.hidden_size)
    np.testing.assert_allclose(np.linalg.norm(keys, axis=1), 1.0, atol=1e-5)
    model = chunk_key_embedder.build_chunk_key_embedder(cfg)
    sample = [0, len(rows) // 2, len(rows) - 1]
    expected = model(chunk_key_embedder.pack_chunks([rows[i]["tokens"] for i in sample], 101, 102)).numpy()
    np.testing.assert_allclose(keys[sample], expected, atol=1e-4)
    index = brute_force_index.BruteForceIndex()
    index.build(keys)
    neighbours, _ = index.search_batched(keys[sample], 1)
    assert neighbours[:, 0].tolist() == sample  # a chunk's own key is its nearest neighbour
    # A second run, on Beam's portable runner, publishes the next version, with the same keys; the chunks are
    # rewritten, not appended to. Its progress lines (one per chunk embedded here) count every chunk.
    assert cli.main(["build-chunk-database", "--config", TINY, "--progress-interval", "1e-9",
                     *sum((["--set", s] for s in sets), []), *portable_runner]) == 0
    assert index_publisher.complete_versions(str(tmp_path / "index")) == [0, 1]
    np.testing.assert_allclose(np.load(os.path.join(index_publisher.version_dir(str(tmp_path / "index"), 1),
                                                    "embeddings.npy")), keys, atol=1e-6)
    assert progress_totals(capsys.readouterr().err, "build_chunk_database") == {"done": len(rows)}
    assert sorted((tmp_path / "chunks").glob("chunks-*.tfrecord")) == files


def test_a_database_without_pre_trained_keys_is_refused_before_it_starts(tmp_path, pretraining_workspace):
    code = cli.main(["build-chunk-database", "--config", TINY, "--set", f"retro.chunks_dir={tmp_path}/chunks",
                     "--set", f"data.blocks_dir={pretraining_workspace}/blocks"])
    assert code == 2 and not (tmp_path / "chunks").exists()
