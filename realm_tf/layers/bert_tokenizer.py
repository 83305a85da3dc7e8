"""In-graph WordPiece tokenizer and BERT input packing (join_BERT of REALM §3.2).

REALM feeds BERT with ``join_BERT(x1, x2) = [CLS] x1 [SEP] x2 [SEP]`` (Guu et al., 2020, eq. after (2)); a
knowledge-corpus block is ``[CLS] title [SEP] body [SEP]``. Everything here runs inside a ``tf.function``
and is saved with a SavedModel (the vocabulary becomes an asset of the FastWordpiece model buffer), so
serving needs TensorFlow and tensorflow_text only.
"""
from __future__ import annotations

import hashlib
import types
import weakref
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
import tf_keras

from realm_tf import resources

#: WordPiece's marker of a piece that continues a word (``un ##aff ##able``).
SUFFIX_INDICATOR = "##"


def read_vocab(vocab_file: str) -> list[str]:
    """Reads a BERT vocab.txt (one token a line, id = line number)."""
    path = resources.resolve(vocab_file)
    with open(path, encoding="utf-8") as f:
        vocab = [line.rstrip("\n").rstrip("\r") for line in f]
    while vocab and vocab[-1] == "":
        vocab.pop()
    for special in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
        if special not in vocab:
            raise ValueError(f"{path}: vocabulary has no {special} token")
    return vocab


def continuation_table(vocab: list[str] | tuple[str, ...]) -> np.ndarray:
    """``bool[vocab_size]``: True for the pieces that continue a word (``##...``), False for word starts.

    An answer span (REALM's reader, Guu et al., 2020, §3.4) and a block cut stop only at word boundaries;
    this is the one place that decides what a word boundary is.
    """
    return np.array([token.startswith(SUFFIX_INDICATOR) for token in vocab], dtype=bool)


def vocab_hash(vocab_file: str) -> str:
    """SHA1 identifying a vocabulary (recorded in manifests, exports and indexes to refuse mismatches)."""
    return _hash(read_vocab(vocab_file))


def _hash(vocab: list[str]) -> str:
    return hashlib.sha1("\n".join(vocab).encode("utf-8")).hexdigest()


# Building the FastWordpiece and normaliser models costs about a second of CPU; the tokenizer is a stateless
# tf.Module over two constant buffers, so every layer over the same vocabulary shares one.
_FAST_TOKENIZERS: dict[tuple[str, bool], tf_text.FastBertTokenizer] = {}


def _fast_bert_tokenizer(vocab: list[str], vocab_sha1: str, lower_case: bool) -> tf_text.FastBertTokenizer:
    """tensorflow_text's FastBertTokenizer over ``vocab`` (built once per process for each vocabulary)."""
    key = (vocab_sha1, bool(lower_case))
    tokenizer = _FAST_TOKENIZERS.get(key)
    if tokenizer is None:
        with tf.init_scope():  # eager buffers, even when the first layer is built inside a traced function
            tokenizer = _FAST_TOKENIZERS[key] = tf_text.FastBertTokenizer(
                vocab=vocab,
                suffix_indicator=SUFFIX_INDICATOR,
                max_bytes_per_word=100,
                token_out_type=tf.int32,
                unknown_token="[UNK]",
                no_pretokenization=False,
                support_detokenization=True,
                lower_case_nfd_strip_accents=lower_case,
            )
    return tokenizer


class _Vocabulary:
    """The wordpieces and their ids, held as one plain object: tf.Module walks every attribute of a module (and of
    the models and SavedModel exports that hold the tokenizer) to collect variables, descending into tuples and
    mappings, so a 30k-entry tuple or mapping attribute costs half a second per walk, and a SavedModel save walks
    hundreds of times. An object that is neither a module nor a nested structure is one leaf."""

    __slots__ = ("tokens", "ids")

    def __init__(self, tokens: Sequence[str]) -> None:
        self.tokens: tuple[str, ...] = tuple(tokens)
        self.ids: Mapping[str, int] = types.MappingProxyType({token: i for i, token in enumerate(self.tokens)})


