"""Gradient accumulation: a batch read in micro-batches gives the update of the whole batch (under XLA too), its
per-example outputs in the batch's order, and clear errors where the parts cannot add up to the whole."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import config
from realm_tf.core import gradient_accumulation
from realm_tf.core import optimizer as optimizer_lib
from realm_tf.core import precision
from realm_tf.core import training_loop

TRAINER = dataclasses.replace(config.TrainerConfig(), learning_rate=1e-2, warmup_steps=0,
                              learning_rate_decay="constant", steps=10, weight_decay=0.01)


def _model():
    ids = tf_keras.Input([5], dtype=tf.int32, name="ids")
    embedded = tf_keras.layers.Embedding(50, 8, name="embedding")(ids)  # its gradient: IndexedSlices
    hidden = tf_keras.layers.Dense(8, activation="gelu", name="hidden")(tf.reduce_mean(embedded, axis=1))
    unused = tf_keras.layers.Dense(3, name="unused")(hidden)  # no gradient: the update must leave it alone
    return tf_keras.Model(ids, {"score": tf_keras.layers.Dense(1, name="score")(hidden)[:, 0], "unused": unused})


def _batches():
    rng = np.random.default_rng(0)
    return [(rng.integers(0, 50, size=(8, 5)).astype(np.int32), rng.normal(size=(8,)).astype(np.float32))
            for _ in range(3)]


def _train(steps: int, trainer: config.TrainerConfig = TRAINER, jit: bool = True):
    tf_keras.utils.set_random_seed(0)
    with precision.policy_scope(trainer.precision):
        model = _model()
    optimizer = optimizer_lib.build_optimizer(trainer, model)
    optimizer_lib.create_slots(optimizer, model.trainable_variables)
    start = [v.numpy() for v in model.trainable_variables]

    def loss_fn(part):
        ids, target = part
        score = tf.cast(model(ids, training=True)["score"], tf.float32)  # [micro]
        error = tf.square(score - target)  # [micro]
        return error, {"error": error, "first_id": ids[:, 0]}

    @tf.function(jit_compile=jit, autograph=False)
    def step(ids, target):
        return training_loop.minimize(loss_fn, (ids, target), model.trainable_variables, optimizer, 8, steps)

    outputs = [step(*batch) for batch in _batches()]
    return model, start, outputs


def test_micro_batches_give_the_update_of_the_whole_batch_under_xla():
    whole, start, whole_outputs = _train(1)
    parts, part_start, part_outputs = _train(4)
    for a, b in zip(start, part_start):
        np.testing.assert_array_equal(a, b)
    moved = max(float(np.abs(v.numpy() - s).max()) for v, s in zip(whole.trainable_variables, start))
    assert moved > 1e-2  # AdamW at 1e-2 for 3 steps
    for v, w in zip(whole.trainable_variables, parts.trainable_variables):
        np.testing.assert_allclose(w.numpy(), v.numpy(), atol=1e-5, err_msg=v.name)
    unused = [i for i, v in enumerate(parts.trainable_variables) if "unused" in v.name]
    assert unused and all(np.array_equal(parts.trainable_variables[i].numpy(), start[i]) for i in unused)
    batches = _batches()
    for (ids, _), (per_example, terms), (reference, _) in zip(batches, part_outputs, whole_outputs):
        assert per_example.shape == [8] and terms["error"].shape == [8]
        np.testing.assert_array_equal(terms["first_id"].numpy(), ids[:, 0])  # the batch's order
        np.testing.assert_allclose(per_example.numpy(), reference.numpy(), rtol=1e-4, atol=1e-6)


def test_an_overflow_in_one_micro_batch_skips_the_update_under_loss_scaling():
    trainer = dataclasses.replace(TRAINER, precision="mixed_float16", loss_scale_growth_steps=100)
    tf_keras.utils.set_random_seed(0)
    with precision.policy_scope("mixed_float16"):
        model = _model()
    optimizer = optimizer_lib.build_optimizer(trainer, model)
    optimizer_lib.create_slots(optimizer, model.trainable_variables)
    scale = float(optimizer.loss_scale)
    ids, target = _batches()[0]
    target = target.copy()
    target[7] = np.inf  # the last micro-batch's last example
    before = [v.numpy() for v in model.trainable_variables]

    def loss_fn(part):
        part_ids, part_target = part
        error = tf.square(tf.cast(model(part_ids, training=True)["score"], tf.float32) - part_target)
        return error, {}

    training_loop.minimize(loss_fn, (ids, target), model.trainable_variables, optimizer, 8, 4)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.trainable_variables))
    assert float(optimizer.loss_scale) == scale / 2


def test_parts_that_cannot_make_the_whole_are_refused():
    variable = tf.Variable(1.0)
    with pytest.raises(ValueError, match="must divide each replica's batch, which holds 6"):
        gradient_accumulation.gradients(lambda x: (x * variable, {}), tf.ones([6]), [variable], 6, steps=4)
    with pytest.raises(ValueError, match="every output of the loss must be per example"):
        gradient_accumulation.gradients(lambda x: (x * variable, {"mean": tf.reduce_mean(x)}), tf.ones([8]),
                                        [variable], 8, steps=4)
    with pytest.raises(config.ConfigError, match="ict.gradient_accumulation_steps must be 1"):
        config.load_config("configs/tiny.yaml", ["ict.gradient_accumulation_steps=2"])
    with pytest.raises(config.ConfigError, match="divide the batch of 4 examples, got 3"):
        config.load_config("configs/tiny.yaml", ["pretrain.gradient_accumulation_steps=3"])
    cfg = config.load_config("configs/tiny.yaml", ["reader.batch_size=12", "reader.gradient_accumulation_steps=3"])
    assert (cfg.reader.batch_size, cfg.reader.gradient_accumulation_steps, cfg.data.batch_size) == (12, 3, 4)


def test_a_batch_whose_size_is_known_only_when_it_runs_is_read_in_parts():
    """The batch dimension unknown when traced (a dataset without drop_remainder): a term whose size is static
    (2) beside a loss whose size is not still goes back together in the batch's order."""
    variable = tf.Variable(3.0)

    def loss_fn(x):  # x: [micro] with micro unknown; the term: [2]
        return x * variable, {"x": tf.reshape(x, [2])}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def parts(x):
        return gradient_accumulation.gradients(loss_fn, x, [variable], 8, steps=4)

    x = tf.range(8, dtype=tf.float32)
    (grad,), per_example, terms = parts(x)
    np.testing.assert_allclose(grad.numpy(), float(np.sum(np.arange(8))) / 8)  # d/dv of mean(x · v)
    np.testing.assert_allclose(per_example.numpy(), 3.0 * np.arange(8))
    np.testing.assert_array_equal(terms["x"].numpy(), np.arange(8))
