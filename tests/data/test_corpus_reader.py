"""Corpus reading without Beam: formats, line numbers, dead-letter reasons, TFRecord framing, CSV quoting."""
import io
import json
import os
import struct
import tempfile

import pytest
import tensorflow as tf

from realm_tf.data import corpus_reader
from realm_tf.data import example_schemas


def _records(data: bytes, fmt: str, path: str = "f"):
    return list(corpus_reader.iter_records(io.BytesIO(data), path, fmt))


def _parse(line: bytes, fmt: str = corpus_reader.JSONL):
    return corpus_reader.parse_record(corpus_reader.RawRecord("f", 7, line, fmt))


@pytest.mark.parametrize("path, fmt", [
    ("a/b.jsonl", "jsonl"), ("gs://b/x.JSONL.gz", "jsonl"), ("p.json.bz2", "jsonl"), ("psgs_w100.tsv", "tsv"),
    ("x.tsv.gz", "tsv"), ("wiki-00001.tfrecord", "tfrecord"), ("w.tfrecord.gz", "tfrecord"),
])
def test_detect_format_from_extension(path, fmt):
    assert corpus_reader.detect_format(path) == fmt
    assert corpus_reader.detect_format("anything.bin", fmt) == fmt


def test_detect_format_unknown_extension_names_the_file():
    with pytest.raises(ValueError, match="corpus.txt.*--format"):
        corpus_reader.detect_format("corpus.txt")
    with pytest.raises(ValueError, match="unknown input format"):
        corpus_reader.detect_format("x.jsonl", "csv")


def test_lines_keep_numbers_crlf_and_last_line_without_newline():
    records = _records(b"a\r\nb\n\nc", "jsonl")
    assert [(r.line, r.data) for r in records] == [(1, b"a"), (2, b"b"), (3, b""), (4, b"c")]
    assert _records(b"", "jsonl") == []
    big = b"x" * (3 << 20)  # longer than the read chunk
    assert [r.data for r in _records(big + b"\ny\n", "jsonl")] == [big, b"y"]


def test_tsv_header_only_on_first_line():
    records = _records(b"id\ttext\ttitle\n1\tbody\tT\nid\ttext\ttitle\n", "tsv")
    assert [r.is_header for r in records] == [True, False, False]
    assert not _records(b"1\tbody\tT\n", "tsv")[0].is_header


def test_json_documents_ids_and_content_hash():
    doc = _parse(json.dumps({"id": 12, "title": " T ", "text": " Body text. "}).encode())
    assert isinstance(doc, corpus_reader.Document)
    assert (doc.doc_id, doc.title, doc.text, doc.file, doc.line) == ("12", "T", "Body text.", "f", 7)
    assert doc.content_hash == example_schemas.block_uid("T", "Body text.")
    no_id = _parse(b'{"title": "T", "text": "Body text."}')
    assert no_id.doc_id == no_id.content_hash == doc.content_hash


@pytest.mark.parametrize("line, reason", [
    (b'{"title": "T", "text": "x"', corpus_reader.MALFORMED_JSON),
    (b'["T", "x"]', corpus_reader.WRONG_TYPE),
    (b'{"text": "x"}', corpus_reader.MISSING_FIELD),
    (b'{"title": "T"}', corpus_reader.MISSING_FIELD),
    (b'{"title": "T", "text": null}', corpus_reader.MISSING_FIELD),
    (b'{"title": "", "text": "x"}', corpus_reader.EMPTY_FIELD),
    (b'{"title": "T", "text": " \\u200b\\t "}', corpus_reader.EMPTY_FIELD),
    (b'{"title": 5, "text": "x"}', corpus_reader.WRONG_TYPE),
    (b'{"title": "T", "text": ["x"]}', corpus_reader.WRONG_TYPE),
    (b'{"id": 1.5, "title": "T", "text": "x"}', corpus_reader.WRONG_TYPE),
    (b'{"id": true, "title": "T", "text": "x"}', corpus_reader.WRONG_TYPE),
    (b'{"title": "T", "text": "bad \\ud800 escape"}', corpus_reader.NON_UTF8),
    (b'{"title": "T", "text": "caf\xe9"}', corpus_reader.NON_UTF8),
    (b"   ", corpus_reader.BLANK_LINE),
])
def test_json_dead_letters(line, reason):
    dead = _parse(line)
    assert isinstance(dead, corpus_reader.DeadLetter), dead
    assert (dead.reason, dead.file, dead.line) == (reason, "f", 7)
    assert dead.detail
    assert dead.text == line.decode("utf-8", "backslashreplace")
    json.loads(dead.to_json())  # always valid JSON, even for undecodable input


