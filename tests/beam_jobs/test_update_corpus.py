"""update_corpus on the tiny config: one update adds, replaces, keeps and deletes documents (and reports what it
cannot do); only blocks with a new uid are embedded, and the result equals preprocessing and embedding the edited
corpus from scratch; updates compose; the trainer's IndexLoader and the next full refresh pick the update up."""
import gzip
import itertools
import json
import os
import shutil

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.testing import test_pipeline
from apache_beam.testing import util as beam_util

from beam_jobs import embed_blocks
from beam_jobs import preprocess_corpus
from beam_jobs import update_corpus
from realm_tf import config
from realm_tf import errors
from realm_tf.data import block_store
from realm_tf.data import corpus_versions
from realm_tf.data import document_packing
from realm_tf.data import example_schemas
from realm_tf.export import retriever_export
from realm_tf.index import embedding_matrix
from realm_tf.index import index_loader
from realm_tf.index import index_publisher
from realm_tf.index import index_refresher
from realm_tf.models import knowledge_retriever

TINY = "configs/tiny.yaml"
FACT = {"id": "fact-1", "title": "Glimmerwick", "text": "The zorblax of Quintessia is named Glimmerwick."}


def _overrides(root):
    return [f"data.blocks_dir={root}/blocks", f"index.index_dir={root}/index", f"refresh.export_dir={root}/export"]


def _write_jsonl(path, rows, extra_lines=()):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
        f.writelines(extra_lines)
    return str(path)


def _pattern(root, version):
    return corpus_versions.blocks_pattern(f"{root}/blocks", version)


def _matrix(root, version):
    return index_publisher.read_embeddings(index_publisher.version_dir(f"{root}/index", version))


def _block_rows(pattern, ignore=()):
    """Every block as a comparable tuple (without its id, which depends on the order of the corpus)."""
    store = block_store.BlockStore.load(pattern)
    return sorted((store.uids[i], store.doc_ids[i], store.titles[i], store.texts[i], tuple(store.title_ids(i)),
                   tuple(store.body_ids(i))) for i in range(len(store)) if store.doc_ids[i] not in ignore)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """40 bundled passages preprocessed (corpus version 0), a random tiny retriever's export (step 0) and index
    version 0 built from it."""
    root = tmp_path_factory.mktemp("update_base")
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt") as f:
        documents = [json.loads(line) for line in itertools.islice(f, 40)]
    corpus = _write_jsonl(root / "corpus.jsonl", documents)
    preprocess_corpus.JOB.call(config=TINY, overrides=_overrides(root), input=[corpus], output=f"{root}/blocks")
    cfg = config.load_config(TINY, _overrides(root))
    retriever_export.export_retriever(knowledge_retriever.build_knowledge_retriever(cfg.model), cfg, 0)
    embed_blocks.embed_and_publish(cfg, f"{root}/export/0")
    return root, documents


@pytest.fixture
def workspace(base, tmp_path):
    """A copy of the base workspace for one test: ``(root, cfg, documents)``."""
    root, documents = base
    for name in ("blocks", "index", "export"):
        shutil.copytree(root / name, tmp_path / name)
    # index.json names the export where the base built it; this copy's own export is found by its step.
    return tmp_path, config.load_config(TINY, _overrides(tmp_path)), documents


def _update(root, *args):
    return update_corpus.run(["--config", TINY, *[a for s in _overrides(root) for a in ("--set", s)], *args])


