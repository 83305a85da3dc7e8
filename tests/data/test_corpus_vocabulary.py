"""The corpus vocabulary: MiniLM's pieces cut to those a corpus uses; the texts tokenize to the same pieces."""
import gzip
import itertools
import json

import tensorflow as tf

from realm_tf import config
from realm_tf.data import corpus_vocabulary
from realm_tf.layers import bert_tokenizer

TINY = "configs/tiny.yaml"


def test_the_cut_vocabulary_tokenizes_the_corpus_to_the_same_pieces(tmp_path):
    vocab_file = config.load_config(TINY).model.vocab_file
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in itertools.islice(f, 40)]
    vocab = corpus_vocabulary.cut_vocabulary(vocab_file, texts)
    full = bert_tokenizer.read_vocab(vocab_file)
    assert set(corpus_vocabulary.SPECIAL_TOKENS) <= set(vocab) and len(vocab) < len(full) // 5
    assert [full.index(p) for p in vocab] == sorted(full.index(p) for p in vocab)  # the full vocabulary's order
    path = str(tmp_path / "vocab.txt")
    corpus_vocabulary.write_vocabulary(vocab, path)
    cut = bert_tokenizer.BertTokenizer(path)(tf.constant(texts))
    original = bert_tokenizer.BertTokenizer(vocab_file)(tf.constant(texts))
    assert [[vocab[i] for i in row] for row in cut.to_list()] == [[full[i] for i in row] for row in original.to_list()]
