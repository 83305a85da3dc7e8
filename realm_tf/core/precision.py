"""Training precision selected by ``<trainer section>.precision`` (Keras mixed precision).

``mixed_bfloat16`` keeps every variable, the optimizer and the losses in float32 and computes the layers in
bfloat16 (Micikevicius et al., 2018, "Mixed Precision Training"; bfloat16 keeps float32's exponent range, so no
loss scaling is needed). On TPUs this is the usual setting; on CPUs with AVX-512 BF16 instructions oneDNN's
bfloat16 matmuls run about twice as fast as float32's, and a MiniLM training step about 1.2×
(``benchmarks/reader_mixture_benchmark.py``).

``mixed_float16`` computes in float16, for GPUs without bfloat16 (V100, T4). float16's range is narrow, so small
gradients underflow: the optimizer is a dynamic ``LossScaleOptimizer`` (``core/optimizer.build_optimizer``),
which multiplies the loss by a scale, unscales the gradients, skips a step whose gradients are not finite and
halves the scale, and doubles it after ``loss_scale_growth_steps`` good steps (Micikevicius et al., 2018, §3.2).
Checkpoints hold float32 variables in every precision, so a run trained in one is evaluated and exported in any.
A run resumes in float32 or mixed_bfloat16 whichever it started in; a mixed_float16 run's optimizer also holds its
loss scale, so it resumes in mixed_float16. Only training uses the precision: ``evaluate``, ``export`` and the
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
