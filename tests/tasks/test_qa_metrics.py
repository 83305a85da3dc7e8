"""accuracy@k / gold_recall@k against a brute-force reference; token-boundary answer matching."""
import random

import numpy as np

from realm_tf.tasks import qa_metrics


def test_token_boundary_matching():
    matcher = qa_metrics.AnswerMatcher(["The oil crisis of 1973, (October).", "In 19730 nothing"])
    norm = qa_metrics.normalized_answers(["1973", "  "])
    assert norm == [" 1973 "]
    assert matcher.has_answer(0, norm) and not matcher.has_answer(1, norm)
    assert matcher.has_answer(0, qa_metrics.normalized_answers(["the October"]))  # article + punctuation
    assert not matcher.has_answer(0, qa_metrics.normalized_answers(["crisis 1973"]))


def test_matches_brute_force_reference():
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    texts = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(40)]
    doc_ids = [str(i // 3) for i in range(40)]
    questions = [([rng.choice(words) + " " + rng.choice(words)], [str(rng.randrange(14))]) for _ in range(50)]
    retrieved = np.array([rng.sample(range(40), 20) for _ in range(50)])
    retrieved[3, 10:] = -1  # a short list
    got = qa_metrics.qa_metrics(
        retrieved, qa_metrics.AnswerMatcher(texts), [a for a, _ in questions], doc_ids,
        [g for _, g in questions], ks=(1, 5, 20))
    for k in (1, 5, 20):
        acc = gold = 0
        for q, (answers, gold_ids) in enumerate(questions):
            rows = [r for r in retrieved[q][:k] if r >= 0]
            acc += any(f" {answers[0]} " in f" {texts[r]} " for r in rows)
            gold += any(doc_ids[r] in gold_ids for r in rows)
        assert got[f"accuracy@{k}"] == acc / 50 and got[f"gold_recall@{k}"] == gold / 50
    assert got["num_questions"] == 50


def test_exact_match_needs_a_reference_with_words_and_agrees_with_the_error_table():
    from realm_tf.tasks import answer_errors

    assert qa_metrics.exact_match("The 1973 oil crisis!", ["1973 oil crisis"])
    assert not qa_metrics.exact_match("1973", ["1973 oil crisis"])
    # "the" normalises to nothing, as do "", "." and "a": no answer, so nothing matches them
    for prediction, answers in (("the", ["", "Army"]), (".", ["a."]), ("", ["", " "])):
        assert not qa_metrics.exact_match(prediction, answers)
        record = {"prediction": prediction, "answers": answers, "predicted_block": 0, "read_blocks_with_answer": []}
        assert answer_errors.outcome(record) != "correct"
    record = {"prediction": "Army.", "answers": ["", "army"], "predicted_block": 0, "read_blocks_with_answer": [0]}
    assert qa_metrics.exact_match(record["prediction"], record["answers"])
    assert answer_errors.outcome(record) == "correct"


def test_short_answer_scores_keep_nq_open_questions_and_their_short_answers():
    """ORQA's NQ-open keeps the answers of at most five NQ tokens (NQ answer strings are tokens joined by spaces);
    a question without one is not an NQ-open question."""
    assert qa_metrics.short_answers(["Tim Allen", "the actor and comedian Tim Allen", " ", "a b c d e"]) == [
        "Tim Allen", "a b c d e"]
    predictions = [
        {"prediction": "Tim Allen", "answers": ["the actor and comedian Tim Allen", "Tim Allen"]},  # right on NQ-open
        {"prediction": "actor and comedian Tim Allen", "answers": ["the actor and comedian Tim Allen", "Tim Allen"]},
        {"prediction": "1983", "answers": ["in the year of 1983 or so"]},  # no short answer: not counted
        {"prediction": "the Beatles", "answers": ["Beatles"]},
        {"prediction": "Paul", "answers": ["John Paul"]},
    ]
    scores = qa_metrics.short_answer_scores(predictions)
    assert scores["num_questions"] == 4 and scores["max_tokens"] == 5
    assert scores["exact_match"] == 2 / 4  # Tim Allen, Beatles; the long prediction is now wrong
    expected_f1 = (1.0 + 2 * (2 / 5) * 1.0 / (2 / 5 + 1.0) + 1.0 + 2 * 1.0 * 0.5 / 1.5) / 4
    assert abs(scores["f1"] - expected_f1) < 1e-9
    assert qa_metrics.short_answer_scores(predictions[2:3]) == {"max_tokens": 5, "num_questions": 0,
                                                               "exact_match": 0.0, "f1": 0.0}
    assert qa_metrics.short_answer_scores(predictions, max_tokens=7)["num_questions"] == 5