class BertTokenizer(tf_keras.layers.Layer):
    """WordPiece tokenizer over a BERT vocabulary, with REALM's ``join_BERT`` packing.

    Calling the layer on a ``string[batch]`` tensor returns ``int32`` wordpiece ids as a
    ``RaggedTensor[batch, (num_wordpieces)]`` (no special tokens). ``join_bert`` and ``pack_single``
    build the dense ``input_word_ids`` / ``input_mask`` / ``input_type_ids`` BERT expects.
    """

    def __init__(self, vocab_file: str, lower_case: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self._vocab_file = vocab_file
        self._lower_case = lower_case
        vocab = read_vocab(vocab_file)
        self._vocabulary = _Vocabulary(vocab)
        self.vocab_hash = _hash(vocab)
        self.pad_id = self.token_id("[PAD]")
        self.unk_id = self.token_id("[UNK]")
        self.cls_id = self.token_id("[CLS]")
        self.sep_id = self.token_id("[SEP]")
        self.mask_id = self.token_id("[MASK]")
        self._tokenizer = _fast_bert_tokenizer(vocab, self.vocab_hash, lower_case)

    @property
    def vocab(self) -> tuple[str, ...]:
        """The wordpieces, by id."""
        return self._vocabulary.tokens

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_id(self, token: str) -> int:
        """The id of a vocabulary token (KeyError names the token if absent)."""
        return self._vocabulary.ids[token]

    def call(self, text: tf.Tensor) -> tf.RaggedTensor:
        """Tokenizes ``string[batch]`` into ``RaggedTensor[batch, (num_wordpieces)]`` of int32 ids."""
        text = tf.convert_to_tensor(text, dtype=tf.string)
        return self._tokenizer.tokenize(text)  # [batch, (num_wordpieces)]

    def tokenize_with_offsets(self, text: tf.Tensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor, tf.RaggedTensor]:
        """Ids with UTF-8 byte offsets ``(ids, starts, ends)``, each ``[batch, (num_wordpieces)]``."""
        text = tf.convert_to_tensor(text, dtype=tf.string)
        return self._tokenizer.tokenize_with_offsets(text)

    def detokenize(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        """Joins wordpiece ids back into text ``string[batch]`` (``##`` pieces merged)."""
        return self._tokenizer.detokenize(ids)

    def join_bert(self, first: tf.RaggedTensor, second: tf.RaggedTensor, seq_length: int,
                  pad_to_seq_length: bool = True) -> dict[str, tf.Tensor]:
        """``[CLS] first [SEP] second [SEP]`` padded to ``seq_length`` (REALM's join_BERT).

        Truncation keeps both segments: ``second`` (the document) is cut first, but never below half the
        budget while ``first`` (the query) is too long; ``first`` is then cut to what is left.

        Args:
          first: ``RaggedTensor[batch, (len_a)]`` of wordpiece ids (or ``string[batch]`` to tokenize).
          second: ``RaggedTensor[batch, (len_b)]`` of wordpiece ids (or ``string[batch]``).
          seq_length: total length including the three special tokens.
          pad_to_seq_length: pad to ``seq_length``; False pads only to the longest row of the batch (same
            outputs from BERT, less compute for short inputs).

        Returns:
          ``input_word_ids``, ``input_mask``, ``input_type_ids``: each ``int32[batch, seq_length]``.
        """
        first = self._as_ids(first)  # [batch, (len_a)]
        second = self._as_ids(second)  # [batch, (len_b)]
        budget = seq_length - 3
        if budget < 2:
            raise ValueError(f"join_bert: seq_length={seq_length} leaves no room for two segments")
        len_a = tf.cast(first.row_lengths(), tf.int32)  # [batch]
        len_b = tf.cast(second.row_lengths(), tf.int32)  # [batch]
        keep_b = tf.minimum(len_b, tf.maximum(budget - len_a, budget // 2))  # [batch]
        keep_a = tf.minimum(len_a, budget - keep_b)  # [batch]
        first = _truncate(first, keep_a)
        second = _truncate(second, keep_b)
        return self._pack([first, second], seq_length if pad_to_seq_length else None)

    def special_ids(self) -> dict[str, int]:
        """``{"cls", "sep", "pad"}`` ids, what :func:`join_bert_ids` packs with."""
        return {"cls": self.cls_id, "sep": self.sep_id, "pad": self.pad_id}

    def pack_single(self, ids: tf.RaggedTensor, seq_length: int,
                    pad_to_seq_length: bool = True) -> dict[str, tf.Tensor]:
        """``[CLS] ids [SEP]`` padded or truncated to ``seq_length`` (a query x on its own)."""
        ids = self._as_ids(ids)  # [batch, (len)]
        keep = tf.minimum(tf.cast(ids.row_lengths(), tf.int32), seq_length - 2)  # [batch]
        return self._pack([_truncate(ids, keep)], seq_length if pad_to_seq_length else None)

    def _as_ids(self, x: tf.Tensor | tf.RaggedTensor) -> tf.RaggedTensor:
        if isinstance(x, tf.RaggedTensor):
            return tf.cast(x, tf.int32).with_row_splits_dtype(tf.int64)  # parsed records use int32 splits
        x = tf.convert_to_tensor(x)
        if x.dtype == tf.string:
            return self(x)
        raise TypeError(f"expected string[batch] or RaggedTensor of ids, got dense {x.dtype} {x.shape}")

    def _pack(self, segments: list[tf.RaggedTensor], seq_length: int | None) -> dict[str, tf.Tensor]:
        batch = segments[0].nrows(out_type=tf.int32)
        cls = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], self.cls_id))  # [batch, 1]
        sep = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], self.sep_id))  # [batch, 1]
        pieces, types = [cls], [tf.zeros_like(cls)]
        for segment_id, segment in enumerate(segments):
            pieces += [segment, sep]
            types += [tf.ones_like(segment) * segment_id, tf.ones_like(sep) * segment_id]
        word_ids = tf.concat(pieces, axis=1)  # [batch, (len)]
        type_ids = tf.concat(types, axis=1)  # [batch, (len)]
        shape = [None, seq_length]
        return {
            "input_word_ids": word_ids.to_tensor(default_value=self.pad_id, shape=shape),
            "input_mask": tf.ones_like(word_ids).to_tensor(default_value=0, shape=shape),
            "input_type_ids": type_ids.to_tensor(default_value=0, shape=shape),
        }

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"vocab_file": self._vocab_file, "lower_case": self._lower_case})
        return config


