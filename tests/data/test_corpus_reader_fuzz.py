"""A property-based fuzzer (hypothesis) of the corpus readers: whatever bytes a file holds, every line or record
becomes a document or a dead letter with a known reason, never an exception, and none is dropped."""
import io
import json
import struct

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from realm_tf.data import corpus_reader

LINES = st.one_of(
    st.binary(max_size=200),  # anything, invalid UTF-8 included
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.fixed_dictionaries({"id": st.one_of(st.text(max_size=10), st.integers(), st.none(), st.lists(st.integers())),
                           "title": st.one_of(st.text(max_size=30), st.integers(), st.none()),
                           "text": st.one_of(st.text(max_size=100), st.floats(), st.none(), st.booleans())})
    .map(lambda d: json.dumps(d).encode()),
    st.lists(st.text(alphabet=st.characters(blacklist_characters="\t\n\r"), max_size=20), max_size=4)
    .map(lambda fields: "\t".join(fields).encode("utf-8", "surrogatepass")),
)


def _check(records, expected_count):
    count = 0
    for record in records:
        count += 1
        parsed = corpus_reader.parse_record(record)
        if isinstance(parsed, corpus_reader.DeadLetter):
            assert parsed.reason in corpus_reader.REASONS and parsed.line == record.line
            json.loads(parsed.to_json())  # the dead-letter line is valid JSON whatever the input was
        else:
            assert isinstance(parsed, corpus_reader.Document) and parsed.text == parsed.text.strip()
            assert corpus_reader.has_visible_text(parsed.text)
    assert expected_count is None or count == expected_count


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(LINES.filter(lambda b: b"\n" not in b and b"\r" not in b), max_size=12),
       fmt=st.sampled_from([corpus_reader.JSONL, corpus_reader.TSV]))
def test_every_line_is_a_document_or_a_dead_letter(lines, fmt):
    stream = io.BytesIO(b"\n".join(lines) + (b"\n" if lines else b""))
    _check(corpus_reader.iter_records(stream, f"fuzz.{fmt}", fmt), len(lines))


@settings(max_examples=100, deadline=None)
@given(payloads=st.lists(st.binary(max_size=100), max_size=5), tail=st.binary(max_size=30),
       flip=st.integers(min_value=0, max_value=10_000))
def test_a_damaged_tfrecord_file_ends_in_a_dead_letter_not_an_exception(payloads, tail, flip):
    framed = b"".join(struct.pack("<Q", len(p)) + b"\0" * 4 + p + b"\0" * 4 for p in payloads) + tail
    if framed:
        data = bytearray(framed)
        data[flip % len(data)] ^= 0x41  # one damaged byte somewhere (a length, a CRC or the payload)
        framed = bytes(data)
    _check(corpus_reader.iter_records(io.BytesIO(framed), "fuzz.tfrecord", corpus_reader.TFRECORD), None)
