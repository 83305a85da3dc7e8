"""Training precision: the Keras policy scope restores the previous policy (also on an error), an unknown
precision is refused, and mixed_float16 trains with dynamic loss scaling."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import config
from realm_tf.core import optimizer as optimizer_lib
from realm_tf.core import precision
from realm_tf.core import training_loop


def test_policy_scope_builds_bfloat16_layers_and_restores_the_policy():
    with precision.policy_scope("mixed_bfloat16"):
        layer = tf_keras.layers.Dense(3)
    assert tf_keras.mixed_precision.global_policy().name == "float32"
    out = layer(tf.ones([2, 4]))
    assert layer.compute_dtype == "bfloat16" and out.dtype == tf.bfloat16 and layer.kernel.dtype == tf.float32
    with pytest.raises(RuntimeError):
        with precision.policy_scope("mixed_bfloat16"):
            raise RuntimeError("build failed")
    assert tf_keras.mixed_precision.global_policy().name == "float32"
    with pytest.raises(ValueError, match="mixed_float16"):
        with precision.policy_scope("float16"):
            pass



def test_mixed_float16_skips_an_overflowing_step_halves_the_scale_and_grows_it_back():
    trainer = dataclasses.replace(config.TrainerConfig(), precision="mixed_float16", loss_scale_growth_steps=2,
                                  learning_rate=1e-2, warmup_steps=0, learning_rate_decay="constant", steps=10)
    x = tf.constant(np.random.default_rng(0).normal(size=(8, 4)), tf.float32)  # [batch, 4]
    models = {}
    for name in ("mixed_float16", "float32"):
        with precision.policy_scope(name):
            models[name] = tf_keras.Sequential([tf_keras.layers.Dense(6, activation="gelu"), tf_keras.layers.Dense(1)])
            models[name].build((None, 4))
    rng = np.random.default_rng(1)  # fixed weights, small enough that the first scaled step does not overflow
    weights = [rng.normal(scale=0.3, size=w.shape).astype(np.float32) for w in models["float32"].get_weights()]
    for model in models.values():
        model.set_weights(weights)
    half, full = models["mixed_float16"], models["float32"]
    optimizer = optimizer_lib.build_optimizer(trainer, half)
    reference = optimizer_lib.build_optimizer(dataclasses.replace(trainer, precision="float32"), full)
    assert isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    start_scale = float(optimizer.loss_scale)

    def step(model, opt, overflow=1.0):
        def loss_fn(x):  # [batch]: a squared output (small, as a token's share of a loss is), times inf where an
            # overflow is injected
            out = tf.cast(model(x)[:, 0], tf.float32)
            return 1e-2 * tf.square(out - 1.0) * overflow, None
        return float(tf.reduce_mean(training_loop.minimize(loss_fn, x, model.trainable_variables, opt, 8)[0]))

    np.testing.assert_allclose(step(half, optimizer), step(full, reference), rtol=1e-2)
    assert float(optimizer.loss_scale) == start_scale  # a good step: applied, not skipped
    for a, b in zip(half.get_weights(), full.get_weights()):  # the update of a good step: float32's
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=1e-3)
    before = half.get_weights()
    step(half, optimizer, overflow=np.inf)  # step 2: infinite gradients
    assert all(np.array_equal(a, b) for a, b in zip(half.get_weights(), before))  # skipped
    assert float(optimizer.loss_scale) == start_scale / 2
    step(half, optimizer)
    assert float(optimizer.loss_scale) == start_scale / 2
    step(half, optimizer)  # the second good step in a row: the scale doubles again
    assert float(optimizer.loss_scale) == start_scale
    assert not all(np.array_equal(a, b) for a, b in zip(half.get_weights(), before))
