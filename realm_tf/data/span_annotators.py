"""Salient span annotators by name: the factory choosing an implementation of ``SalientSpanAnnotator``.

The pre-training data pipeline (``beam_jobs/generate_pretraining_data``, ``data.salient_span_annotator``) names
its annotator; this module maps the name to an implementation. It lives apart from the interface
(``salient_span_annotator``) because the implementations import the interface: the factory depends on both.
"""
from __future__ import annotations

from realm_tf import config as config_lib
from realm_tf.data import rule_based_span_annotator
from realm_tf.data import salient_span_annotator
from realm_tf.data import spacy_span_annotator

ANNOTATORS = config_lib.choices(config_lib.SpanAnnotator)


def make_annotator(name: str = "rules", include_numbers: bool = False) -> salient_span_annotator.SalientSpanAnnotator:
    """Builds a salient span annotator by name.

    Args:
      name: ``"rules"`` (stdlib capitalisation + date-regex tagger, always available) or ``"spacy"``
        (an installed spaCy English pipeline; raises ``ImportError`` naming the missing package).
      include_numbers: also return ``NUMBER`` spans (quantities, money, percentages). REALM masked only
        entities and dates, so this is off by default.
    """
    if name == "rules":
        return rule_based_span_annotator.RuleBasedSpanAnnotator(include_numbers=include_numbers)
    if name == "spacy":
        return spacy_span_annotator.SpacySpanAnnotator(include_numbers=include_numbers)
    raise ValueError(f"unknown salient span annotator {name!r}; expected one of {ANNOTATORS}")