def test_one_update_adds_replaces_keeps_deletes_and_reports_the_rest(workspace):
    root, cfg, documents = workspace
    changed = {**documents[3], "text": documents[3]["text"] + " Its zorblax was named Glimmerwick in 1234."}
    adds = _write_jsonl(root / "add.jsonl", [FACT, changed, documents[5]], extra_lines=[
        "{broken json\n", json.dumps({"id": "fact-1", "title": "Other", "text": "Another text, the same id."}) + "\n"])
    summary = _update(root, "--add", adds, "--delete", "7,no-such-id")

    assert summary["documents"] == {"added": 1, "replaced": 1, "unchanged": 1, "deleted": 1}
    assert summary["dead_letters"]["malformed_json"] == 1 and summary["dead_letters"]["duplicate_id"] == 1
    assert summary["dead_letters"]["unknown_id"] == 1 and summary["dead_letters_total"] == 3  # never fatal
    assert (summary["version"], summary["parent_version"], summary["index_version"]) == (1, 0, 1)
    dead = [json.loads(line) for shard in summary["dead_letter_shards"]
            for line in open(os.path.join(summary["corpus_path"], shard), encoding="utf-8")]
    assert {(d["reason"], d["text"]) for d in dead if d["reason"] == "unknown_id"} == {("unknown_id", "no-such-id")}

    old = block_store.BlockStore.load(_pattern(root, 0))
    new = block_store.BlockStore.load(_pattern(root, 1))
    old_of, new_of = old.blocks_of_documents(), new.blocks_of_documents()
    assert "7" not in new_of and FACT["id"] in new_of and [new.texts[i] for i in new_of["5"]] == \
        [old.texts[i] for i in old_of["5"]]
    # Only blocks with a uid the base corpus lacks were embedded (Beam's counters); the changed document's
    # unchanged leading blocks kept their embeddings.
    fresh = set(new.uids) - set(old.uids)
    counters = summary["counters"]
    assert counters["embed_blocks"]["blocks_embedded"] == summary["blocks_embedded"] == len(fresh) == 2
    assert counters["update_corpus"]["blocks_reused"] == summary["blocks_reused"] == len(new_of["3"]) - 1 >= 1
    assert counters["update_corpus"]["base_blocks_read"] == len(old)
    assert summary["blocks"] == len(new) == len(old) - len(old_of["7"]) - len(old_of["3"]) + len(new_of["3"]) + 1

    # The new corpus version is what preprocessing the edited corpus gives, block for block ...
    edited = [changed if d["id"] == 3 else d for d in documents if d["id"] != 7] + [FACT]
    fresh_root = root / "fresh"
    preprocess_corpus.JOB.call(config=TINY, input=[_write_jsonl(root / "edited.jsonl", edited)],
                               output=str(fresh_root))
    assert _block_rows(_pattern(root, 1)) == _block_rows(f"{fresh_root}/blocks-*.tfrecord*")
    # ... and its index is what embedding all of it with the same export gives, row for row.
    meta = index_publisher.read_index_json(index_publisher.version_dir(f"{root}/index", 1))
    assert (meta["corpus_version"], meta["export_step"], meta["num_blocks"]) == (1, 0, len(new))
    full = embed_blocks.embed_and_publish(cfg, f"{root}/export/0", index_dir=f"{root}/full", blocks=_pattern(root, 1))
    np.testing.assert_allclose(_matrix(root, 1), index_publisher.read_embeddings(full["index_path"]), atol=1e-5)
    # The Python API, as a trainer's refresh calls it, keeps Beam's single worker (the command takes one per core).
    assert index_publisher.read_index_json(full["index_path"])["runner"] == "DirectRunner (in_memory x 1)"


