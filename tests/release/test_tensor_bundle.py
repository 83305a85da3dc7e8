"""Tensor bundles read from their files: the rows of a checkpoint tensor memory-mapped, against TensorFlow's own
reader, in checkpoints written by TF1's Saver and TF2's tf.train.Checkpoint."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.release import tensor_bundle


def _tf1_checkpoint(prefix, tensors):
    graph = tf.Graph()
    with graph.as_default():
        variables = [tf.compat.v1.get_variable(name, initializer=value) for name, value in tensors.items()]
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(session, prefix)


def test_every_tensor_of_a_saver_checkpoint_maps_to_tensorflows_values(tmp_path):
    rng = np.random.default_rng(0)
    # Many names: the index table then has more than one data block, and keys share prefixes.
    tensors = {f"module/layer_{i:03d}/kernel": rng.normal(size=[i % 7 + 1, 3]).astype(np.float32) for i in range(300)}
    tensors.update({"block_emb": rng.normal(size=[1000, 16]).astype(np.float32),
                    "ids": np.arange(12, dtype=np.int64).reshape(3, 4), "step": np.int32(7)})
    prefix = _tf1_checkpoint(str(tmp_path / "encoded.ckpt"), tensors)
    reader = tf.train.load_checkpoint(prefix)
    for name in tensors:
        mapped = tensor_bundle.memory_map(prefix, name)
        np.testing.assert_array_equal(np.asarray(mapped), reader.get_tensor(name), err_msg=name)
        assert mapped.dtype == reader.get_tensor(name).dtype
    assert isinstance(tensor_bundle.memory_map(prefix, "block_emb"), np.memmap)
    with pytest.raises(KeyError, match="no tensor 'block_em'"):
        tensor_bundle.memory_map(prefix, "block_em")


def test_a_tf2_checkpoint_and_a_damaged_index(tmp_path):
    value = tf.Variable(np.arange(40, dtype=np.float32).reshape(10, 4))
    prefix = tf.train.Checkpoint(block_emb=value).write(str(tmp_path / "ckpt"))
    name = "block_emb/.ATTRIBUTES/VARIABLE_VALUE"
    np.testing.assert_array_equal(tensor_bundle.memory_map(prefix, name), value.numpy())
    (tmp_path / "bad.index").write_bytes(b"not a table" * 10)
    with pytest.raises(tensor_bundle.BundleFormatError, match="bad.index: not a checkpoint index"):
        tensor_bundle.memory_map(str(tmp_path / "bad"), "block_emb")
