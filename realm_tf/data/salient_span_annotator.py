"""The salient span annotator interface and a factory choosing an implementation by name.

REALM (Guu et al., 2020, §3.4 "Salient span masking") pre-trains by masking salient spans -- named
entities found by a BERT tagger trained on CoNLL-2003, and dates found by a regular expression -- that
tagger was never released. The pre-training data pipeline talks only to ``SalientSpanAnnotator``, so the
stdlib rule-based annotator shipped here (``"rules"``, the default) can be swapped for a statistical one
(``"spacy"``, when a spaCy English pipeline is installed) without touching the pipeline.
"""
from __future__ import annotations

import abc
import bisect
from collections.abc import Iterable

from realm_tf.data import salient_span


class SalientSpanAnnotator(abc.ABC):
    """Finds the salient spans (entities and dates, REALM §3.4) of a text."""

    @abc.abstractmethod
    def annotate(self, text: str) -> list[salient_span.SalientSpan]:
        """Returns the salient spans of ``text``: sorted, non-overlapping, whitespace-trimmed."""

    def annotate_batch(self, texts: Iterable[str]) -> list[list[salient_span.SalientSpan]]:
        """Annotates several texts; implementations with batched inference override this."""
        return [self.annotate(text) for text in texts]


def resolve_overlaps(spans: Iterable[salient_span.SalientSpan]) -> list[salient_span.SalientSpan]:
    """Sorts spans and drops those overlapping an earlier-kept one (longer spans are kept first).

    Greedy by length: for each span from longest to shortest, keep it if it overlaps no kept span.
    Ties go to the earlier start.
    """
    kept: list[salient_span.SalientSpan] = []  # Sorted by start, pairwise disjoint.
    starts: list[int] = []
    for span in sorted(spans, key=lambda s: (-(s.end - s.start), s.start)):
        k = bisect.bisect_left(starts, span.start)
        if k < len(kept) and kept[k].start < span.end:
            continue  # Overlaps the next kept span.
        if k > 0 and kept[k - 1].end > span.start:
            continue  # Overlaps the previous kept span.
        kept.insert(k, span)
        starts.insert(k, span.start)
    return kept


ANNOTATORS = ("rules", "spacy")


def make_annotator(name: str = "rules", include_numbers: bool = False) -> SalientSpanAnnotator:
    """Builds a salient span annotator by name.

    Args:
      name: ``"rules"`` (stdlib capitalisation + date-regex tagger, always available) or ``"spacy"``
        (an installed spaCy English pipeline; raises ``ImportError`` naming the missing package).
      include_numbers: also return ``NUMBER`` spans (quantities, money, percentages). REALM masked only
        entities and dates, so this is off by default.
    """
    if name == "rules":
        from realm_tf.data import rule_based_span_annotator  # pylint: disable=import-outside-toplevel
        return rule_based_span_annotator.RuleBasedSpanAnnotator(include_numbers=include_numbers)
    if name == "spacy":
        from realm_tf.data import spacy_span_annotator  # pylint: disable=import-outside-toplevel
        return spacy_span_annotator.SpacySpanAnnotator(include_numbers=include_numbers)
    raise ValueError(f"unknown salient span annotator {name!r}; expected one of {ANNOTATORS}")