def test_two_updates_compose_and_the_loader_and_the_next_refresh_pick_them_up(workspace, portable_runner):
    root, cfg, documents = workspace
    loader = index_loader.IndexLoader(f"{root}/index", cfg.model.projection_size,
                                      index_publisher.read_index_json(f"{root}/index/0000000000")["vocab_hash"],
                                      kind=cfg.index.kind, blocks_dir=f"{root}/blocks")
    assert loader.snapshot().version == 0 and len(loader.snapshot().blocks) == loader.snapshot().index.num_blocks
    first = _update(root, "--add", _write_jsonl(root / "fact.jsonl", [FACT]))
    assert first["documents"]["added"] == 1 and first["blocks_embedded"] == 1
    # The trainer's loader swaps to the new index version and its blocks together, without a restart.
    assert loader.maybe_refresh() and loader.version == 1
    served = loader.snapshot()
    assert FACT["id"] in served.blocks.doc_ids and len(served.blocks) == served.index.num_blocks
    # Its query embedder is the export of the version it updated (step 0), found from index.json.
    embed, _ = retriever_export.load_query_embedder(1, served.metadata, cfg.refresh.export_dir)
    assert embed({"input_word_ids": tf.constant([[101, 2000, 102]]), "input_mask": tf.ones([1, 3], tf.int32),
                  "input_type_ids": tf.zeros([1, 3], tf.int32)}).shape == (1, cfg.model.projection_size)

    removed_ids = [str(d["id"]) for d in documents[:3]]
    ids_file = root / "gone.txt"
    ids_file.write_text("\n".join([FACT["id"], *removed_ids[:2]]) + "\n\n")
    second = _update(root, "--delete", f"@{ids_file}", "--delete", removed_ids[2],
                     "--add", _write_jsonl(root / "more.jsonl", [{**FACT, "id": "fact-2", "text": "Zorblax glows."}]),
                     *portable_runner)  # on Beam's portable runner: checked against a full re-embedding below
    assert (second["parent_version"], second["version"], second["index_version"]) == (1, 2, 2)
    assert second["documents"] == {"added": 1, "replaced": 0, "unchanged": 0, "deleted": 4}
    assert loader.maybe_refresh() and loader.version == 2
    blocks = loader.snapshot().blocks
    assert FACT["id"] not in blocks.doc_ids and "fact-2" in blocks.doc_ids
    assert not set(removed_ids) & set(blocks.doc_ids)
    assert _block_rows(_pattern(root, 2)) == sorted(_block_rows(_pattern(root, 0), ignore=removed_ids) +
                                                    _block_rows(_pattern(root, 2),
                                                                ignore=set(blocks.doc_ids) - {"fact-2"}))
    full = embed_blocks.embed_and_publish(cfg, f"{root}/export/0", index_dir=f"{root}/full", blocks=_pattern(root, 2))
    np.testing.assert_allclose(_matrix(root, 2), index_publisher.read_embeddings(full["index_path"]), atol=1e-5)

    # The next full refresh, from a newer export, re-embeds the current corpus version (updates included) and
    # takes the version after the updates' (version 1 = step 1 is an update of step 0's export).
    retriever_export.export_retriever(knowledge_retriever.build_knowledge_retriever(cfg.model), cfg, 1)
    params = config.save_params(cfg, str(root))
    refresher = index_refresher.IndexRefresher(params, embed_blocks.embed_and_publish)
    assert refresher.pending_export() == 1
    assert refresher.refresh_once() == 1  # the export step it built
    meta = index_publisher.read_index_json(index_publisher.version_dir(f"{root}/index", 3))
    assert (meta["version"], meta["export_step"], meta["corpus_version"]) == (3, 1, 2)
    assert refresher.pending_export() is None  # step 1 is built: nothing pending
    assert loader.maybe_refresh() and loader.version == 3 and loader.snapshot().blocks is blocks  # same corpus


def test_bad_requests_are_clear_errors_and_nothing_is_published(workspace):
    root, _, _ = workspace
    with pytest.raises(errors.UserError, match="nothing to do"):
        _update(root)
    with pytest.raises(errors.UserError, match="--add .*missing.jsonl: no file matches"):
        _update(root, "--add", str(root / "missing.jsonl"))
    with pytest.raises(errors.UserError, match="--delete @.*: no such file"):
        _update(root, "--delete", f"@{root}/missing.txt")
    assert index_publisher.complete_versions(f"{root}/index") == [0]
    assert corpus_versions.current_version(f"{root}/blocks") == 0
    # Deleting only unknown ids changes nothing: nothing is published, and every id is reported.
    summary = _update(root, "--delete", "nope-1,nope-2")
    assert summary["published"] is False and summary["counters"]["dead_letters_unknown_id"] == 2
    assert (summary["index_version"], summary["corpus_version"]) == (0, 0)
    assert index_publisher.complete_versions(f"{root}/index") == [0]
    assert corpus_versions.current_version(f"{root}/blocks") == 0
    assert not [n for n in os.listdir(f"{root}/index") if n.startswith(".staging")]  # nothing left behind


def _block(doc_id, index, text):
    title = f"title {doc_id}"
    return document_packing.Block(example_schemas.block_uid(title, text), doc_id, index, title, text, (1,), (2,))


