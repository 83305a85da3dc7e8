"""Reading a raw text corpus into documents, or into dead letters that say why a line is not one.

REALM's knowledge corpus Z is Wikipedia cut into blocks (Guu et al., 2020, §4.1 "Knowledge corpus"); this
module holds the part of ``beam_jobs/preprocess_corpus`` that needs no Beam, so that the trainer and tools
read corpora with the same rules. Three input formats:

* ``jsonl``: one JSON object a line, ``{"title": str, "text": str}`` and an optional ``"id"`` (str or int);
* ``tsv``: DPR style ``id<TAB>text<TAB>title``, a first line ``id<TAB>text<TAB>title`` is a header; fields
  may be CSV-quoted (``"a ""quoted"" word"``) as in DPR's ``psgs_w100.tsv``;
* ``tfrecord``: ``tf.train.Example`` records with bytes features ``title``, ``text`` and an optional ``id``
  (bytes or int64).

Files are read as BYTES through Beam's ``FileSystems`` (local paths, gs://, ...; gzip/bzip2 chosen by the
file extension), so that a line that is not UTF-8 is reported, not lost. Every line (or TFRecord record)
becomes a :class:`RawRecord` carrying its file and 1-based line number, then either a :class:`Document`
or a :class:`DeadLetter` with one of the ``REASONS``; nothing is dropped silently.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import struct
import unicodedata
from typing import BinaryIO, Iterator

import google_crc32c

from realm_tf.data import example_schemas

AUTO = "auto"
JSONL = "jsonl"
TSV = "tsv"
TFRECORD = "tfrecord"
FORMATS = (JSONL, TSV, TFRECORD)

# ---- dead-letter reasons (also the Beam counter suffixes and the keys of manifest["dead_letters"]) ------
NON_UTF8 = "non_utf8"  # bytes that are not UTF-8 (or a JSON "\ud800" escape that is not a character)
MALFORMED_JSON = "malformed_json"  # JSONL line that json.loads rejects
MALFORMED_TSV = "malformed_tsv"  # TSV line without exactly 3 columns, or with broken quoting
UNPARSABLE_RECORD = "unparsable_record"  # TFRecord record that is not a tf.train.Example
CORRUPT_TFRECORD = "corrupt_tfrecord"  # TFRecord framing broken (truncated file, bad length checksum)
BLANK_LINE = "blank_line"  # an empty (or whitespace-only) line inside a JSONL / TSV file
MISSING_FIELD = "missing_field"  # no title or no text
EMPTY_FIELD = "empty_field"  # title or text with no visible character
WRONG_TYPE = "wrong_type"  # JSON line not an object, title/text not strings, id not str/int, ...
NO_WORDPIECES = "no_wordpieces"  # body has characters but the tokenizer makes no wordpiece of them
REASONS = (NON_UTF8, MALFORMED_JSON, MALFORMED_TSV, UNPARSABLE_RECORD, CORRUPT_TFRECORD, BLANK_LINE,
           MISSING_FIELD, EMPTY_FIELD, WRONG_TYPE, NO_WORDPIECES)

TSV_HEADER = ("id", "text", "title")
_COMPRESSED = (".gz", ".gzip", ".bz2", ".deflate", ".zst", ".zstd", ".lzma", ".xz")
_EXTENSIONS = {".jsonl": JSONL, ".json": JSONL, ".ndjson": JSONL, ".tsv": TSV,
               ".tfrecord": TFRECORD, ".tfrecords": TFRECORD, ".tfr": TFRECORD}
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class RawRecord:
    """One input line (JSONL, TSV) or record (TFRecord), as bytes, with where it came from.

    Attributes:
      file: the path it was read from.
      line: 1-based line number (record number for TFRecord).
      data: the line without its ``\\n`` / ``\\r\\n``; the record payload for TFRecord.
      fmt: one of ``FORMATS``.
      is_header: a TSV header line (not a document; counted apart).
      framing_error: for TFRecord, why the file could not be read on from here ("" when fine).
    """

    file: str
    line: int
    data: bytes
    fmt: str
    is_header: bool = False
    framing_error: str = ""


@dataclasses.dataclass(frozen=True)
class Document:
    """A parsed input document: ``title`` and body ``text`` (stripped of surrounding whitespace).

    Attributes:
      doc_id: the input's ``id``, or ``content_hash`` when it has none.
      content_hash: ``example_schemas.block_uid(title, text)``: SHA1 identity used to merge duplicates.
      duplicates: how many other input lines with the same content were merged into this one.
    """

    doc_id: str
    title: str
    text: str
    file: str
    line: int
    content_hash: str
    duplicates: int = 0

    @property
    def source_lines(self) -> int:
        """Input lines this document stands for (itself and its merged duplicates)."""
        return 1 + self.duplicates


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """An input line that produced no block, and why.

    Attributes:
      reason: one of ``REASONS``.
      detail: a human-readable explanation (e.g. the JSON error and its column).
      text: the line as text, undecodable bytes escaped (``\\xff``).
      duplicates: lines with the same content merged into this one before it was rejected.
    """

    file: str
    line: int
    reason: str
    detail: str
    text: str
    duplicates: int = 0

    def to_json(self) -> str:
        """One line of ``dead_letter-*.jsonl``."""
        record = {"file": self.file, "line": self.line, "reason": self.reason, "detail": self.detail,
                  "text": self.text}
        if self.duplicates:
            record["duplicates_merged"] = self.duplicates
        return json.dumps(record, ensure_ascii=False)


def detect_format(path: str, fmt: str = AUTO) -> str:
    """The input format of ``path``: ``fmt`` itself unless it is ``auto``, else from the file extension.

    Raises:
      ValueError: naming the file when the extension says nothing (pass ``--format``).
    """
    if fmt != AUTO:
        if fmt not in FORMATS:
            raise ValueError(f"unknown input format {fmt!r} (one of {', '.join((AUTO,) + FORMATS)})")
        return fmt
    name = path.lower()
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            name = name[:-len(suffix)]
            break
    for extension, found in _EXTENSIONS.items():
        if name.endswith(extension):
            return found
    raise ValueError(f"{path}: cannot tell the input format from the extension "
                     f"(expected {', '.join(sorted(_EXTENSIONS))}, optionally compressed); pass --format")


def iter_records(stream: BinaryIO, path: str, fmt: str) -> Iterator[RawRecord]:
    """Yields every line (``jsonl`` / ``tsv``) or record (``tfrecord``) of an opened, decompressed file."""
    if fmt == TFRECORD:
        yield from _iter_tfrecords(stream, path)
        return
    for number, line in enumerate(_iter_lines(stream), start=1):
        header = fmt == TSV and number == 1 and is_tsv_header(line)
        yield RawRecord(path, number, line, fmt, is_header=header)


def is_tsv_header(line: bytes) -> bool:
    """Whether a TSV line is DPR's ``id<TAB>text<TAB>title`` header."""
    return tuple(f.strip().lower() for f in line.split(b"\t")) == tuple(f.encode() for f in TSV_HEADER)


