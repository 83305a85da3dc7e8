"""The vector jobs' skeleton: a failing batch is retried item by item, outcomes split into values and failures with
their counters, shards round-trip into one matrix, and an incomplete matrix is refused."""
import json

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.ml.inference import base as inference_base
from apache_beam.testing import test_pipeline
from apache_beam.testing import util as beam_testing

from beam_jobs import job_support
from beam_jobs import vector_job
from realm_tf.index import embedding_matrix

NAMESPACE = "test.vector_job"


class _Model:
    """RunInference keeps the model through a weak reference: an object, not a str."""


class _Doubling(vector_job.FallbackModelHandler[float]):
    """``x`` -> ``[x, 2x]``; a batch holding a negative item raises; NaN gives a non-finite vector."""

    namespace = NAMESPACE

    def __init__(self) -> None:
        super().__init__(min_batch_size=1, max_batch_size=4)
        self.calls: list[int] = []

    def load_model(self):
        return _Model()

    def infer(self, model, batch):
        self.calls.append(len(batch))
        if any(x < 0 for x in batch):
            raise ValueError(f"negative item\nsecond line {list(batch)}")
        return [vector_job.finite(np.array([x, 2 * x]), "pair") for x in batch]


def test_a_failing_batch_is_retried_one_by_one_and_only_the_culprit_fails():
    handler = _Doubling()
    outcomes = list(handler.run_inference([1.0, -1.0, float("nan"), 3.0], handler.load_model()))
    assert handler.calls == [4, 1, 1, 1, 1]
    assert [o.error for o in outcomes] == [None, "ValueError: negative item", "non-finite pair (NaN or Inf)", None]
    np.testing.assert_array_equal(outcomes[0].value, [1.0, 2.0])
    np.testing.assert_array_equal(outcomes[3].value, [3.0, 6.0])
    assert outcomes[0].value.dtype == np.float32 and outcomes[1].value is None
    assert handler.get_metrics_namespace() == NAMESPACE + ".RunInference"


def test_a_batch_without_failures_is_one_call():
    handler = _Doubling()
    outcomes = handler.run_inference([1.0, 2.0], handler.load_model())
    assert handler.calls == [2] and [o.error for o in outcomes] == [None, None]


def test_split_outcomes_counts_items_and_weights_and_keys_the_failures():
    outcomes = [(0, vector_job.Outcome(np.ones(2, np.float32), None, 3)),
                (1, vector_job.Outcome(None, "bad", 5)),
                (2, vector_job.Outcome(np.zeros(2, np.float32), None, 4))]
    p = test_pipeline.TestPipeline()
    split = (p | beam.Create(outcomes)
             | vector_job.SplitOutcomes("job", "items", NAMESPACE, {"done": "done", "failed": "failed",
                                                                    "done_weight": "w", "failed_weight": "fw"},
                                        "item_id"))
    beam_testing.assert_that(split["values"] | beam.Map(lambda kv: (kv[0], kv[1].tolist())),
                             beam_testing.equal_to([(0, [1.0, 1.0]), (2, [0.0, 0.0])]), label="Values")
    beam_testing.assert_that(split["failures"], beam_testing.equal_to([{"item_id": 1, "error": "bad"}]),
                             label="Failures")
    result = p.run()
    result.wait_until_finish()
    assert job_support.read_counters(result, NAMESPACE) == {"done": 2, "failed": 1, "w": 7, "fw": 5}


def test_split_outcomes_refuses_an_unknown_counter():
    with pytest.raises(ValueError, match="unknown counters"):
        vector_job.SplitOutcomes("job", "items", NAMESPACE, {"succeeded": "x"}, "item_id")


def test_run_inference_through_the_handler_then_shards_back_into_one_matrix(tmp_path):
    items = [(i, float(i)) for i in range(6)]
    with test_pipeline.TestPipeline() as p:
        split = (p | beam.Create(items)
                 | inference_base.RunInference(inference_base.KeyedModelHandler(_Doubling()))
                 | vector_job.SplitOutcomes("job", "items", NAMESPACE, {"done": "done"}, "item_id"))
        _ = split["values"] | vector_job.WriteKeyedVectors(str(tmp_path), "vectors", num_shards=2)
        _ = split["failures"] | vector_job.WriteFailures(str(tmp_path))
    matrix = vector_job.read_matrix(str(tmp_path), "vectors", 2, 6)  # [6, 2]
    np.testing.assert_array_equal(matrix, [[i, 2 * i] for i in range(6)])


def test_a_failure_or_a_missing_id_refuses_the_matrix(tmp_path):
    with test_pipeline.TestPipeline() as p:
        _ = (p | "Vectors" >> beam.Create([(0, np.ones(2, np.float32)), (2, np.ones(2, np.float32))])
             | vector_job.WriteKeyedVectors(str(tmp_path), "vectors"))
        _ = (p | "Failures" >> beam.Create([{"block_id": 1, "error": "ValueError: négatif"}])
             | vector_job.WriteFailures(str(tmp_path)))
    (failures,) = list(tmp_path.glob("failures-*.jsonl"))
    assert json.loads(failures.read_text(encoding="utf-8")) == {"block_id": 1, "error": "ValueError: négatif"}
    with pytest.raises(embedding_matrix.IncompleteEmbeddingsError, match="1"):
        vector_job.read_matrix(str(tmp_path), "vectors", 2, 3)
    failures.unlink()
    with pytest.raises(embedding_matrix.IncompleteEmbeddingsError):
        vector_job.read_matrix(str(tmp_path), "vectors", 2, 3)
