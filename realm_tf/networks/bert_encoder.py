"""The BERT encoder used by every REALM tower (Guu et al., 2020, §3.2; Devlin et al., 2019).

REALM's knowledge retriever (Embed_input, Embed_doc) and knowledge-augmented encoder are each a BERT; here
each is tf-models' :class:`official.nlp.modeling.networks.BertEncoderV2`, configured from
:class:`realm_tf.config.EncoderConfig`, with its layers' attention products computed head-major
(:class:`BertEncoder`).
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf
import tf_keras
from official.nlp.modeling import networks

from realm_tf import config as config_lib
from realm_tf.layers import fused_layer_normalization
from realm_tf.layers import head_major_encoder_block
from realm_tf.layers import integer_dropout

#: The packed inputs every BERT here takes, each ``int32[batch, seq_len]``.
INPUT_KEYS = ("input_word_ids", "input_mask", "input_type_ids")


def activation(hidden_act: str) -> str | Callable[[tf.Tensor], tf.Tensor]:
    """The Keras activation of ``encoder.hidden_act``: ``gelu`` is the exact (erf) GELU of Hugging Face
    checkpoints, ``gelu_new`` the tanh approximation of the original BERT code (google-research/bert
    ``modeling.gelu``, used by every released REALM and ORQA checkpoint), ``relu``."""
    activations = {"gelu": "gelu", "gelu_new": "gelu_approximate", "relu": "relu"}
    if hidden_act not in activations:
        raise ValueError(f"encoder.hidden_act={hidden_act!r}: expected one of {sorted(activations)}")
    if activations[hidden_act] == "gelu_approximate":
        return lambda x: tf_keras.activations.gelu(x, approximate=True)
    return activations[hidden_act]


@tf_keras.utils.register_keras_serializable(package="realm_tf")
class BertEncoder(networks.BertEncoderV2):
    """tf-models' ``BertEncoderV2`` (Devlin et al., 2019) whose transformer layers are
    :class:`realm_tf.layers.head_major_encoder_block.HeadMajorEncoderBlock`: attention products as batched
    matmuls, projections as oneDNN matmuls with their bias and GELU fused, layer norms as one oneDNN kernel each
    (:class:`realm_tf.layers.fused_layer_normalization.FusedLayerNormalization`; measured by
    ``benchmarks/bert_kernels.py``). Same arguments, variables,
    checkpoint keys and config as ``BertEncoderV2``; outputs equal to float rounding."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        for layer in self._transformer_layers:
            # Not built yet, and HeadMajorEncoderBlock adds a build step, no state. The objects stay the ones
            # BertEncoderV2 made and tracks: replacing them would move their variables in the encoder's weight
            # order, and a tracked list whose items were replaced cannot be checkpointed.
            layer.__class__ = head_major_encoder_block.HeadMajorEncoderBlock
        norm = self._embedding_norm_layer
        if type(norm) is tf_keras.layers.LayerNormalization:  # pylint: disable=unidiomatic-typecheck
            norm.__class__ = fused_layer_normalization.FusedLayerNormalization  # not built yet; no new state
        if type(self._embedding_dropout) is tf_keras.layers.Dropout:  # pylint: disable=unidiomatic-typecheck
            self._embedding_dropout.__class__ = integer_dropout.IntegerDropout  # only `call` differs; no state


def build_bert_encoder(cfg: config_lib.EncoderConfig, name: str = "bert") -> networks.BertEncoderV2:
    """Builds an (untrained) BertEncoderV2 matching ``cfg``.

    The activation is :func:`activation` of ``cfg.hidden_act``, so imported weights reproduce their outputs;
    layer-norm epsilon is BertEncoderV2's 1e-12, as in BERT.
    """
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(f"encoder.hidden_size={cfg.hidden_size} is not divisible by "
                         f"encoder.num_attention_heads={cfg.num_attention_heads}")
    return BertEncoder(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        max_sequence_length=cfg.max_position_embeddings,
        type_vocab_size=cfg.type_vocab_size,
        inner_dim=cfg.intermediate_size,
        inner_activation=activation(cfg.hidden_act),
        output_dropout=cfg.dropout_rate,
        attention_dropout=cfg.attention_dropout_rate,
        initializer=tf_keras.initializers.TruncatedNormal(stddev=cfg.initializer_range),
        name=name,
    )
