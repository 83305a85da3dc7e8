"""A WordPiece vocabulary cut to the pieces a corpus uses, for encoders trained from scratch on it.

An encoder trained from scratch on one corpus (REALM's copying control, a generated world of fictional facts)
needs no row for a wordpiece the corpus never uses, and its masked-LM softmax (tied to the word embeddings, as in
BERT, Devlin et al. 2019) then costs a fraction of the full vocabulary's. The cut keeps the pieces the full
vocabulary gives the corpus's texts, and the special tokens, in the full vocabulary's order.

WordPiece's greedy longest-match-first search finds the same pieces in the cut vocabulary: every piece the full
vocabulary chose for a word is kept, and any longer candidate the search tried before it was absent from the full
vocabulary, so it is absent from the cut one too. The texts are tokenized as before, only renumbered
(:func:`cut_vocabulary` checks this on the texts it is given).
"""
from __future__ import annotations

import os
import tempfile
from typing import Iterable, Sequence

import tensorflow as tf

from realm_tf import config as config_lib
from realm_tf.layers import bert_tokenizer

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def cut_vocabulary(vocab_file: str, texts: Sequence[str], lower_case: bool = True) -> list[str]:
    """The pieces of ``vocab_file`` that the tokenizer gives ``texts``, and the special tokens, in its order.

    Raises:
      ValueError: the cut vocabulary tokenizes a text differently (a tokenizer that is not greedy WordPiece).
    """
    full = bert_tokenizer.read_vocab(vocab_file)
    ids = _piece_ids(bert_tokenizer.BertTokenizer(vocab_file, lower_case=lower_case), texts)  # [pieces]
    used = set(ids)
    vocab = [piece for i, piece in enumerate(full) if i in used or piece in SPECIAL_TOKENS]
    renumbered = {piece: i for i, piece in enumerate(vocab)}
    expected = [renumbered[full[i]] for i in ids]
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "vocab.txt")
        write_vocabulary(vocab, path)
        cut = _piece_ids(bert_tokenizer.BertTokenizer(path, lower_case=lower_case), texts)
    if cut != expected:
        raise ValueError(f"{vocab_file}: the cut vocabulary tokenizes the texts differently")
    return vocab


def write_cut_vocabulary(vocab_file: str, texts: Sequence[str], path: str, lower_case: bool = True) -> list[str]:
    """:func:`cut_vocabulary` of ``texts``, written to ``path`` (:func:`write_vocabulary`); the pieces."""
    vocab = cut_vocabulary(vocab_file, texts, lower_case=lower_case)
    write_vocabulary(vocab, path)
    return vocab


def write_vocabulary(vocab: Iterable[str], path: str) -> None:
    """``vocab`` as a BERT ``vocab.txt`` (one piece a line, id = line number), written atomically."""
    config_lib.atomic_write_text(path, "\n".join(vocab) + "\n")


def _piece_ids(tokenizer: bert_tokenizer.BertTokenizer, texts: Sequence[str]) -> list[int]:
    pieces: list[int] = []
    for start in range(0, len(texts), 1024):
        pieces.extend(tokenizer(tf.constant(list(texts[start:start + 1024]))).flat_values.numpy().tolist())
    return pieces
