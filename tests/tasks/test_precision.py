"""Training precision: the Keras policy scope restores the previous policy (also on an error), an unknown
precision is refused, and native bfloat16 is read from the CPU flags."""
import pytest
import tensorflow as tf
import tf_keras

from realm_tf.tasks import precision


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


def test_native_bfloat16_reads_the_cpu_flags(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 fma\n\nprocessor\t: 1\n")
    assert precision.native_bfloat16(str(path))
    path.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f fma\n")
    assert not precision.native_bfloat16(str(path))
    path.write_text("processor\t: 0\nflags\t\t: fpu amx_bf16 amx_tile\n")
    assert precision.native_bfloat16(str(path))
    assert not precision.native_bfloat16(str(tmp_path / "missing"))
