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

import io
import os
from typing import Sequence

import numpy as np

from realm_tf import config as config_lib

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


def precision_at_coverage(confidence: Sequence[float], correct: Sequence[bool], coverage: float) -> float:
    """The precision of the answers given at the first threshold that covers at least ``coverage`` of the
    questions (ties answered together, so the coverage reached may exceed it)."""
    covered, risk = risk_coverage(confidence, correct)
    return float(1.0 - risk[np.flatnonzero(covered >= coverage - 1e-12)[0]])


def paired_differences(confidence: Sequence[float], baseline: Sequence[float], correct: Sequence[bool],
                       num_samples: int = 1000, seed: int = 0, coverage: float = 0.2) -> dict[str, dict[str, float]]:
    """``confidence``'s figure minus ``baseline``'s over the same answers, each as ``{"value", "low", "high"}``:
    a 95% paired bootstrap interval (both scored on the same resampled questions), for ``aurc``, ``ece``,
    ``brier`` and ``precision_at_coverage_<coverage>``. An interval that excludes 0 is a difference the
    questions' sampling does not explain."""
    conf, hit = _arrays(confidence, correct)
    base, _ = _arrays(baseline, correct)
    figures = {"aurc": aurc, "ece": expected_calibration_error, "brier": brier_score,
               f"precision_at_coverage_{coverage:g}": lambda c, h: precision_at_coverage(c, h, coverage)}
    samples = np.random.default_rng(seed).integers(0, len(conf), size=(num_samples, len(conf)))  # [S, n]
    out = {}
    for name, figure in figures.items():
        deltas = np.array([figure(conf[s], hit[s]) - figure(base[s], hit[s]) for s in samples])  # [S]
        low, high = np.percentile(deltas, [2.5, 97.5])
        out[name] = {"value": figure(conf, hit) - figure(base, hit), "low": float(low), "high": float(high)}
    return out


def threshold_for_precision(confidence: Sequence[float], correct: Sequence[bool], precision: float) -> float:
    """The lowest threshold whose answers (confidence ≥ threshold) are right at least ``precision`` of the time,
    which gives :func:`coverage_at_precision`; +inf (abstain on every question) where no threshold reaches it."""
    conf, hit = _arrays(confidence, correct)
    coverage, risk = risk_coverage(conf, hit)
    thresholds = np.sort(np.unique(conf))[::-1]  # [m]: the distinct confidences, highest first, as the curve
    reached = np.flatnonzero(1.0 - risk >= precision - 1e-12)
    return float(thresholds[reached.max()]) if len(reached) else float("inf")


def at_threshold(confidence: Sequence[float], correct: Sequence[bool], threshold: float) -> dict[str, float]:
    """What abstaining below ``threshold`` does: ``coverage`` (the share answered), ``answered``, and
    ``precision`` (the share of those that are right; 0 when none is answered)."""
    conf, hit = _arrays(confidence, correct)
    answered = conf >= threshold  # [n]
    count = int(answered.sum())
    return {"threshold": float(threshold), "coverage": count / len(conf), "answered": count,
            "precision": float(hit[answered].mean()) if count else 0.0}


def reliability_bins(confidence: Sequence[float], correct: Sequence[bool],
                     bins: int = ECE_BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean confidence[b], accuracy[b], count[b])`` of the equal-mass bins of
    :func:`expected_calibration_error`: the points of a reliability diagram (DeGroot & Fienberg, 1983)."""
    conf, hit = _arrays(confidence, correct)
    chunks = np.array_split(np.argsort(conf, kind="stable"), min(bins, len(conf)))
    return (np.array([conf[c].mean() for c in chunks]), np.array([hit[c].mean() for c in chunks]),
            np.array([len(c) for c in chunks]))


def write_reliability_diagram(path: str, curves: dict[str, tuple[Sequence[float], Sequence[bool]]],
                              title: str = "") -> str:
    """A PNG at ``path``: accuracy against mean confidence in equal-mass bins for each named
    ``(confidence, correct)`` of ``curves``, beside the diagonal of perfect calibration, with each curve's ECE
    in its label. Written atomically; returns ``path``."""
    import matplotlib  # pylint: disable=import-outside-toplevel  (tf-models-official's dependency)

    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    figure, axes = pyplot.subplots(figsize=(4.5, 4.5), dpi=100)
    axes.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect calibration")
    for name, (confidence, correct) in curves.items():
        mean, accuracy, _ = reliability_bins(confidence, correct)
        ece = expected_calibration_error(confidence, correct)
        axes.plot(mean, accuracy, marker="o", markersize=4, label=f"{name} (ECE {ece:.3f})")
    axes.set(xlim=(0, 1), ylim=(0, 1), xlabel=f"mean confidence ({ECE_BINS} equal-mass bins)",
             ylabel="exact match", title=title or "reliability diagram")
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format="png")
    pyplot.close(figure)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    config_lib.atomic_write_bytes(path, image.getvalue())
    return path


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
