"""Salient span masking of one pre-training query (REALM, Guu et al., 2020, §3.4).

REALM masks *salient spans* -- named entities and dates -- rather than random tokens, because filling
them in needs world knowledge and so rewards retrieving useful documents: "we select and mask one of
these salient spans within a sentence for the masked language modeling task" (§3.4). Here:

* the candidate spans (character offsets into the query text, from a ``SalientSpanAnnotator``) are mapped
  to the wordpieces they overlap;
* a span is *usable* when it covers at least one and at most ``max_span_wordpieces`` wordpieces (default
  10, REALM's maximum answer span width, ``ModelConfig.max_span_width``: longer "entities" are almost
  always run-on annotations, and a masked span should be something the Open-QA reader could answer) and
  leaves at least one wordpiece of the query unmasked;
* ONE usable span is chosen with a pseudo-random generator seeded from ``key`` (the job uses the config
  seed, the block uid and the query index), so that reruns produce identical data on any runner;
* ALL its wordpieces become ``[MASK]``; ``mask_positions`` / ``target_ids`` record them.

A query without a usable span falls back, when ``random_fallback`` is on, to BERT whole-word random
masking (Devlin et al., 2019): ``round(mask_probability * n)`` wordpieces, at least one, whole words
(a word with its ``##`` pieces), every one replaced by ``[MASK]`` (no 80/10/10 corruption: the schema
promises ``[MASK]`` at every mask position), never the whole query. Otherwise the query is dropped.

REALM's ablation (Table 3) compares salient spans with two controls, the ``strategy`` here:

* ``random_token``: "random uniform masks", BERT's whole-word random masking (above) for every query;
* ``random_span``: "random span masks" (SpanBERT, Joshi et al., 2019): ONE run of consecutive whole words at a
  random position. Its length is the salient span's that the query would have had masked (or, without one, the
  random fallback's budget), so that the two differ only in *which* words are hidden, not in how many.
"""
from __future__ import annotations

import hashlib
import random
from typing import Sequence

from realm_tf.data import example_schemas
from realm_tf.data import salient_span
from realm_tf.data import tokenized_text

SALIENT = b"salient"
RANDOM = b"random"
RANDOM_SPAN = b"random_span"

#: The masking strategies of REALM's ablation (Table 3).
STRATEGIES = ("salient", "random_span", "random_token")

# Reasons a candidate span was not usable, as counted by the job.
SKIPPED_NO_PIECES = "span_skipped_no_wordpieces"
SKIPPED_TOO_LONG = "span_skipped_too_long"
SKIPPED_WHOLE_QUERY = "span_skipped_whole_query"


def seeded_rng(*key_parts: object) -> random.Random:
    """A ``random.Random`` seeded by a SHA-256 of the key parts: identical in every process and runner."""
    key = "\x1f".join(str(part) for part in key_parts).encode("utf-8")
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))