def _truncate(ids: tf.RaggedTensor, keep: tf.Tensor) -> tf.RaggedTensor:
    """Keeps the first ``keep[i]`` ids of row i (``keep[i] <= len[i]``). ``ids``: [batch, (len)], ``keep``:
    int32[batch]. A gather of the kept values' positions: two ops, where a ragged boolean mask traces dozens
    (with validation conditionals) in every graph that packs inputs."""
    starts = ids.row_starts()  # [batch]
    kept = tf.ragged.range(starts, starts + tf.cast(keep, starts.dtype))  # [batch, (keep)]: positions in values
    return kept.with_flat_values(tf.gather(ids.flat_values, kept.flat_values))  # [batch, (keep)]


# One traced tokenize_with_offsets per tokenizer, kept outside the layer so SavedModels do not carry it.
_TRACED: "weakref.WeakKeyDictionary[BertTokenizer, Callable]" = weakref.WeakKeyDictionary()


def traced_tokenize_with_offsets(tokenizer: BertTokenizer) -> Callable[[tf.Tensor], tuple]:
    """``tokenizer.tokenize_with_offsets`` as a cached ``tf.function`` over ``string[batch]``.

    For Python callers (Beam jobs, data tools) that tokenize many batches eagerly: a traced graph is about
    4x faster than eager ragged ops, whose Python dispatch dominates on CPU. Returns ``(ids, byte_starts,
    byte_ends)``, each a ``RaggedTensor[batch, (num_wordpieces)]``.
    """
    fn = _TRACED.get(tokenizer)
    if fn is None:
        owner = weakref.ref(tokenizer)  # the cached function must not keep its (weak) key alive

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
        def fn(texts: tf.Tensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor, tf.RaggedTensor]:
            return owner().tokenize_with_offsets(texts)  # [batch, (pieces)] ids, byte starts, byte ends

        _TRACED[tokenizer] = fn
    return fn


def join_bert_ids(first: np.ndarray, second: np.ndarray, seq_length: int, special: Mapping[str, int]
                  ) -> dict[str, np.ndarray]:
    """:meth:`BertTokenizer.join_bert` of one example in numpy, padded to ``seq_length``: for a host that packs
    ids outside the graph (an accelerator's input, whose shape must be static), with the same truncation.

    Args:
      first, second: ``int[len_a]``, ``int[len_b]`` wordpiece ids.
      special: :meth:`BertTokenizer.special_ids`.

    Returns:
      ``input_word_ids``, ``input_mask``, ``input_type_ids``: each ``int32[seq_length]``.
    """
    budget = seq_length - 3
    if budget < 2:
        raise ValueError(f"join_bert_ids: seq_length={seq_length} leaves no room for two segments")
    keep_b = min(len(second), max(budget - len(first), budget // 2))
    keep_a = min(len(first), budget - keep_b)
    words = [special["cls"], *first[:keep_a], special["sep"], *second[:keep_b], special["sep"]]
    out = {"input_word_ids": np.full(seq_length, special["pad"], np.int32),
           "input_mask": np.zeros(seq_length, np.int32), "input_type_ids": np.zeros(seq_length, np.int32)}
    out["input_word_ids"][:len(words)] = words
    out["input_mask"][:len(words)] = 1
    out["input_type_ids"][keep_a + 2:len(words)] = 1
    return out
