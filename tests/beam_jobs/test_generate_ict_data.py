"""The Inverse Cloze Task data job (Lee et al., 2019; REALM's retriever warm start) on a small inline corpus."""
import json

import apache_beam as beam
from apache_beam.testing import test_pipeline
from apache_beam.testing import util as beam_util

from beam_jobs import generate_ict_data as job
from beam_jobs import job_support
from realm_tf import cli
from realm_tf import config as config_lib
from realm_tf.data import example_schemas as es
from realm_tf.data import inverse_cloze_task as ict

SENTENCES = ["The river {0} flows through the valley of Town{1}.", "In 18{1}, a bridge was built near it.",
             "Fishermen still use the old harbour.", "Its water is cold, even in August.",
             "Tourists from Town{2} visit it every summer."]
DOCUMENTS = ([(f"River {i}", " ".join(s.format(f"Name{i}", 10 + i % 80, i % 7) for s in SENTENCES))
              for i in range(40)] + [("Alone", "Only one sentence lives in this block.")])


def _removed_in_place(query, body, context):
    """``context`` is ``body`` with ``query`` cut out at one place."""
    return any(body[i:i + len(query)] == query and context == body[:i] + body[i + len(query):]
               for i in range(len(body) - len(query) + 1))


def test_pipeline_pairs_sentences_with_their_blocks(make_blocks):
    records = make_blocks(DOCUMENTS)
    blocks = {}
    for record in records:
        block = job_support.parse_example(record, es.block_feature_spec())
        blocks[block[es.UID].decode()] = block

    def check(outputs):
        assert len(outputs) == 200
        for record in outputs:
            ex = job_support.parse_example(record, es.ict_feature_spec())
            block = blocks[ex[es.UID].decode()]
            assert ex[es.BLOCK_ID] == block[es.BLOCK_ID] and ex[es.TITLE_IDS] == block[es.TITLE_IDS]
            query, body = ex[es.QUERY_IDS], block[es.BODY_IDS]
            assert 0 < len(query) <= 94
            if ex[es.QUERY_REMOVED]:
                assert _removed_in_place(query, body, ex[es.BODY_IDS])
            else:
                assert ex[es.BODY_IDS] == body  # the whole block, sentence included
                assert any(body[i:i + len(query)] == query for i in range(len(body)))

    p = test_pipeline.TestPipeline()
    beam_util.assert_that(p | beam.Create(records) | job.GenerateIctExamples(config_lib.load_config()), check)
    result = p.run()
    result.wait_until_finish()
    counts = job_support.read_counters(result, job.NAMESPACE)
    assert counts[job.BLOCKS] == 41 and counts[job.EXAMPLES] == 200
    assert counts[ict.SKIPPED_WHOLE_BODY] == 1 and job.BODY_IDS_MISMATCH not in counts
    assert counts[ict.REMOVED] + counts[ict.KEPT] == 200
    assert abs(counts[ict.REMOVED] / 200 - 0.9) < 0.07


def test_run_end_to_end_is_deterministic(tmp_path, make_blocks, write_blocks, read_records, portable_runner):
    pattern = write_blocks(str(tmp_path / "blocks"), make_blocks(DOCUMENTS))
    manifest = job.run(["--input", pattern, "--output", str(tmp_path / "a")])
    code = cli.main(["generate-ict-data", "--input", pattern, "--output", str(tmp_path / "b"),
                     "--num-shards", "3", "--", *portable_runner])  # the same examples on the portable runner
    assert code == 0
    rows = read_records(str(tmp_path / "a" / "ict-*.tfrecord"), es.ict_feature_spec())
    again = read_records(str(tmp_path / "b" / "ict-*.tfrecord"), es.ict_feature_spec())
    key = lambda r: (r[es.BLOCK_ID], r[es.QUERY_IDS])  # noqa: E731
    assert sorted(rows, key=key) == sorted(again, key=key)
    assert len(rows) == 200 == manifest["counts"][job.EXAMPLES]
    assert sum(r[es.QUERY_REMOVED] for r in rows) == manifest["counts"][ict.REMOVED]
    on_disk = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert on_disk["remove_probability"] == 0.9 and on_disk["sentences_per_block"] == 0