def parse_record(record: RawRecord) -> Document | DeadLetter:
    """Turns one input line into a :class:`Document`, or a :class:`DeadLetter` saying what is wrong."""
    if record.framing_error:
        return _dead(record, CORRUPT_TFRECORD, record.framing_error)
    if record.fmt == TFRECORD:
        return _parse_example(record)
    try:
        line = record.data.decode("utf-8")
    except UnicodeDecodeError as e:
        return _dead(record, NON_UTF8, f"byte {e.start}: {e.reason}")
    if not line.strip():
        return _dead(record, BLANK_LINE, "empty line")
    if record.fmt == JSONL:
        return _parse_json(record, line)
    if record.fmt == TSV:
        return _parse_tsv(record, line)
    raise ValueError(f"unknown input format {record.fmt!r}")


def has_visible_text(text: str) -> bool:
    """Whether ``text`` has a character BERT's tokenizer keeps (not whitespace, control or format)."""
    return any(not ch.isspace() and not unicodedata.category(ch).startswith("C") and ch != "\ufffd"
               for ch in text)


def escape(data: bytes) -> str:
    """Bytes as text for a dead letter: UTF-8 where valid, ``\\xNN`` for every other byte."""
    return data.decode("utf-8", "backslashreplace")


# ----------------------------------------------------------------------------------------------------------
# Implementation.


def _dead(record: RawRecord, reason: str, detail: str) -> DeadLetter:
    return DeadLetter(record.file, record.line, reason, detail, escape(record.data))


def _make_document(record: RawRecord, title: object, text: object, doc_id: object) -> Document | DeadLetter:
    """Checks the three fields (already extracted from the line) and builds the Document."""
    for name, value in (("title", title), ("text", text)):
        if value is None:
            return _dead(record, MISSING_FIELD, f"no '{name}' field")
        if not isinstance(value, str):
            return _dead(record, WRONG_TYPE, f"'{name}' is {type(value).__name__}, expected a string")
        if not has_visible_text(value):
            return _dead(record, EMPTY_FIELD, f"'{name}' is empty or only whitespace/control characters")
    if doc_id is not None and (isinstance(doc_id, bool) or not isinstance(doc_id, (str, int))):
        return _dead(record, WRONG_TYPE, f"'id' is {type(doc_id).__name__}, expected a string or an integer")
    assert isinstance(title, str) and isinstance(text, str)
    title, text = title.strip(), text.strip()
    for name, value in (("title", title), ("text", text), ("id", doc_id)):
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:  # a JSON "\ud800" escape: a lone surrogate, not a character
                return _dead(record, NON_UTF8, f"'{name}' has a lone surrogate at character {e.start}")
    content_hash = example_schemas.block_uid(title, text)
    doc_id = str(doc_id) if doc_id is not None and doc_id != "" else content_hash
    return Document(doc_id, title, text, record.file, record.line, content_hash)


