"""BlockStore: blocks by dense id from TFRecords; refuses gaps and duplicates, naming the files."""
import os

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.data import block_store
from realm_tf.data import example_schemas


def _write(path, rows):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for block_id, title_ids, body_ids, title, text in rows:
            writer.write(example_schemas.to_example({
                example_schemas.BLOCK_ID: block_id, example_schemas.UID: example_schemas.block_uid(title, text),
                example_schemas.DOC_ID: "d", example_schemas.BLOCK_INDEX: 0, example_schemas.TITLE: title,
                example_schemas.TEXT: text, example_schemas.TITLE_IDS: title_ids, example_schemas.BODY_IDS: body_ids}))


def test_loads_blocks_by_id_across_shards(tmp_path):
    # Two shards, ids out of order, one empty title.
    _write(tmp_path / "blocks-00000-of-00002.tfrecord", [(2, [7], [8, 9, 10], "t2", "body two"),
                                                         (0, [], [5], "", "zero")])
    _write(tmp_path / "blocks-00001-of-00002.tfrecord", [(1, [3, 4], [6], "t1", "ünïcode")])
    store = block_store.BlockStore.load(str(tmp_path / "blocks-*.tfrecord"))
    assert len(store) == 3
    assert [store.title_ids(i).tolist() for i in range(3)] == [[], [3, 4], [7]]
    assert [store.body_ids(i).tolist() for i in range(3)] == [[5], [6], [8, 9, 10]]
    assert store.body_ids(2).dtype == np.int32
    assert store.texts == ["zero", "ünïcode", "body two"] and store.titles == ["", "t1", "t2"]
    assert store.uids[1] == example_schemas.block_uid("t1", "ünïcode")
    store.check_ids(np.array([[-1, 0, 2]]))
    with pytest.raises(IndexError, match="out of range.*another corpus"):
        store.check_ids(np.array([[-1, 3]]))


@pytest.mark.parametrize("ids,message", [([0, 2], r"missing: \[1\]"), ([0, 1, 1], r"duplicated: \[1\]")])
def test_refuses_ids_that_are_not_dense(tmp_path, ids, message):
    _write(tmp_path / "blocks-0.tfrecord", [(i, [1], [2], f"t{n}", f"b{n}") for n, i in enumerate(ids)])
    with pytest.raises(block_store.BlockStoreError, match=message):
        block_store.BlockStore.load(str(tmp_path / "blocks-*.tfrecord"))


def test_no_files_and_corrupt_files_are_named(tmp_path):
    with pytest.raises(block_store.BlockStoreError, match="no block TFRecords match.*realm-tf preprocess"):
        block_store.BlockStore.load(str(tmp_path / "nothing-*.tfrecord"))
    with open(tmp_path / "blocks-0.tfrecord", "wb") as f:
        f.write(os.urandom(64))
    with pytest.raises(block_store.BlockStoreError, match="blocks-\\*.tfrecord: cannot read block records"):
        block_store.BlockStore.load(str(tmp_path / "blocks-*.tfrecord"))
