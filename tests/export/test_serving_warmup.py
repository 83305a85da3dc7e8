"""TF Serving warm-up records: the wire format read back by message classes built from TF Serving's .proto
fields (tests/export/serving_protos.py), and the questions chosen. The records of a real export are replayed in
tests/export/test_open_qa_export.py."""
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from realm_tf.export import serving_warmup

sys.path.insert(0, os.path.dirname(__file__))
import serving_protos  # noqa: E402  (next to this file; tests are not a package)


def test_predict_log_reads_back_with_the_serving_protos():
    long_text = "é" * 300  # a payload above 127 bytes: multi-byte length varints
    inputs = {"question": np.asarray(["who wrote it", long_text], dtype=object),
              "k": np.arange(6, dtype=np.int32).reshape(2, 3)}
    signature, decoded = serving_protos.parse_prediction_log(serving_warmup.predict_log(inputs, "serving_default",
                                                                                        "realm"))
    assert signature == "serving_default"
    assert sorted(decoded) == ["k", "question"]
    assert [q.decode() for q in decoded["question"]] == ["who wrote it", long_text]
    np.testing.assert_array_equal(decoded["k"], inputs["k"])


def test_write_warmup_requests_writes_one_per_question_then_a_batch(tmp_path):
    questions = ["what is a", "what is b", "what is c"]
    path = serving_warmup.write_warmup_requests(str(tmp_path), questions)
    assert path == str(tmp_path / "assets.extra" / "tf_serving_warmup_requests")
    records = [serving_protos.parse_prediction_log(r.numpy()) for r in tf.data.TFRecordDataset(path)]
    batches = [[q.decode() for q in inputs["question"]] for _, inputs in records]
    assert batches == [["what is a"], ["what is b"], ["what is c"], questions]
    assert {signature for signature, _ in records} == {"serving_default"}


def test_questions_spread_over_titles_and_the_last_is_too_long():
    np.testing.assert_array_equal(serving_warmup.spread(100, 5), [0, 24, 49, 74, 99])
    np.testing.assert_array_equal(serving_warmup.spread(3, 8), [0, 1, 2])
    assert serving_warmup.spread(10, 0).size == 0
    questions = serving_warmup.warmup_questions(["Paris", "Kenya", "Mars"], max_words=64)
    assert questions[:2] == ["what is Paris", "what is Kenya"]
    assert len(questions[2].split()) > 64 and questions[2].endswith("Mars")
    assert serving_warmup.warmup_questions([], 64) == []


def test_records_read_back_as_the_reference_parser_reads_them(tmp_path):
    questions = ["what is a", "é" * 200, "what is c"]
    path = serving_warmup.write_warmup_requests(str(tmp_path), questions)
    ours = serving_warmup.read_warmup_requests(str(tmp_path))
    reference = [serving_protos.parse_prediction_log(r.numpy()) for r in tf.data.TFRecordDataset(path)]
    assert len(ours) == len(reference) == 4
    for (signature, inputs), (ref_signature, ref_inputs) in zip(ours, reference):
        assert signature == ref_signature and sorted(inputs) == sorted(ref_inputs)
        np.testing.assert_array_equal(inputs["question"], ref_inputs["question"])
    assert serving_warmup.read_warmup_requests(str(tmp_path / "elsewhere")) == []


def test_a_damaged_record_names_the_file_and_record(tmp_path):
    good = serving_warmup.predict_log({"question": np.asarray(["q"], dtype=object)}, "serving_default")
    path = tmp_path / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir()
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(good)
        writer.write(good[:-3])  # cut inside the tensor
    with pytest.raises(ValueError, match=r"tf_serving_warmup_requests: record 1"):
        serving_warmup.read_warmup_requests(str(tmp_path))
