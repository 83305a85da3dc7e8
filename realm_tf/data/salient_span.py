"""The salient span type: a character range of a text that REALM's pre-training may mask.

REALM (Guu et al., 2020, §3.4 "Salient span masking") masks *salient spans* -- named entities and
dates -- instead of random tokens, because predicting them needs world knowledge and so teaches the
retriever to fetch useful documents. Annotators (see ``salient_span_annotator``) return these spans;
the masking step later maps the character offsets onto wordpieces.
"""
from __future__ import annotations

import dataclasses

DATE = "DATE"
ENTITY = "ENTITY"
NUMBER = "NUMBER"

LABELS = (DATE, ENTITY, NUMBER)


@dataclasses.dataclass(frozen=True, order=True)
class SalientSpan:
    """A salient span ``text[start:end]`` (character offsets, ``end`` exclusive).

    Attributes:
      start: offset of the first character of the span.
      end: offset one past the last character of the span; ``end > start``.
      label: ``DATE``, ``ENTITY`` (a named entity of any type) or ``NUMBER`` (a quantity, money or
        percentage; off by default, REALM masked only entities and dates).
    """

    start: int
    end: int
    label: str

    def __post_init__(self) -> None:
        if self.start < 0 or self.end <= self.start:
            raise ValueError(f"invalid span offsets [{self.start}, {self.end})")
        if self.label not in LABELS:
            raise ValueError(f"unknown salient span label {self.label!r}; expected one of {LABELS}")

    def text(self, document: str) -> str:
        """Returns the surface string of this span in ``document``."""
        return document[self.start:self.end]

    def overlaps(self, other: "SalientSpan") -> bool:
        """Whether the two spans share at least one character."""
        return self.start < other.end and other.start < self.end
