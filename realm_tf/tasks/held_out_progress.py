"""When to stop training that has no length fixed in advance: held-out scores that no longer improve.

REALM pre-trains for 200k steps (Guu et al., 2020, App. A); a run of a smaller model on a smaller corpus has no
such figure to copy, so it trains while its held-out scores improve, and stops once none of them has beaten its
best for ``patience`` evaluations ("early stopping", Prechelt, 1998). An improvement must exceed ``min_delta``
(about the scores' standard error), so that evaluation noise alone does not keep a run going.
"""
from __future__ import annotations

from typing import Mapping, Sequence


def plateaued(curve: Sequence[Mapping[str, float]], keys: Sequence[str], patience: int, min_delta: float) -> bool:
    """Whether none of ``keys`` (higher is better) has beaten its best before the last ``patience`` evaluations
    by ``min_delta`` within them; a curve of ``patience`` points or fewer has not plateaued."""
    if patience < 1:
        raise ValueError(f"patience={patience} must be >= 1")
    if len(curve) <= patience:
        return False
    before, recent = curve[:-patience], curve[-patience:]
    return not any(max(point[key] for point in recent) >= max(point[key] for point in before) + min_delta
                   for key in keys)
