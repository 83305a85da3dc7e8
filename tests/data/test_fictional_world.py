"""The fictional world: seeded, its facts consistent, every question answerable from exactly the documents that
state its fact, no held-out fact in a training document, and its fact spans found by the salient-span annotator."""
import json
import re

import pytest

from realm_tf.data import fictional_world
from realm_tf.data import span_annotators


@pytest.fixture(scope="module")
def world():
    return fictional_world.generate_world(seed=7, num_people=60, num_places=12, num_organisations=10)


def _sentences(text):
    return [s for s in re.split(r"(?<=\.) ", text) if s]


def _statements(world):
    """``(document id, person, value)`` of every sentence naming a person: brute force over all names."""
    people = sorted({f.person for f in world.facts})
    values = sorted({f.value for f in world.facts})
    found = []
    for d in world.documents:
        for sentence in _sentences(d.text):
            named = [p for p in people if p in sentence]
            assert len(named) == 1, sentence  # one person a sentence, no name inside another
            stated = [v for v in values if re.search(rf"\b{re.escape(v)}\b", sentence)]
            found.append((d.id, named[0], stated))
    return found


def test_the_same_seed_makes_the_same_world_and_another_seed_another():
    make = fictional_world.generate_world
    assert make(seed=3, num_people=20) == make(seed=3, num_people=20) != make(seed=4, num_people=20)


def test_every_sentence_states_a_fact_of_the_world_and_each_person_has_one_value_a_relation(world):
    values = {}
    for f in world.facts:
        assert values.setdefault((f.person, f.relation), f.value) == f.value
    assert len(values) == len(world.facts) == 3 * 60
    facts_of = {}
    for f in world.facts:
        facts_of.setdefault(f.person, set()).add(f.value)
    for _, person, stated in _statements(world):
        assert len(stated) <= 1 and set(stated) <= facts_of[person]  # the opening sentence states no value
    text = " ".join(d.text for d in world.documents)
    assert not re.search(r"\ba [aeiou]", text) and re.search(r"\ban [aeiou]", text)  # "an astronomer"


def test_every_question_is_answerable_from_exactly_the_documents_that_state_its_fact(world):
    statements = _statements(world)
    for split in fictional_world.SPLITS:
        questions = world.questions(split)
        assert questions and all(q["question"].endswith("?") for q in questions)
        for q in questions:
            person = next(f.person for f in world.facts if f.person in q["question"])
            stating = {d for d, p, stated in statements if p == person and q["answers"][0] in stated}
            assert stating == set(q["gold_passage_ids"]) and len(stating) == 1 + 2  # reference + 2 restatements
            reference = [d for d in world.documents if d.title == person]
            assert len(reference) == 1 and reference[0].id in stating


def test_no_held_out_fact_is_stated_in_a_training_document(world):
    split_of = {f.person: f.split for f in world.facts}
    assert set(split_of.values()) == set(fictional_world.SPLITS)
    for d, person, _ in _statements(world):
        assert split_of[person] == world.documents[d].split
    held_out = {p for p, s in split_of.items() if s != "train"}
    train_text = " ".join(d.text for d in world.documents if d.split == "train")
    assert held_out and not any(p in train_text for p in held_out)


def test_restatements_use_other_words_than_the_reference(world):
    reference = {d.id for d in world.documents if not d.title.startswith("Notes ")}
    for f_index, fact in enumerate(world.facts):
        first = fictional_world.REFERENCE[fact.relation].format(person=fact.person, value=fact.value)
        for d in world.documents_stating(f_index):
            assert (first in world.documents[d].text) == (d in reference)


def test_the_salient_span_annotator_finds_the_fact_spans(world):
    annotator = span_annotators.make_annotator()
    facts = found = 0
    for d in world.documents:
        spans = {d.text[s.start:s.end] for s in annotator.annotate(d.text)}
        for i in d.facts:
            facts += 1
            found += world.facts[i].value in spans and world.facts[i].person in spans
    assert found / facts > 0.95, (found, facts)


def test_write_world_writes_the_bundled_formats(tmp_path, world):
    counts = fictional_world.write_world(world, str(tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "passages.jsonl").read_text().splitlines()]
    assert len(rows) == counts["passages"] == len(world.documents) and set(rows[0]) == {"id", "title", "text", "split"}
    split_rows = sum(len((tmp_path / f"passages-{s}.jsonl").read_text().splitlines()) for s in fictional_world.SPLITS)
    assert split_rows == len(rows)
    questions = [json.loads(line) for line in (tmp_path / "questions-test.jsonl").read_text().splitlines()]
    assert len(questions) == counts["questions_test"]
    assert {"question", "answers", "gold_passage_ids"} <= set(questions[0])
    with pytest.raises(ValueError, match="split_fractions"):
        fictional_world.generate_world(split_fractions=(0.5, 0.5))


def test_a_large_world_gets_longer_names_and_keeps_every_name_apart():
    large = fictional_world.generate_world(seed=3, num_people=800)
    people = sorted({f.person for f in large.facts})
    assert len(people) == 800
    words = {w.lower() for p in people for w in p.split()}
    assert not [(a, b) for a in words for b in words if a != b and a in b]  # no word holds another
    with pytest.raises(ValueError, match="too large for the syllables"):
        fictional_world.generate_world(seed=0, num_people=10 ** 7)
    # 20,000 places take every short word as a piece: the organisations' words then grow too.
    crowded = fictional_world.generate_world(seed=1, num_people=50, num_places=20_000)
    assert len({f.value for f in crowded.facts if f.relation == "works_for"}) > 10


def test_the_lexicon_finds_the_clashes_a_scan_of_every_word_finds():
    """Whether a word equals, holds or is held by an invented one: the lexicon's lookups against a brute-force
    scan, on words of shared syllables (so that clashes are common)."""
    import random

    rng = random.Random(0)
    lexicon, seen = fictional_world._Lexicon(), []
    for _ in range(400):
        word = fictional_world._word(rng, rng.randint(1, 3))
        brute = any(word.lower() in t or t in word.lower() for t in seen)
        assert lexicon.clashes(word) == brute, word
        if not brute:
            lexicon.add(word)
            seen.append(word.lower())
    assert 20 < len(seen) < 400  # both outcomes were tried