class SalientSpanMasker:
    """Masks one salient span of a query, or falls back to whole-word random masking.

    Args:
      mask_id: id of ``[MASK]`` in the vocabulary.
      max_span_wordpieces: longest usable span in wordpieces (REALM's max answer span width: 10).
      random_fallback: mask random whole words when no salient span is usable (else drop the query).
      mask_probability: fraction of wordpieces masked by the random fallback (BERT: 0.15).
      strategy: one of :data:`STRATEGIES` (see the module docstring): ``salient`` (REALM), or one of its two
        controls.
    """

    def __init__(self, mask_id: int, max_span_wordpieces: int = 10, random_fallback: bool = True,
                 mask_probability: float = 0.15, strategy: str = "salient") -> None:
        if max_span_wordpieces < 1:
            raise ValueError(f"max_span_wordpieces={max_span_wordpieces} must be positive")
        if not 0.0 < mask_probability < 1.0:
            raise ValueError(f"mask_probability={mask_probability} must be in (0, 1)")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy={strategy!r}: one of {', '.join(STRATEGIES)}")
        self.strategy = strategy
        self.mask_id = mask_id
        self.max_span_wordpieces = max_span_wordpieces
        self.random_fallback = random_fallback
        self.mask_probability = mask_probability

    def usable_spans(self, query: tokenized_text.TokenizedText, spans: Sequence[salient_span.SalientSpan]
                     ) -> tuple[list[tuple[salient_span.SalientSpan, range]], dict[str, int]]:
        """The spans that may be masked, each with its wordpiece range, and counts of the rejected ones."""
        usable = []
        skipped = {SKIPPED_NO_PIECES: 0, SKIPPED_TOO_LONG: 0, SKIPPED_WHOLE_QUERY: 0}
        for span in spans:
            pieces = query.pieces_overlapping(span.start, span.end)
            if not pieces:
                skipped[SKIPPED_NO_PIECES] += 1
            elif len(pieces) >= len(query):
                skipped[SKIPPED_WHOLE_QUERY] += 1
            elif len(pieces) > self.max_span_wordpieces:
                skipped[SKIPPED_TOO_LONG] += 1
            else:
                usable.append((span, pieces))
        return usable, {reason: count for reason, count in skipped.items() if count}

    def mask(self, query: tokenized_text.TokenizedText, spans: Sequence[salient_span.SalientSpan],
             key: Sequence[object]) -> tuple[dict[str, object] | None, dict[str, int]]:
        """Masks ``query``.

        Args:
          query: the query's wordpieces with character offsets into ``query.text``.
          spans: salient spans of ``query.text`` (character offsets), e.g. ``annotator.annotate(query.text)``.
          key: what seeds the choice, e.g. ``(seed, uid, query_index)``: same key, same masking.

        Returns:
          ``(features, skipped)``. ``features`` maps ``example_schemas`` names to values (``QUERY_TEXT``,
          ``QUERY_IDS``, ``MASK_POSITIONS``, ``TARGET_IDS``, ``MASKING``, ``SPAN_LABEL``), or is None when
          the query is dropped (no usable span and no fallback, or nothing maskable). ``skipped`` counts
          the rejected candidate spans by reason.
        """
        usable, skipped = self.usable_spans(query, spans)
        if self.strategy == "random_token":
            positions = self.random_positions(query, key)
            return (self._features(query, positions, RANDOM, b"") if positions else None), skipped
        if self.strategy == "random_span":
            if usable:
                length = len(seeded_rng(*key, "span").choice(usable)[1])
            elif self.random_fallback:
                length = max(1, round(self.mask_probability * len(query)))
            else:
                return None, skipped
            positions = self.random_span_positions(query, length, key)
            return (self._features(query, positions, RANDOM_SPAN, b"") if positions else None), skipped
        if usable:
            span, pieces = seeded_rng(*key, "span").choice(usable)
            return self._features(query, list(pieces), SALIENT, span.label.encode("utf-8")), skipped
        if not self.random_fallback:
            return None, skipped
        positions = self.random_positions(query, key)
        if not positions:
            return None, skipped
        return self._features(query, positions, RANDOM, b""), skipped

    def random_positions(self, query: tokenized_text.TokenizedText, key: Sequence[object]) -> list[int]:
        """BERT whole-word masking positions (sorted); empty when the query has fewer than two words."""
        words = query.words()
        if len(words) < 2:
            return []
        budget = max(1, round(self.mask_probability * len(query)))
        order = list(range(len(words)))
        seeded_rng(*key, "random").shuffle(order)
        chosen: list[int] = []
        for index in order:
            word = words[index]
            if chosen and len(chosen) + len(word) > budget:
                continue
            if len(chosen) + len(word) >= len(query):
                continue  # Never mask the whole query.
            chosen.extend(word)
            if len(chosen) >= budget:
                break
        return sorted(chosen)

    def random_span_positions(self, query: tokenized_text.TokenizedText, length: int,
                              key: Sequence[object]) -> list[int]:
        """One run of consecutive whole words at a seeded random start, about ``length`` wordpieces: words are
        added from the start while the run stays within ``length`` (the first word always), never the whole
        query; empty when the query has fewer than two words."""
        words = query.words()
        if len(words) < 2:
            return []
        starts = list(range(len(words)))
        seeded_rng(*key, "random_span").shuffle(starts)
        for start in starts:
            chosen: list[int] = []
            for word in words[start:]:
                if chosen and len(chosen) + len(word) > length:
                    break
                chosen.extend(word)
            if len(chosen) < len(query):
                return chosen
        return []

    def _features(self, query: tokenized_text.TokenizedText, positions: list[int], masking: bytes,
                  label: bytes) -> dict[str, object]:
        ids = list(query.ids)
        targets = [ids[p] for p in positions]
        for p in positions:
            ids[p] = self.mask_id
        return {
            example_schemas.QUERY_TEXT: query.text,
            example_schemas.QUERY_IDS: ids,  # int[n]: the query with [MASK] at mask positions
            example_schemas.MASK_POSITIONS: positions,  # int[m]: sorted indices into QUERY_IDS
            example_schemas.TARGET_IDS: targets,  # int[m]: original ids at those positions
            example_schemas.MASKING: masking,
            example_schemas.SPAN_LABEL: label,
        }
