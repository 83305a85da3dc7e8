"""Inverse Cloze Task examples (Lee et al., 2019, "Latent Retrieval for Weakly Supervised Open Domain QA").

REALM warm-starts its retriever with ICT (Guu et al., 2020, §3.4 "Initialization"): a sentence is a
pseudo-query and the block it came from is the positive context, "the context is a block of text that
contains the sentence ... with probability 0.9 we remove the sentence from the context" (ORQA §5), so that
the retriever learns more than lexical matching while still being rewarded for word overlap 10% of the time.

Sentence sampling: every sentence of a block becomes a query by default, as in ORQA; ``sentences_per_block``
> 0 instead takes a deterministic sample of that many sentences per block (seeded by the block uid), for
smaller data sets. The decision to remove is a pseudo-random draw seeded by (seed, uid, sentence index), so
reruns are identical. A sentence whose removal would leave the context body empty (the only sentence of
its block) is skipped; sentences without wordpieces are ignored.
"""
from __future__ import annotations

from typing import Sequence

from realm_tf.data import example_schemas
from realm_tf.data import salient_span_masking
from realm_tf.data import tokenized_text

# Event counts returned next to the examples.
SENTENCES = "sentences"
SAMPLED_OUT = "sentences_not_sampled"
SKIPPED_WHOLE_BODY = "skipped_whole_body"
REMOVED = "query_removed"
KEPT = "query_kept"
QUERY_TRUNCATED = "query_truncated"


class InverseClozeTask:
    """Builds ICT examples (pseudo-query sentence, context block) from a tokenized block.

    Args:
      query_max_length: wordpieces of a pseudo-query without ``[CLS]``/``[SEP]`` (REALM: 96 - 2); longer
        sentences are truncated (the whole sentence is still what gets removed from the context).
      remove_probability: probability of removing the sentence from the context (ORQA/REALM: 0.9).
      seed: seeds every pseudo-random decision together with the block uid.
      sentences_per_block: 0 for every sentence (ORQA), else at most this many sentences per block.
    """

    def __init__(self, query_max_length: int, remove_probability: float = 0.9, seed: int = 0,
                 sentences_per_block: int = 0) -> None:
        if query_max_length < 1:
            raise ValueError(f"query_max_length={query_max_length} must be positive")
        if not 0.0 <= remove_probability <= 1.0:
            raise ValueError(f"remove_probability={remove_probability} must be in [0, 1]")
        if sentences_per_block < 0:
            raise ValueError(f"sentences_per_block={sentences_per_block} must be >= 0")
        self.query_max_length = query_max_length
        self.remove_probability = remove_probability
        self.seed = seed
        self.sentences_per_block = sentences_per_block

    def examples(self, body: tokenized_text.TokenizedText, sentence_spans: Sequence[tuple[int, int]],
                 title_ids: Sequence[int], uid: str, block_id: int
                 ) -> tuple[list[dict[str, object]], dict[str, int]]:
        """The ICT examples of one block.

        Args:
          body: the tokenized block body (its ids are the block's ``body_ids``).
          sentence_spans: the body's sentences as character spans (``SentenceSplitter().split(body.text)``).
          title_ids: the block's title wordpieces (the context keeps them whole).
          uid: the block uid (seeds the decisions; written as ``UID``).
          block_id: the block id (written as ``BLOCK_ID``).

        Returns:
          ``(examples, counts)``: dicts of ``example_schemas`` ICT features, in sentence order, and counts of
          events (``SENTENCES``, ``REMOVED``, ``KEPT``, ``SKIPPED_WHOLE_BODY``, ...).
        """
        counts = {SENTENCES: 0, SAMPLED_OUT: 0, SKIPPED_WHOLE_BODY: 0, REMOVED: 0, KEPT: 0, QUERY_TRUNCATED: 0}
        ranges = [(index, first, end) for index, (first, end) in enumerate(body.sentence_ranges(sentence_spans))
                  if end > first]
        counts[SENTENCES] = len(ranges)
        if self.sentences_per_block and len(ranges) > self.sentences_per_block:
            sample = salient_span_masking.seeded_rng(self.seed, uid, "ict-sample").sample(
                range(len(ranges)), self.sentences_per_block)
            counts[SAMPLED_OUT] = len(ranges) - self.sentences_per_block
            ranges = [ranges[i] for i in sorted(sample)]
        examples = []
        ids = list(body.ids)
        for index, first, end in ranges:
            if end - first >= len(ids):
                counts[SKIPPED_WHOLE_BODY] += 1
                continue
            draw = salient_span_masking.seeded_rng(self.seed, uid, index, "ict-remove").random()
            removed = draw < self.remove_probability
            counts[REMOVED if removed else KEPT] += 1
            query = ids[first:end]
            if len(query) > self.query_max_length:
                query = query[:self.query_max_length]
                counts[QUERY_TRUNCATED] += 1
            examples.append({
                example_schemas.QUERY_IDS: query,  # int[<= query_max_length]: the sentence
                example_schemas.TITLE_IDS: list(title_ids),  # int[t]: the block title
                example_schemas.BODY_IDS: ids[:first] + ids[end:] if removed else ids,  # int[b]: context
                example_schemas.UID: uid,
                example_schemas.BLOCK_ID: int(block_id),
                example_schemas.QUERY_REMOVED: int(removed),
            })
        return examples, {name: count for name, count in counts.items() if count}
