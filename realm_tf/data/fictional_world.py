"""A generated world of fictional facts, where knowledge must be retrieved: a control for REALM (Guu et al., 2020).

REALM's claim is that masked-LM pre-training alone teaches the retriever to find the documents that hold the
knowledge a masked span needs (§3, §4.4). On real text a pretrained encoder may already know the fact, or the span
may be guessable from the sentence; in a world whose people, places, organisations and years are invented from a
seed, no pretrained weights know a fact, and the only way to predict a masked fact span is to read another document
that states it.

The world (:func:`generate_world`): people, each with three facts (the place they were born in, the year they were
born, the organisation they work for), over invented places and organisations. Every fact is stated in its
person's **reference document** and **restated, in other words**, in ``restatements`` note documents, each note
gathering facts of several people. Each person, with all their facts and every document that states them, belongs
to one **split** (``train``, ``tune``, ``test``, drawn from the seed): a held-out fact's sentences are in held-out
documents only, so a pre-training query made from the training documents never states a held-out fact
(REALM's held-out evaluation then asks whether the retriever finds facts it never trained on). The questions
("where was X born?") are answerable from exactly the documents that state their fact (``gold_passage_ids``).

:func:`write_world` writes the bundled formats: passages ``{id, title, text, split}`` (all, and one file a split)
and questions ``{id, question, answers, gold_passage_ids}`` a split, plus ``world.json`` (the facts).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
from typing import Any, Sequence

from realm_tf import config as config_lib

SPLITS = ("train", "tune", "test")
RELATIONS = ("born_in", "born_year", "works_for")

_SYLLABLES = ("vel", "dor", "ith", "zan", "quor", "mab", "lis", "thre", "oon", "yx", "kes", "bru", "fen", "gal",
              "hom", "jor", "kri", "lun", "mor", "nev", "osk", "pra", "rud", "sav", "tul", "ulv", "vor", "wen",
              "xan", "yor", "zeb", "cath", "drel", "ebb", "frim")
_PLACE_ENDINGS = ("holm", "vard", "mere", "stad", "wick", "dun", "rith", "gate")
_ORGANISATION_KINDS = ("Institute", "Company", "Guild", "Foundation", "Society", "Works", "Bank", "Academy")
_OCCUPATIONS = ("clockmaker", "cartographer", "botanist", "engineer", "weaver", "astronomer", "printer", "chemist")

#: The reference document's sentence for each relation (``{person}``, ``{value}``).
REFERENCE = {"born_in": "{person} was born in {value}.", "born_year": "{person} was born in {value}.",
             "works_for": "{person} works for the {value}."}
#: The restatements, in other words: a note restates a fact with one of these, drawn from the seed.
RESTATEMENTS = {
    "born_in": ("The town of {value} is the birthplace of {person}.",
                "{person} grew up in {value}, the town of their birth.",
                "Records from {value} list {person} among those born there."),
    "born_year": ("The year {value} saw the birth of {person}.", "{person} came into the world in {value}.",
                  "Born in the year {value}, {person} is well known locally."),
    "works_for": ("The {value} counts {person} among its staff.", "{person} is employed by the {value}.",
                  "Among the members of the {value} is {person}."),
}
#: The question for each relation.
QUESTIONS = {"born_in": "where was {person} born?", "born_year": "in what year was {person} born?",
             "works_for": "which organisation does {person} work for?"}


@dataclasses.dataclass(frozen=True)
class Fact:
    """``person`` ``relation`` ``value`` (a place, a year or an organisation), of the person's ``split``."""

    person: str
    relation: str
    value: str
    split: str


@dataclasses.dataclass(frozen=True)
class Document:
    """A passage: ``id``, ``title``, ``text`` (its sentences), ``split`` and the indices of the facts it states."""

    id: int
    title: str
    text: str
    split: str
    facts: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class World:
    """The facts and the documents that state them (see the module docstring)."""

    seed: int
    facts: tuple[Fact, ...]
    documents: tuple[Document, ...]

    @functools.cached_property
    def _stating(self) -> dict[int, list[int]]:
        """Fact index -> the ids of the documents that state it, in document order."""
        stating: dict[int, list[int]] = {}
        for d in self.documents:
            for fact in d.facts:
                stating.setdefault(fact, []).append(d.id)
        return stating

    def documents_stating(self, fact: int) -> list[int]:
        """The ids of the documents that state fact ``fact`` (its reference document and its restatements)."""
        return list(self._stating.get(fact, ()))

    def questions(self, split: str) -> list[dict[str, Any]]:
        """One question a fact of ``split``, in the bundled question format."""
        return [{"id": f"{self.seed}-{i}", "question": QUESTIONS[f.relation].format(person=f.person),
                 "answers": [f.value], "gold_passage_ids": self.documents_stating(i), "relation": f.relation}
                for i, f in enumerate(self.facts) if f.split == split]


class _Lexicon:
    """The invented words so far, and every piece of them: whether a new word equals, holds or is held by one
    of them is a few set lookups, not a scan of the world."""

    def __init__(self) -> None:
        self.words: set[str] = set()
        self._pieces: set[str] = set()  # every substring of every word

    def clashes(self, word: str) -> bool:
        word = word.lower()
        return word in self._pieces or any(word[i:j] in self.words
                                           for i in range(len(word)) for j in range(i + 1, len(word) + 1))

    def add(self, word: str) -> None:
        word = word.lower()
        self.words.add(word)
        self._pieces.update(word[i:j] for i in range(len(word)) for j in range(i + 1, len(word) + 1))


