"""ORQA/REALM Open-QA loss against a float64 numpy reference, incl. examples without an answer."""
import numpy as np
import tensorflow as tf

from realm_tf.tasks import open_qa_loss


def _logsumexp(x):
    m = x.max()
    return m + np.log(np.exp(x - m).sum())


def _reference(retrieval, spans, valid, answer):
    """Per-example float64 losses, flags and argmax, computed row by row from the definitions."""
    answer = answer & valid
    out = {k: [] for k in ("retriever_loss", "reader_loss", "has_answer_block", "has_answer_span",
                           "predicted_block", "predicted_span")}
    for b in range(retrieval.shape[0]):
        p_block = np.exp(retrieval[b] - _logsumexp(retrieval[b]))  # [k]
        blocks = answer[b].any(-1)  # [k]
        out["has_answer_block"].append(float(blocks.any()))
        out["retriever_loss"].append(-np.log(p_block[blocks].sum()) if blocks.any() else 0.0)
        joint = retrieval[b][:, None] + spans[b]  # [k, num_spans]
        out["has_answer_span"].append(float(answer[b].any()))
        out["reader_loss"].append(_logsumexp(joint[valid[b]]) - _logsumexp(joint[answer[b]])
                                  if answer[b].any() else 0.0)
        z, s = np.unravel_index(np.where(valid[b], joint, -np.inf).argmax(), joint.shape)
        out["predicted_block"].append(z)
        out["predicted_span"].append(s)
    out = {k: np.array(v) for k, v in out.items()}
    out["loss"] = out["retriever_loss"] + out["reader_loss"]
    return out


def _random_case(seed, scale=3.0):
    rng = np.random.default_rng(seed)
    batch, k, num_spans = 6, 4, 15
    retrieval = rng.normal(size=(batch, k)) * scale
    spans = rng.normal(size=(batch, k, num_spans)) * scale
    valid = rng.random((batch, k, num_spans)) < 0.6
    answer = rng.random((batch, k, num_spans)) < 0.15
    answer[0] = False  # no answer anywhere
    answer[1] = ~valid[1]  # "answers" only at invalid spans: dropped by the intersection, so none
    answer[2] = False
    answer[2, 3] = valid[2, 3]  # answers in one block only
    answer[3] |= valid[3] & (rng.random((k, num_spans)) < 0.5)
    return retrieval, spans, valid, answer


def _tf_loss(retrieval, spans, valid, answer):
    return open_qa_loss.open_qa_marginal_loss(tf.constant(retrieval, tf.float32), tf.constant(spans, tf.float32),
                                              tf.constant(valid), tf.constant(answer))


def test_matches_numpy_reference():
    for seed in range(3):
        case = _random_case(seed)
        got = {k: v.numpy() for k, v in _tf_loss(*case).items()}
        want = _reference(*case)
        assert want["has_answer_span"].tolist()[:3] == [0.0, 0.0, 1.0] and want["has_answer_span"].sum() >= 3
        for key in ("loss", "retriever_loss", "reader_loss"):
            assert got[key].shape == (6,) and np.isfinite(got[key]).all(), key
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-4, err_msg=key)
        for key in ("has_answer_block", "has_answer_span", "predicted_block", "predicted_span"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        assert got["predicted_block"].dtype == np.int32 and got["predicted_span"].dtype == np.int32
        assert (got["reader_loss"][want["has_answer_span"] == 1] > 0).all()


def test_stable_for_large_logits_and_reader_masked_values():
    retrieval, spans, valid, answer = _random_case(7, scale=300.0)
    spans = np.where(valid, spans, -1e4)  # as SpanReader fills invalid spans
    got = {k: v.numpy() for k, v in _tf_loss(retrieval, spans, valid, answer).items()}
    want = _reference(retrieval, spans, valid, answer)
    for key in ("loss", "retriever_loss", "reader_loss"):
        assert np.isfinite(got[key]).all(), key
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-2, err_msg=key)
    np.testing.assert_array_equal(got["predicted_span"], want["predicted_span"])


def test_skipped_rows_and_masked_spans_get_no_gradient():
    retrieval, spans, valid, answer = (tf.constant(x) for x in _random_case(1))
    retrieval, spans = tf.cast(retrieval, tf.float32), tf.cast(spans, tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([retrieval, spans])
        out = open_qa_loss.open_qa_marginal_loss(retrieval, spans, valid, answer)
        total = tf.reduce_sum(out["loss"])
        reader_total, retriever_total = tf.reduce_sum(out["reader_loss"]), tf.reduce_sum(out["retriever_loss"])
    g_retrieval, g_spans = (g.numpy() for g in tape.gradient(total, [retrieval, spans]))
    assert np.isfinite(g_retrieval).all() and np.isfinite(g_spans).all()
    skipped = out["has_answer_span"].numpy() == 0
    assert skipped.tolist()[:2] == [True, True]
    assert (g_retrieval[skipped] == 0).all() and (g_spans[skipped] == 0).all()
    assert (g_spans[~valid.numpy()] == 0).all()  # invalid spans are out of the softmax
    assert (np.abs(g_retrieval[~skipped]).sum(-1) > 0).all()
    # The retriever term does not depend on the span scores; the reader term's gradient is
    # p(z, s | valid) - p(z, s | answer), which sums to zero over each answered row.
    assert tape.gradient(retriever_total, spans) is None
    g_reader = tape.gradient(reader_total, spans).numpy()
    np.testing.assert_allclose(g_reader.sum((1, 2)), 0, atol=1e-5)
    assert (np.abs(g_reader[~skipped]).sum((1, 2)) > 0).all()
