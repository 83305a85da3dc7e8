"""Stopping when held-out scores no longer improve."""
import pytest

from realm_tf.tasks import held_out_progress


def _curve(*pairs):
    return [{"accuracy": a, "utility": u} for a, u in pairs]


def test_a_short_curve_has_not_plateaued():
    assert not held_out_progress.plateaued(_curve((0.1, 0.0), (0.1, 0.0)), ["accuracy"], 2, 0.01)


def test_no_improvement_by_min_delta_in_the_last_evaluations_is_a_plateau():
    curve = _curve((0.10, 0.0), (0.20, 0.0), (0.205, 0.0), (0.19, 0.0))
    assert held_out_progress.plateaued(curve, ["accuracy"], 2, 0.01)  # +0.005 < 0.01: noise
    assert not held_out_progress.plateaued(curve, ["accuracy"], 2, 0.001)  # +0.005 >= 0.001
    assert not held_out_progress.plateaued(curve, ["accuracy"], 3, 0.01)  # 0.20 beat 0.10 within the last 3


def test_any_watched_score_that_still_improves_keeps_training():
    curve = _curve((0.20, 0.00), (0.20, 0.02), (0.19, 0.05))
    assert held_out_progress.plateaued(curve, ["accuracy"], 2, 0.01)
    assert not held_out_progress.plateaued(curve, ["accuracy", "utility"], 2, 0.01)
    assert held_out_progress.plateaued(curve + _curve((0.19, 0.04), (0.18, 0.05)), ["accuracy", "utility"], 2, 0.01)


def test_patience_must_be_positive():
    with pytest.raises(ValueError, match="patience"):
        held_out_progress.plateaued(_curve((0.1, 0.1)), ["accuracy"], 0, 0.01)
