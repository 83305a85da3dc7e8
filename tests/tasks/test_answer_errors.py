"""The error table of Open-QA predictions: each hand-made record lands in exactly its outcome."""
import json

import pytest

from realm_tf import errors
from realm_tf.tasks import answer_errors


def _record(prediction: str, answers: list[str], predicted_block: int, holding: list[int]) -> dict:
    return {"prediction": prediction, "answers": answers, "predicted_block": predicted_block,
            "read_blocks_with_answer": holding}


# One prediction per outcome, each built so that the outcomes before it in the precedence do not apply.
CASES = {
    "correct": _record("The Beatles", ["beatles"], 0, [0]),
    "too_long": _record("actor and comedian Tim Allen", ["Tim Allen"], 0, [0]),
    "too_short": _record("Bobby Scott", ["Bobby Scott and Bob Russell"], 1, [1]),
    "partial_overlap": _record("Scott Russell", ["Bob Russell", "Bobby Scott and Bob Russell x"], 2, [0]),
    "answer_not_read": _record("1969", ["1973"], 0, []),
    "right_block_wrong_span": _record("Paris", ["London"], 3, [1, 3]),
    "wrong_block": _record("Paris", ["London"], 2, [1, 3]),
}


@pytest.mark.parametrize("expected", sorted(CASES))
def test_each_hand_made_record_has_its_outcome(expected):
    assert answer_errors.outcome(CASES[expected]) == expected


def test_word_boundaries_decide_containment():
    # "1973" inside "19730" is no containment: the answer is elsewhere in a read block, this block holds it.
    assert answer_errors.outcome(_record("19730", ["1973"], 0, [0])) == "right_block_wrong_span"
    # Normalisation (case, punctuation, articles) applies before comparing: this is an exact match.
    assert answer_errors.outcome(_record("the U.S.", ["US"], 0, [])) == "correct"


def test_an_empty_prediction_is_judged_by_where_the_reader_looked():
    assert answer_errors.outcome(_record("", ["London"], 0, [0])) == "right_block_wrong_span"
    assert answer_errors.outcome(_record("", ["London"], 0, [])) == "answer_not_read"


def test_table_from_a_predictions_file_counts_every_outcome_once(tmp_path):
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps(CASES[name]) + "\n" for name in answer_errors.OUTCOMES) + "\n")
    counts = answer_errors.count_outcomes(answer_errors.read_predictions(str(path)))
    assert counts == {name: 1 for name in answer_errors.OUTCOMES}
    table = answer_errors.format_table(counts).splitlines()
    assert len(table) == 2 + len(answer_errors.OUTCOMES) + 1
    share = f"{100 / len(answer_errors.OUTCOMES):.1f}%"
    for name in answer_errors.OUTCOMES:
        assert f"| {answer_errors.DESCRIPTIONS[name]} | 1 | {share} |" in table
    assert table[-1] == f"| all | {len(answer_errors.OUTCOMES)} | 100.0% |"


def test_counts_list_every_outcome_even_when_none_fell_there():
    counts = answer_errors.count_outcomes([CASES["correct"], CASES["correct"], CASES["wrong_block"]])
    assert counts["correct"] == 2 and counts["wrong_block"] == 1
    assert list(counts) == list(answer_errors.OUTCOMES) and sum(counts.values()) == 3


def test_a_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "predictions.jsonl"
    path.write_text(json.dumps(CASES["correct"]) + "\n{not json\n")
    with pytest.raises(errors.UserError, match=r"predictions\.jsonl:2: not valid JSON"):
        answer_errors.read_predictions(str(path))
    path.write_text(json.dumps({"prediction": "x", "answers": ["y"]}) + "\n")
    with pytest.raises(errors.UserError, match=r"predictions\.jsonl:1: .*predicted_block, read_blocks_with_answer"):
        answer_errors.read_predictions(str(path))
