"""The BERT encoder used by every REALM tower (Guu et al., 2020, §3.2; Devlin et al., 2019).

REALM's knowledge retriever (Embed_input, Embed_doc) and knowledge-augmented encoder are each a BERT; here
each is tf-models' :class:`official.nlp.modeling.networks.BertEncoderV2`, configured from
:class:`realm_tf.config.EncoderConfig`.
"""
from __future__ import annotations

from official.nlp.modeling import networks
import tf_keras

from realm_tf import config as config_lib

#: The packed inputs every BERT here takes, each ``int32[batch, seq_len]``.
INPUT_KEYS = ("input_word_ids", "input_mask", "input_type_ids")


def build_bert_encoder(cfg: config_lib.EncoderConfig, name: str = "bert") -> networks.BertEncoderV2:
    """Builds an (untrained) BertEncoderV2 matching ``cfg``.

    The activation is the exact (erf) GELU of the original BERT and of Hugging Face checkpoints, so imported
    weights reproduce their outputs; layer-norm epsilon is BertEncoderV2's 1e-12, as in BERT.
    """
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(f"encoder.hidden_size={cfg.hidden_size} is not divisible by "
                         f"encoder.num_attention_heads={cfg.num_attention_heads}")
    activations = {"gelu": "gelu", "gelu_new": "gelu_approximate", "relu": "relu"}
    if cfg.hidden_act not in activations:
        raise ValueError(f"encoder.hidden_act={cfg.hidden_act!r}: expected one of {sorted(activations)}")
    activation = activations[cfg.hidden_act]
    if activation == "gelu_approximate":
        activation = lambda x: tf_keras.activations.gelu(x, approximate=True)  # noqa: E731
    return networks.BertEncoderV2(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        max_sequence_length=cfg.max_position_embeddings,
        type_vocab_size=cfg.type_vocab_size,
        inner_dim=cfg.intermediate_size,
        inner_activation=activation,
        output_dropout=cfg.dropout_rate,
        attention_dropout=cfg.attention_dropout_rate,
        initializer=tf_keras.initializers.TruncatedNormal(stddev=cfg.initializer_range),
        name=name,
    )
