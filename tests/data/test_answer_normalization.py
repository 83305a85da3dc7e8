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


def _official_squad_v1_1_normalize_answer(s):
    """The official SQuAD v1.1 evaluation script's normalize_answer, restated independently."""
    import re
    import string

    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


@pytest.mark.parametrize("raw, expected", [
    ("The Beatles", "beatles"),
    ("beatles", "beatles"),
    ("an apple", "apple"),
    ("theater", "theater"),                  # "the" inside a word stays
    ("The theater", "theater"),
    ("U.S.A.", "usa"),
    ("Rock 'n' Roll", "rock n roll"),
    ("  The\tRolling \n\n Stones\r\n", "rolling stones"),
    ("1939 – 1945", "1939 – 1945"),          # a non-ASCII dash is not in string.punctuation
    ("Tom—Jerry", "tom—jerry"),
    ("A.N. Other", "other"),                 # "a.n." loses its dots, then "an" is an article
    ("THE END.", "end"),
])
def test_tricky_cases_match_official_squad_normalizer(raw, expected):
    assert _official_squad_v1_1_normalize_answer(raw) == expected
    assert answer_normalization.normalize_answer(raw) == expected


def test_beatles_variants_normalize_equal():
    assert (answer_normalization.normalize_answer("The Beatles")
            == answer_normalization.normalize_answer("beatles")
            == answer_normalization.normalize_answer("the beatles!"))


def test_normaliser_and_f1_equal_tf_models_copy_of_the_official_squad_script():
    """tf-models ships the official SQuAD v1.1 evaluation (``official/nlp/tools/squad_evaluate_v1_1.py``): an
    independent reference for the normaliser and the token F1 on real answers of the bundled questions."""
    import gzip
    import itertools
    import json

    from official.nlp.tools import squad_evaluate_v1_1 as official  # pylint: disable=protected-access

    with gzip.open("data/open_qa/qa_squad_dev.jsonl.gz", "rt", encoding="utf-8") as f:
        answers = [a for line in itertools.islice(f, 300) for a in json.loads(line)["answers"]]
    answers += ["The Beatles", "1914–1918", "the.the", "Men 's hockey", "", "A a AN the"]
    for answer in answers:
        assert answer_normalization.normalize_answer(answer) == official._normalize_answer(answer)
    for prediction, truth in zip(answers, answers[7:] + answers[:7]):
        assert answer_normalization.f1_score(prediction, truth) == pytest.approx(official._f1_score(prediction, truth))
        assert answer_normalization.f1_score(truth, truth) == pytest.approx(official._f1_score(truth, truth))
