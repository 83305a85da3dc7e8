"""REALM marginal loss against a float64 numpy reference."""
import numpy as np

from realm_tf.tasks import realm_loss


def _log_softmax(x, axis=-1):
    x = x - x.max(axis, keepdims=True)
    return x - np.log(np.exp(x).sum(axis, keepdims=True))


def test_matches_numpy_reference():
    rng = np.random.default_rng(0)
    batch, k, m, vocab = 3, 4, 5, 11
    retrieval = rng.normal(size=(batch, k)) * 3
    mlm = rng.normal(size=(batch, k, m, vocab)) * 2
    targets = rng.integers(0, vocab, size=(batch, m))
    weights = (rng.random((batch, m)) < 0.7).astype(np.float32)
    weights[:, 0] = 1
    out = {key: v.numpy() for key, v in realm_loss.realm_marginal_loss(
        retrieval.astype(np.float32), mlm.astype(np.float32), targets, weights).items()}
    for b in range(batch):
        log_pz = _log_softmax(retrieval[b])
        log_py = np.array([sum(weights[b, j] * _log_softmax(mlm[b, z, j])[targets[b, j]] for j in range(m))
                           for z in range(k)])
        marginal = np.log(np.sum(np.exp(log_pz + log_py)))
        np.testing.assert_allclose(out["loss"][b], -marginal, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out["retrieval_utility"][b], marginal - log_py[0], rtol=1e-4, atol=1e-4)
        probs = sum(np.exp(log_pz[z]) * np.exp(_log_softmax(mlm[b, z])) for z in range(k))  # [m, vocab]
        correct = sum(weights[b, j] * (probs[j].argmax() == targets[b, j]) for j in range(m))
        assert out["mlm_correct"][b] == correct and out["mlm_count"][b] == weights[b].sum()


def test_a_useful_document_gets_credit():
    # Candidate 2 predicts the target; raising its retrieval score lowers the loss and makes RU positive.
    mlm = np.zeros((1, 3, 1, 4), np.float32)
    mlm[0, 2, 0, 1] = 5.0
    low = realm_loss.realm_marginal_loss(np.zeros((1, 3), np.float32), mlm, [[1]], [[1.0]])
    high = realm_loss.realm_marginal_loss(np.array([[0, 0, 4.0]], np.float32), mlm, [[1]], [[1.0]])
    assert high["loss"].numpy()[0] < low["loss"].numpy()[0]
    assert high["retrieval_utility"].numpy()[0] > 0
