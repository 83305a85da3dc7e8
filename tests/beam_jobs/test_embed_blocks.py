"""beam_jobs/embed_blocks: REALM's index builder (§3.4) against the Keras retriever it was exported from.

One tiny retriever export (step 3) and 40 real passages from the bundled corpus are shared by every test;
the reference embeddings come from the Keras model itself (``embed_blocks`` of ``join_bert(title, text)``),
not from the SavedModel the job runs.
"""
import gzip
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import threading

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.options import pipeline_options
from apache_beam.testing import test_pipeline
from apache_beam.testing import util as beam_testing

from beam_jobs import embed_blocks
from beam_jobs import job_support
from realm_tf import config
from realm_tf import errors
from realm_tf.data import example_schemas
from realm_tf.export import retriever_export
from realm_tf.index import embedding_matrix
from realm_tf.index import index_loader
from realm_tf.index import index_publisher
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_retriever

NUM_BLOCKS = 40
STEP = 3


def _passages(n):
    """``n`` (title, text) pairs of the bundled corpus, bodies cut to varied lengths (some > 64 wordpieces)."""
    pairs = []
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if len(pairs) == n:
                break
            row = json.loads(line)
            words = row["text"].split()
            pairs.append((row["title"], " ".join(words[:3 + (i * 7) % 80])))
    return pairs


def _record(tok, block_id, title, text):
    title_ids, body_ids = tok(tf.constant([title, text])).to_list()
    return example_schemas.to_example({
        example_schemas.BLOCK_ID: block_id, example_schemas.UID: example_schemas.block_uid(title, text),
        example_schemas.DOC_ID: f"doc-{block_id}", example_schemas.BLOCK_INDEX: 0,
        example_schemas.TITLE: title, example_schemas.TEXT: text,
        example_schemas.TITLE_IDS: title_ids, example_schemas.BODY_IDS: body_ids})


def _write(path, records):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """cfg, tokenizer, export path, passages, Keras reference embeddings [40, 16], block file pattern."""
    tmp = tmp_path_factory.mktemp("embed_blocks")
    cfg = config.load_config("configs/tiny.yaml", [f"refresh.export_dir={tmp / 'export'}",
                                                   f"index.index_dir={tmp / 'unused_index'}"])
    model = knowledge_retriever.build_knowledge_retriever(cfg.model)
    tok = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, cfg.model.lower_case)
    export = retriever_export.export_retriever(model, cfg, step=STEP, tokenizer=tok)
    passages = _passages(NUM_BLOCKS)
    titles, texts = zip(*passages)
    reference = model.embed_blocks(tok.join_bert(tok(tf.constant(titles)), tok(tf.constant(texts)),
                                                 cfg.model.block_seq_length)).numpy()  # [40, 16]
    records = [_record(tok, i, title, text) for i, (title, text) in enumerate(passages)]
    # Two shards, ids interleaved, so that the job has to put the rows back in block_id order itself.
    _write(str(tmp / "blocks" / "blocks-00000-of-00002.tfrecord"), records[1::2])
    _write(str(tmp / "blocks" / "blocks-00001-of-00002.tfrecord"), records[0::2])
    return {"cfg": cfg, "tok": tok, "export": export, "passages": passages, "reference": reference,
            "records": records, "blocks": str(tmp / "blocks" / "blocks-*.tfrecord"), "tmp": tmp}


@pytest.fixture(scope="module")
def published(setup):
    index_dir = str(setup["tmp"] / "index")
    summary = embed_blocks.run(["--config", "configs/tiny.yaml", "--blocks", setup["blocks"],
                                "--export", setup["export"], "--index-dir", index_dir, "--max-batch-size", "8",
                                "--runner=DirectRunner"])
    return summary, index_dir