def _parse_json(record: RawRecord, line: str) -> Document | DeadLetter:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        return _dead(record, MALFORMED_JSON, f"{e.msg} at column {e.colno}")
    except RecursionError:
        return _dead(record, MALFORMED_JSON, "nested too deeply")
    if not isinstance(value, dict):
        return _dead(record, WRONG_TYPE, f"line is a JSON {type(value).__name__}, expected an object")
    return _make_document(record, value.get("title"), value.get("text"), value.get("id"))


def _parse_tsv(record: RawRecord, line: str) -> Document | DeadLetter:
    try:
        rows = list(csv.reader([line], delimiter="\t", strict=True))
    except csv.Error as e:
        return _dead(record, MALFORMED_TSV, f"bad quoting: {e}")
    fields = rows[0] if rows else []
    if len(fields) != 3:
        return _dead(record, MALFORMED_TSV, f"{len(fields)} tab-separated columns, expected 3 (id, text, title)")
    doc_id, text, title = fields
    return _make_document(record, title, text, doc_id.strip() or None)


def _parse_example(record: RawRecord) -> Document | DeadLetter:
    from google.protobuf import message  # pylint: disable=import-outside-toplevel
    from tensorflow.core.example import example_pb2  # pylint: disable=import-outside-toplevel

    try:
        example = example_pb2.Example.FromString(record.data)
    except message.DecodeError as e:
        return _dead(record, UNPARSABLE_RECORD, f"not a tf.train.Example: {e}")
    features = example.features.feature
    values: dict[str, object] = {}
    for name in ("title", "text", "id"):
        if name not in features:
            values[name] = None
            continue
        feature = features[name]
        kind = feature.WhichOneof("kind")
        items = list(getattr(feature, kind).value) if kind else []
        if len(items) != 1 or (kind == "int64_list" and name != "id") or kind == "float_list":
            return _dead(record, WRONG_TYPE, f"feature '{name}' is {kind or 'empty'} with {len(items)} values, "
                                             f"expected one {'bytes or int64' if name == 'id' else 'bytes'} value")
        item = items[0]
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError as e:
                return _dead(record, NON_UTF8, f"feature '{name}' byte {e.start}: {e.reason}")
        values[name] = item
    return _make_document(record, values["title"], values["text"], values["id"])


def _iter_lines(stream: BinaryIO) -> Iterator[bytes]:
    """Lines of a binary stream without their ``\\n`` (and ``\\r``); a last line without ``\\n`` counts."""
    pending = b""
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        pending += chunk
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            yield line[:-1] if line.endswith(b"\r") else line
    if pending:
        yield pending[:-1] if pending.endswith(b"\r") else pending


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    parts, left = [], n
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _iter_tfrecords(stream: BinaryIO, path: str) -> Iterator[RawRecord]:
    """TFRecord framing: ``uint64 length, uint32 masked_crc32c(length), data, uint32 masked_crc32c(data)``.

    The length checksum is verified (a wrong length would misframe the rest of the file); the data
    checksum is not checked here: a damaged payload shows up as an unparsable record.
    A framing error ends the file with one ``corrupt_tfrecord`` record holding the remaining bytes.
    """
    number = 0
    while True:
        header = _read_exact(stream, 12)
        if not header:
            return
        number += 1
        error = ""
        if len(header) < 12:
            error = f"file ends inside a record header ({len(header)} of 12 bytes)"
        else:
            length, length_crc = struct.unpack("<QI", header)
            if _masked_crc32c(header[:8]) != length_crc:
                error = "record length checksum mismatch"
            else:
                data = _read_exact(stream, length)
                footer = _read_exact(stream, 4)
                if len(data) < length or len(footer) < 4:
                    error = f"file ends inside a record ({len(data)} of {length} bytes)"
                    header += data + footer
                else:
                    yield RawRecord(path, number, data, TFRECORD)
                    continue
        rest = header + stream.read()
        yield RawRecord(path, number, rest, TFRECORD, framing_error=error)
        return


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C (Castagnoli), with the google-crc32c C implementation."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
