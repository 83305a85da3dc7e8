"""TF Serving's SavedModel warm-up records for the Open-QA export (issue #20: serving latency).

TF Serving replays ``assets.extra/tf_serving_warmup_requests`` when it loads a version, before the version takes
traffic (https://www.tensorflow.org/tfx/serving/saved_model_warmup): a TFRecord file of
``tensorflow.serving.PredictionLog`` protos. The first requests of a fresh server then find the graph's
functions initialised and, with ``model.compiled_inference``, its XLA programs compiled (about a second each for
MiniLM, measured in benchmarks/RESULTS.md: p99 1,160 ms with a cold cache against 347 ms warm).

tensorflow-serving-api is not in this project's stack. The records are therefore written here with protobuf's
wire format from the field numbers of ``tensorflow_serving/apis/{prediction_log,predict,model}.proto``:
PredictionLog.predict_log = 6, PredictLog.request = 1, PredictRequest.model_spec = 1,
PredictRequest.inputs = 2 (map<string, TensorProto>: entries of key = 1, value = 2), ModelSpec.name = 1,
ModelSpec.signature_name = 3. The TensorProto values are TensorFlow's own serialization.
tests/serving/test_serving_warmup.py parses the file with a descriptor built from those .proto definitions.
:func:`read_warmup_requests` reads them back, for a Python server (``Answerer.warm_up``) to replay them as TF
Serving does.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf
from google.protobuf import message
from tensorflow.core.framework import tensor_pb2

#: Where TF Serving looks for the records, relative to a SavedModel version directory.
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field (a string, bytes or an embedded message)."""
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _fields(data: bytes) -> list[tuple[int, bytes]]:
    """The length-delimited fields of one message, ``[(number, payload)]``; other wire types are skipped."""
    fields, pos = [], 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == _LENGTH_DELIMITED:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise ValueError(f"field {number}: {size} bytes past the end of the message")
            fields.append((number, data[pos:pos + size]))
            pos += size
        elif wire_type == _VARINT:
            _, pos = _read_varint(data, pos)
        elif wire_type in (_FIXED64, _FIXED32):
            pos += 8 if wire_type == _FIXED64 else 4
            if pos > len(data):
                raise ValueError(f"field {number}: fixed-width value past the end of the message")
        else:
            raise ValueError(f"field {number}: unsupported wire type {wire_type}")
    return fields


def parse_predict_log(serialized: bytes) -> tuple[str, dict[str, np.ndarray]] | None:
    """``(signature_name, {input: array})`` of a serialized ``PredictionLog``; None when it holds no
    ``predict_log`` (TF Serving's other request kinds)."""
    logs = [payload for number, payload in _fields(serialized) if number == 6]
    if not logs:
        return None
    requests = [payload for number, payload in _fields(logs[-1]) if number == 1]
    signature, inputs = "serving_default", {}
    for number, payload in _fields(requests[-1] if requests else b""):
        if number == 1:
            names = [p for n, p in _fields(payload) if n == 3]
            signature = names[-1].decode() if names and names[-1] else signature
        elif number == 2:
            entry = dict(_fields(payload))
            inputs[entry.get(1, b"").decode()] = tf.make_ndarray(
                tensor_pb2.TensorProto.FromString(entry.get(2, b"")))
    return signature, inputs


def read_warmup_requests(export_dir: str) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The predict requests of ``<export_dir>/assets.extra/tf_serving_warmup_requests`` ([] without the file)."""
    path = os.path.join(export_dir, WARMUP_FILE)
    if not tf.io.gfile.exists(path):
        return []
    requests = []
    for index, record in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator()):
        try:
            parsed = parse_predict_log(record)
        except (ValueError, message.DecodeError) as e:
            raise ValueError(f"{path}: record {index}: not a PredictionLog ({e})") from e
        if parsed is not None:
            requests.append(parsed)
    return requests


def predict_log(inputs: Mapping[str, np.ndarray], signature_name: str, model_name: str = "") -> bytes:
    """A serialized ``PredictionLog`` holding ``PredictRequest(model_spec, inputs)``.

    Args:
      inputs: the signature's input names and their values (any array ``tf.make_tensor_proto`` accepts).
      signature_name: the SavedModel signature the request calls.
      model_name: ``ModelSpec.name``; TF Serving's warm-up ignores it (the version being loaded is warmed).
    """
    spec = (_field(1, model_name.encode()) if model_name else b"") + _field(3, signature_name.encode())
    request = _field(1, spec)
    for name in sorted(inputs):
        tensor = tf.make_tensor_proto(inputs[name]).SerializeToString()
        request += _field(2, _field(1, name.encode()) + _field(2, tensor))
    return _field(6, _field(1, request))


def spread(total: int, count: int) -> np.ndarray:
    """``min(count, total)`` row indices spread evenly over ``range(total)``, first and last included."""
    return np.unique(np.linspace(0, total - 1, num=max(min(count, total), 0), dtype=np.int64))


def warmup_questions(titles: Sequence[str], max_words: int) -> list[str]:
    """One question about each title. The last one is longer than ``max_words`` words (pass the question
    length in wordpieces), so that the truncation to the question length is warmed too."""
    questions = [f"what is {title}" for title in titles]
    if questions:
        word = questions[-1].split()[-1]
        questions[-1] = " ".join(["what is", *([word] * max_words)])
    return questions


def warmup_batches(questions: Sequence[str]) -> list[list[str]]:
    """The requests made of ``questions``: one batch-1 request each, then one with all of them (a batched call)."""
    return [[q] for q in questions] + ([list(questions)] if len(questions) > 1 else [])


def write_warmup_requests(export_dir: str, questions: Sequence[str], signature_name: str = "serving_default",
                          input_name: str = "question") -> str:
    """Writes the requests of :func:`warmup_batches` to ``<export_dir>/assets.extra/tf_serving_warmup_requests``.
    Call it on the staging directory of an export, so that the records appear with the version. Returns the
    file's path."""
    path = os.path.join(export_dir, WARMUP_FILE)
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for batch in warmup_batches(questions):
            writer.write(predict_log({input_name: np.asarray(batch, dtype=object)}, signature_name))
    return path
