"""tracing.trace_once: one trace for a dataset's batches of every length, the same values as eager calls."""
import numpy as np
import tensorflow as tf

from realm_tf.core import tracing


def _batches():
    rng = np.random.default_rng(0)
    # Batch sizes 3 and 2 (a short last batch), lengths 2..7: every batch a new shape.
    return [rng.normal(size=(3 if n < 7 else 2, n)).astype(np.float32) for n in range(2, 8)]


def _fn(batch):
    return {"sum": tf.reduce_sum(tf.square(batch), axis=1), "length": tf.shape(batch)[1]}


def test_a_dataset_is_traced_once_for_its_element_spec():
    batches = _batches()
    dataset = tf.data.Dataset.from_generator(lambda: iter(batches),
                                             output_signature=tf.TensorSpec([None, None], tf.float32))
    step = tracing.trace_once(_fn, dataset)
    for batch, got in zip(batches, (step(b) for b in dataset)):
        np.testing.assert_allclose(got["sum"].numpy(), np.square(batch).sum(axis=1), rtol=1e-6)
        assert int(got["length"]) == batch.shape[1]
    assert step.experimental_get_tracing_count() == 1


def test_other_iterables_relax_the_shapes_after_one_retrace():
    batches = _batches()
    step = tracing.trace_once(_fn, batches)
    for batch in batches:
        np.testing.assert_allclose(step(tf.constant(batch))["sum"].numpy(), np.square(batch).sum(axis=1), rtol=1e-6)
    # [3, 2]; then [3, None] for the next length; then [None, None] at the short last batch; never again.
    assert step.experimental_get_tracing_count() == 3
