"""Tests for the rule-based sentence splitter used by salient span masking (REALM §3.4)."""
import gzip
import json
import pathlib
import random

import pytest

from realm_tf.data import sentence_splitter

PASSAGES = pathlib.Path(__file__).resolve().parents[2] / "data" / "open_qa" / "passages.jsonl.gz"


def _sentences(text, **kwargs):
    splitter = sentence_splitter.SentenceSplitter(**kwargs)
    return [text[start:end] for start, end in splitter.split(text)]


def _assert_lossless(text, spans):
    """Spans are sorted, disjoint, trimmed and non-empty; only whitespace lies outside them."""
    position = 0
    for start, end in spans:
        assert position <= start < end <= len(text)
        assert text[position:start].strip() == "", (text, position, start)
        assert not text[start].isspace() and not text[end - 1].isspace()
        position = end
    assert text[position:].strip() == ""
    rebuilt = "".join(text[a:b] + text[b:c] for (a, b), c in
                      zip(spans, [s for s, _ in spans[1:]] + [len(text)]))
    leading = spans[0][0] if spans else len(text)
    assert text[:leading] + rebuilt == text


def test_simple_sentences_split_on_period_question_and_exclamation():
    text = "Paris is the capital of France. Is it large? Yes! It has many museums."
    assert _sentences(text) == [
        "Paris is the capital of France.", "Is it large?", "Yes!", "It has many museums."]


@pytest.mark.parametrize("text", [
    "Mr. Smith met Dr. Jones at St. Paul's Cathedral on the way home.",
    "J. R. R. Tolkien wrote The Hobbit and George W. Bush read it.",
    "Some metals, e.g. Iron and Copper, rust; i.e. They oxidise in air.",
    "The bill passed on Jan. 5 and took effect in Feb. 2001 across the country.",
    "The price rose to 3.5 dollars and then to 12.75 dollars per barrel.",
    "She joined Apple Inc. and later moved to Acme Corp. in Boston as manager.",
    "The U.S. Army and the U.K. Parliament both met in Washington, D.C. last week.",
    "See Fig. 3 and No. 7 in vol. 2 of the report by Smith et al. for details.",
    "He was born c. 1500 and died in 1560 in Mt. Vernon.",
])
def test_abbreviations_initials_and_decimals_do_not_split(text):
    assert _sentences(text) == [text]


def test_sentence_can_end_with_an_abbreviation_before_a_sentence_opener():
    text = "He moved to the U.S. The move was hard. He founded Acme Inc. It grew fast."
    assert _sentences(text) == [
        "He moved to the U.S.", "The move was hard.", "He founded Acme Inc.", "It grew fast."]


def test_closing_quotes_brackets_and_citations_stay_with_their_sentence():
    text = 'He said "Stop." Then he left (quietly.) It was 1990.[3] Later "Why?" she asked.'
    assert _sentences(text) == [
        'He said "Stop."', "Then he left (quietly.)", "It was 1990.[3]", 'Later "Why?" she asked.']


def test_ellipsis_splits_only_before_a_capital():
    text = "He waited... Then he left. It went on and on... and on."
    assert _sentences(text) == ["He waited...", "Then he left.", "It went on and on... and on."]
    assert _sentences("Wait… What happened?") == ["Wait…", "What happened?"]


def test_lower_case_after_period_does_not_split():
    assert _sentences("The value is approx. twenty metres.") == ["The value is approx. twenty metres."]


def test_whitespace_tokenised_text():
    text = ("Maltase ( EC 3.2. 1.20 ) is an enzyme . Maltase catalyzes the hydrolysis of maltose . "
            "It is found in plants , bacteria , and yeast .")
    assert _sentences(text) == [
        "Maltase ( EC 3.2. 1.20 ) is an enzyme .",
        "Maltase catalyzes the hydrolysis of maltose .",
        "It is found in plants , bacteria , and yeast ."]


def test_newlines():
    text = "First heading\nA line without a period\n\nNew paragraph. Second sentence."
    assert _sentences(text) == [
        "First heading", "A line without a period", "New paragraph.", "Second sentence."]
    assert _sentences(text, newline_is_boundary=False) == [
        "First heading\nA line without a period", "New paragraph.", "Second sentence."]


def test_empty_and_whitespace_only():
    assert sentence_splitter.SentenceSplitter().split("") == []
    assert sentence_splitter.SentenceSplitter().split(" \n\t ") == []


def test_bundled_passages_are_split_without_losing_characters():
    with gzip.open(PASSAGES, "rt", encoding="utf-8") as f:
        passages = [json.loads(line)["text"] for line in f]
    rng = random.Random(1234)
    splitter = sentence_splitter.SentenceSplitter()
    sample = rng.sample(passages, 500)
    for text in sample:
        spans = splitter.split(text)
        _assert_lossless(text, spans)
    # Glue passages with random whitespace so that paragraph and line breaks are exercised too.
    glued = "".join(p + rng.choice([" ", "\n", "\n\n", "  \n \n ", "\t"]) for p in sample[:50])
    _assert_lossless(glued, splitter.split(glued))
    average = sum(len(splitter.split(t)) for t in sample) / len(sample)
    assert 2 < average < 20  # Passages are paragraphs of a few sentences, not one or dozens.


def test_random_character_soup_is_split_without_losing_characters():
    rng = random.Random(99)
    alphabet = list("abcXYZ .?!…\"'()[]0123456789\n\t-")
    alphabet += ["Mr.", "U.S.", " The ", "e.g.", "...", "[1]"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        for newline_is_boundary in (True, False):
            splitter = sentence_splitter.SentenceSplitter(newline_is_boundary=newline_is_boundary)
            _assert_lossless(text, splitter.split(text))