def test_non_utf8_text_is_escaped_in_dead_letter():
    dead = _parse(b'{"title": "T", "text": "caf\xe9"}')
    assert "\\xe9" in dead.text and json.loads(dead.to_json())["text"].endswith('caf\\xe9"}')


def test_tsv_dpr_style_with_quotes_and_errors():
    doc = _parse(b'17\t"He said ""hi"" twice."\tGreeting', corpus_reader.TSV)
    assert (doc.doc_id, doc.title, doc.text) == ("17", "Greeting", 'He said "hi" twice.')
    assert _parse(b"\tbody\tTitle", corpus_reader.TSV).doc_id == example_schemas.block_uid("Title", "body")
    for line, reason in [(b"1\tonly two", corpus_reader.MALFORMED_TSV),
                         (b"1\ta\tb\tc", corpus_reader.MALFORMED_TSV),
                         (b'1\t"unclosed\tT', corpus_reader.MALFORMED_TSV),
                         (b"1\tbody\t ", corpus_reader.EMPTY_FIELD),
                         (b"1\t\xff\tT", corpus_reader.NON_UTF8)]:
        dead = _parse(line, corpus_reader.TSV)
        assert isinstance(dead, corpus_reader.DeadLetter) and dead.reason == reason, (line, dead)


def _example(**features) -> bytes:
    feature = {}
    for key, value in features.items():
        if isinstance(value, int):
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        else:
            values = value if isinstance(value, list) else [value]
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _tfrecord_file(records) -> bytes:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "records.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for record in records:
                writer.write(record)
        with open(path, "rb") as f:
            return f.read()


def test_tfrecord_examples_and_field_errors():
    records = [_example(id=b"a", title=b"T", text=b"Body."), _example(id=3, title=b"T", text=b"Other."),
               b"\xff\xff not a proto", _example(title=5, text=b"x"), _example(title=b"T"),
               _example(title=b"T", text=[b"a", b"b"]), _example(title=b"T", text=b"\xff")]
    parsed = [corpus_reader.parse_record(r) for r in _records(_tfrecord_file(records), "tfrecord")]
    assert [p.doc_id for p in parsed[:2]] == ["a", "3"]
    assert [(p.line, p.reason) for p in parsed[2:]] == [
        (3, corpus_reader.UNPARSABLE_RECORD), (4, corpus_reader.WRONG_TYPE), (5, corpus_reader.MISSING_FIELD),
        (6, corpus_reader.WRONG_TYPE), (7, corpus_reader.NON_UTF8)]


def test_tfrecord_framing_errors_end_the_file_with_one_dead_letter():
    good = _tfrecord_file([_example(title=b"T", text=b"Body."), _example(title=b"U", text=b"More.")])
    truncated = _records(good[:-7], "tfrecord")
    assert [r.framing_error == "" for r in truncated] == [True, False]
    dead = corpus_reader.parse_record(truncated[1])
    assert (dead.line, dead.reason) == (2, corpus_reader.CORRUPT_TFRECORD) and "ends inside" in dead.detail
    length = struct.unpack("<Q", good[:8])[0]
    bad_length = struct.pack("<Q", length + 1) + good[8:]  # length no longer matches its checksum
    records = _records(bad_length, "tfrecord")
    assert len(records) == 1 and "checksum" in records[0].framing_error
    assert records[0].data == bad_length  # the unread rest of the file is kept in the dead letter
