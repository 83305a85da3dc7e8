"""beam_jobs/build_knn_datastore: which documents' text becomes kNN-LM's datastore (Khandelwal et al., 2020)."""
import apache_beam as beam
from apache_beam.testing import test_pipeline
from apache_beam.testing import util as beam_testing

from beam_jobs import build_knn_datastore
from realm_tf.retro import retro_chunks
from realm_tf.retro import retro_sequences


def test_parse_keeps_training_and_database_documents_and_counts_held_out_ones():
    doc_ids = [f"doc-{i}" for i in range(60)]
    records = [retro_chunks.chunk_to_example((i, retro_chunks.Chunk(d, 0, (5, 6, 7), (8,))))
               for i, d in enumerate(doc_ids)] + [b"not a tf.Example"]
    splits = {d: retro_sequences.document_split(d, 0.2, 0.1, 0.4) for d in doc_ids}
    assert {"train", "database", "validation", "test"} <= set(splits.values())
    kept = sorted((d, (i, (5, 6, 7))) for i, d in enumerate(doc_ids) if splits[d] in ("train", "database"))
    with test_pipeline.TestPipeline() as p:
        parsed = (p | beam.Create(records)
                  | "Parse" >> beam.ParDo(build_knn_datastore._ParseChunkFn(0.2, 0.1, 0.4))  # pylint: disable=protected-access
                  .with_outputs("dead_letters", main="chunks"))
        beam_testing.assert_that(parsed["chunks"], beam_testing.equal_to(kept), label="Kept")
        beam_testing.assert_that(parsed["dead_letters"] | beam.Map(lambda d: d["reason"]),
                                 beam_testing.equal_to(["unparseable_chunk"]), label="DeadLetters")
    counters = {c.key.metric.name: c.committed for c in p.result.metrics().query()["counters"]}
    assert counters[build_knn_datastore.HELD_OUT_CHUNKS] == sum(s in ("validation", "test") for s in splits.values())
    assert counters[build_knn_datastore.CHUNKS_READ] == len(records)
