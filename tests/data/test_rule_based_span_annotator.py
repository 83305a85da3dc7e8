"""Tests for the rule-based salient span annotator (REALM §3.4 salient span masking)."""
import gzip
import importlib
import json
import pathlib
import random

import pytest

from realm_tf.data import rule_based_span_annotator
from realm_tf.data import salient_span
from realm_tf.data import salient_span_annotator
from realm_tf.data import span_annotators

PASSAGES = pathlib.Path(__file__).resolve().parents[2] / "data" / "open_qa" / "passages.jsonl.gz"


@pytest.fixture(scope="module")
def annotator():
    return rule_based_span_annotator.RuleBasedSpanAnnotator()


def _spans(annotator, text):
    return [(text[s.start:s.end], s.label) for s in annotator.annotate(text)]


def _texts(annotator, text, label=None):
    return [t for t, l in _spans(annotator, text) if label is None or l == label]


def _assert_well_formed(text, spans):
    previous_end = 0
    for span in spans:
        assert isinstance(span, salient_span.SalientSpan)
        assert previous_end <= span.start < span.end <= len(text)
        assert not text[span.start].isspace() and not text[span.end - 1].isspace()
        assert span.label in salient_span.LABELS
        previous_end = span.end


def test_wikipedia_lead_paragraph(annotator):
    text = ("The 1973 oil crisis began in October 1973 when the members of the Organization of Arab "
            "Petroleum Exporting Countries proclaimed an oil embargo. By the end of the embargo in "
            "March 1974, the price of oil had risen from $3 per barrel to nearly $12 globally.")
    assert _spans(annotator, text) == [
        ("1973", "DATE"),
        ("October 1973", "DATE"),
        ("Organization of Arab Petroleum Exporting Countries", "ENTITY"),
        ("March 1974", "DATE"),
    ]


def test_names_with_initials_connectors_and_abbreviations(annotator):
    text = ("J. R. R. Tolkien wrote The Lord of the Rings while teaching in Oxford. Later the Bank of "
            "England, Procter & Gamble and Ludwig van Beethoven were mentioned with St. Louis and "
            "World War I.")
    assert _texts(annotator, text, "ENTITY") == [
        "J. R. R. Tolkien", "The Lord of the Rings", "Oxford", "Bank of England", "Procter & Gamble",
        "Ludwig van Beethoven", "St. Louis", "World War I"]


def test_sentence_initial_function_words_are_not_entities(annotator):
    text = "However, the treaty failed. The war ended. In 1945 Germany surrendered."
    spans = _spans(annotator, text)
    assert ("However", "ENTITY") not in spans
    assert all(not t.startswith(("The", "In")) for t, _ in spans)
    assert ("Germany", "ENTITY") in spans
    assert ("1945", "DATE") in spans


def test_sentence_initial_common_word_is_not_an_entity_but_a_name_is(annotator):
    text = ("Enzymes speed up reactions. Many enzymes exist. Lisbon is old. The city of Lisbon lies on "
            "the coast.")
    texts = _texts(annotator, text)
    assert "Enzymes" not in texts  # Seen lower-case elsewhere in the document.
    assert texts.count("Lisbon") == 2  # Capitalised mid-sentence elsewhere: a name.


def test_sentence_initial_multiword_name_and_lead_subject(annotator):
    texts = _texts(annotator, "Barack Obama was elected. Paracelsus (1493–1541) was a physician.")
    assert texts[:2] == ["Barack Obama", "Paracelsus"]


def test_mid_sentence_the_is_kept_in_band_names(annotator):
    assert _texts(annotator, "It was recorded by English rock band The Police in London.") == [
        "English", "The Police", "London"]


def test_of_after_a_multiword_person_name_starts_a_new_name(annotator):
    assert _texts(annotator, "He drafted Bobby Hurley of Duke and met the Reserve Bank of India.") == [
        "Bobby Hurley", "Duke", "Reserve Bank of India"]


@pytest.mark.parametrize("text, expected", [
    ("It opened on October 17, 1973 in Cairo.", "October 17, 1973"),
    ("It opened on 17 October 1973 in Cairo.", "17 October 1973"),
    ("It was ratified on December 15 , 1791 .", "December 15 , 1791"),
    ("It happened in the 1990s mostly.", "1990s"),
    ("It grew during the late 1990s mostly.", "late 1990s"),
    ("It was common in the 19th century only.", "19th century"),
    ("It was common in the nineteenth-century only.", "nineteenth-century"),
    ("The file was written 2004-06-30 here.", "2004-06-30"),
    ("Caesar died in 44 BC at home.", "44 BC"),
    ("It was played in the 2017–18 season.", "2017–18"),
    ("It began on April 12 -- 13 , 1861 at dawn.", "April 12 -- 13 , 1861"),
    ("It happened in the summer of 1969 again.", "summer of 1969"),
    ("The meeting was held in October as planned.", "October"),
    ("She was born in 1066 in a village.", "1066"),
])
def test_dates(annotator, text, expected):
    assert _texts(annotator, text, "DATE") == [expected]


