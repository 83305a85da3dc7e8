"""run_experiment drives any Task: phases in order with their own variables, one iterator for phases with
equal inputs, resume from the last checkpoint, params.yaml, the task's hooks and result."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import config
from realm_tf.core import base_task
from realm_tf.core import evaluation
from realm_tf.core import experiment


class _Regression(base_task.Task):
    """y = x·w + b on a fixed stream of 64 examples: features ``x`` [batch, 3], labels ``y`` and ``index``."""

    trainer_section = "pretrain"

    def __init__(self, cfg, frozen_until=0, separate_inputs=False):
        super().__init__(cfg)
        self.frozen_until = frozen_until
        self.separate_inputs = separate_inputs
        self.seen = []  # (phase input seed, first example index of each batch)
        self.events = []
        self.traces = []  # the running phase's step-function traces, after each step

    def build_model(self):
        x = tf_keras.Input([3], name="x")
        hidden = tf_keras.layers.Dense(1, name="bias_layer", kernel_initializer="zeros")(x)
        return tf_keras.Model(x, {"y": tf.squeeze(hidden, -1)})

    def build_inputs(self, input_context=None, seed=None, tag=0):
        rng = np.random.default_rng(0)
        x = rng.normal(size=[64, 3]).astype(np.float32)
        y = x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.25
        data = tf.data.Dataset.from_tensor_slices(({"x": x}, {"y": y, "index": np.arange(64)}))
        return data.repeat().batch(4).map(lambda f, l: (f, {**l, "tag": tf.fill([4], tag)}))

    def call_model(self, model, features, training):
        return model(features["x"], training=training)

    def build_losses(self, labels, outputs):
        return tf.square(outputs["y"] - labels["y"]), {"first": labels["index"][0], "tag": labels["tag"][0]}

    def build_metrics(self, labels, terms):
        return {"first": tf.cast(terms["first"], tf.float32), "tag": tf.cast(terms["tag"], tf.float32)}

    def trainable_variables(self, model, kernel=True):
        return [v for v in model.trainable_variables if kernel or "bias" in v.name.split("/")[-1]]

    def phases(self, step):
        both = base_task.Phase("train", None, (("tag", 0),), (("kernel", True),))
        frozen = base_task.Phase("bias_only", self.frozen_until, (("tag", 1 if self.separate_inputs else 0),),
                                 (("kernel", False),))
        return [frozen, both] if step < self.frozen_until else [both]

    def initialize(self, model, loop):
        self.events.append(("initialize", loop.step))
        self.model, self.loop = model, loop

    def train_hooks(self, model, loop):
        def hook(step, logs):
            kernel = model.get_layer("bias_layer").kernel.numpy()
            self.seen.append((step, int(logs["first"]), int(logs["tag"]), float(np.abs(kernel).sum())))
            self.traces.append(loop.tracing_count)
        return [hook]

    def finish(self, model, loop):
        self.events.append(("finish", loop.step))
        return {"extra": 1}

    def close(self):
        self.events.append(("close",))


def _cfg(tmp_path, steps):
    return config.load_config("configs/tiny.yaml", [
        f"pretrain.model_dir={tmp_path}/run", f"pretrain.steps={steps}", "pretrain.learning_rate=0.05",
        "pretrain.warmup_steps=0", "pretrain.checkpoint_every_steps=2", "pretrain.summary_every_steps=1",
        "data.batch_size=4", "pretrain.weight_decay=0.0"])


def test_phases_share_one_iterator_and_train_their_own_variables(tmp_path):
    task = _Regression(_cfg(tmp_path, 6), frozen_until=3)
    result = experiment.run_experiment(task)
    assert result["step"] == 6 and result["extra"] == 1 and result["train"]
    steps, firsts, tags, kernels = zip(*task.seen)
    assert steps == (1, 2, 3, 4, 5, 6)
    assert firsts == (0, 4, 8, 12, 16, 20)  # one stream across both phases: no example twice
    assert kernels[:3] == (0.0, 0.0, 0.0) and kernels[3] > 0  # the kernel trains only from the second phase
    assert task.events == [("initialize", 0), ("finish", 6), ("close",)]
    # Each phase traces its step once: the optimizer's state exists before it is traced.
    assert task.traces == [1] * 6
    assert os.path.exists(tmp_path / "run" / "params.yaml")
    assert tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints")).endswith("ckpt-6")


def test_phases_with_other_inputs_get_their_own_iterator(tmp_path):
    task = _Regression(_cfg(tmp_path, 5), frozen_until=2, separate_inputs=True)
    experiment.run_experiment(task)
    _, firsts, tags, _ = zip(*task.seen)
    assert tags == (1, 1, 0, 0, 0)
    # A phase's inputs start at seed + step, so the second stream is its own, from its own beginning.
    assert firsts == (0, 4, 0, 4, 8)


def test_a_rerun_resumes_after_the_finished_phase(tmp_path):
    experiment.run_experiment(_Regression(_cfg(tmp_path, 4), frozen_until=3))
    task = _Regression(_cfg(tmp_path, 6), frozen_until=3)
    result = experiment.run_experiment(task)
    assert result["step"] == 6
    assert [s for s, *_ in task.seen] == [5, 6]
    assert task.events[0] == ("initialize", 4)
    assert all(kernel > 0 for *_, kernel in task.seen)  # restored weights, in the second phase


def test_the_optimizer_state_created_before_the_step_is_the_restored_one(tmp_path):
    first = _Regression(_cfg(tmp_path, 4), frozen_until=3)
    experiment.run_experiment(first)
    again = _Regression(_cfg(tmp_path, 4), frozen_until=3)  # resumes at step 4 and has nothing left to train
    experiment.run_experiment(again)

    def moments(task):
        optimizer = task.loop.checkpoint.optimizer
        return {(v.name, slot): optimizer.get_slot(v, slot).numpy() for v in task.model.trainable_variables
                for slot in ("m", "v")}

    trained, restored = moments(first), moments(again)
    assert sorted(trained) == sorted(restored) and all(np.abs(m).sum() > 0 for m in trained.values())
    for key, value in trained.items():
        np.testing.assert_array_equal(restored[key], value, err_msg=str(key))
    assert int(again.loop.checkpoint.optimizer.iterations.numpy()) == 4


def test_validation_step_matches_numpy(tmp_path):
    task = _Regression(_cfg(tmp_path, 1))
    model = task.build_model()
    features, labels = next(iter(task.build_inputs()))
    logs = task.validation_step((features, labels), model)
    want = np.mean((model(features["x"])["y"].numpy() - labels["y"].numpy()) ** 2)
    np.testing.assert_allclose(logs["loss"].numpy(), want, rtol=1e-6)


def test_run_evaluation_averages_the_validation_logs_over_the_batches(tmp_path):
    """The default protocol (aggregate_logs, reduce_aggregated_logs): the mean of each log over the batches."""
    task = _Regression(_cfg(tmp_path, 1))
    model = task.build_model()
    model.get_layer("bias_layer").set_weights([np.array([[0.5], [0.0], [1.0]], np.float32), np.zeros([1], np.float32)])
    dataset = task.build_inputs().take(5)
    metrics = evaluation.run_evaluation(task, model, dataset)
    losses, firsts = [], []
    for features, labels in dataset:
        losses.append(np.mean((features["x"].numpy() @ [0.5, 0.0, 1.0] - labels["y"].numpy()) ** 2))
        firsts.append(labels["index"].numpy()[0])
    assert set(metrics) == {"loss", "first", "tag"}
    np.testing.assert_allclose(metrics["loss"], np.mean(losses), rtol=1e-5)
    assert metrics["first"] == np.mean(firsts) == 8.0 and metrics["tag"] == 0.0
    evaluation.write_metrics(metrics, str(tmp_path / "metrics.json"))
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics


class _EvaluatedRegression(_Regression):
    """_Regression with held-out batches (another 16 examples of the same line) and a record of each evaluation."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.evaluations = []

    def eval_inputs(self):
        rng = np.random.default_rng(1)
        x = rng.normal(size=[16, 3]).astype(np.float32)
        y = x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.25
        return tf.data.Dataset.from_tensor_slices(({"x": x}, {"y": y, "index": np.arange(16),
                                                              "tag": np.zeros(16, np.int64)})).batch(4)

    def reduce_aggregated_logs(self, state):
        metrics = super().reduce_aggregated_logs(state)
        self.evaluations.append((self.loop.step, metrics["loss"]))
        return metrics