def test_publishes_a_complete_version_named_after_the_export_step(setup, published):
    summary, index_dir = published
    assert index_publisher.complete_versions(index_dir) == [STEP]
    meta = index_publisher.read_index_json(index_publisher.version_dir(index_dir, STEP))
    assert meta["version"] == STEP and meta["export_step"] == STEP and meta["export_path"] == setup["export"]
    assert meta["num_blocks"] == NUM_BLOCKS and meta["dim"] == setup["cfg"].model.projection_size == 16
    assert meta["kind"] == "brute_force" and meta["vocab_hash"] == setup["tok"].vocab_hash
    counts = meta["counts"]
    assert counts["blocks_read"] == counts["blocks_embedded"] == NUM_BLOCKS
    assert counts.get("blocks_failed", 0) == 0 and counts.get("blocks_unparseable", 0) == 0
    assert counts["batches"] >= NUM_BLOCKS // 8
    # Padding accounting: the real wordpieces of the 40 blocks, at most the padded ones.
    titles, texts = zip(*setup["passages"])
    title_lengths = setup["tok"](tf.constant(titles)).row_lengths().numpy()  # [40]
    text_lengths = setup["tok"](tf.constant(texts)).row_lengths().numpy()  # [40]
    lengths = np.minimum(title_lengths + text_lengths + 3, 64)  # [40]
    assert counts["wordpieces"] == lengths.sum() <= counts["padded_wordpieces"]
    for key in ("embed_seconds", "assemble_seconds", "build_seconds"):
        assert meta[key] >= 0
    assert summary["publish_seconds"] >= 0 and summary["index_path"].endswith("0000000003")
    cores = os.cpu_count()  # no --direct_* flag: a worker thread per core, one TensorFlow thread per op each
    assert meta["runner"] == (f"DirectRunner (multi_threading x {cores})" if cores > 1
                              else "DirectRunner (in_memory x 1)")
    assert meta["intra_op_threads"] == (1 if cores > 1 else 0)
    assert not [n for n in os.listdir(index_dir) if n.startswith(".")]  # staging and shards removed


def test_a_rerun_of_a_finished_job_has_nothing_to_do_and_another_export_step_is_refused(setup, published, caplog,
                                                                                         tmp_path):
    """A rerun after the commit (a finished job, or one killed just after it) succeeds without embedding; the same
    version number from another export is still refused."""
    summary, index_dir = published
    flags = ["--config", "configs/tiny.yaml", "--blocks", setup["blocks"], "--index-dir", index_dir]
    again = embed_blocks.run([*flags, "--export", setup["export"], "--runner=DirectRunner"])
    assert again["index_path"] == summary["index_path"] and again["exported_at"] == summary["exported_at"]
    assert any("nothing to do" in r.getMessage() for r in caplog.records)
    other = shutil.copytree(setup["export"], str(tmp_path / "other_export"))
    with pytest.raises(index_publisher.IndexVersionExistsError):
        embed_blocks.run([*flags, "--export", other, "--runner=DirectRunner"])


def test_embeddings_equal_the_keras_document_tower_in_block_id_order(setup, published):
    _, index_dir = published
    embeddings = np.load(os.path.join(index_publisher.version_dir(index_dir, STEP), "embeddings.npy"))
    assert embeddings.shape == (NUM_BLOCKS, 16)
    assert np.abs(embeddings - setup["reference"]).max() <= 1e-5


def test_the_published_index_finds_each_block_from_its_own_embedding(setup, published):
    _, index_dir = published
    loader = index_loader.IndexLoader(index_dir, expected_dim=16, expected_vocab_hash=setup["tok"].vocab_hash,
                                      kind="brute_force")
    reference = np.asarray(setup["reference"], np.float64)  # [num_blocks, dim]
    result = loader.search_batched(setup["reference"], k=1)
    assert result.version == STEP
    scores = reference @ reference.T  # brute-force MIPS of every block's embedding against all blocks
    np.testing.assert_allclose(result.scores[:, 0], scores.max(1), rtol=1e-5, atol=1e-4)
    # The block itself wins wherever it is not tied: a random tiny model embeds blocks almost alike
    # (LayerNorm'd vectors of equal norm), so near-ties within float error are common.
    runner_up = np.sort(scores, axis=1)[:, -2]
    clear = scores[np.arange(NUM_BLOCKS), np.arange(NUM_BLOCKS)] - runner_up > 1e-5
    np.testing.assert_array_equal(result.rows[clear, 0], np.arange(NUM_BLOCKS)[clear])


def test_the_job_runs_on_beams_portable_runner(setup, published, portable_runner):
    """Beam's portable runner API, the path of Flink, Spark and Dataflow (Runner v2), with its job service and
    workers in this process: the same vectors as the DirectRunner's."""
    index_dir = str(setup["tmp"] / "index_portable")
    summary = embed_blocks.run(["--config", "configs/tiny.yaml", "--blocks", setup["blocks"], "--export",
                                setup["export"], "--index-dir", index_dir, "--max-batch-size", "8", *portable_runner])
    assert summary["counts"][embed_blocks.BLOCKS_EMBEDDED] == NUM_BLOCKS
    np.testing.assert_allclose(index_publisher.read_embeddings(summary["index_path"]),
                               index_publisher.read_embeddings(published[0]["index_path"]), atol=1e-5)


