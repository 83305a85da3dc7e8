"""Beam job: knowledge-corpus blocks -> Inverse Cloze Task examples (Lee et al., 2019; REALM §3.4).

REALM (Guu et al., 2020) does not train its retriever from scratch: "we warm-start Embed_input and
Embed_doc using ... the Inverse Cloze Task (ICT)" (§3.4 "Initialization"), the pre-training task of ORQA
(Lee, Chang and Toutanova, 2019, §5): given a sentence, retrieve the block it came from. The sentence is the
pseudo-query; its block ``[CLS] title [SEP] body [SEP]`` is the positive context (the other blocks of a
batch are the negatives); with probability 0.9 the sentence is removed from the context body, so that the
retriever must match meaning, not just words.

Per block (``example_schemas.block_feature_spec()`` records from ``beam_jobs/preprocess_corpus``): split the
body TEXT into sentences, tokenize it with offsets, and let ``InverseClozeTask`` turn every sentence (ORQA's
choice; ``--sentences-per-block K`` takes a deterministic sample of K instead) into one example:
QUERY_IDS = the sentence (truncated to ``model.query_seq_length - 2``), TITLE_IDS + BODY_IDS = the context
with the sentence's wordpieces removed when QUERY_REMOVED = 1 (probability ``data.ict_remove_probability``,
a pseudo-random draw seeded by ``data.seed``, the block uid and the sentence index, so reruns are identical).
A sentence that is the whole body is skipped (counter ``skipped_whole_body``).

Output: ``<output>/ict-SSSSS-of-NNNNN.tfrecord`` (``example_schemas.ict_feature_spec()``) and, last,
``<output>/manifest.json`` with the counters, the vocabulary hash and the config.

Usage::

    python -m beam_jobs.generate_ict_data --config configs/minilm.yaml \\
        --input '/tmp/realm_tf/blocks/blocks-*.tfrecord' --output /tmp/realm_tf/ict [Beam options]
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
from realm_tf.data import inverse_cloze_task

NAMESPACE = "realm_tf.generate_ict_data"
PREFIX = "ict"

# Counter names (also the keys of manifest["counts"]), besides the inverse_cloze_task event names.
BLOCKS = "blocks"
EXAMPLES = "examples"
BODY_IDS_MISMATCH = "body_ids_mismatch"  # re-tokenized TEXT differs from the block's BODY_IDS


class _MakeIctExamples(job_support.BlocksDoFn):
    """A batch of serialized blocks -> serialized ICT examples (tokenizer built in setup)."""

    def __init__(self, vocab_file: str, lower_case: bool, query_max_length: int, remove_probability: float,
                 seed: int, sentences_per_block: int) -> None:
        super().__init__(vocab_file, lower_case)
        self._task = inverse_cloze_task.InverseClozeTask(
            query_max_length, remove_probability=remove_probability, seed=seed,
            sentences_per_block=sentences_per_block)

    def process(self, batch: Sequence[bytes]) -> Iterator[bytes]:
        blocks = self.parse_blocks(batch)
        job_support.count(NAMESPACE, BLOCKS, len(blocks))
        for block, body in blocks:
            if list(body.ids) != list(block[example_schemas.BODY_IDS]):
                # The sentence boundaries are only known on the re-tokenized text, which is then the context.
                job_support.count(NAMESPACE, BODY_IDS_MISMATCH)
            examples, counts = self._task.examples(
                body, self._splitter.split(body.text), title_ids=block[example_schemas.TITLE_IDS],
                uid=block[example_schemas.UID].decode("utf-8"), block_id=block[example_schemas.BLOCK_ID])
            for name, n in counts.items():
                job_support.count(NAMESPACE, name, n)
            job_support.count(NAMESPACE, EXAMPLES, len(examples))
            for example in examples:
                yield example_schemas.to_example(example)


class GenerateIctExamples(beam.PTransform):
    """``PCollection[bytes]`` of block records -> ``PCollection[bytes]`` of ICT example records.

    Args:
      cfg: the experiment config (model.vocab_file / lower_case / query_seq_length,
        data.ict_remove_probability / seed).
      sentences_per_block: 0 for every sentence (ORQA), else a deterministic sample of that many per block.
      batch_size: blocks tokenized together.
    """

    def __init__(self, cfg: config_lib.ExperimentConfig, sentences_per_block: int = 0,
                 batch_size: int = 64) -> None:
        super().__init__()
        self._cfg = cfg
        self._sentences_per_block = sentences_per_block
        self._batch_size = batch_size

    def expand(self, blocks: beam.PCollection) -> beam.PCollection:
        cfg = self._cfg
        return (blocks
                | "BatchBlocks" >> beam.BatchElements(min_batch_size=1, max_batch_size=self._batch_size)
                | "MakeIctExamples" >> beam.ParDo(_MakeIctExamples(
                    vocab_file=cfg.model.vocab_file, lower_case=cfg.model.lower_case,
                    query_max_length=cfg.model.query_seq_length - 2,
                    remove_probability=cfg.data.ict_remove_probability, seed=cfg.data.seed,
                    sentences_per_block=self._sentences_per_block)))


class GenerateIctDataJob(job_support.ExamplesFromBlocksJob):
    """``python -m beam_jobs.generate_ict_data`` / ``realm-tf generate-ict-data``."""

    name = "generate_ict_data"
    namespace = NAMESPACE
    prefix = PREFIX

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        job_flags.add_ict_args(parser)

    def output_dir(self, cfg: config_lib.ExperimentConfig) -> str:
        return cfg.data.ict_dir

    def transform(self, args: argparse.Namespace, cfg: config_lib.ExperimentConfig) -> beam.PTransform:
        return GenerateIctExamples(cfg, args.sentences_per_block, args.batch_size)

    def manifest_fields(self, args: argparse.Namespace, cfg: config_lib.ExperimentConfig) -> dict[str, object]:
        return {"remove_probability": cfg.data.ict_remove_probability,
                "sentences_per_block": args.sentences_per_block,
                "query_max_length": cfg.model.query_seq_length - 2}

    def summarize(self, counts: Mapping[str, int]) -> str:
        examples = counts.get(EXAMPLES, 0)
        removed = counts.get(inverse_cloze_task.REMOVED, 0)
        rate = f"{removed / examples:.3f}" if examples else "n/a"
        return (f"{counts.get(BLOCKS, 0)} blocks, {counts.get(inverse_cloze_task.SENTENCES, 0)} sentences -> "
                f"{examples} examples, sentence removed from context in {removed} (rate {rate}); skipped "
                f"(sentence = whole body) {counts.get(inverse_cloze_task.SKIPPED_WHOLE_BODY, 0)}, query truncated "
                f"{counts.get(inverse_cloze_task.QUERY_TRUNCATED, 0)}, body_ids mismatches "
                f"{counts.get(BODY_IDS_MISMATCH, 0)}")


JOB = GenerateIctDataJob()
run = JOB.run  # python: generate_ict_data.run(argv)


if __name__ == "__main__":
    sys.exit(job_support.main(__spec__))
