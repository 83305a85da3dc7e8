"""The reader warm start: extractive reading on gold blocks before Open-QA fine-tuning.

REALM (Guu et al., 2020, §4) and ORQA (Lee et al., 2019, §5) fine-tune a reader whose BERT has already learned
to read: BERT-base, or REALM's knowledge-augmented encoder after 200k steps of pre-training. A small sentence
embedder imported as the reader (all-MiniLM-L6-v2 here) has never extracted a span, and Open-QA fine-tuning
reads k = 5 blocks per question, so teaching it to read there costs five block readings per question. This
stage teaches it first, on reading-comprehension pairs: each question's **gold block** (a block of a gold
passage that contains an answer) read next to ``qa.reader_negatives`` **negative blocks** (BM25's best-ranked
blocks that hold no answer), with ORQA's reader loss over all spans of all of them (no retrieval score), so the
reader learns to prefer the block that answers as well as the span within it:

    L = −log Σ_{(z, s): TEXT(s) = answer} exp S_read(z, s) + log Σ_{(z, s)} exp S_read(z, s)

The checkpoint holds the whole span reader (BERT and span MLP); ``qa.reader_checkpoint`` starts Open-QA
fine-tuning from it. The dev and tune splits of every question file are never read here.
"""
from __future__ import annotations

import os
from typing import Any, Sequence


from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import block_store as block_store_lib
from realm_tf.tasks import open_qa
from realm_tf.tasks import reading_sets

def read_training_questions(cfg: config_lib.ExperimentConfig,
                            paths: Sequence[str]) -> list[open_qa.QaExample]:
    """The train split (neither dev nor tune) of every question file."""
    examples: list[open_qa.QaExample] = []
    for path in paths:
        train, _ = open_qa.split_questions(open_qa.read_questions(path), cfg.data.qa_dev_fraction,
                                           cfg.data.qa_tune_fraction)
        examples += train
    return examples


def train_reader(cfg: config_lib.ExperimentConfig, question_paths: Sequence[str] = ()) -> dict[str, Any]:
    """``realm-tf train-reader``: trains the span reader on gold + negative blocks for ``reader.steps``
    (or ``reader.max_minutes``); resumes from ``reader.model_dir``.

    Args:
      question_paths: {question, answers, gold_passage_ids} JSONL files (default ``qa.reader_questions``).
    """
    from realm_tf.layers import knowledge_corpus  # pylint: disable=import-outside-toplevel
    from realm_tf.tasks import distribution  # pylint: disable=import-outside-toplevel
    from realm_tf.tasks import optimizer as optimizer_lib  # pylint: disable=import-outside-toplevel
    from realm_tf.tasks import training_loop  # pylint: disable=import-outside-toplevel

    paths = list(question_paths) or list(cfg.qa.reader_questions)
    if not paths:
        raise errors.UserError("train-reader needs question files (--questions or qa.reader_questions)")
    config_lib.save_params(cfg, cfg.reader.model_dir)
    task = open_qa.OpenQaTask(cfg)
    blocks = block_store_lib.BlockStore.load(os.path.join(cfg.data.blocks_dir, "blocks-*.tfrecord*"))
    examples = read_training_questions(cfg, paths)
    reading = reading_sets.gold_and_negatives(examples, blocks, cfg.qa.reader_negatives, seed=cfg.reader.seed)
    print(f"train-reader: {len(reading.examples)} questions from {len(paths)} file(s), each read with its gold "
          f"block and {cfg.qa.reader_negatives} negatives; skipped: {reading.skipped}", flush=True)
    strategy = distribution.make_strategy(cfg.reader.strategy)
    batch_size = cfg.data.batch_size
    with strategy.scope():
        # The reader reads the blocks it is given; the corpus embeddings are never searched here.
        corpus = knowledge_corpus.KnowledgeCorpus.without_index(blocks, task.tokenizer)
        model = task.build_model(corpus)
        optimizer = optimizer_lib.build_optimizer(cfg.reader, model)
    loop = training_loop.TrainingLoop(cfg.reader, strategy, {"reader": model.reader, "optimizer": optimizer},
                                      batch_size)
    # A resumed run draws a new order (seed + step) instead of replaying the examples it has already seen.
    dataset = task.dataset(reading.examples, batch_size, repeat=True, shuffle=True, seed=cfg.reader.seed + loop.step,
                           drop_remainder=True, block_ids=reading.block_ids)
    logs = loop.run(dataset, task.make_step_fn(model, optimizer, batch_size, reader_only=True))
    return {"step": loop.step, "train": logs, "num_questions": len(reading.examples), "skipped": reading.skipped}
