"""A run's checkpoints partly damaged: the newest complete one is read (a warning names the damaged one), a
damaged file is an error naming the checkpoint, and a run without checkpoints reads as None."""
import logging
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import errors
from realm_tf.core import checkpoint_reading


def _run(tmp_path):
    """A run directory with checkpoints 1 and 2 (variable value 1.0, then 2.0) and TensorFlow's state file."""
    directory = str(tmp_path / "checkpoints")
    weight = tf.Variable(0.0)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(weight=weight), directory, max_to_keep=5)
    for step in (1, 2):
        weight.assign(float(step))
        manager.save(checkpoint_number=step)
    return directory


def _value(prefix):
    weight = tf.Variable(-1.0)
    checkpoint_reading.read(tf.train.Checkpoint(weight=weight), prefix).assert_existing_objects_matched()
    return float(weight.numpy())


def test_the_newest_complete_checkpoint_is_read(tmp_path):
    directory = _run(tmp_path)
    newest = checkpoint_reading.newest_complete(directory)
    assert newest == os.path.join(directory, "ckpt-2") == tf.train.latest_checkpoint(directory)
    assert _value(newest) == 2.0
    assert checkpoint_reading.newest_complete(str(tmp_path / "nothing")) is None  # no run: nothing to read
    (tmp_path / "empty").mkdir()
    assert checkpoint_reading.newest_complete(str(tmp_path / "empty")) is None


@pytest.mark.parametrize("damage", ["index_deleted", "data_deleted"])
def test_a_newest_checkpoint_with_files_missing_is_skipped_with_a_warning(tmp_path, monkeypatch, caplog, damage):
    monkeypatch.chdir(tmp_path)  # a relative run directory, as on the command line
    directory = _run(pathlib.Path("run"))
    suffix = ".index" if damage == "index_deleted" else ".data-00000-of-00001"
    os.remove(os.path.join(directory, "ckpt-2" + suffix))
    assert tf.train.latest_checkpoint(directory) in (None, os.path.join(directory, "ckpt-2"))  # TF: none or bad
    with caplog.at_level(logging.WARNING):
        newest = checkpoint_reading.newest_complete(directory)
    assert newest == os.path.join(directory, "ckpt-1") and _value(newest) == 1.0
    messages = [r.getMessage() for r in caplog.records if r.name == checkpoint_reading.__name__]
    assert any(m.startswith(os.path.join(directory, "ckpt-2") + ":") and "previous" in m for m in messages)
    assert len(messages) == 1, messages  # ckpt-1, as listed, is complete: no other warning


@pytest.mark.parametrize("damage", ["garbled", "deleted"])
def test_without_a_readable_state_file_the_highest_numbered_complete_checkpoint_is_read(tmp_path, caplog, damage):
    directory = _run(tmp_path)
    state = os.path.join(directory, "checkpoint")
    if damage == "garbled":
        with open(state, "w", encoding="utf-8") as f:
            f.write('model_checkpoint_path: "ckpt-2\nall_model_che\x00')
    else:
        os.remove(state)
    with caplog.at_level(logging.WARNING):
        newest = checkpoint_reading.newest_complete(directory)
    assert newest == os.path.join(directory, "ckpt-2") and _value(newest) == 2.0
    assert any(("cannot be read" if damage == "garbled" else "is missing") in r.getMessage() for r in caplog.records)


def test_every_checkpoint_damaged_or_a_corrupted_one_is_an_error_that_names_it(tmp_path):
    directory = _run(tmp_path)
    data = os.path.join(directory, "ckpt-2.data-00000-of-00001")
    raw = bytearray(open(data, "rb").read())
    raw[len(raw) // 2] ^= 0xFF  # TensorFlow's CRC32C over each tensor finds it on read
    open(data, "wb").write(bytes(raw))
    with pytest.raises(errors.UserError) as raised:
        _value(os.path.join(directory, "ckpt-2"))
    message = str(raised.value)
    assert message.startswith(os.path.join(directory, "ckpt-2")) and "Delete its files (ckpt-2.*)" in message
    for step in (1, 2):
        os.remove(os.path.join(directory, f"ckpt-{step}.index"))
    with pytest.raises(errors.UserError, match="every checkpoint is damaged"):
        checkpoint_reading.newest_complete(directory)


def test_a_trainer_resumes_from_the_previous_checkpoint_when_the_newest_is_damaged(tmp_path):
    from realm_tf import config
    from realm_tf.core import distribution
    from realm_tf.core import training_loop

    directory = _run(tmp_path)  # the run's model_dir is tmp_path: checkpoints of "weight" at steps 1 and 2
    os.remove(os.path.join(directory, "ckpt-2.index"))
    cfg = config.TrainerConfig(model_dir=str(tmp_path), steps=4, checkpoint_every_steps=1, summary_every_steps=1)
    weight = tf.Variable(-1.0)
    loop = training_loop.TrainingLoop(cfg, distribution.make_strategy("default"), {"weight": weight}, 1)
    assert loop.restored_from == os.path.join(directory, "ckpt-1")
    np.testing.assert_equal(weight.numpy(), 1.0)