@pytest.mark.parametrize("text", [
    "The army had 1500 soldiers and 1200 horses.",
    "The ticket cost $2000 last time.",
    "About 1,500 people came.",
    "The road is 1800 km long.",
    "Route 1900 is closed.",
])
def test_counts_are_not_years(annotator, text):
    assert _texts(annotator, text, "DATE") == []


def test_full_year_range_gives_two_dates(annotator):
    assert _texts(annotator, "Paracelsus lived 1493–1541 in Europe.", "DATE") == ["1493", "1541"]


def test_may_as_a_name_is_not_a_date(annotator):
    spans = _spans(annotator, "The prime minister Theresa May resigned.")
    assert ("Theresa May", "ENTITY") in spans
    assert all(label != "DATE" for _, label in spans)


def test_quoted_titles(annotator):
    text = 'The Police released "Message in a Bottle" in 1979, but "a lower-case quote" is not a title.'
    spans = _spans(annotator, text)
    assert ("Message in a Bottle", "ENTITY") in spans
    assert all("quote" not in t for t, _ in spans)
    # NaturalQuestions writes quotes as `` and '' in its whitespace-tokenised text.
    assert ("Let It Be", "ENTITY") in _spans(annotator, "the song `` Let It Be '' topped charts .")


def test_whitespace_tokenised_hyphenated_names(annotator):
    assert _texts(annotator, "It starred Daniel Day - Lewis and Olivia Newton - John .") == [
        "Daniel Day - Lewis", "Olivia Newton - John"]


def test_numbers_only_when_asked():
    text = "The tower is 324 metres tall and cost $1.5 million in 1889, 12% over budget."
    plain = rule_based_span_annotator.RuleBasedSpanAnnotator()
    with_numbers = rule_based_span_annotator.RuleBasedSpanAnnotator(include_numbers=True)
    assert [(t, l) for t, l in _spans(plain, text)] == [("1889", "DATE")]
    assert _spans(with_numbers, text) == [
        ("324 metres", "NUMBER"), ("$1.5 million", "NUMBER"), ("1889", "DATE"), ("12%", "NUMBER")]


def test_empty_text(annotator):
    assert annotator.annotate("") == []
    assert annotator.annotate("   \n") == []


def test_bundled_passages_give_sorted_non_overlapping_spans():
    with gzip.open(PASSAGES, "rt", encoding="utf-8") as f:
        passages = [json.loads(line)["text"] for line in f]
    sample = random.Random(7).sample(passages, 400)
    for include_numbers in (False, True):
        annotator = rule_based_span_annotator.RuleBasedSpanAnnotator(include_numbers=include_numbers)
        batches = annotator.annotate_batch(sample)
        total = 0
        for text, spans in zip(sample, batches):
            _assert_well_formed(text, spans)
            total += len(spans)
        assert total / len(sample) > 5  # Wikipedia paragraphs are dense in names and dates.


def test_salient_span_validation():
    with pytest.raises(ValueError):
        salient_span.SalientSpan(3, 3, "DATE")
    with pytest.raises(ValueError):
        salient_span.SalientSpan(0, 2, "PERSON")
    span = salient_span.SalientSpan(4, 9, "ENTITY")
    assert span.text("The Paris hotel") == "Paris"
    assert span.overlaps(salient_span.SalientSpan(8, 12, "DATE"))
    assert not span.overlaps(salient_span.SalientSpan(9, 12, "DATE"))


def test_resolve_overlaps_keeps_longest_then_earliest():
    spans = [salient_span.SalientSpan(0, 4, "DATE"), salient_span.SalientSpan(2, 10, "ENTITY"),
             salient_span.SalientSpan(10, 12, "DATE"), salient_span.SalientSpan(9, 11, "ENTITY")]
    assert salient_span_annotator.resolve_overlaps(spans) == [
        salient_span.SalientSpan(2, 10, "ENTITY"), salient_span.SalientSpan(10, 12, "DATE")]


def test_make_annotator():
    assert isinstance(span_annotators.make_annotator("rules"), rule_based_span_annotator.RuleBasedSpanAnnotator)
    assert span_annotators.make_annotator("rules", include_numbers=True).annotate("It cost $5 million.") == [
        salient_span.SalientSpan(8, 18, "NUMBER")]
    assert span_annotators.make_annotator("rules").annotate("It cost $5 million.") == []
    with pytest.raises(ValueError, match="unknown salient span annotator"):
        span_annotators.make_annotator("bert")


def test_spacy_annotator_names_the_missing_package(monkeypatch):
    real_import = importlib.import_module

    def fake_import(name, *args, **kwargs):
        if name == "spacy":
            raise ImportError("No module named 'spacy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    with pytest.raises(ImportError, match="spacy"):
        span_annotators.make_annotator("spacy")
