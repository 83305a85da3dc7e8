"""REALM's copying control on the tiny config, through the real pipeline: handed the block its masked span came
from, a reader trained from scratch learns to copy the span.

The pipeline is the product's: ``preprocess`` and ``generate-pretraining-data`` (salient spans), then
``pretrain`` with its first index, candidate selection, tf.data input and ``RealmPretrainingTask``, the
retriever frozen and every query's source block forced among its candidates (``pretrain.force_source_block``),
in training and in the held-out scoring (held out by source block: those blocks were never trained on).

The corpus is one sentence a document, "<first> <last> lives in <place>.", titled with the person, over
words that are single wordpieces, so that the masked span sits at the same place in every query and its source
block. A reader trained from scratch learns such a copy in a few hundred steps; finding a span by its content
(wherever the sentence sits in its block) takes a from-scratch BERT thousands of steps, too many for a test
(``benchmarks/realm_copy_control.py`` measures that).
"""
import itertools
import json
import random

import pytest

from beam_jobs import embed_blocks
from beam_jobs import generate_pretraining_data
from beam_jobs import preprocess_corpus
from realm_tf import config
from realm_tf.data import corpus_vocabulary
from realm_tf.tasks import realm_pretraining

pytestmark = pytest.mark.slow  # a few hundred training steps: `make test-fast` skips it

TINY = "configs/tiny.yaml"
FIRST = "anna peter maria john paul george james mary david sarah thomas laura robert helen daniel emma".split()
LAST = "smith brown jones miller davis wilson moore taylor clark hall young king wright green baker adams".split()
PLACES = "paris london berlin rome madrid vienna cairo tokyo lisbon dublin oslo athens prague warsaw moscow boston"
#: The retriever frozen, every query's source block forced in (training and held-out scoring), one retrieved
#: candidate beside the null document.
CONTROL = ["pretrain.freeze_retriever_steps=1000000000", "pretrain.trivial_retrieval_rate_while_frozen=1.0",
           "pretrain.force_source_block=true", "pretrain.eval_keep_source_block=true",
           "pretrain.learning_rate_decay=constant", "pretrain.warmup_steps=0", "refresh.mode=external",
           "model.num_candidates=2"]


def _write_corpus(path, seed=0):
    """256 one-sentence documents, each person living in one of 16 places; the texts."""
    rng = random.Random(seed)
    places = PLACES.split()
    rows = []
    for i, (first, last) in enumerate(itertools.product(FIRST, LAST)):
        person = f"{first.title()} {last.title()}"
        rows.append({"id": i, "title": person, "text": f"{person} lives in {rng.choice(places).title()}."})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [t for r in rows for t in (r["title"], r["text"])]


def test_a_reader_handed_its_source_block_copies_the_masked_span(tmp_path):
    texts = _write_corpus(tmp_path / "corpus.jsonl")
    vocab = corpus_vocabulary.write_cut_vocabulary(config.load_config(TINY).model.vocab_file, texts,
                                                   str(tmp_path / "vocab.txt"))
    sets = [f"data.blocks_dir={tmp_path}/blocks", f"data.pretraining_dir={tmp_path}/pretraining",
            f"index.index_dir={tmp_path}/index", f"refresh.export_dir={tmp_path}/export",
            f"pretrain.model_dir={tmp_path}/model", f"model.vocab_file={tmp_path}/vocab.txt",
            f"model.encoder.vocab_size={len(vocab)}", "data.pretraining_heldout_fraction=0.2", "data.batch_size=32",
            "pretrain.learning_rate=3e-3", "pretrain.steps=450", "pretrain.eval_examples=64",
            "pretrain.checkpoint_every_steps=1000", "pretrain.seed=0", *CONTROL]
    preprocess_corpus.JOB.call(config=TINY, overrides=sets, input=[str(tmp_path / "corpus.jsonl")],
                               output=str(tmp_path / "blocks"))
    generate_pretraining_data.JOB.call(config=TINY, overrides=sets)
    result = realm_pretraining.pretrain(config.load_config(TINY, sets), index_builder=embed_blocks.embed_and_publish)
    scores = result["eval"]
    assert result["eval_name"].endswith("_source_forced") and scores["source_in_candidates"] == 1.0
    assert scores["num_examples"] >= 32
    assert scores["mlm_accuracy_source_alone"] >= 0.5, scores
    assert scores["mlm_accuracy_source_alone"] >= 5 * scores["mlm_accuracy_null_only"], scores
