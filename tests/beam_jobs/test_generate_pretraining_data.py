"""The salient-span pre-training data job (REALM §3.4) on a small inline corpus."""
import json
import os
import unicodedata

import apache_beam as beam
import tensorflow as tf
from apache_beam.testing import test_pipeline
from apache_beam.testing import util as beam_util

from beam_jobs import generate_pretraining_data as job
from beam_jobs import job_support
from realm_tf import cli
from realm_tf import config as config_lib
from realm_tf.data import example_schemas as es
from realm_tf.data import span_annotators

QUERY_SEQ_LENGTH = 24  # queries of at most 22 wordpieces
DOCUMENTS = [
    ("1973 oil crisis", "The 1973 oil crisis began in October 1973 when the members of OAPEC proclaimed an oil "
                        "embargo. By the end of the embargo in March 1974, the price of oil had risen to $12. "
                        "Henry Kissinger negotiated an Israeli troop withdrawal from the Sinai Peninsula."),
    ("Émile Zola", "Émile Zola was born in Paris on 2 April 1840. He wrote Germinal, a novel about miners in "
                   "northern France. Zola died in 1902."),
    ("Cats", "the cat sat on the mat and purred quietly. it was warm in the little room and nobody spoke."),
    ("Long", "The committee said that the proposal, which had been discussed at great length by many members "
             "over several long and tiring meetings held throughout the whole year, would finally be adopted "
             "by the assembly in Geneva."),
]


def _norm(text):
    return "".join(ch for ch in unicodedata.normalize("NFKD", text.casefold()) if ch.isalnum())


def _cfg(*overrides):
    return config_lib.load_config(None, [f"model.query_seq_length={QUERY_SEQ_LENGTH}", *overrides])


def test_pipeline_masks_one_salient_span_or_falls_back(make_blocks, tokenizer):
    records = make_blocks(DOCUMENTS)
    texts = {es.block_uid(t, b): (block_id, b) for block_id, (t, b) in enumerate(DOCUMENTS)}
    mask_id = tokenizer.mask_id

    def check(outputs):
        assert outputs, "no examples"
        for record in outputs:
            ex = job_support.parse_example(record, es.pretraining_feature_spec())
            ids, positions = ex[es.QUERY_IDS], ex[es.MASK_POSITIONS]
            assert 0 < len(ids) <= QUERY_SEQ_LENGTH - 2
            assert positions and positions == sorted(set(positions))
            assert [i for i, t in enumerate(ids) if t == mask_id] == positions
            assert len(ex[es.TARGET_IDS]) == len(positions) and mask_id not in ex[es.TARGET_IDS]
            block_id, text = texts[ex[es.SOURCE_UID].decode()]
            assert ex[es.SOURCE_BLOCK_ID] == block_id
            assert ex[es.QUERY_TEXT].decode() in text
            if ex[es.MASKING] == b"salient":
                assert positions == list(range(positions[0], positions[-1] + 1))
                assert ex[es.SPAN_LABEL] in (b"ENTITY", b"DATE")
            else:
                assert ex[es.MASKING] == b"random" and ex[es.SPAN_LABEL] == b""

    p = test_pipeline.TestPipeline()
    out = (p | beam.Create(records) | "Generate" >> job.GeneratePretrainingExamples(_cfg()))
    beam_util.assert_that(out, check)
    result = p.run()
    result.wait_until_finish()
    counts = job_support.read_counters(result, job.NAMESPACE)
    assert counts[job.BLOCKS] == len(DOCUMENTS)
    assert counts[job.EXAMPLES] == counts[job.SALIENT] + counts[job.RANDOM_FALLBACK]
    assert counts[job.SALIENT] >= 4 and counts[job.RANDOM_FALLBACK] >= 1  # the lower-case cat block
    assert counts[job.TRUNCATED] == 1  # the long sentence
    assert sum(v for k, v in counts.items() if k.startswith(job.LABEL_PREFIX)) == counts[job.SALIENT]
    assert counts.get(job.NO_SPAN_DROPPED, 0) == 0


