"""tf.distribute strategies selected by ``pretrain.strategy``.

REALM pre-trained on 64 TPUs (Guu et al., 2020, App. A). The same training code runs under:
``default`` (one device), ``mirrored`` (all local devices), ``multi_worker`` (MultiWorkerMirroredStrategy,
workers described by ``TF_CONFIG``) and ``tpu`` (TPUStrategy; ``TPU_NAME`` names a TPU node, or ``TPU_CONFIG``
describes it; with neither, the TPU VM's own chips, ``"local"``).
"""
from __future__ import annotations

import logging
import os

import tensorflow as tf

from realm_tf import config as config_lib
from realm_tf import errors

logger = logging.getLogger(__name__)

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
        return _tpu_strategy(tpu_address())
    raise ValueError(f"pretrain.strategy={name!r}: expected one of {STRATEGIES}")


def allow_memory_growth() -> None:
    """Lets each GPU's memory grow as it is used instead of being taken whole at the first op, so that a process
    beside the trainer (an index builder with ``refresh.devices: all``, an evaluation) can have some. Must run
    before the first op; later it leaves the GPUs as they are."""
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # the runtime already started: too late, and harmless
            logger.debug("memory growth of %s not set: TensorFlow already started", gpu.name)


def describe(strategy: tf.distribute.Strategy, section: str, trainer: config_lib.TrainerConfig) -> str:
    """The line a training job prints at its start: its strategy, replicas and their devices, XLA and precision
    (e.g. ``pretrain: strategy mirrored, 2 replicas on CPU:0, CPU:1 (no GPU visible); jit_compile off; precision
    float32``), so that a missing GPU shows at once."""
    try:
        devices = [tf.DeviceSpec.from_string(d) for d in strategy.extended.worker_devices]
    except RuntimeError:  # the default strategy: the first GPU if there is one, else the CPU
        devices = [tf.DeviceSpec.from_string((tf.config.list_logical_devices("GPU")
                                              or tf.config.list_logical_devices("CPU"))[0].name)]
    names = ", ".join(f"{d.device_type}:{d.device_index or 0}" for d in devices)
    replicas = strategy.num_replicas_in_sync
    no_gpu = "" if tf.config.list_logical_devices("GPU") or trainer.strategy == "tpu" else " (no GPU visible)"
    return (f"{section}: strategy {trainer.strategy}, {replicas} replica{'s' if replicas != 1 else ''} on "
            f"{names}{no_gpu}; jit_compile {'on' if trainer.jit_compile else 'off'}; precision {trainer.precision}")


def tpu_address() -> str | None:
    """What ``TPUClusterResolver`` is given: ``TPU_NAME``; None where ``TPU_CONFIG`` describes the TPU (the
    resolver reads it); else ``"local"``, the chips of the TPU VM this runs on."""
    if os.environ.get("TPU_NAME"):
        return os.environ["TPU_NAME"]
    return None if os.environ.get("TPU_CONFIG") else "local"


def _tpu_strategy(address: str | None) -> tf.distribute.Strategy:
    """TPUStrategy over the TPU at ``address``; a clear error where there is none."""
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
        raise errors.UserError(f"strategy=tpu: no TPU found at {address or 'TPU_CONFIG'} (set TPU_NAME to a TPU "
                               f"node's name, or run on a TPU VM): {e}") from e
    return tf.distribute.TPUStrategy(resolver)


def set_intra_op_threads(threads: int) -> int:
    """Sets how many threads one op may split its work over (a training section's ``intra_op_threads``; 0 leaves
    TensorFlow's default, one per core) and returns the number in force (0: the default).

    TensorFlow sizes its intra-op pool when its runtime starts, so this must run before the first op; later (a
    second task in one process) the pool keeps its size and a warning says so. Splitting an op hands its pieces
    to pool threads and wakes the caller when they are done: on two cores a training step does that thousands of
    times, each a context switch. With one thread per op, independent ops still run concurrently on
    the inter-op threads.
    """
    current = tf.config.threading.get_intra_op_parallelism_threads()
    if threads < 0:
        raise ValueError(f"intra_op_threads={threads}: must be >= 0 (0: TensorFlow's default)")
    if threads == 0 or threads == current:
        return current
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError:  # the runtime has started: its pool cannot be resized
        logger.warning("intra_op_threads=%d not applied: TensorFlow had already started in this process "
                       "with %s intra-op threads", threads, current or "its default number of")
        return current
    return threads


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the worker that writes checkpoints, exports and summaries."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (resolver.task_type == "worker" and resolver.task_id == 0)
