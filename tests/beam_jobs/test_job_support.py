"""Beam job support: protobuf record parsing and Beam counters."""
import apache_beam as beam
import tensorflow as tf
from apache_beam.testing import test_pipeline

from beam_jobs import job_support
from realm_tf.data import example_schemas as es


def test_counters_are_read_back_by_name():
    p = test_pipeline.TestPipeline()
    _ = (p | beam.Create([1, 2, 3]) | beam.Map(lambda x: job_support.count("test", "items", x))
         | beam.Map(lambda _: job_support.count("test", "zero", 0)))
    result = p.run()
    result.wait_until_finish()
    assert job_support.read_counters(result, "test") == {"items": 6}


def test_parse_example_follows_the_schema():
    record = es.to_example({es.QUERY_TEXT: "héllo", es.QUERY_IDS: [1, 2], es.MASK_POSITIONS: [1],
                            es.TARGET_IDS: [2], es.SOURCE_UID: b"abc", es.SOURCE_BLOCK_ID: 4,
                            es.MASKING: b"salient"})
    row = job_support.parse_example(record, es.pretraining_feature_spec())
    assert row == {es.QUERY_TEXT: "héllo".encode(), es.QUERY_IDS: [1, 2], es.MASK_POSITIONS: [1],
                   es.TARGET_IDS: [2], es.SOURCE_UID: b"abc", es.SOURCE_BLOCK_ID: 4, es.MASKING: b"salient",
                   es.SPAN_LABEL: b""}  # the schema's default for an absent span label
    parsed = tf.io.parse_example(tf.constant([record]), es.pretraining_feature_spec())
    assert parsed[es.QUERY_IDS][0].numpy().tolist() == row[es.QUERY_IDS]