def test_run_end_to_end_deterministic_and_fallback_counted(tmp_path, make_blocks, write_blocks, read_records,
                                                          tokenizer, portable_runner):
    pattern = write_blocks(str(tmp_path / "blocks"), make_blocks(DOCUMENTS))
    common = ["--input", pattern, "--set", f"model.query_seq_length={QUERY_SEQ_LENGTH}", "--set", "data.seed=5"]
    manifest = job.run([*common, "--output", str(tmp_path / "a"), "--num-shards", "2"])
    again_manifest = job.run([*common, "--output", str(tmp_path / "b"), *portable_runner])  # the portable runner

    rows = read_records(str(tmp_path / "a" / "pretraining-*.tfrecord"), es.pretraining_feature_spec())
    again = read_records(str(tmp_path / "b" / "pretraining-*.tfrecord"), es.pretraining_feature_spec())
    key = lambda r: (r[es.SOURCE_BLOCK_ID], r[es.QUERY_TEXT])  # noqa: E731
    assert sorted(rows, key=key) == sorted(again, key=key)  # identical data from a rerun
    assert again_manifest["counts"] == manifest["counts"]  # and the same counters
    assert len(os.listdir(tmp_path / "a")) == 3  # two shards + manifest

    on_disk = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert on_disk["counts"] == manifest["counts"] and on_disk["vocab_hash"] == tokenizer.vocab_hash
    assert on_disk["annotator"] == "rules" and on_disk["config"]["data"]["seed"] == 5
    counts = manifest["counts"]
    random_rows = [r for r in rows if r[es.MASKING] == b"random"]
    assert counts[job.EXAMPLES] == len(rows) and counts[job.RANDOM_FALLBACK] == len(random_rows) > 0
    assert counts[job.MASKED_WORDPIECES] == sum(len(r[es.MASK_POSITIONS]) for r in rows)

    # Masked wordpieces are exactly those of one salient span of the query text.
    annotator = span_annotators.make_annotator("rules")
    for row in rows:
        text = row[es.QUERY_TEXT].decode()
        restored = list(row[es.QUERY_IDS])
        for p, t in zip(row[es.MASK_POSITIONS], row[es.TARGET_IDS]):
            restored[p] = t
        assert restored == tokenizer(tf.constant([text]))[0].numpy().tolist()
        if row[es.MASKING] == b"salient":
            target = tokenizer.detokenize(tf.ragged.constant([row[es.TARGET_IDS]]))[0].numpy().decode()
            spans = [s for s in annotator.annotate(text) if _norm(s.text(text)) == _norm(target)]
            assert spans and spans[0].label.encode() == row[es.SPAN_LABEL], (text, target)

    # Without the fallback the same queries are dropped and counted; through the CLI, Beam options after --.
    code = cli.main(["generate-pretraining-data", *common, "--output", str(tmp_path / "c"),
                     "--set", "data.random_mask_fallback=false", "--", "--direct_num_workers=1"])
    assert code == 0
    strict = json.loads((tmp_path / "c" / "manifest.json").read_text())["counts"]
    assert strict[job.NO_SPAN_DROPPED] == len(random_rows) and job.RANDOM_FALLBACK not in strict
    assert strict[job.SALIENT] == counts[job.SALIENT]

    # REALM's random-span control: the same queries, each with one run of whole words as long as the salient span
    # it stands for (or the fallback's), counted and recorded in the manifest.
    job.run([*common, "--output", str(tmp_path / "d"), "--set", "data.masking_strategy=random_span"])
    control = read_records(str(tmp_path / "d" / "pretraining-*.tfrecord"), es.pretraining_feature_spec())
    on_disk = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert on_disk["masking_strategy"] == "random_span"
    assert on_disk["counts"][job.RANDOM_SPAN] == len(control) == len(rows) and job.SALIENT not in on_disk["counts"]
    by_query = {key(r): r for r in rows}
    moved = 0
    for row in control:
        assert row[es.MASKING] == b"random_span"
        positions = list(row[es.MASK_POSITIONS])
        assert positions == list(range(positions[0], positions[-1] + 1))
        reference = by_query[key(row)]
        moved += positions != list(reference[es.MASK_POSITIONS])
    assert moved > len(control) // 2  # elsewhere than the salient span, most of the time


def test_missing_input_is_a_clean_error(tmp_path, capsys):
    code = cli.main(["generate-pretraining-data", "--input", str(tmp_path / "none-*.tfrecord"),
                     "--output", str(tmp_path / "out")])
    assert code == 2 and "no block TFRecords match" in capsys.readouterr().err
