"""Tests for the SQuAD answer normaliser (used to score salient spans, REALM §3.4, and Open-QA EM)."""
import pytest

from realm_tf.data import answer_normalization


@pytest.mark.parametrize("raw, expected", [
    ("The Beatles", "beatles"),
    ("  the   Lord of   the Rings ", "lord of rings"),
    ("A-ha", "aha"),                          # punctuation is deleted, not replaced by a space
    ("an apple a day", "apple day"),
    ("Theatre", "theatre"),                   # articles only as whole words
    ("Anne and Thea", "anne and thea"),
    ("U.S.", "us"),
    ("December 15 , 1791", "december 15 1791"),
    ("$1,000,000", "1000000"),
    ("Men 's hockey", "men s hockey"),
    ("A", ""),
    ("...", ""),
    ("Tab\tand\nnewline", "tab and newline"),
    ("a.b", "ab"),
    ("the.the", "thethe"),                     # punctuation goes before articles are removed
    ("the-end", "theend"),
])
def test_normalize_answer(raw, expected):
    assert answer_normalization.normalize_answer(raw) == expected


def test_non_ascii_punctuation_is_kept_as_in_official_script():
    assert answer_normalization.normalize_answer("1914–1918") == "1914–1918"
    assert answer_normalization.normalize_answer("Ampère’s law") == "ampère’s law"


def test_normalisation_is_idempotent():
    for raw in ["The  Police!", "an  A-Team", "Who's  the (Boss)?", "Árpád   THE great"]:
        once = answer_normalization.normalize_answer(raw)
        assert answer_normalization.normalize_answer(once) == once