def test_train_and_eval_keeps_the_model_of_the_best_evaluation(tmp_path):
    cfg = config.load_config("configs/tiny.yaml", [
        f"pretrain.model_dir={tmp_path}/run", "pretrain.steps=12", "pretrain.learning_rate=0.5",
        "pretrain.warmup_steps=0",
        "pretrain.checkpoint_every_steps=4", "pretrain.eval_every_steps=3", "data.batch_size=4",
        "pretrain.weight_decay=0.0"])
    task = _EvaluatedRegression(cfg)
    experiment.run_experiment(task)
    assert [step for step, _ in task.evaluations] == [3, 6, 9, 12]
    best_step, best_loss = min(task.evaluations, key=lambda e: e[1])
    best_dir = tmp_path / "run" / experiment.BEST_DIR
    marker = json.loads((best_dir / experiment.BEST_MARKER).read_text())
    assert (marker["step"], marker["metric"]) == (best_step, "loss")
    np.testing.assert_allclose(marker["value"], best_loss, rtol=1e-6)
    # The kept model is that step's: its held-out loss, computed in numpy from the restored weights.
    model = task.build_model()
    tf.train.Checkpoint(model=model).read(str(best_dir / "ckpt")).expect_partial()
    kernel, bias = model.get_layer("bias_layer").get_weights()
    features, labels = next(iter(task.eval_inputs().unbatch().batch(16)))
    want = np.mean((features["x"].numpy() @ kernel[:, 0] + bias[0] - labels["y"].numpy()) ** 2)
    np.testing.assert_allclose(best_loss, want, rtol=1e-5)
    assert not list(tmp_path.glob("run/.staging-*")) and not list(tmp_path.glob("run/.replaced-*"))


def test_a_budget_decay_is_refused_with_the_line_of_the_config(tmp_path):
    """Training runs its steps on every machine: there is no schedule that ends with a time budget."""
    with pytest.raises(config.ConfigError, match="learning_rate_decay"):
        config.load_config("configs/tiny.yaml", ["pretrain.learning_rate_decay=budget"])


def test_a_time_budget_with_several_workers_is_refused_before_training(tmp_path):
    cfg = config.load_config("configs/tiny.yaml", [
        f"pretrain.model_dir={tmp_path}/run", "pretrain.strategy=multi_worker", "pretrain.max_minutes=1"])
    with pytest.raises(config.ConfigError, match="pretrain.max_minutes needs a single-worker strategy"):
        experiment.run_experiment(_Regression(cfg))
    assert not os.path.exists(tmp_path / "run")  # refused before anything was written
