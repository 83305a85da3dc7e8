"""The Open-QA span reader of ORQA (Lee et al., 2019, §4) and REALM fine-tuning (Guu et al., 2020, §3.2).

For each of the k retrieved blocks z, a BERT reads join_BERT(x, z) = ``[CLS] question [SEP] title [SEP] body
[SEP]``; every span s of the block segment is scored from the BERT outputs at its endpoints:

    S_read(z, s, x) = MLP([h_START(s); h_END(s)]),   MLP = Dense(span_hidden_size, ReLU) → Dense(1)

With ``span_layer_norm`` the hidden layer is layer-normalised after the ReLU, as in ORQA's released reader
(``orqa_model.read``: ``dense_1(LayerNormalization(ReLU(start[s] + end[e])))`` over ``dense(2·span_hidden)``'s two
halves, Keras' ε = 1e-3); ``[W_s; W_e]`` here is that dense's kernel split in two, its bias the halves' sum.

REALM: p(y | z, x) ∝ Σ_{s ∈ S(z, y)} exp(MLP([h_START(s); h_END(s)])). The candidates are all spans of at
most ``max_span_width`` wordpieces (REALM: 10) inside the block segment. They are enumerated densely as
``(start, width)`` pairs, ``index = start * max_span_width + width`` (shared with
:mod:`realm_tf.data.answer_spans`), and a ``span_mask`` marks the valid ones. The loss that combines these
scores with the retriever's is :func:`realm_tf.tasks.open_qa_loss.open_qa_marginal_loss`.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf.data import answer_spans
from realm_tf.networks import bert_encoder
from realm_tf.networks import bert_weight_import
from realm_tf.networks import length_buckets

#: The logit of a span outside the block segment: exp() of it underflows to 0 next to any real span score.
MASKED_SPAN_LOGIT = -1e4
#: ε of the optional LayerNorm of the span MLP: ORQA's ``tf.keras.layers.LayerNormalization()`` default.
SPAN_LAYER_NORM_EPSILON = 1e-3


class SpanReader(tf_keras.Model):
    """BERT over join_BERT(question, block) for k blocks, with an MLP scoring every candidate span.

    Args:
      encoder: a BertEncoderV2 (anything taking :data:`bert_encoder.INPUT_KEYS` and returning
        ``sequence_output``), e.g. named "reader_bert".
      max_span_width: the longest candidate span, in wordpieces.
      span_hidden_size: width of the span MLP's hidden layer.
      initializer_range: stddev of the span MLP's truncated-normal initialiser.
      span_layer_norm: LayerNorm (ε = :data:`SPAN_LAYER_NORM_EPSILON`) between the span MLP's ReLU and its
        output layer (ORQA's reader); off by default.
      length_buckets: the ``batch * num_blocks`` rows are sorted by length and read by BERT in this many
        groups, each padded only to its own longest row (1: one group padded to the longest row). Outputs are
        the same up to float rounding (padding is masked out of attention); blocks vary in length (bundled
        corpus: median 133 wordpieces, 99th percentile 288), so the encoder reads far fewer padding positions.
      compiled_inference: BERT's inference pass runs as XLA programs
        (:func:`realm_tf.networks.length_buckets.encode`'s ``compiled``); training is not compiled.

    Inputs of :meth:`call`: ``input_word_ids`` / ``input_mask`` / ``input_type_ids``, each
    ``int32[batch, num_blocks, seq_len]``, with the block in segment 1 (``input_type_ids == 1``).

    Returns, with ``num_spans = seq_len * max_span_width``:
      ``span_logits`` ``float32[batch, num_blocks, num_spans]`` (:data:`MASKED_SPAN_LOGIT` where invalid),
      ``span_starts`` / ``span_ends`` ``int32[batch, num_blocks, num_spans]`` (inclusive; ``span_ends`` may
      reach past the sequence, such spans are invalid), ``span_mask`` ``bool[batch, num_blocks, num_spans]``
      (start and end are block wordpieces: type id 1, input mask 1, not the final [SEP]) and
      ``sequence_output`` ``[batch, num_blocks, seq_len, hidden]`` (with ``length_buckets`` > 1, zeros at padded
      positions past the longest row of a row's group).
    """

    def __init__(self, encoder: tf_keras.layers.Layer, max_span_width: int, span_hidden_size: int,
                 initializer_range: float = 0.02, length_buckets: int = 1, span_layer_norm: bool = False,
                 compiled_inference: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        if max_span_width < 1 or span_hidden_size < 1 or length_buckets < 1:
            raise ValueError(f"max_span_width={max_span_width}, span_hidden_size={span_hidden_size} and "
                             f"length_buckets={length_buckets} must be positive")
        self.encoder = encoder
        self._length_buckets = length_buckets
        self._compiled_inference = compiled_inference
        self._max_span_width = max_span_width
        self._span_hidden_size = span_hidden_size
        self._initializer_range = initializer_range
        self.span_hidden = tf_keras.layers.Dense(
            span_hidden_size, activation="relu", name="span_hidden",
            kernel_initializer=tf_keras.initializers.TruncatedNormal(stddev=initializer_range))
        self.span_logit = tf_keras.layers.Dense(
            1, name="span_logit", kernel_initializer=tf_keras.initializers.TruncatedNormal(stddev=initializer_range))
        self.span_layer_norm = (tf_keras.layers.LayerNormalization(epsilon=SPAN_LAYER_NORM_EPSILON,
                                                                   name="span_layer_norm")
                                if span_layer_norm else None)

    def call(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> dict[str, tf.Tensor]:
        word_ids = inputs["input_word_ids"]  # [batch, num_blocks, seq_len]
        shape = tf.shape(word_ids)
        batch, num_blocks = _dim(word_ids, 0, shape), _dim(word_ids, 1, shape)
        seq_len = _dim(word_ids, 2, shape)
        flat = {k: tf.reshape(inputs[k], [-1, seq_len]) for k in bert_encoder.INPUT_KEYS}  # each [b * k, seq_len]
        sequence = length_buckets.encode(self.encoder, flat, self._length_buckets, training,
                                         compiled=self._compiled_inference)["sequence_output"]  # [b*k, len, hidden]

        num_spans = answer_spans.num_spans(seq_len, self._max_span_width)
        index = tf.range(num_spans)  # [num_spans]
        starts, ends = answer_spans.span_bounds(index, self._max_span_width)  # each [num_spans]
        in_block = _block_positions(flat["input_mask"], flat["input_type_ids"])  # [b * k, seq_len]
        in_range = ends < seq_len  # [num_spans]
        safe_ends = tf.minimum(ends, seq_len - 1)  # [num_spans]: spans past the end are gathered, then masked
        mask = (tf.gather(in_block, starts, axis=1) & tf.gather(in_block, safe_ends, axis=1)
                & in_range[None, :])  # [b * k, num_spans]

        # MLP([h_s; h_e]) = ReLU(W_s h_s + W_e h_e + b): project every position once, then add the projections of
        # each span's endpoints; the same function as concatenating, without a [spans, 2 * hidden] tensor.
        hidden = sequence.shape[-1]
        if not self.span_hidden.built:  # created through __call__, so its variables are named span_hidden/...
            self.span_hidden(tf.zeros([1, 2 * hidden], sequence.dtype))
        kernel = tf.cast(self.span_hidden.kernel, sequence.dtype)  # [2 * hidden, span_hidden]
        from_start = tf.einsum("rlh,hd->rld", sequence, kernel[:hidden])  # [b * k, seq_len, span_hidden]
        from_end = tf.einsum("rlh,hd->rld", sequence, kernel[hidden:]) + tf.cast(self.span_hidden.bias,
                                                                                 sequence.dtype)
        span_hidden = tf.nn.relu(tf.gather(from_start, starts, axis=1)
                                 + tf.gather(from_end, safe_ends, axis=1))  # [b * k, num_spans, span_hidden]
        if self.span_layer_norm is not None:
            span_hidden = self.span_layer_norm(span_hidden)  # [b * k, num_spans, span_hidden]
        logits = tf.squeeze(self.span_logit(span_hidden), -1)  # [b * k, num_spans]
        logits = tf.cast(logits, tf.float32)
        logits = tf.where(mask, logits, tf.constant(MASKED_SPAN_LOGIT, tf.float32))  # [b * k, num_spans]

        spans_shape = [batch, num_blocks, num_spans]
        return {
            "span_logits": tf.reshape(logits, spans_shape),  # [batch, num_blocks, num_spans]
            "span_starts": tf.broadcast_to(starts, spans_shape),  # [batch, num_blocks, num_spans]
            "span_ends": tf.broadcast_to(ends, spans_shape),  # [batch, num_blocks, num_spans]
            "span_mask": tf.reshape(mask, spans_shape),  # [batch, num_blocks, num_spans]
            "sequence_output": tf.reshape(sequence, [batch, num_blocks, seq_len, hidden]),  # [b, k, seq_len, hidden]
        }

    def get_config(self) -> dict[str, Any]:
        return {"encoder": tf_keras.layers.serialize(self.encoder), "max_span_width": self._max_span_width,
                "span_hidden_size": self._span_hidden_size, "initializer_range": self._initializer_range,
                "length_buckets": self._length_buckets, "span_layer_norm": self.span_layer_norm is not None,
                "compiled_inference": self._compiled_inference, "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "SpanReader":
        config = dict(config)
        config["encoder"] = tf_keras.layers.deserialize(config["encoder"], custom_objects=custom_objects)
        return cls(**config)


def _dim(x: tf.Tensor, axis: int, dynamic: tf.Tensor) -> int | tf.Tensor:
    """``x.shape[axis]`` when static, else ``dynamic[axis]`` (``dynamic = tf.shape(x)``)."""
    return x.shape[axis] if x.shape[axis] is not None else dynamic[axis]


def _block_positions(input_mask: tf.Tensor, type_ids: tf.Tensor) -> tf.Tensor:
    """``bool[rows, seq_len]``: the block's wordpieces, i.e. segment 1 without its last token (the final [SEP])."""
    segment = tf.equal(type_ids, 1) & tf.not_equal(input_mask, 0)  # [rows, seq_len]
    next_in_segment = tf.pad(segment[:, 1:], [[0, 0], [0, 1]])  # [rows, seq_len]: position i + 1 is in it
    return segment & next_in_segment


def build_span_reader(cfg: config_lib.ModelConfig, restore: bool = True) -> SpanReader:
    """Builds the reader from ``cfg`` (loading ``cfg.init_checkpoint`` into its BERT) and creates its variables."""
    encoder = bert_encoder.build_bert_encoder(cfg.encoder, name="reader_bert")
    if restore and cfg.init_checkpoint:
        bert_weight_import.restore_encoder(encoder, cfg.init_checkpoint)
    model = SpanReader(encoder, max_span_width=cfg.max_span_width, span_hidden_size=cfg.span_hidden_size,
                       initializer_range=cfg.encoder.initializer_range, length_buckets=cfg.reader_length_buckets,
                       span_layer_norm=cfg.span_layer_norm, compiled_inference=cfg.compiled_inference,
                       name="span_reader")
    dummy = tf.zeros([1, 1, 2], tf.int32)  # [batch, num_blocks, seq_len]
    model({"input_word_ids": dummy, "input_mask": tf.ones_like(dummy), "input_type_ids": dummy})
    return model
