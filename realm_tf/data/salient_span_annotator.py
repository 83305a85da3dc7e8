"""The salient span annotator interface (``span_annotators.make_annotator`` builds one by name).

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
