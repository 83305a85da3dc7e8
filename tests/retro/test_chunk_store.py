"""ChunkStore and same-document exclusion of RETRO's neighbours, against brute force."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.retro import chunk_store
from realm_tf.retro import retro_chunks


def _store():
    chunks = []
    for doc, tokens in (("a", list(range(100, 111))), ("b", list(range(200, 205))), ("c", list(range(300, 309)))):
        chunks += retro_chunks.chunk_document(doc, tokens, 4, 3).chunks
    return chunks, chunk_store.ChunkStore([c.tokens for c in chunks], [c.continuation for c in chunks],
                                          [c.doc_id for c in chunks])


def test_values_are_chunk_then_continuation_cut_or_padded_to_r():
    chunks, store = _store()
    ids = np.array([[0, 3], [-1, len(chunks) - 1]])
    tokens, mask = store.values(ids, length=6, pad_id=0)
    assert tokens.shape == mask.shape == (2, 2, 6)
    for (i, j), chunk_id in np.ndenumerate(ids):
        expected = [] if chunk_id < 0 else (list(chunks[chunk_id].tokens) + list(chunks[chunk_id].continuation))[:6]
        assert tokens[i, j, :len(expected)].tolist() == expected and mask[i, j].sum() == len(expected)
        assert not tokens[i, j, len(expected):].any()
    with pytest.raises(IndexError, match="another chunk database"):
        store.values(np.array([len(chunks)]), 6)


def test_select_neighbours_drops_the_own_document_and_keeps_the_order():
    rng = np.random.default_rng(0)
    doc_index = rng.integers(0, 5, size=40)  # 40 chunks of 5 documents
    candidates = np.stack([rng.permutation(40)[:12] for _ in range(30)])  # [30, 12] best first
    candidates[3, 5:] = -1  # a query with few candidates
    own = rng.integers(-1, 5, size=30)  # -1: a sequence from outside the database
    chosen = chunk_store.select_neighbours(candidates, doc_index, own, k=4)
    for row in range(30):  # brute force
        expected = [int(c) for c in candidates[row] if c >= 0 and (own[row] < 0 or doc_index[c] != own[row])][:4]
        assert chosen[row].tolist() == expected + [-1] * (4 - len(expected))
        assert all(doc_index[c] != own[row] for c in chosen[row] if c >= 0 and own[row] >= 0)


def test_load_reads_the_job_records_and_refuses_gaps(tmp_path):
    chunks, store = _store()
    path = str(tmp_path / "chunks-00000-of-00001.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for chunk_id in reversed(range(len(chunks))):  # any order on disk
            writer.write(retro_chunks.chunk_to_example((chunk_id, chunks[chunk_id])))
    loaded = chunk_store.ChunkStore.load(str(tmp_path / "chunks-*"))
    assert len(loaded) == len(chunks) and loaded.doc_ids == store.doc_ids
    assert all(loaded.tokens(i).tolist() == list(c.tokens) for i, c in enumerate(chunks))
    assert loaded.document_of("b") == store.document_of("b") >= 0 and loaded.document_of("zzz") == -1
    (tmp_path / "gap").mkdir()
    with tf.io.TFRecordWriter(str(tmp_path / "gap" / "chunks-0.tfrecord")) as writer:
        writer.write(retro_chunks.chunk_to_example((1, chunks[1])))
    with pytest.raises(chunk_store.ChunkStoreError, match="missing"):
        chunk_store.ChunkStore.load(str(tmp_path / "gap" / "chunks-*"))


def test_select_neighbours_keeps_only_allowed_chunks():
    candidates = np.array([[0, 1, 2, 3, 4, -1]])
    doc_index = np.array([0, 1, 1, 2, 3])
    allowed = np.array([True, False, True, True, True])
    np.testing.assert_array_equal(chunk_store.select_neighbours(candidates, doc_index, 2, 3, allowed), [[0, 2, 4]])
    np.testing.assert_array_equal(chunk_store.select_neighbours(candidates, doc_index, -1, 6, allowed),
                                  [[0, 2, 3, 4, -1, -1]])
