"""Block records read on demand: the same wordpieces, texts and answer spans as the in-memory KnowledgeCorpus, over
shard boundaries, from a SavedModel moved to another directory, in the time of a shard read."""
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf.data import block_records
from realm_tf.data import block_store
from realm_tf.data import example_schemas
from realm_tf.data import knowledge_corpus
from realm_tf.layers import bert_tokenizer

TITLES = ["Alpha", "Beta Gamma", "Délta ünïcode", "", "Epsilon", "Zeta"]
TEXTS = ["The river flows North into the sea.", "Many cities line the long coast of the island.",
         "A very long body: " + " ".join(f"word{i}" for i in range(60)) + " and finally The End.",
         "Café crème, naïve façade — 東京 and more.", "", "Last one, in its own shard."]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """``(in-memory corpus, record corpus, tokenizer, records directory)`` over the same six blocks, three a
    shard (so that blocks 3.. are in the second shard)."""
    tokenizer = bert_tokenizer.BertTokenizer(config.load_config("configs/tiny.yaml").model.vocab_file)
    blocks = block_store.BlockStore(tokenizer(tf.constant(TITLES)).to_list(), tokenizer(tf.constant(TEXTS)).to_list(),
                                    [str(i) for i in range(6)], TITLES, TEXTS)
    embeddings = np.random.default_rng(0).normal(size=[6, 4]).astype(np.float32)
    directory = str(tmp_path_factory.mktemp("records"))
    index = block_records.write_records(blocks, tokenizer, directory, blocks_per_shard=3)
    records = block_records.BlockRecords(directory, index)
    return (knowledge_corpus.KnowledgeCorpus(embeddings, blocks, tokenizer),
            block_records.RecordCorpus(records, embeddings=embeddings), tokenizer, directory)


def test_write_records_shards_and_offsets(corpora):
    _, recorded, _, directory = corpora
    assert sorted(os.listdir(directory)) == ["block_records-000000", "block_records-000001"]
    starts, lengths = recorded.records.starts.numpy(), recorded.records.lengths.numpy()
    assert list(starts[:3]) == [0, lengths[0], lengths[0] + lengths[1]] and starts[3] == 0  # a new shard
    with open(os.path.join(directory, "block_records-000001"), "rb") as f:
        data = f.read()
    assert len(data) == lengths[3:].sum()
    example = tf.train.Example.FromString(data[starts[5]:starts[5] + lengths[5]])
    assert example.features.feature["text"].bytes_list.value[0].decode() == TEXTS[5]


