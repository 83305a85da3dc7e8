"""Training precision selected by ``<trainer section>.precision`` (Keras mixed precision).

``mixed_bfloat16`` keeps every variable, the optimizer and the losses in float32 and computes the layers in
bfloat16 (Micikevicius et al., 2018, "Mixed Precision Training"; bfloat16 keeps float32's exponent range, so no
loss scaling is needed). On TPUs this is the usual setting; on CPUs with AVX-512 BF16 instructions oneDNN's
bfloat16 matmuls run about twice as fast as float32's, and a MiniLM training step about 1.2×
(``benchmarks/reader_mixture_benchmark.py``). Checkpoints hold float32 variables either way, so a run trained in
one precision is evaluated, exported and resumed in the other. Only training uses it: ``evaluate``, ``export`` and the
index's embeddings stay float32.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import tf_keras

from realm_tf import config as config_lib

PRECISIONS = config_lib.choices(config_lib.Precision)


@contextlib.contextmanager
def policy_scope(precision: str) -> Iterator[None]:
    """Layers built inside compute in ``precision``'s Keras dtype policy; the previous global policy is restored
    on exit (Keras layers take the policy when they are created)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: expected one of {PRECISIONS}")
    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(precision)
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)
