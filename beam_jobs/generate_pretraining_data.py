"""Beam job: knowledge-corpus blocks -> salient-span-masked pre-training examples (REALM §3.4).

REALM (Guu et al., 2020) pre-trains on queries x drawn from the same Wikipedia text as the knowledge corpus,
with one *salient span* (a named entity or a date) masked: "we select and mask one of these salient spans
within a sentence for the masked language modeling task" (§3.4 "Salient span masking"). Predicting such a
span needs world knowledge, which is what makes the retriever learn to fetch useful blocks. Each example
keeps the uid and block_id of the block it was taken from, so that the trainer can exclude that block from
the retrieved candidates (§3.4 "Exclude trivial retrievals").

Per block (``example_schemas.block_feature_spec()`` records from ``beam_jobs/preprocess_corpus``):

1. split its body TEXT into sentences (``SentenceSplitter``) and tokenize it with offsets;
2. pack consecutive sentences into queries of at most ``model.query_seq_length - 2`` wordpieces
   (``QueryPacker``; a longer sentence is truncated at a word boundary, counter ``truncated``);
3. annotate the salient spans of each query text with ``data.salient_span_annotator``;
4. mask all wordpieces of ONE usable span, chosen pseudo-randomly from (``data.seed``, block uid, query
   index) so that reruns are identical (``SalientSpanMasker``); spans longer than ``--max-span-wordpieces``
   (default ``model.max_span_width`` = 10) or covering the whole query are not usable;
5. without a usable span: BERT whole-word random masking (``data.mask_probability``) when
   ``data.random_mask_fallback`` is true, else the query is dropped (counter ``no_span_dropped``).

``data.masking_strategy`` ``random_span`` / ``random_token`` makes the controls of REALM's ablation (Table 3)
instead of salient spans (``SalientSpanMasker``; counters ``random_span`` / ``random_token``).

Output: ``<output>/pretraining-SSSSS-of-NNNNN.tfrecord`` (``example_schemas.pretraining_feature_spec()``)
and, last, ``<output>/manifest.json`` with the counters, the vocabulary hash, the annotator and the config.

Usage::

    python -m beam_jobs.generate_pretraining_data --config configs/minilm.yaml \\
        --input '/tmp/realm_tf/blocks/blocks-*.tfrecord' --output /tmp/realm_tf/pretraining [Beam options]
"""
from __future__ import annotations

import argparse
import sys
from typing import Iterator, Mapping, Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)

# isort: split
import apache_beam as beam

from beam_jobs import job_flags
from beam_jobs import job_support
from realm_tf import config as config_lib
from realm_tf.data import example_schemas
from realm_tf.data import query_packer
from realm_tf.data import salient_span_masking

NAMESPACE = "realm_tf.generate_pretraining_data"
PREFIX = "pretraining"

# Counter names (also the keys of manifest["counts"]).
BLOCKS = "blocks"
QUERIES = "queries"
EXAMPLES = "examples"
SALIENT = "salient"
RANDOM_FALLBACK = "random_fallback"
RANDOM_SPAN = "random_span"
RANDOM_TOKEN = "random_token"
NO_SPAN_DROPPED = "no_span_dropped"
TRUNCATED = "truncated"
MASKED_WORDPIECES = "masked_wordpieces"
SALIENT_MASKED_WORDPIECES = "salient_masked_wordpieces"
SPANS_FOUND = "spans_found"
LABEL_PREFIX = "span_label_"  # + DATE / ENTITY / NUMBER: salient examples by the label of the masked span


class _MakePretrainingExamples(job_support.BlocksDoFn):
    """A batch of serialized blocks -> serialized pre-training examples (tokenizer, annotator built in setup)."""

    def __init__(self, vocab_file: str, lower_case: bool, annotator_name: str, query_max_length: int,
                 max_span_wordpieces: int, random_fallback: bool, mask_probability: float, seed: int,
                 strategy: str = "salient") -> None:
        super().__init__(vocab_file, lower_case)
        self._strategy = strategy
        self._annotator_name = annotator_name
        self._query_max_length = query_max_length
        self._max_span_wordpieces = max_span_wordpieces
        self._random_fallback = random_fallback
        self._mask_probability = mask_probability
        self._seed = seed

    def setup(self) -> None:
        from realm_tf.data import span_annotators  # pylint: disable=import-outside-toplevel

        super().setup()
        self._annotator = span_annotators.make_annotator(self._annotator_name)
        self._packer = query_packer.QueryPacker(self._query_max_length)
        self._masker = salient_span_masking.SalientSpanMasker(
            self._tokenizer.mask_id, max_span_wordpieces=self._max_span_wordpieces,
            random_fallback=self._random_fallback, mask_probability=self._mask_probability, strategy=self._strategy)

    def process(self, batch: Sequence[bytes]) -> Iterator[bytes]:
        blocks = self.parse_blocks(batch)
        # (block, query index, query) for every query of the batch, annotated in one call.
        queries = []
        for block, body in blocks:
            packed = self._packer.pack(body, self._splitter.split(body.text))
            for index, (query, truncated) in enumerate(packed):
                queries.append((block, index, query))
                job_support.count(NAMESPACE, TRUNCATED, int(truncated))
        job_support.count(NAMESPACE, BLOCKS, len(blocks))
        job_support.count(NAMESPACE, QUERIES, len(queries))
        annotations = self._annotator.annotate_batch([query.text for _, _, query in queries])
        for (block, index, query), spans in zip(queries, annotations):
            uid = block[example_schemas.UID].decode("utf-8")
            job_support.count(NAMESPACE, SPANS_FOUND, len(spans))
            features, skipped = self._masker.mask(query, spans, key=(self._seed, uid, index))
            for reason, n in skipped.items():
                job_support.count(NAMESPACE, reason, n)
            if features is None:
                job_support.count(NAMESPACE, NO_SPAN_DROPPED)
                continue
            masked = len(features[example_schemas.MASK_POSITIONS])
            job_support.count(NAMESPACE, EXAMPLES)
            job_support.count(NAMESPACE, MASKED_WORDPIECES, masked)
            if features[example_schemas.MASKING] == salient_span_masking.SALIENT:
                job_support.count(NAMESPACE, SALIENT)
                job_support.count(NAMESPACE, SALIENT_MASKED_WORDPIECES, masked)
                job_support.count(NAMESPACE, LABEL_PREFIX + features[example_schemas.SPAN_LABEL].decode())
            elif features[example_schemas.MASKING] == salient_span_masking.RANDOM_SPAN:
                job_support.count(NAMESPACE, RANDOM_SPAN)
            elif self._strategy == "random_token":
                job_support.count(NAMESPACE, RANDOM_TOKEN)
            else:
                job_support.count(NAMESPACE, RANDOM_FALLBACK)
            features[example_schemas.SOURCE_UID] = uid
            features[example_schemas.SOURCE_BLOCK_ID] = int(block[example_schemas.BLOCK_ID])
            yield example_schemas.to_example(features)