def test_records_read_as_the_in_memory_corpus(corpora):
    memory, recorded, _, _ = corpora
    ids = tf.constant([5, 0, 3, 3, 2, 4, 1], tf.int32)  # any order, repeats, both shards, empty title and body
    for method in ("title_ids", "body_ids"):
        assert getattr(recorded, method)(ids).to_list() == getattr(memory, method)(ids).to_list(), method
    for got, want in zip(recorded.wordpieces(ids), memory.wordpieces(ids)):  # both from one read
        assert got.to_list() == want.to_list()
    grid = tf.constant([[5, 0], [3, 2]])  # [2, 2]: the shape is kept
    for method in ("title_text", "body_text"):
        np.testing.assert_array_equal(getattr(recorded, method)(grid).numpy(), getattr(memory, method)(grid).numpy())
    for got, want in zip(recorded.title_and_text(grid), memory.title_and_text(grid)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    queries = tf.random.stateless_normal([3, 4], seed=[1, 2])
    for got, want in zip(recorded.search(queries, 2), memory.search(queries, 2)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_span_text_matches_the_in_memory_corpus_for_every_span_inside_a_block(corpora):
    memory, recorded, _, _ = corpora
    block, in_title, first, last = [], [], [], []
    for i in range(6):
        for title, pieces in ((True, memory.title_ids([i]).to_list()[0]), (False, memory.body_ids([i]).to_list()[0])):
            for a in range(len(pieces)):
                for b in range(a, min(a + 4, len(pieces))):
                    block.append(i), in_title.append(title), first.append(a), last.append(b)
    args = [tf.constant(block), tf.constant(in_title), tf.constant(first), tf.constant(last)]
    got, want = recorded.span_text(*args).numpy(), memory.span_text(*args).numpy()
    assert len(got) > 100 and list(got) == list(want)
    assert "crème" in {t.decode() for t in got}  # cut from the original UTF-8 text, accents kept
    # A piece past the block's end takes the block's last piece (never another block's text).
    past = recorded.span_text(tf.constant([0]), tf.constant([False]), tf.constant([0]), tf.constant([99])).numpy()
    assert past[0].decode() == TEXTS[0]


def test_a_saved_model_reads_its_records_after_it_moved(corpora, tmp_path):
    _, recorded, _, _ = corpora

    class Served(tf.Module):
        def __init__(self, corpus):
            super().__init__()
            self.corpus = corpus

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
        def texts(self, ids):
            return self.corpus.body_text(ids)

    saved = str(tmp_path / "saved")
    tf.saved_model.save(Served(recorded), saved)
    recorded.copy_shards(os.path.join(saved, "assets"))
    moved = str(tmp_path / "moved")
    shutil.move(saved, moved)
    loaded = tf.saved_model.load(moved)
    assert [t.decode() for t in loaded.texts(tf.constant([5, 1, 3])).numpy()] == [TEXTS[5], TEXTS[1], TEXTS[3]]


def test_bad_arguments_are_named(corpora, tmp_path):
    memory, _, tokenizer, directory = corpora
    blocks = block_store.BlockStore([[1]], [[2]], ["a"])
    with pytest.raises(ValueError, match="no text"):
        block_records.write_records(blocks, tokenizer, str(tmp_path / "x"))
    with pytest.raises(ValueError, match="blocks_per_shard"):
        block_records.write_records(block_store.BlockStore([[1]], [[2]], ["a"], ["t"], ["b"]), tokenizer,
                                    str(tmp_path / "y"), blocks_per_shard=0)
    index = block_records.RecordIndex(np.zeros([6], np.int32), np.zeros([6], np.int64), np.ones([6], np.int64))
    records = block_records.BlockRecords(directory, index)
    with pytest.raises(ValueError, match="do not cover"):
        block_records.RecordCorpus(records, embeddings=np.zeros([5, 4], np.float32))
    with pytest.raises(ValueError, match="needs a searcher"):
        block_records.RecordCorpus(records)
    with pytest.raises(ValueError, match="approximate.*rows"):
        block_records.RecordCorpus(records, searcher=_ScrambledSearcher(np.zeros([6, 4], np.float32)))
    with pytest.raises(ValueError, match="record index of 6 shards, 5 starts"):
        block_records.BlockRecords(directory, index._replace(starts=np.zeros([5], np.int64)))


def _write_blocks(path, rows, tokenizer):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for block_id in rows:
            title, text = TITLES[block_id], TEXTS[block_id]
            writer.write(example_schemas.to_example({
                example_schemas.BLOCK_ID: block_id, example_schemas.UID: str(block_id), example_schemas.DOC_ID: "d",
                example_schemas.BLOCK_INDEX: 0, example_schemas.TITLE: title, example_schemas.TEXT: text,
                example_schemas.TITLE_IDS: tokenizer(tf.constant([title])).to_list()[0],
                example_schemas.BODY_IDS: tokenizer(tf.constant([text])).to_list()[0]}))


def test_records_stream_from_block_files_in_any_order(corpora, tmp_path):
    memory, _, tokenizer, _ = corpora
    _write_blocks(tmp_path / "blocks-00000-of-00002.tfrecord", [4, 1, 5], tokenizer)
    _write_blocks(tmp_path / "blocks-00001-of-00002.tfrecord", [0, 3, 2], tokenizer)
    directory = str(tmp_path / "records")
    index = block_records.stream_records(str(tmp_path / "blocks-*.tfrecord"), tokenizer, directory, blocks_per_shard=4)
    assert index.shards.tolist() == [0, 0, 1, 1, 0, 0]  # written in file order, 4 a shard
    streamed = block_records.RecordCorpus(block_records.BlockRecords(directory, index),
                                          embeddings=memory.embeddings.numpy())
    ids = tf.constant([0, 1, 2, 3, 4, 5, 2])
    for got, want in zip(streamed.wordpieces(ids), memory.wordpieces(ids)):
        assert got.to_list() == want.to_list()
    np.testing.assert_array_equal(streamed.body_text(ids).numpy(), memory.body_text(ids).numpy())
    _write_blocks(tmp_path / "dup-0.tfrecord", [0, 1, 1], tokenizer)
    with pytest.raises(block_store.BlockStoreError, match=r"dup-\*.*duplicated: \[1\], missing: \[2\]"):
        block_records.stream_records(str(tmp_path / "dup-*.tfrecord"), tokenizer, str(tmp_path / "dup"))


def test_embedding_rows_read_from_shards_equal_the_matrix(tmp_path):
    matrix = np.random.default_rng(1).normal(size=[11, 5]).astype(np.float32)
    block_records.write_embedding_rows(matrix, str(tmp_path), rows_per_shard=4)
    assert sorted(os.listdir(tmp_path)) == [f"block_embeddings-00000{i}" for i in range(3)]
    rows = block_records.EmbeddingRows(str(tmp_path), 11, 5, rows_per_shard=4)
    ids = np.array([[10, 0, 3], [4, 4, 7]])  # [2, 3]: both ends, a shard's edges, repeats
    np.testing.assert_array_equal(rows.read(tf.constant(ids)).numpy(), matrix[ids])


class _ScrambledSearcher:
    """A searcher with approximate scores: every block, in reverse id order, each scored 0."""

    exact_scores = False

    def __init__(self, embeddings):
        self.num_blocks = len(embeddings)

    def depth(self, k):
        return self.num_blocks

    def search(self, queries, k, depth=None):
        ids = tf.tile(tf.range(self.num_blocks - 1, -1, -1)[None, :depth or k], [tf.shape(queries)[0], 1])
        return tf.zeros(tf.shape(ids), tf.float32), ids


def test_an_approximate_searcher_is_re_scored_exactly_from_the_rows(corpora, tmp_path):
    memory, recorded, _, _ = corpora
    matrix = memory.embeddings.numpy()
    block_records.write_embedding_rows(matrix, str(tmp_path), rows_per_shard=4)
    rows = block_records.EmbeddingRows(str(tmp_path), 6, 4, rows_per_shard=4)
    served = block_records.RecordCorpus(recorded.records, searcher=_ScrambledSearcher(matrix), rows=rows)
    assert served.embeddings is None and int(served.num_blocks) == 6
    queries = tf.random.stateless_normal([3, 4], seed=[3, 4])
    (scores, ids), (want_scores, want_ids) = served.search(queries, 3), memory.search(queries, 3)
    np.testing.assert_array_equal(ids.numpy(), want_ids.numpy())
    np.testing.assert_allclose(scores.numpy(), want_scores.numpy(), rtol=1e-6)
