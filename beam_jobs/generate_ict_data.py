"""Beam job: knowledge-corpus blocks -> Inverse Cloze Task examples (Lee et al., 2019; REALM §3.4).

REALM (Guu et al., 2020) does not train its retriever from scratch: "we warm-start Embed_input and
Embed_doc using ... the Inverse Cloze Task (ICT)" (§3.4 "Initialization"), the pre-training task of ORQA
(Lee, Chang and Toutanova, 2019, §5): given a sentence, retrieve the block it came from. The sentence is the
pseudo-query; its block ``[CLS] title [SEP] body [SEP]`` is the positive context (the other blocks of a
batch are the negatives); with probability 0.9 the sentence is removed from the context body, so that the
retriever must match meaning, not just words.

Per block (``example_schemas.block_feature_spec()`` records from ``beam_jobs/preprocess_corpus``): split the
body TEXT into sentences, tokenize it with offsets, and let ``InverseClozeTask`` turn every sentence (ORQA's
choice; ``--sentences_per_block K`` takes a deterministic sample of K instead) into one example:
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
import time
from typing import Iterator, Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)
import apache_beam as beam
from apache_beam.io import filesystems

from beam_jobs import job_flags
from beam_jobs import job_support
from realm_tf import config as config_lib
from realm_tf.data import example_schemas
from realm_tf.data import inverse_cloze_task
from realm_tf.data import job_manifest
from realm_tf.data import tokenized_text

NAMESPACE = "realm_tf.generate_ict_data"
PREFIX = "ict"

# Counter names (also the keys of manifest["counts"]), besides the inverse_cloze_task event names.
BLOCKS = "blocks"
EXAMPLES = "examples"
BODY_IDS_MISMATCH = "body_ids_mismatch"  # re-tokenized TEXT differs from the block's BODY_IDS


class _MakeIctExamples(beam.DoFn):
    """A batch of serialized blocks -> serialized ICT examples (tokenizer built in setup)."""

    def __init__(self, vocab_file: str, lower_case: bool, query_max_length: int, remove_probability: float,
                 seed: int, sentences_per_block: int) -> None:
        super().__init__()
        self._vocab_file = vocab_file
        self._lower_case = lower_case
        self._task = inverse_cloze_task.InverseClozeTask(
            query_max_length, remove_probability=remove_probability, seed=seed,
            sentences_per_block=sentences_per_block)

    def setup(self) -> None:
        from realm_tf.data import sentence_splitter  # pylint: disable=import-outside-toplevel
        from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel

        self._tokenizer = bert_tokenizer.BertTokenizer(self._vocab_file, lower_case=self._lower_case)
        self._continuation = tokenized_text.TokenizedText.continuation_table(self._tokenizer.vocab)
        self._splitter = sentence_splitter.SentenceSplitter()

    def process(self, batch: Sequence[bytes]) -> Iterator[bytes]:
        spec = example_schemas.block_feature_spec()
        blocks = [job_support.parse_example(record, spec) for record in batch]
        texts = [block[example_schemas.TEXT].decode("utf-8") for block in blocks]
        bodies = tokenized_text.TokenizedText.from_batch(self._tokenizer, texts, self._continuation)
        job_support.count(NAMESPACE, BLOCKS, len(blocks))
        for block, body in zip(blocks, bodies):
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


def summarize(counts: dict[str, int]) -> str:
    """A human-readable summary of the counters."""
    examples = counts.get(EXAMPLES, 0)
    removed = counts.get(inverse_cloze_task.REMOVED, 0)
    rate = f"{removed / examples:.3f}" if examples else "n/a"
    return (f"{counts.get(BLOCKS, 0)} blocks, {counts.get(inverse_cloze_task.SENTENCES, 0)} sentences -> "
            f"{examples} examples, sentence removed from context in {removed} (rate {rate}); skipped (sentence "
            f"= whole body) {counts.get(inverse_cloze_task.SKIPPED_WHOLE_BODY, 0)}, query truncated "
            f"{counts.get(inverse_cloze_task.QUERY_TRUNCATED, 0)}, body_ids mismatches "
            f"{counts.get(BODY_IDS_MISMATCH, 0)}")


def run(argv: list[str] | None = None) -> dict[str, object]:
    """Runs the job on ``argv``; returns the manifest it wrote. Unknown flags are Beam pipeline options."""
    parser = argparse.ArgumentParser(prog="generate_ict_data", description=__doc__.split("\n\n")[0])
    job_flags.add_ict_args(parser)
    args, beam_args = parser.parse_known_args(argv)
    return run_with_args(args, beam_args)


def run_with_args(args: argparse.Namespace, beam_args: Sequence[str]) -> dict[str, object]:
    """Runs the job on parsed ``job_flags.add_ict_args`` flags and Beam options (used by ``realm-tf``)."""
    cfg, options = job_support.resolve(args, beam_args)
    output = args.output or cfg.data.ict_dir

    from realm_tf.layers import bert_tokenizer  # pylint: disable=import-outside-toplevel
    vocab_hash = bert_tokenizer.vocab_hash(cfg.model.vocab_file)
    job_support.check_input(args.input, vocab_hash)
    job_support.prepare_output(output, PREFIX)

    started = time.time()
    pipeline = beam.Pipeline(options=options)
    _ = (pipeline
         | "ReadBlocks" >> beam.io.ReadFromTFRecord(args.input)
         | "GenerateExamples" >> GenerateIctExamples(cfg, args.sentences_per_block, args.batch_size)
         | "WriteExamples" >> beam.io.WriteToTFRecord(
             filesystems.FileSystems.join(output, PREFIX), file_name_suffix=".tfrecord",
             num_shards=args.num_shards))
    result = pipeline.run()
    result.wait_until_finish()
    counts = job_support.read_counters(result, NAMESPACE)
    manifest = {
        "job": "generate_ict_data",
        "input": args.input,
        "output_pattern": filesystems.FileSystems.join(output, f"{PREFIX}-*.tfrecord"),
        "counts": counts,
        "vocab_file": cfg.model.vocab_file,
        "vocab_hash": vocab_hash,
        "remove_probability": cfg.data.ict_remove_probability,
        "sentences_per_block": args.sentences_per_block,
        "query_max_length": cfg.model.query_seq_length - 2,
        "config_hash": config_lib.config_hash(cfg),
        "config": config_lib.to_dict(cfg),
        "seconds": round(time.time() - started, 1),
    }
    job_manifest.write_manifest(output, manifest)
    print(f"generate_ict_data: {summarize(counts)}; wrote {manifest['output_pattern']} in {manifest['seconds']}s")
    return manifest


if __name__ == "__main__":
    sys.exit(job_support.main(run, "generate_ict_data"))