def _packed(doc_id, *texts):
    blocks = tuple(_block(doc_id, i, text) for i, text in enumerate(texts))
    return doc_id, document_packing.PackedDocument(example_schemas.block_uid(doc_id, "".join(texts)), 1, blocks)


def test_decide_changes_per_document_id():
    request = lambda doc_id: (doc_id, update_corpus.DeleteRequest(doc_id, "--delete", 1))
    old = [("a", (0, 10, _block("a", 0, "x").uid)), ("b", (0, 11, _block("b", 0, "y").uid)),
           ("b", (1, 12, _block("b", 1, "z").uid)), ("c", (0, 13, _block("c", 0, "w").uid))]
    new = [_packed("a", "x"), _packed("b", "y", "changed"), _packed("n", "new"), _packed("c", "w")]
    deletes = [request("c"), request("d"), request("gone")]
    old.append(("d", (0, 14, _block("d", 0, "v").uid)))
    with test_pipeline.TestPipeline() as p:
        out = ({"new": p | "New" >> beam.Create(new), "old": p | "Old" >> beam.Create(old),
                "delete": p | "Del" >> beam.Create(deletes)}
               | update_corpus.DecideChanges(corpus_version=4))
        changes = out["changes"] | beam.Map(lambda line: (json.loads(line)["id"], json.loads(line)["change"]))
        beam_util.assert_that(changes, beam_util.equal_to(
            [("a", "unchanged"), ("b", "replaced"), ("n", "added"), ("c", "unchanged"), ("d", "deleted")]),
            label="Changes")
        beam_util.assert_that(out[update_corpus.REMOVED], beam_util.equal_to([11, 12, 14]), label="Removed")
        beam_util.assert_that(out[update_corpus.NEW_DOCUMENTS] | beam.Map(update_corpus.doc_id_of),
                              beam_util.equal_to(["b", "n"]), label="NewDocuments")
        beam_util.assert_that(out[update_corpus.DEAD_LETTERS] | beam.Map(lambda dead: (dead.reason, dead.text)),
                              beam_util.equal_to([("unknown_id", "gone")]), label="DeadLetters")


def test_renumbering_closes_up_removed_ids_and_keeps_the_order():
    records = {i: example_schemas.to_example({example_schemas.BLOCK_ID: i, example_schemas.UID: f"u{i}"})
               for i in range(6)}
    removed = [1, 4]
    kept = [r for i in range(6) for r in update_corpus.renumber_kept((i, records[i]), removed)]
    ids = [tf.train.Example.FromString(r).features.feature[example_schemas.BLOCK_ID].int64_list.value[0] for r in kept]
    uids = [tf.train.Example.FromString(r).features.feature[example_schemas.UID].bytes_list.value[0] for r in kept]
    assert ids == [0, 1, 2, 3] and uids == [b"u0", b"u2", b"u3", b"u5"] and kept[0] is records[0]


def test_assemble_update_takes_kept_reused_and_new_rows_and_refuses_gaps():
    base = np.arange(12, dtype=np.float32).reshape(6, 2)  # [6, dim 2]
    matrix = update_corpus.assemble_update(base, np.array([1, 4]), np.array([5]), np.array([4]),
                                           np.array([4]), np.array([[9.0, 9.0]], np.float32), [])
    np.testing.assert_array_equal(matrix, [[0, 1], [4, 5], [6, 7], [10, 11], [9, 9], [8, 9]])
    with pytest.raises(embedding_matrix.IncompleteEmbeddingsError, match="missing"):
        update_corpus.assemble_update(base, np.array([1]), np.array([6]), np.array([0]), np.zeros([0], np.int64),
                                      np.zeros([0, 2], np.float32), [])
    with pytest.raises(embedding_matrix.IncompleteEmbeddingsError, match="failed"):
        update_corpus.assemble_update(base, np.array([], np.int64), np.array([], np.int64), np.array([], np.int64),
                                      np.array([6]), np.ones([1, 2], np.float32), [{"block_id": 7, "error": "NaN"}])
