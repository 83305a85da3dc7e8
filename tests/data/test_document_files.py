"""Documents a user brings to be scored: JSONL or plain text, with file:line errors."""
import gzip
import json

import pytest

from realm_tf import errors
from realm_tf.data import document_files


def test_plain_text_documents_are_separated_by_blank_lines(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("First line of one.\nIts second line.\n\n\n  Another document.  \n")
    documents = document_files.read_documents(str(path))
    assert [(d.id, d.text) for d in documents] == [(f"{path}:1", "First line of one. Its second line."),
                                                   (f"{path}:5", "Another document.")]


def test_jsonl_documents_keep_their_ids_and_titles_gzip_too(tmp_path):
    rows = [{"id": 7, "title": "Paris", "text": "Paris is large."}, {"text": "No id here."}]
    path = tmp_path / "mine.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    documents = document_files.read_documents(str(path))
    assert documents == [document_files.Document("7", "Paris", "Paris is large."),
                         document_files.Document(f"{path}:2", "", "No id here.")]


@pytest.mark.parametrize("line, message", [("{oops", "not valid JSON"),
                                           ('{"text": ""}', "needs a non-empty string 'text'"),
                                           ('["a"]', "needs a non-empty string 'text'"),
                                           ('{"text": "x", "title": 3}', "'title' must be a string")])
def test_a_malformed_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(errors.UserError, match=rf"bad\.jsonl:2: {message}"):
        document_files.read_documents(str(path))


def test_an_empty_or_unreadable_file_is_a_clear_error(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(errors.UserError, match="no documents"):
        document_files.read_documents(str(tmp_path / "empty.txt"))
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(errors.UserError, match="not UTF-8"):
        document_files.read_documents(str(tmp_path / "latin.txt"))
    with pytest.raises(errors.UserError, match="cannot read"):
        document_files.read_documents(str(tmp_path / "missing.txt"))
