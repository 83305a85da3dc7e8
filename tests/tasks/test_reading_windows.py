"""Reading windows: each gold window holds an answer at a drawn offset, against a brute-force reference."""
import numpy as np
import pytest

from realm_tf.tasks import reading_windows


def _brute_occurrences(body, pieces):
    n = len(pieces)
    return [p for p in range(len(body) - n + 1) if list(body[p:p + n]) == list(pieces)] if n else []


def test_occurrences_match_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        body = rng.integers(0, 4, size=rng.integers(0, 30)).astype(np.int32)
        pieces = rng.integers(0, 4, size=rng.integers(1, 4)).astype(np.int32)
        assert reading_windows.find_occurrences(body, pieces) == _brute_occurrences(body, pieces)


def test_gold_windows_hold_an_answer_at_every_offset_and_negatives_stay_inside():
    rng = np.random.default_rng(1)
    bodies = [rng.integers(10, 60, size=n).astype(np.int32) for n in (100, 200, 12, 150, 90)]
    length = 40
    # Questions over blocks 0, 1, 3 (long) and 2 (shorter than the window); answers cut from the bodies.
    rows = np.array([[0, 1], [1, 3], [3, 4], [2, 0]])
    answers = [[bodies[0][70:73]], [bodies[1][5:9], bodies[1][180:182]], [bodies[3][100:104]], [bodies[2][3:5]]]
    starts = {q: set() for q in range(len(rows))}
    for seed in range(30):
        windows, counts = reading_windows.choose_windows(rows, bodies.__getitem__, answers, length, seed=seed)
        assert windows.shape == (4, 2, 2)
        assert counts == {"whole": 1, "windowed": 3, "answer_not_in_body": 0, "negatives": 4}
        for q, row in enumerate(rows):
            for j, block in enumerate(row):
                start, count = windows[q, j]
                body = bodies[block]
                assert 0 <= start and start + count <= len(body) and count == min(length, len(body))
                if j == 0:
                    window = body[start:start + count]
                    assert any(_brute_occurrences(window, a) for a in answers[q]), (q, start)
                    starts[q].add(int(start))
    # A drawn offset: the long gold blocks' windows start at many places, the short block is read whole.
    assert len(starts[0]) > 10 and len(starts[2]) > 10 and starts[3] == {0}


def test_a_gold_body_without_the_answer_gets_a_random_window_and_is_counted():
    bodies = [np.arange(100, dtype=np.int32)]
    windows, counts = reading_windows.choose_windows(np.array([[0]]), bodies.__getitem__, [[np.array([999])]], 30)
    assert counts["answer_not_in_body"] == 1 and windows[0, 0, 1] == 30 and 0 <= windows[0, 0, 0] <= 70
    with pytest.raises(ValueError, match="must be > 0"):
        reading_windows.choose_windows(np.array([[0]]), bodies.__getitem__, [[]], 0)