class GeneratePretrainingExamples(beam.PTransform):
    """``PCollection[bytes]`` of block records -> ``PCollection[bytes]`` of pre-training example records.

    Args:
      cfg: the experiment config (model.vocab_file / lower_case / query_seq_length, data.salient_span_annotator
        / random_mask_fallback / mask_probability / seed).
      max_span_wordpieces: longest maskable salient span (None: ``cfg.model.max_span_width``).
      batch_size: blocks tokenized and annotated together.
    """

    def __init__(self, cfg: config_lib.ExperimentConfig, max_span_wordpieces: int | None = None,
                 batch_size: int = 64) -> None:
        super().__init__()
        self._cfg = cfg
        self._max_span_wordpieces = max_span_wordpieces or cfg.model.max_span_width
        self._batch_size = batch_size

    def expand(self, blocks: beam.PCollection) -> beam.PCollection:
        cfg = self._cfg
        return (blocks
                | "BatchBlocks" >> beam.BatchElements(min_batch_size=1, max_batch_size=self._batch_size)
                | "MaskSalientSpans" >> beam.ParDo(_MakePretrainingExamples(
                    vocab_file=cfg.model.vocab_file, lower_case=cfg.model.lower_case,
                    annotator_name=cfg.data.salient_span_annotator,
                    query_max_length=cfg.model.query_seq_length - 2,
                    max_span_wordpieces=self._max_span_wordpieces,
                    random_fallback=cfg.data.random_mask_fallback,
                    mask_probability=cfg.data.mask_probability, seed=cfg.data.seed,
                    strategy=cfg.data.masking_strategy)))


class GeneratePretrainingDataJob(job_support.ExamplesFromBlocksJob):
    """``python -m beam_jobs.generate_pretraining_data`` / ``realm-tf generate-pretraining-data``."""

    name = "generate_pretraining_data"
    namespace = NAMESPACE
    prefix = PREFIX

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        job_flags.add_pretraining_args(parser)

    def output_dir(self, cfg: config_lib.ExperimentConfig) -> str:
        return cfg.data.pretraining_dir

    def transform(self, args: argparse.Namespace, cfg: config_lib.ExperimentConfig) -> beam.PTransform:
        return GeneratePretrainingExamples(cfg, args.max_span_wordpieces, args.batch_size)

    def manifest_fields(self, args: argparse.Namespace, cfg: config_lib.ExperimentConfig) -> dict[str, object]:
        return {"annotator": cfg.data.salient_span_annotator, "masking_strategy": cfg.data.masking_strategy,
                "max_span_wordpieces": args.max_span_wordpieces or cfg.model.max_span_width,
                "query_max_length": cfg.model.query_seq_length - 2}

    def summarize(self, counts: Mapping[str, int]) -> str:
        examples = counts.get(EXAMPLES, 0)
        share = lambda n: f"{100.0 * n / examples:.1f}%" if examples else "n/a"  # noqa: E731
        labels = ", ".join(f"{name[len(LABEL_PREFIX):]} {n}" for name, n in counts.items()
                           if name.startswith(LABEL_PREFIX)) or "none"
        mean = counts.get(MASKED_WORDPIECES, 0) / examples if examples else 0.0
        return (f"{counts.get(BLOCKS, 0)} blocks -> {counts.get(QUERIES, 0)} queries -> {examples} examples: "
                f"salient {counts.get(SALIENT, 0)} ({share(counts.get(SALIENT, 0))}), random fallback "
                f"{counts.get(RANDOM_FALLBACK, 0)} ({share(counts.get(RANDOM_FALLBACK, 0))}), random spans "
                f"{counts.get(RANDOM_SPAN, 0)}, random tokens {counts.get(RANDOM_TOKEN, 0)}, dropped without "
                f"span {counts.get(NO_SPAN_DROPPED, 0)}, truncated {counts.get(TRUNCATED, 0)}; span labels: "
                f"{labels}; mean masked wordpieces {mean:.2f}")


JOB = GeneratePretrainingDataJob()
run = JOB.run  # python: generate_pretraining_data.run(argv)


if __name__ == "__main__":
    sys.exit(job_support.main(__spec__))
