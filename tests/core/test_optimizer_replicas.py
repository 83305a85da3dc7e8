"""AdamW's per-variable learning-rate scales under MirroredStrategy: every replica's copy of a variable takes the
scale its path gives, the same update as on one device (2 logical CPUs, in a child process: the devices must
be split before TensorFlow starts)."""
import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import dataclasses
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_keras
from realm_tf import config
from realm_tf.core import distribution
from realm_tf.core import optimizer as optimizer_lib


class Component(tf_keras.layers.Layer):
    def __init__(self, inner, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner

    def call(self, x):
        return self.inner(x)


class Model(tf_keras.Model):
    def __init__(self):
        super().__init__()
        outside = tf_keras.layers.Dense(3, name="query_embedder_bert")  # named outside its component, as imports are
        outside(tf.zeros([1, 4]))
        self.retriever = Component(outside, name="knowledge_retriever")
        self.reader = Component(tf_keras.layers.Dense(3, name="reader_bert"), name="reader")

    def call(self, x):
        return self.retriever(x) + self.reader(x)


cfg = dataclasses.replace(config.TrainerConfig(), learning_rate=1e-2, warmup_steps=0, steps=100, weight_decay=0.0,
                          clip_norm=0.0, learning_rate_scales=("knowledge_retriever=0.1",))
x = tf.constant(np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))


def step(model, optimizer, inputs):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(inputs) ** 2) / 4.0  # the global batch's mean: the replicas' gradients sum
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


single_model = Model()
single_model(x)
initial = single_model.get_weights()
single_optimizer = optimizer_lib.build_optimizer(cfg, single_model)
for _ in range(3):
    step(single_model, single_optimizer, x)
single = [v.numpy() for v in single_model.trainable_variables]
strategy = distribution.make_strategy("mirrored")
assert strategy.num_replicas_in_sync == 2
with strategy.scope():
    model = Model()
    model(x)
    model.set_weights(initial)
    optimizer = optimizer_lib.build_optimizer(cfg, model)
halves = strategy.experimental_distribute_values_from_function(
    lambda context: x[2 * context.replica_id_in_sync_group:2 * context.replica_id_in_sync_group + 2])


replica_step = tf.function(lambda half: step(model, optimizer, half))
for _ in range(3):
    strategy.run(replica_step, args=(halves,))
report = {}
for variable, expected in zip(model.trainable_variables, single):
    copies = strategy.experimental_local_results(variable)
    report[variable.name] = [float(np.abs(c.numpy() - expected).max()) for c in copies]
scaled = [optimizer.lr_scale(c.name) for v in model.trainable_variables for c in strategy.experimental_local_results(v)]
print(json.dumps({"differences": report, "scales": scaled}))
"""


def test_every_replica_takes_the_scale_of_its_variables_path():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(set(result["scales"])) == [0.1, 1.0]
    assert result["scales"].count(0.1) == 4  # the retriever's kernel and bias, on both replicas
    for name, differences in result["differences"].items():
        assert max(differences) < 1e-6, (name, differences)
