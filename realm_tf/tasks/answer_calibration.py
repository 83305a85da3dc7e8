"""Fitting the answer confidence of :mod:`realm_tf.models.answer_confidence` on held-out questions.

A calibrator is a logistic regression from an answer's features to whether it is right (exact match), fitted by
Newton's method on the L2-penalised log-likelihood, over the predictions of ``realm-tf evaluate`` on a split no
training stage read (the tune split; dev stays for measuring). Two kinds:

* ``platt``: the answer logit alone (Platt scaling, Platt 1999): monotone in the span probability, so it changes
  its calibration and not its ranking;
* ``features``: every feature of :data:`answer_confidence.FEATURES`, standardised: it can rank answers better
  than the span probability (Kamath et al., 2020).

The fit is a versioned JSON file (:func:`write_calibrator`), read by ``evaluate`` and ``export``
(``qa.confidence_calibrator``), which loads it into the exported graph.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.models import answer_confidence

KINDS = ("platt", "features")
FORMAT = 1  # the file's format version
#: The L2 penalty on the standardised weights (not on the bias), per question.
DEFAULT_L2 = 1e-2


@dataclasses.dataclass(frozen=True)
class Calibrator:
    """A fitted calibrator: σ(wᵀ (f − μ) / s + b) over :data:`answer_confidence.FEATURES`.

    ``fitted_on`` records where it was fitted (the predictions file, its question count, its corpus version).
    """

    kind: str
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    fitted_on: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def calibrated(self) -> bool:
        """Whether this is a fit (not :func:`identity`, the span probability itself)."""
        return self.kind != "none"

    @property
    def parameters(self) -> dict[str, Any]:
        """What :meth:`AnswerCalibrator.set_parameters` loads."""
        return {"mean": list(self.mean), "scale": list(self.scale), "weights": list(self.weights), "bias": self.bias}

    def record(self, path: str, corpus_version: int | None) -> dict[str, Any]:
        """What an export's marker says of its calibrator: its kind, file, where it was fitted, and the corpus
        version it answers over when exported (a later corpus-only version keeps the fit and says so)."""
        if not self.calibrated:
            return {"calibrator": "none"}
        return {"calibrator": self.kind, "file": path, "fitted_on": dict(self.fitted_on),
                "corpus_version": corpus_version}

    def confidence(self, features: np.ndarray) -> np.ndarray:
        """``[n]`` confidences of ``features`` ``[n, F]`` (numpy, as the graph computes them)."""
        standard = (np.asarray(features, np.float64) - np.asarray(self.mean)) / np.asarray(self.scale)  # [n, F]
        return _sigmoid(standard @ np.asarray(self.weights) + self.bias)


def identity() -> Calibrator:
    """The unfitted calibrator: the span probability itself."""
    n = len(answer_confidence.FEATURES)
    return Calibrator("none", (0.0,) * n, (1.0,) * n, (1.0,) + (0.0,) * (n - 1), 0.0)


def fit(features: np.ndarray, correct: Sequence[bool], kind: str = "features", l2: float = DEFAULT_L2,
        fitted_on: Mapping[str, Any] | None = None) -> Calibrator:
    """A calibrator of ``kind`` fitted on ``features`` ``[n, F]`` and ``correct`` ``[n]``.

    Raises:
      UserError: an unknown kind, a shape mismatch, or labels that are all right or all wrong (no link to fit).
    """
    if kind not in KINDS:
        raise errors.UserError(f"unknown calibrator kind {kind!r}: one of {', '.join(KINDS)}")
    x = np.asarray(features, np.float64)  # [n, F]
    y = np.asarray(correct, np.float64)  # [n]
    num_features = len(answer_confidence.FEATURES)
    if x.ndim != 2 or x.shape[1] != num_features or len(x) != len(y):
        raise errors.UserError(f"need [n, {num_features}] features and n labels, got {x.shape} and {y.shape}")
    if y.min() == y.max():
        raise errors.UserError(f"all {len(y)} answers are {'right' if y[0] else 'wrong'}: there is nothing to "
                               f"calibrate against; fit on more questions")
    used = np.arange(num_features) if kind == "features" else np.array([0])  # [m] the features fitted
    mean = np.zeros(num_features)
    scale = np.ones(num_features)
    if kind == "features":
        mean = x.mean(0)
        scale = np.where(x.std(0) > 1e-6, x.std(0), 1.0)
    standard = (x[:, used] - mean[used]) / scale[used]  # [n, m]
    coefficients = _newton(np.concatenate([standard, np.ones([len(y), 1])], 1), y, l2 * len(y))  # [m + 1]
    weights = np.zeros(num_features)
    weights[used] = coefficients[:-1]
    return Calibrator(kind, tuple(mean.tolist()), tuple(scale.tolist()), tuple(weights.tolist()),
                      float(coefficients[-1]), dict(fitted_on or {}, num_questions=int(len(y)),
                                                    accuracy=float(y.mean())))


def _newton(design: np.ndarray, y: np.ndarray, l2: float, steps: int = 100) -> np.ndarray:
    """argmin_β −Σ log-likelihood(y | σ(Xβ)) + l2/2 ‖β[:-1]‖² (the last column, the bias, unpenalised)."""
    beta = np.zeros(design.shape[1])
    penalty = np.full(design.shape[1], l2)
    penalty[-1] = 0.0
    for _ in range(steps):
        p = _sigmoid(design @ beta)  # [n]
        gradient = design.T @ (p - y) + penalty * beta  # [m + 1]
        hessian = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty + 1e-9)  # [m + 1, m + 1]
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return beta


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # σ without overflow


def prediction_features(predictions: Sequence[Mapping[str, Any]], path: str = "predictions") -> np.ndarray:
    """``[n, F]`` the ``features`` of ``realm-tf evaluate``'s prediction records (a UserError names a record
    without them: predictions written before the model computed them)."""
    rows = []
    for line, record in enumerate(predictions, 1):
        features = record.get("features")
        if not isinstance(features, Mapping) or set(features) != set(answer_confidence.FEATURES):
            raise errors.UserError(f"{path}:{line}: no confidence features ({', '.join(answer_confidence.FEATURES)});"
                                   f" evaluate the model again to write them")
        rows.append([float(features[name]) for name in answer_confidence.FEATURES])
    return np.asarray(rows, np.float64).reshape(-1, len(answer_confidence.FEATURES))


def fit_predictions(path: str, kind: str = "features", l2: float = DEFAULT_L2,
                    predictions: Sequence[Mapping[str, Any]] | None = None) -> Calibrator:
    """A calibrator fitted on the prediction records of ``realm-tf evaluate`` at ``path`` (JSON lines;
    ``predictions``: its records, when the caller has read them)."""
    predictions = read_predictions(path) if predictions is None else predictions
    if not predictions:
        raise errors.UserError(f"{path}: no predictions")
    return fit(prediction_features(predictions, path), [bool(p["exact_match"]) for p in predictions], kind, l2,
               fitted_on={"predictions": path})


def read_predictions(path: str) -> list[dict[str, Any]]:
    """The records of a predictions file; a line that is not JSON is a UserError naming it."""
    if not tf.io.gfile.exists(path):
        raise errors.UserError(f"{path}: no such predictions file (realm-tf evaluate writes one)")
    records = []
    with tf.io.gfile.GFile(path) as f:
        for line, text in enumerate(f, 1):
            if text.strip():
                try:
                    records.append(json.loads(text))
                except json.JSONDecodeError as e:
                    raise errors.UserError(f"{path}:{line}: not JSON ({e.msg})") from e
    return records


def write_calibrator(calibrator: Calibrator, path: str) -> None:
    """Writes ``calibrator`` to ``path`` atomically, with its format version and feature names."""
    record = {"format": FORMAT, "features": list(answer_confidence.FEATURES), **dataclasses.asdict(calibrator),
              **{key: [float(v) for v in getattr(calibrator, key)] for key in ("mean", "scale", "weights")},
              "bias": float(calibrator.bias)}  # numpy scalars written as JSON numbers
    config_lib.atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def read_calibrator(path: str) -> Calibrator:
    """The calibrator at ``path``; a UserError names a file of another format or other features."""
    try:
        with tf.io.gfile.GFile(path) as f:
            record = json.load(f)
    except (OSError, tf.errors.NotFoundError, json.JSONDecodeError) as e:
        raise errors.UserError(f"{path}: not a calibrator file ({e})") from e
    if record.get("format") != FORMAT or record.get("features") != list(answer_confidence.FEATURES):
        raise errors.UserError(f"{path}: a calibrator of format {record.get('format')} over features "
                               f"{record.get('features')}; this version reads format {FORMAT} over "
                               f"{list(answer_confidence.FEATURES)}: fit it again (realm-tf calibrate)")
    return Calibrator(record["kind"], tuple(record["mean"]), tuple(record["scale"]), tuple(record["weights"]),
                      float(record["bias"]), record.get("fitted_on", {}))


def configured(path: str) -> Calibrator:
    """``qa.confidence_calibrator``'s calibrator: :func:`identity` for "", else the file's."""
    return read_calibrator(path) if path else identity()
