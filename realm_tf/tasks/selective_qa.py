"""Selective question answering: how well a confidence ranks and calibrates the answers it is attached to.

A system that may abstain answers the questions whose confidence clears a threshold. Lowering the threshold trades
risk (the error rate of the answers given) for coverage (the fraction of questions answered): the risk-coverage
curve and its area, AURC (El-Yaniv & Wiener, 2010; Geifman & El-Yaniv, 2017), measure the ranking; selective QA
reports coverage at a target precision (Kamath et al., 2020, "Selective Question Answering under Domain Shift").
Calibration, whether a confidence of 0.7 is right 70% of the time, is measured by the expected calibration error
over equal-mass bins (Guo et al., 2017; Nixon et al., 2019) and the Brier score (Brier, 1950). Each figure gets a
percentile bootstrap interval over questions.

Thresholds sit between distinct confidences: questions of equal confidence are answered or abstained on together,
so the curve has one point per distinct confidence, not per question.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

#: Precisions at which coverage is reported.
TARGET_PRECISIONS = (0.8, 0.9)
#: Equal-mass bins of the expected calibration error.
ECE_BINS = 15


def risk_coverage(confidence: Sequence[float], correct: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """``(coverage[m], risk[m])``: one point per distinct confidence, highest first; answering every question
    whose confidence is at least that one covers ``coverage`` of them with error rate ``risk``."""
    conf, hit = _arrays(confidence, correct)
    order = np.argsort(-conf, kind="stable")
    conf, hit = conf[order], hit[order]
    ends = np.flatnonzero(np.append(conf[1:] != conf[:-1], True)) + 1  # [m]: answered count at each threshold
    errors = np.cumsum(1.0 - hit)[ends - 1]  # [m]
    return ends / len(conf), errors / ends


def aurc(confidence: Sequence[float], correct: Sequence[bool]) -> float:
    """The area under the risk-coverage curve, as a step function over coverage from 0 to 1 (lower is better)."""
    coverage, risk = risk_coverage(confidence, correct)
    widths = np.diff(np.concatenate([[0.0], coverage]))  # [m]
    return float(np.sum(widths * risk))


def coverage_at_precision(confidence: Sequence[float], correct: Sequence[bool], precision: float) -> float:
    """The largest coverage whose answers are right at least ``precision`` of the time (0 where none is)."""
    coverage, risk = risk_coverage(confidence, correct)
    reached = coverage[1.0 - risk >= precision - 1e-12]
    return float(reached.max()) if len(reached) else 0.0


def expected_calibration_error(confidence: Sequence[float], correct: Sequence[bool], bins: int = ECE_BINS) -> float:
    """Σ_b |B_b| / n · |accuracy(B_b) − mean confidence(B_b)| over ``bins`` bins of (nearly) equal size, the
    questions sorted by confidence."""
    conf, hit = _arrays(confidence, correct)
    order = np.argsort(conf, kind="stable")
    total = 0.0
    for chunk in np.array_split(order, min(bins, len(order))):
        total += len(chunk) * abs(hit[chunk].mean() - conf[chunk].mean())
    return float(total / len(conf))


def brier_score(confidence: Sequence[float], correct: Sequence[bool]) -> float:
    """The mean squared difference between confidence and being right (lower is better)."""
    conf, hit = _arrays(confidence, correct)
    return float(np.mean((conf - hit) ** 2))


def selective_metrics(confidence: Sequence[float], correct: Sequence[bool], num_samples: int = 1000,
                      seed: int = 0) -> dict[str, dict[str, float]]:
    """Each figure of this module as ``{"value", "low", "high"}``, the bounds a 95% percentile bootstrap interval
    over ``num_samples`` resamplings of the questions: ``aurc``, ``coverage_at_precision_0.8`` and ``_0.9``,
    ``ece``, ``brier`` and ``accuracy``."""
    conf, hit = _arrays(confidence, correct)
    figures = {"aurc": aurc, "ece": expected_calibration_error, "brier": brier_score,
               "accuracy": lambda c, h: float(np.mean(h))}
    for p in TARGET_PRECISIONS:
        figures[f"coverage_at_precision_{p}"] = lambda c, h, p=p: coverage_at_precision(c, h, p)
    rng = np.random.default_rng(seed)
    samples = rng.integers(0, len(conf), size=(num_samples, len(conf)))  # [S, n]
    out = {}
    for name, figure in figures.items():
        values = np.array([figure(conf[s], hit[s]) for s in samples])  # [S]
        low, high = np.percentile(values, [2.5, 97.5])
        out[name] = {"value": figure(conf, hit), "low": float(low), "high": float(high)}
    return out


def _arrays(confidence: Sequence[float], correct: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    conf = np.asarray(confidence, dtype=np.float64)  # [n]
    hit = np.asarray(correct, dtype=np.float64)  # [n]
    if conf.shape != hit.shape or conf.ndim != 1 or not len(conf):
        raise ValueError(f"need one confidence per answer and at least one answer, got shapes {conf.shape} and "
                         f"{hit.shape}")
    if not np.all(np.isfinite(conf)) or np.any((conf < -1e-6) | (conf > 1 + 1e-6)):
        raise ValueError("confidences must be finite probabilities in [0, 1]")
    return np.clip(conf, 0.0, 1.0), hit  # a sum of probabilities may round past 1