@pytest.mark.slow
def test_the_job_run_as_a_module_runs_on_workers_in_other_processes(setup, published):
    """``python -m beam_jobs.embed_blocks`` on the DirectRunner's multi_processing workers: the job's own classes
    (``BlockInput``) cross to processes that cannot import the driver's ``__main__``, as on Dataflow."""
    index_dir = str(setup["tmp"] / "index_processes")
    result = subprocess.run(
        [sys.executable, "-m", "beam_jobs.embed_blocks", "--config", "configs/tiny.yaml", "--blocks",
         setup["blocks"], "--export", setup["export"], "--index-dir", index_dir, "--max-batch-size", "8",
         "--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert index_publisher.complete_versions(index_dir) == [STEP]
    got = np.load(os.path.join(index_publisher.version_dir(index_dir, STEP), "embeddings.npy"))
    want = np.load(os.path.join(published[0]["index_path"], "embeddings.npy"))
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("flags, workers, threads", [
    ([], ("multi_threading", 4), 1),
    (["--direct_running_mode=in_memory"], ("in_memory", 1), 0),
    (["--direct_running_mode=multi_processing", "--direct_num_workers=2"], ("multi_processing", 2), 2),
    (["--direct_num_workers", "3"], ("in_memory", 3), 0),
    (["--runner=DataflowRunner"], None, 0)])
def test_on_the_direct_runner_the_job_takes_a_worker_per_core_unless_told_otherwise(monkeypatch, flags, workers,
                                                                                   threads):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    options = job_support.pipeline_options_for(flags)
    embed_blocks.use_the_cores(options, flags)
    direct = options.view_as(pipeline_options.DirectOptions)
    if workers is not None:
        assert (direct.direct_running_mode, direct.direct_num_workers) == workers
    else:  # another runner: the DirectRunner's options are left alone
        assert (direct.direct_running_mode, direct.direct_num_workers) == ("in_memory", 1)
    assert embed_blocks.default_intra_op_threads(options) == threads


def test_the_batches_of_one_file_are_embedded_by_every_worker(setup, monkeypatch, tmp_path):
    """A read of one file is one bundle, sorted and cut into batches on one worker; the batches must still reach
    every worker (SpreadBatches), or one worker embeds them all while the others wait."""
    callers = set()
    run_inference = embed_blocks.BlockEmbeddingModelHandler.run_inference

    def recording(self, batch, model, inference_args=None):
        callers.add(threading.get_ident())
        return run_inference(self, batch, model, inference_args)

    monkeypatch.setattr(embed_blocks.BlockEmbeddingModelHandler, "run_inference", recording)
    one_file = str(tmp_path / "blocks-00000-of-00001.tfrecord")
    _write(one_file, setup["records"])
    reference = setup["reference"]

    def check_embeddings(actual):
        assert sorted(block_id for block_id, _ in actual) == list(range(NUM_BLOCKS))
        assert max(np.abs(vector - reference[block_id]).max() for block_id, vector in actual) <= 1e-5

    options = pipeline_options.PipelineOptions(["--direct_running_mode=multi_threading", "--direct_num_workers=2"])
    with test_pipeline.TestPipeline(options=options) as p:
        outputs = (p
                   | beam.io.ReadFromTFRecord(one_file)
                   | embed_blocks.EmbedBlocks(setup["export"], setup["cfg"].model.block_seq_length,
                                              min_batch_size=2, max_batch_size=2))
        beam_testing.assert_that(outputs["embeddings"], check_embeddings)
    assert len(callers) == 2


def test_the_model_handler_sets_tensorflows_threads_where_tensorflow_has_not_run(setup, caplog):
    code = ("import tensorflow as tf\nfrom beam_jobs import embed_blocks\n"
            f"embed_blocks.BlockEmbeddingModelHandler({setup['export']!r}, intra_op_threads=1).load_model()\n"
            "print('threads', tf.config.threading.get_intra_op_parallelism_threads())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["threads", "1"]
    # Here TensorFlow has run: the pool stays as it is, the load says so and the model still embeds.
    before = tf.config.threading.get_intra_op_parallelism_threads()
    handler = embed_blocks.BlockEmbeddingModelHandler(setup["export"], intra_op_threads=before + 3)
    with caplog.at_level("INFO", logger=embed_blocks.__name__):
        model = handler.load_model()
    assert tf.config.threading.get_intra_op_parallelism_threads() == before
    assert "--intra-op-threads=%d is not applied" % (before + 3) in caplog.text
    (title, text), = setup["passages"][:1]
    vector, = handler.run_inference([embed_blocks.BlockInput(title.encode(), text.encode(), 10)], model)
    assert np.abs(vector.value - setup["reference"][0]).max() <= 1e-5


@pytest.mark.parametrize("batching,signature", [("length", "auto"), ("arrival", "ids")])
def test_embed_transform_keeps_block_ids_attached(setup, batching, signature):
    """Each block's embedding under its own id, by either signature: embed_block's text (auto on a machine
    without a GPU) and embed_block_ids's wordpieces packed on the host to the static block length."""
    order = list(range(0, NUM_BLOCKS, 3))
    random.Random(0).shuffle(order)
    records = [setup["records"][i] for i in order] + [example_schemas.to_example({"title": "no id"})]
    reference = setup["reference"]

    def check_embeddings(actual):
        assert sorted(block_id for block_id, _ in actual) == sorted(order)
        for block_id, vector in actual:
            assert vector.shape == (16,) and np.abs(vector - reference[block_id]).max() <= 1e-5, block_id

    def check_failures(actual):
        assert len(actual) == 1 and actual[0]["block_id"] is None
        assert "unparseable record" in actual[0]["error"] and "block_id" in actual[0]["error"]

    with test_pipeline.TestPipeline() as p:
        outputs = (p
                   | beam.Create(records)
                   | embed_blocks.EmbedBlocks(setup["export"], setup["cfg"].model.block_seq_length,
                                              min_batch_size=2, max_batch_size=4, batching=batching,
                                              signature=signature))
        beam_testing.assert_that(outputs["embeddings"], check_embeddings, label="CheckEmbeddings")
        beam_testing.assert_that(outputs["failures"], check_failures, label="CheckFailures")


def test_the_ids_signature_takes_one_static_shape_and_a_bad_choice_is_refused(setup, caplog):
    handler = embed_blocks.BlockEmbeddingModelHandler(setup["export"], signature="ids")
    with caplog.at_level(logging.INFO, logger="beam_jobs.embed_blocks"):
        model = handler.load_model()
    assert "no GPU; signature embed_block_ids" in caplog.text
    length = setup["cfg"].model.block_seq_length
    assert [spec.shape.as_list() for spec in model.signatures["embed_block_ids"].structured_input_signature[1].values()
            ] == [[None, length]] * 3
    with pytest.raises(errors.UserError, match="unknown block signature"):
        embed_blocks.BlockEmbeddingModelHandler(setup["export"], signature="strings")


def test_a_block_that_fails_is_reported_and_the_rest_of_its_batch_embedded(setup):
    handler = embed_blocks.BlockEmbeddingModelHandler(setup["export"])
    model = handler.load_model()
    (title0, text0), (title1, text1) = setup["passages"][:2]
    batch = [embed_blocks.BlockInput(title0.encode(), text0.encode(), 10),
             embed_blocks.BlockInput(None, b"a title that is not a string fails tf.constant", 5),
             embed_blocks.BlockInput(title1.encode(), text1.encode(), 10)]
    outcomes = list(handler.run_inference(batch, model))
    assert [o.error is None for o in outcomes] == [True, False, True]
    assert outcomes[1].value is None and outcomes[1].error
    assert np.abs(np.stack([outcomes[0].value, outcomes[2].value]) - setup["reference"][:2]).max() <= 1e-5


def test_missing_and_duplicate_block_ids_refuse_the_publish(setup):
    tmp = setup["tmp"] / "holes"
    records = [r for i, r in enumerate(setup["records"][:12]) if i not in (3, 7)] + [setup["records"][5]]
    _write(str(tmp / "blocks" / "blocks-00000-of-00001.tfrecord"), records)
    # The manifest says 14 blocks: 12 and 13 are missing too, which the largest id alone could not reveal.
    with open(tmp / "blocks" / "manifest.json", "w") as f:
        json.dump({"blocks": 14, "vocab_hash": setup["tok"].vocab_hash}, f)
    index_dir = str(tmp / "index")
    with pytest.raises(embedding_matrix.IncompleteEmbeddingsError) as raised:
        embed_blocks.run(["--config", "configs/tiny.yaml", "--blocks", str(tmp / "blocks" / "*.tfrecord"),
                          "--export", setup["export"], "--index-dir", index_dir, "--runner=DirectRunner"])
    message = str(raised.value)
    assert "4 of 14 block ids missing: 3, 7, 12-13" in message
    assert "1 block ids embedded more than once: 5" in message
    assert index_publisher.complete_versions(index_dir) == []
