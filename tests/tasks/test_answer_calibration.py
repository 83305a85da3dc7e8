"""Answer calibration: a fit recovers a known link, Platt scaling keeps the ranking, the Keras layer computes
what the numpy calibrator does, and calibrator files are versioned."""
import json

import numpy as np
import pytest

from realm_tf import errors
from realm_tf.models import answer_confidence
from realm_tf.tasks import answer_calibration
from realm_tf.tasks import selective_qa


def _synthetic(n, seed):
    """Features of n answers and labels drawn from a known logistic link over two of them."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, len(answer_confidence.FEATURES))) * [2.0, 1.0, 1.5, 1.0, 3.0, 0.3] + 1.0
    logit = 0.8 * (features[:, 0] - 1.0) / 2.0 + 1.2 * (features[:, 5] - 1.0) / 0.3 - 0.5  # on standardised scale
    correct = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
    return features, correct, logit


def test_a_fit_on_a_known_link_recovers_it():
    features, correct, _ = _synthetic(20000, 0)
    fitted = answer_calibration.fit(features, correct, "features", l2=1e-4)
    # the link's coefficients, restated on the fit's (sample) standardisation
    true = 0.8 * np.std(features[:, 0]) / 2.0, 1.2 * np.std(features[:, 5]) / 0.3
    assert fitted.weights[0] == pytest.approx(true[0], abs=0.06)
    assert fitted.weights[5] == pytest.approx(true[1], abs=0.06)
    assert np.abs(np.asarray(fitted.weights)[[1, 2, 3, 4]]).max() < 0.06  # the features without signal
    held_features, held_correct, held_logit = _synthetic(5000, 1)
    truth = 1.0 / (1.0 + np.exp(-held_logit))
    assert np.abs(fitted.confidence(held_features) - truth).max() < 0.05
    assert selective_qa.expected_calibration_error(fitted.confidence(held_features), held_correct) < 0.03
    assert fitted.fitted_on["num_questions"] == 20000


def test_platt_scaling_calibrates_an_overconfident_score_without_changing_its_ranking():
    rng = np.random.default_rng(2)
    truth = rng.random(5000)
    correct = rng.random(5000) < truth
    score = truth ** 0.3  # overconfident, and monotone in the truth
    features = np.zeros([5000, len(answer_confidence.FEATURES)])
    features[:, 0] = np.log(score) - np.log1p(-np.minimum(score, 1 - 1e-9))
    platt = answer_calibration.fit(features, correct, "platt")
    confidence = platt.confidence(features)
    assert np.all(np.diff(confidence[np.argsort(score)]) >= -1e-12)  # monotone: the same ranking
    assert selective_qa.aurc(confidence, correct) == pytest.approx(selective_qa.aurc(score, correct))
    assert selective_qa.expected_calibration_error(confidence, correct) < 0.5 * \
        selective_qa.expected_calibration_error(score, correct)
    assert platt.weights[1:] == (0.0,) * 5


def test_the_layer_computes_the_numpy_calibrators_confidence_and_starts_as_the_span_probability():
    features, correct, _ = _synthetic(300, 3)
    fitted = answer_calibration.fit(features, correct)
    layer = answer_confidence.AnswerCalibrator()
    score = np.array([0.02, 0.3, 0.5, 0.97, 1.0], np.float32)
    unfitted = np.zeros([5, 6], np.float32)
    unfitted[:, 0] = answer_confidence.answer_logit(score).numpy()
    np.testing.assert_allclose(layer(unfitted).numpy(), score, atol=1e-6)  # identity: confidence = score
    np.testing.assert_allclose(answer_calibration.identity().confidence(unfitted), score, atol=1e-6)
    layer.set_parameters(fitted.parameters)
    np.testing.assert_allclose(layer(features.astype(np.float32)).numpy(), fitted.confidence(features), atol=1e-5)
    assert answer_confidence.AnswerCalibrator.from_config(layer.get_config()).num_features == 6
    with pytest.raises(ValueError, match="3 values for 6 features"):
        layer.set_parameters({**fitted.parameters, "weights": [1.0, 2.0, 3.0]})


def test_calibrator_files_round_trip_and_other_formats_or_inputs_are_refused(tmp_path):
    features, correct, _ = _synthetic(300, 4)
    fitted = answer_calibration.fit(features, correct, fitted_on={"predictions": "tune.jsonl"})
    path = str(tmp_path / "calibrator.json")
    answer_calibration.write_calibrator(fitted, path)
    assert answer_calibration.read_calibrator(path) == fitted
    record = json.load(open(path))
    json.dump({**record, "features": record["features"][:5]}, open(path, "w"))
    with pytest.raises(errors.UserError, match="fit it again"):
        answer_calibration.read_calibrator(path)
    with pytest.raises(errors.UserError, match="all 300 answers are wrong"):
        answer_calibration.fit(features, np.zeros(300, bool))
    with pytest.raises(errors.UserError, match="unknown calibrator kind"):
        answer_calibration.fit(features, correct, "isotonic")
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text(json.dumps({"score": 0.5, "exact_match": 1.0}) + "\n")
    with pytest.raises(errors.UserError, match="predictions.jsonl:1: no confidence features"):
        answer_calibration.fit_predictions(str(predictions))
