"""embedding_matrix: shards back to a block-ordered matrix, and the refusals that keep an index whole."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.index import embedding_matrix


def test_records_round_trip_through_shards_in_any_order(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(5, 3)).astype(np.float32)  # [5, 3]
    order = [3, 0, 4, 1, 2]
    paths = [str(tmp_path / f"embeddings-0000{i}-of-00002.tfrecord") for i in range(2)]
    for path, ids in zip(paths, (order[:2], order[2:])):
        with tf.io.TFRecordWriter(path) as writer:
            for i in ids:
                writer.write(embedding_matrix.to_embedding_record((i, vectors[i])))
    ids, read = embedding_matrix.read_embedding_shards(paths, dim=3)
    assert list(ids) == order
    np.testing.assert_array_equal(read, vectors[order])
    np.testing.assert_array_equal(embedding_matrix.assemble_matrix(ids, read, num_blocks=5), vectors)
    with pytest.raises(embedding_matrix.IncompleteEmbeddingsError, match="shape \\(3,\\), expected \\(4,\\)"):
        embedding_matrix.read_embedding_shards(paths, dim=4)


def test_assemble_names_out_of_range_ids_and_failures_and_orders_rows():
    vectors = np.arange(8, dtype=np.float32).reshape(4, 2)  # [4, 2]
    matrix = embedding_matrix.assemble_matrix(np.array([2, 0, 3, 1]), vectors, num_blocks=4)
    np.testing.assert_array_equal(matrix, vectors[[1, 3, 0, 2]])
    with pytest.raises(embedding_matrix.IncompleteEmbeddingsError,
                       match=r"outside 0..2: 3.*1 block\(s\) failed .*2: InvalidArgumentError: boom"):
        embedding_matrix.assemble_matrix(np.array([0, 1, 3]), vectors[:3], num_blocks=3,
                                         failures=[{"block_id": 2, "error": "InvalidArgumentError: boom"}])
    assert embedding_matrix.format_ids(list(range(30)) + [40, 42], limit=2) == "0-29, 40, ... and 1 more ids"