def _names(rng: random.Random, count: int, parts: int, syllables: Sequence[int], template: str, endings: Sequence[str],
           taken: _Lexicon) -> list[str]:
    """``count`` new names ``template.format(*words, ending)``, each word invented from ``syllables[i]`` syllables:
    no invented word equals, holds or is held by a word of ``taken`` (which it joins), so that no name is found
    inside another. Words get one syllable more each time the count outgrows what the syllables can name (a
    quarter of the combinations of the shortest word, since no word may hold another), or when ``100 × count``
    tries at a length leave names missing (the shorter words are pieces of longer ones already taken), up to 5.
    """
    while count > len(_SYLLABLES) ** min(syllables[:parts]) // 4 and max(syllables) < 5:
        syllables = [n + 1 for n in syllables]
    if count > len(_SYLLABLES) ** min(syllables[:parts]) // 4:
        raise ValueError(f"could not invent {count} distinct names: the world is too large for the syllables")
    out: list[str] = []
    while True:
        for _ in range(100 * count):
            if len(out) == count:
                return out
            ending = rng.choice(endings) if endings else ""
            words = [_word(rng, syllables[i]) for i in range(parts)]
            if any(taken.clashes(w) for w in words) or len(set(words)) < parts:
                continue
            for w in words:
                taken.add(w)
            out.append(template.format(*words, ending=ending))
        if len(out) == count:
            return out
        if max(syllables) >= 5:
            raise ValueError(f"could not invent {count} distinct names: the world is too large for the syllables")
        syllables = [n + 1 for n in syllables]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def generate_world(seed: int = 0, num_people: int = 200, num_places: int = 40, num_organisations: int = 30,
                   restatements: int = 2, facts_per_note: int = 4,
                   split_fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> World:
    """The world of ``seed``: ``num_people`` people with three facts each over ``num_places`` places and
    ``num_organisations`` organisations, each fact in its person's reference document and in ``restatements``
    notes of about ``facts_per_note`` facts; people split into :data:`SPLITS` by ``split_fractions``."""
    if restatements < 1 or facts_per_note < 1:
        raise ValueError("restatements and facts_per_note must be at least 1")
    if len(split_fractions) != len(SPLITS) or abs(sum(split_fractions) - 1.0) > 1e-6:
        raise ValueError(f"split_fractions {tuple(split_fractions)}: one per split of {SPLITS}, summing to 1")
    rng = random.Random(seed)
    taken = _Lexicon()
    places = _names(rng, num_places, 1, (2,), "{0}{ending}", _PLACE_ENDINGS, taken)
    organisations = _names(rng, num_organisations, 1, (2,), "{0} {ending}", _ORGANISATION_KINDS, taken)
    people = _names(rng, num_people, 2, (2, 3), "{0} {1}", (), taken)
    cuts = [round(sum(split_fractions[:i + 1]) * num_people) for i in range(len(SPLITS))]
    order = list(range(num_people))
    rng.shuffle(order)
    split_of = {people[p]: next(s for s, cut in zip(SPLITS, cuts) if rank < cut) for rank, p in enumerate(order)}
    facts: list[Fact] = []
    for person in people:
        values = {"born_in": rng.choice(places), "born_year": str(rng.randrange(1700, 2000)),
                  "works_for": rng.choice(organisations)}
        facts.extend(Fact(person, relation, values[relation], split_of[person]) for relation in RELATIONS)
    documents: list[Document] = []
    for p, person in enumerate(people):
        own = tuple(range(3 * p, 3 * p + 3))
        occupation = rng.choice(_OCCUPATIONS)
        opening = f"{person} is {'an' if occupation[0] in 'aeiou' else 'a'} {occupation}."
        text = " ".join([opening, *(REFERENCE[facts[i].relation].format(person=person, value=facts[i].value)
                                    for i in own)])
        documents.append(Document(len(documents), person, text, split_of[person], own))
    for split in SPLITS:
        # Each fact of the split `restatements` times, shuffled into notes; a note never restates a fact twice.
        pending = [i for i, f in enumerate(facts) if f.split == split for _ in range(restatements)]
        rng.shuffle(pending)
        notes: list[list[int]] = []
        for i in pending:
            note = next((n for n in notes if len(n) < facts_per_note and i not in n), None)
            if note is None:
                note = []
                notes.append(note)
            note.append(i)
        for note in notes:
            text = " ".join(rng.choice(RESTATEMENTS[facts[i].relation]).format(person=facts[i].person,
                                                                              value=facts[i].value) for i in note)
            documents.append(Document(len(documents), f"Notes {len(documents)}", text, split, tuple(note)))
    return World(seed, tuple(facts), tuple(documents))


def write_world(world: World, out_dir: str) -> dict[str, int]:
    """Writes ``passages.jsonl`` (every document), ``passages-<split>.jsonl``, ``questions-<split>.jsonl`` and
    ``world.json`` into ``out_dir``; returns the counts written."""
    os.makedirs(out_dir, exist_ok=True)

    def write(name: str, rows: list[dict[str, Any]]) -> None:
        config_lib.atomic_write_text(os.path.join(out_dir, name),
                                     "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))

    passages = [{"id": d.id, "title": d.title, "text": d.text, "split": d.split} for d in world.documents]
    write("passages.jsonl", passages)
    counts = {"passages": len(passages), "facts": len(world.facts)}
    for split in SPLITS:
        write(f"passages-{split}.jsonl", [p for p in passages if p["split"] == split])
        questions = world.questions(split)
        write(f"questions-{split}.jsonl", questions)
        counts[f"questions_{split}"] = len(questions)
    write("world.json", [{"seed": world.seed, "facts": [dataclasses.asdict(f) for f in world.facts]}])
    return counts
