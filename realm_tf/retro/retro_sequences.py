"""RETRO's training and evaluation sequences, and the byte count that bits-per-byte divides by (Borgeaud et al.,
2021, §2.1 and §4: models are compared in bits-per-byte on held-out documents, which does not depend on the
tokenizer).

A document's token stream (its chunks in order, ``retro/chunk_store``) is cut into sequences of n tokens aligned
with the chunks (n is a multiple of m), the last one padded. Whole documents are held out by id
(``data/question_split``'s SHA1 positions): ``validation`` for choosing settings (e.g. kNN-LM's λ), ``test``
only measured; their chunks are kept out of the database used with them where the protocol says so. Of the
other documents, a fraction may be kept out of training too (``database``): their chunks are retrievable, their
text is never trained on, so the database is larger than the training text (RETRO §4.1, App. C.2).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from realm_tf.data import question_split

SPLITS = ("train", "database", "validation", "test")

#: The splits whose chunks a "no leakage" database holds (RETRO §4): every document but the held-out ones.
RETRIEVABLE = ("train", "database")


def document_split(doc_id: str, validation_fraction: float, test_fraction: float,
                   training_fraction: float = 1.0) -> str:
    """``validation`` (SHA1 position of the id below ``validation_fraction``), ``test`` (the next
    ``test_fraction``), then ``train`` for the first ``training_fraction`` of the rest and ``database`` after
    it: deterministic, by document."""
    split = question_split.split_of(doc_id, validation_fraction, test_fraction)
    if split != "train":
        return {"dev": "validation", "tune": "test"}[split]
    held_out = validation_fraction + test_fraction
    if training_fraction >= 1.0 or held_out >= 1.0:
        return "train"
    rest = (question_split.position(doc_id) - held_out) / (1.0 - held_out)  # in [0, 1)
    return "train" if rest < training_fraction else "database"


def document_sequences(tokens: Sequence[int], length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A token stream cut into sequences of ``length``: ``(int32 [S, length], bool mask [S, length])``, the last
    one padded with ``pad_id`` (mask False). Sequence s starts at token ``s * length``."""
    tokens = np.asarray(tokens, np.int32)
    count = -(-tokens.size // length)
    ids = np.full([count, length], pad_id, np.int32)  # [S, length]
    mask = np.zeros([count, length], bool)  # [S, length]
    ids.reshape(-1)[:tokens.size] = tokens
    mask.reshape(-1)[:tokens.size] = True
    return ids, mask


def token_byte_lengths(vocab: Sequence[str]) -> np.ndarray:
    """int64 ``[vocab_size]``: the UTF-8 bytes a wordpiece adds to the detokenized text. A ``##`` piece adds its
    text, a word adds a space and its text (the first word of a text: the text only, see
    :func:`text_bytes`), special tokens (``[CLS]``, ``[PAD]``, ...) nothing."""
    out = np.zeros(len(vocab), np.int64)
    for i, token in enumerate(vocab):
        if token.startswith("[") and token.endswith("]"):
            continue
        out[i] = len(token[2:].encode("utf-8")) if token.startswith("##") else len(token.encode("utf-8")) + 1
    return out


def original_byte_lengths(ends: Sequence[int]) -> np.ndarray:
    """int64 ``[n]``: the UTF-8 bytes of the original text each of a text's n wordpieces stands for, from the
    end of the previous piece (the text's start for the first) to its own end (``ends``: byte offsets one past
    each piece). Spaces, punctuation and characters that normalisation changed (case, accents) count where they
    stand, and the lengths add up to the text's bytes up to its last piece."""
    ends = np.asarray(ends, np.int64)
    return np.diff(np.concatenate([np.zeros(1, np.int64), ends]))


def text_bytes(ids: Sequence[int], byte_lengths: np.ndarray, vocab: Sequence[str]) -> int:
    """UTF-8 bytes of the text the wordpieces ``ids`` detokenize to (words joined by single spaces)."""
    ids = [int(i) for i in ids]
    total = int(byte_lengths[ids].sum()) if ids else 0
    first = next((i for i in ids if byte_lengths[i] > 0), None)
    if first is not None and not vocab[first].startswith("##"):
        total -= 1  # no space before the first word
    return total


def bits_per_byte(nll_nats: float, num_bytes: int) -> float:
    """Σ NLL / (ln 2 · UTF-8 bytes): the tokenizer-independent measure of RETRO's §4."""
    return float(nll_nats) / (np.log(2.0) * num_bytes) if num_bytes else float("nan")
