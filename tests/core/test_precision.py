"""Training precision: the Keras policy scope restores the previous policy (also on an error), and an unknown
precision is refused."""
import pytest
import tensorflow as tf
import tf_keras

from realm_tf.core import precision


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
        with precision.policy_scope("mixed_float16"):
            pass

