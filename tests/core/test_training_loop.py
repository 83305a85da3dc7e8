"""TrainingLoop: few traces over variable-length batches, checkpoint resume, TensorBoard scalars, SIGTERM."""
import glob
import os
import signal
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import config
from realm_tf.commands import command
from realm_tf.core import distribution
from realm_tf.core import optimizer as optimizer_lib
from realm_tf.core import training_loop


def _dataset():
    # Batches of 4 sequences padded to their own length: 3, 4, ..., 12 (every batch a new shape).
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(4, n)).astype(np.float32) for n in range(3, 13)]
    return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=tf.TensorSpec([4, None], tf.float32))


def _loop(tmp_path, steps, steps_per_loop=1, summary_every_steps=2):
    cfg = config.TrainerConfig(model_dir=str(tmp_path), steps=steps, checkpoint_every_steps=4,
                               summary_every_steps=summary_every_steps, steps_per_loop=steps_per_loop)
    strategy = distribution.make_strategy("default")
    with strategy.scope():
        weight = tf.Variable(1.0)
        optimizer = tf_keras.optimizers.SGD(0.1)
        optimizer_lib.create_slots(optimizer, [weight])  # as run_experiment does: no variable made in the step
    loop = training_loop.TrainingLoop(cfg, strategy, {"weight": weight, "optimizer": optimizer}, 4)

    def step_fn(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(weight * tf.reduce_mean(batch, axis=1) - 1.0))
        optimizer.apply_gradients([(tape.gradient(loss, weight), weight)])
        return {"loss": loss}

    return loop, step_fn, weight


def test_variable_lengths_do_not_retrace_every_step_and_resume(tmp_path):
    loop, step_fn, weight = _loop(tmp_path, steps=8)
    seen = []
    logs = loop.run(_dataset(), step_fn, hooks=(lambda s, l: seen.append(s),))
    assert loop.step == 8 and seen == list(range(1, 9)) and "loss" in logs
    assert loop.tracing_count == 1  # 8 different shapes, one trace: for the dataset's spec [4, None]
    assert glob.glob(str(tmp_path / "train" / "events.out.tfevents.*"))
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-8")
    trained = float(weight.numpy())
    # A new loop over the same model_dir resumes at step 8 with the trained weight, then goes on to 10.
    again, step_fn, weight = _loop(tmp_path, steps=10)
    assert again.step == 8 and float(weight.numpy()) == trained
    seen = []
    again.run(_dataset(), step_fn, hooks=(lambda s, l: seen.append(s),))
    assert seen == [9, 10]


def test_summaries_are_means_over_the_window(tmp_path, read_scalars):
    loop, step_fn, _ = _loop(tmp_path, steps=6)  # summaries every 2 steps
    counter = tf.Variable(0.0)

    def counting_step(batch):
        logs = step_fn(batch)
        counter.assign_add(1.0)
        return {**logs, "counter": counter.read_value()}  # 1, 2, 3, ... per step

    loop.run(_dataset(), counting_step)
    scalars = read_scalars(tmp_path / "train")
    assert scalars["counter"] == [(2, 1.5), (4, 3.5), (6, 5.5)]
    assert all(0.0 <= v <= 1.0 for _, v in scalars["input_wait_fraction"])


def test_sigterm_checkpoints_stops_and_is_reported(tmp_path):
    loop, step_fn, _ = _loop(tmp_path, steps=8)

    def preempt(step, logs):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice: handled after this step, not fatal

    loop.run(_dataset(), step_fn, hooks=(preempt,))
    assert loop.step == 3 and loop.stopped_by == "SIGTERM"
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-3")  # saved although not due
    # The CLI turns it into exit status 143, so a harness does not record the run as finished.
    assert command.training_exit_code({"stopped_by": loop.stopped_by}) == 143
    again, step_fn, _ = _loop(tmp_path, steps=8)
    again.run(_dataset(), step_fn)
    assert again.step == 8 and again.stopped_by is None
    assert command.training_exit_code({"stopped_by": again.stopped_by}) == 0


def test_an_error_mid_run_closes_the_progress_bar_and_gives_back_sigterm(tmp_path, capsys):
    """A step that fails (a full disk at a checkpoint, say): the bar is closed before the error reaches the
    command line, so the error is the last line printed, and SIGTERM's handler is the one from before the run."""
    loop, step_fn, _ = _loop(tmp_path, steps=8)
    before = signal.getsignal(signal.SIGTERM)

    def disk_full(step, logs):
        if step == 3:
            raise OSError(28, "No space left on device")

    capsys.readouterr()
    with pytest.raises(OSError):
        loop.run(_dataset(), step_fn, hooks=(disk_full,))
    print("the error line", file=sys.stderr)  # what the command line prints next
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1] == "the error line"  # no bar redrawn after it (closed, not collected)
    assert "3/8" in err and signal.getsignal(signal.SIGTERM) is before


def test_steps_per_loop_gives_the_weights_of_single_steps_with_one_host_call_per_loop(tmp_path):
    single, step_fn, weight = _loop(tmp_path / "one", steps=7, summary_every_steps=3)
    single.run(_dataset(), step_fn)
    want = float(weight.numpy())
    several, step_fn, weight = _loop(tmp_path / "three", steps=7, steps_per_loop=3, summary_every_steps=3)
    calls = []
    logs = several.run(_dataset(), step_fn, hooks=(lambda s, l: calls.append(s),))
    # Steps 1-3 and 4-6 in one call each, then the last step alone: three host round trips for seven steps.
    assert several.step == 7 and calls == [3, 6, 7] and np.isfinite(logs["loss"])
    assert float(weight.numpy()) == pytest.approx(want, rel=1e-6)
    assert several.tracing_count == 1  # the loop of three calls the one traced step


def test_steps_per_loop_needs_intervals_that_are_multiples_of_it():
    with pytest.raises(config.ConfigError, match=r"pretrain.steps_per_loop=4 runs 4 steps per call, so "
                                                 r"refresh.export_every_steps=10 must be a multiple of it"):
        config.load_config("configs/tiny.yaml", ["pretrain.steps_per_loop=4", "pretrain.summary_every_steps=4",
                                                 "refresh.export_every_steps=10"])
