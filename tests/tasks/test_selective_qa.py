"""Selective-QA figures against brute force: every threshold tried one by one, bins summed by hand."""
import numpy as np
import pytest

from realm_tf.tasks import selective_qa


def _brute_points(conf, hit):
    """(coverage, risk) of answering every question at or above each distinct confidence, highest first."""
    points = []
    for t in sorted(set(conf), reverse=True):
        answered = [h for c, h in zip(conf, hit) if c >= t]
        points.append((len(answered) / len(conf), 1 - sum(answered) / len(answered)))
    return points


@pytest.fixture(scope="module")
def answers():
    rng = np.random.default_rng(3)
    conf = np.round(rng.random(200), 2)  # rounded: many ties
    hit = rng.random(200) < conf  # right about as often as confident
    return conf, hit


def test_the_curve_and_its_area_are_the_thresholds_tried_one_by_one(answers):
    conf, hit = answers
    coverage, risk = selective_qa.risk_coverage(conf, hit)
    brute = _brute_points(list(conf), list(hit))
    np.testing.assert_allclose(np.stack([coverage, risk], 1), np.array(brute), atol=1e-12)
    area, previous = 0.0, 0.0
    for c, r in brute:
        area, previous = area + (c - previous) * r, c
    assert selective_qa.aurc(conf, hit) == pytest.approx(area, abs=1e-12)
    for p in (0.5, 0.8, 0.9, 1.01):
        best = max([c for c, r in brute if 1 - r >= p], default=0.0)
        assert selective_qa.coverage_at_precision(conf, hit, p) == pytest.approx(best)
    # A confidence that ranks every right answer first has the lowest area; reversed, the highest.
    perfect, worst = hit.astype(float), 1.0 - hit
    assert selective_qa.aurc(perfect, hit) < selective_qa.aurc(conf, hit) < selective_qa.aurc(worst, hit)


def test_calibration_error_and_brier_against_bins_summed_by_hand(answers):
    conf, hit = answers
    order = sorted(range(len(conf)), key=lambda i: conf[i])  # stable: ties keep their order
    size, extra = divmod(len(conf), 15)
    total, start = 0.0, 0
    for b in range(15):
        chunk = order[start:start + size + (b < extra)]
        start += len(chunk)
        total += len(chunk) * abs(np.mean(hit[chunk]) - np.mean(conf[chunk]))
    assert selective_qa.expected_calibration_error(conf, hit) == pytest.approx(total / len(conf))
    assert selective_qa.brier_score(conf, hit) == pytest.approx(np.mean((conf - hit) ** 2))
    # Calibrated by construction, then overconfident: the error grows.
    assert selective_qa.expected_calibration_error(conf, hit) < selective_qa.expected_calibration_error(
        np.minimum(conf + 0.3, 1.0), hit)


def test_intervals_hold_the_value_and_bad_input_is_refused(answers):
    conf, hit = answers
    metrics = selective_qa.selective_metrics(conf, hit, num_samples=200)
    assert set(metrics) == {"aurc", "ece", "brier", "accuracy", "coverage_at_precision_0.8",
                            "coverage_at_precision_0.9"}
    for name, figure in metrics.items():
        assert figure["low"] <= figure["high"], name
    assert metrics["accuracy"]["low"] <= metrics["accuracy"]["value"] <= metrics["accuracy"]["high"]
    assert metrics == selective_qa.selective_metrics(conf, hit, num_samples=200)  # seeded
    with pytest.raises(ValueError, match="one confidence per answer"):
        selective_qa.aurc([0.5], [True, False])
    with pytest.raises(ValueError, match="probabilities"):
        selective_qa.brier_score([1.5], [True])


def test_the_threshold_for_a_precision_gives_the_coverage_at_that_precision(answers):
    """Tried one by one: the lowest distinct confidence whose answers reach the precision; answering from it
    covers coverage_at_precision, at that precision or above; none reaching it abstains on everything."""
    conf, hit = answers
    for p in (0.5, 0.8, 0.9):
        reached = [t for t in sorted(set(conf)) if np.mean(hit[conf >= t]) >= p]
        threshold = selective_qa.threshold_for_precision(conf, hit, p)
        assert threshold == min(reached)
        result = selective_qa.at_threshold(conf, hit, threshold)
        assert result["coverage"] == pytest.approx(selective_qa.coverage_at_precision(conf, hit, p))
        assert result["precision"] >= p and result["answered"] == int((conf >= threshold).sum())
    nothing = selective_qa.at_threshold(conf, hit, selective_qa.threshold_for_precision(conf, np.zeros(200), 0.5))
    assert nothing == {"threshold": float("inf"), "coverage": 0.0, "answered": 0, "precision": 0.0}


def test_the_reliability_diagram_plots_the_bins_of_the_calibration_error(answers, tmp_path):
    conf, hit = answers
    mean, accuracy, count = selective_qa.reliability_bins(conf, hit)
    assert count.sum() == 200 and len(count) == selective_qa.ECE_BINS and count.max() - count.min() <= 1
    assert np.sum(count * np.abs(accuracy - mean)) / 200 == pytest.approx(
        selective_qa.expected_calibration_error(conf, hit))
    path = selective_qa.write_reliability_diagram(str(tmp_path / "plots" / "reliability.png"),
                                                  {"confidence": (conf, hit), "flat": (np.full(200, 0.5), hit)})
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_paired_differences_are_the_figures_differences_with_a_paired_interval(answers):
    """Against the figures computed one by one: the value is the difference; a confidence against itself
    differs by exactly 0; a perfect ranking's AURC is lower with an interval below 0; precision at 20% coverage
    is the precision of the first curve point that covers 20%."""
    conf, hit = answers
    spread = np.linspace(0.0, 0.4, len(hit))  # distinct values: every right answer above every wrong one
    perfect = np.where(hit, 0.5 + spread, spread)
    deltas = selective_qa.paired_differences(perfect, conf, hit, num_samples=300)
    assert deltas["aurc"]["value"] == pytest.approx(selective_qa.aurc(perfect, hit) - selective_qa.aurc(conf, hit))
    assert deltas["aurc"]["high"] < 0 and deltas["precision_at_coverage_0.2"]["low"] > 0
    same = selective_qa.paired_differences(conf, conf, hit, num_samples=50)
    assert all(d == {"value": 0.0, "low": 0.0, "high": 0.0} for d in same.values())
    points = _brute_points(list(conf), list(hit))
    first = next(1 - r for c, r in points if c >= 0.2)
    assert selective_qa.precision_at_coverage(conf, hit, 0.2) == pytest.approx(first)
