"""TF Serving's SavedModel warm-up records for the Open-QA export.

TF Serving replays ``assets.extra/tf_serving_warmup_requests`` when it loads a version, before the version takes
traffic (https://www.tensorflow.org/tfx/serving/saved_model_warmup): a TFRecord file of
``tensorflow.serving.PredictionLog`` protos. The first requests of a fresh server then find the graph's
functions initialised and, with ``model.compiled_inference``, its XLA programs compiled.

The records are TF Serving's own messages (``tensorflow-serving-api``: ``PredictionLog`` → ``PredictLog`` →
``PredictRequest`` with a ``ModelSpec`` and TensorProto inputs). :func:`read_warmup_requests` reads them back, for
a Python server (``Answerer.warm_up``) to replay them as TF Serving does.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from google.protobuf import message
from tensorflow_serving.apis import model_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2

#: Where TF Serving looks for the records, relative to a SavedModel version directory.
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
#: The Open-QA export's signature that takes a confidence threshold beside the question (its warm-up requests
#: carry one; ``serving_default`` answers without).
SELECTIVE_SIGNATURE = "answer_selectively"


def parse_predict_log(serialized: bytes) -> tuple[str, dict[str, np.ndarray]] | None:
    """``(signature_name, {input: array})`` of a serialized ``PredictionLog``; None when it holds no
    ``predict_log`` (TF Serving's other request kinds). A malformed record raises ``message.DecodeError``."""
    log = prediction_log_pb2.PredictionLog.FromString(serialized)
    if log.WhichOneof("log_type") != "predict_log":
        return None
    request = log.predict_log.request
    signature = request.model_spec.signature_name or "serving_default"
    return signature, {name: tf.make_ndarray(tensor) for name, tensor in request.inputs.items()}


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
    request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name=model_name,
                                                                        signature_name=signature_name))
    for name in sorted(inputs):
        request.inputs[name].CopyFrom(tf.make_tensor_proto(inputs[name]))
    log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
    return log.SerializeToString(deterministic=True)


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
                          input_name: str = "question",
                          extra: Mapping[str, Callable[[list[str]], Mapping[str, np.ndarray]]] | None = None) -> str:
    """Writes the requests of :func:`warmup_batches` to ``<export_dir>/assets.extra/tf_serving_warmup_requests``,
    for ``signature_name``, then for each signature of ``extra``, whose function gives a batch's other inputs.
    Call it on the staging directory of an export, so that the records appear with the version. Returns the
    file's path."""
    path = os.path.join(export_dir, WARMUP_FILE)
    tf.io.gfile.makedirs(os.path.dirname(path))
    signatures = {signature_name: lambda batch: {}, **(extra or {})}
    with tf.io.TFRecordWriter(path) as writer:
        for name, other_inputs in signatures.items():
            for batch in warmup_batches(questions):
                inputs = {input_name: np.asarray(batch, dtype=object), **other_inputs(batch)}
                writer.write(predict_log(inputs, name))
    return path
