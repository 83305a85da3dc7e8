"""tf.distribute strategies selected by ``trainer.strategy``.

REALM pre-trained on 64 TPUs (Guu et al., 2020, App. A). The same training code runs under:
``default`` (one device), ``mirrored`` (all local devices), ``multi_worker`` (MultiWorkerMirroredStrategy,
workers described by ``TF_CONFIG``) and ``tpu`` (TPUStrategy; ``TPU_NAME`` names the TPU, empty for a
local TPU VM).
"""
from __future__ import annotations

import os

import tensorflow as tf

from realm_tf import config as config_lib

STRATEGIES = config_lib.choices(config_lib.Strategy)


def make_strategy(name: str) -> tf.distribute.Strategy:
    """Builds the named strategy (ValueError listing the choices for an unknown name)."""
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        if not tf.config.list_logical_devices("GPU"):
            # On CPU-only hosts the default cross-device ops are RING collectives, whose all-gather of
            # IndexedSlices gradients (embedding tables) can pair mismatched instances between replicas
            # ("Shape mismatch in the collective instance"). Reducing on one device is exact and, with all
            # replicas in one host's memory, costs no transfer.
            return tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.ReductionToOneDevice())
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        communication = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", ""))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"trainer.strategy={name!r}: expected one of {STRATEGIES}")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the worker that writes checkpoints, exports and summaries."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (resolver.task_type == "worker" and resolver.task_id == 0)
