"""The RETRO SavedModel (retro/retro_export): its scores match numpy over the Keras model's logits, its in-graph
retrieval matches the retriever, and generation is greedy (or seeded sampling) with retrieval after each chunk."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf import artifacts
from realm_tf import cli
from realm_tf import config
from realm_tf import errors
from realm_tf.retro import lm_evaluation
from realm_tf.retro import retro_export
from realm_tf.retro import retro_lm
from realm_tf.retro import retro_sequences

TINY = "configs/tiny.yaml"


def _export(root, sets, run, baseline=False):
    out = str(root / f"export-{run}")
    args = ["export-retro", "--config", TINY, *sum((["--set", s] for s in sets), []), "--model", str(root / run),
            "--output", out] + (["--baseline"] if baseline else [])
    assert cli.main(args) == 0
    task = retro_lm.RetroLmTask(config.load_config(TINY, sets), retrieval=not baseline)
    return task, lm_evaluation.restore_decoder(task, str(root / run)), tf.saved_model.load(out), out


@pytest.fixture(scope="module")
def exported(trained):
    """The RETRO-fitted tiny decoder, exported: ``(task, keras model, loaded SavedModel, path)``."""
    root, sets = trained
    return _export(root, sets, "fit")


def _log_softmax(logits):
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def test_score_matches_log_softmax_of_the_keras_logits(exported):
    task, model, loaded, _ = exported
    example = next(task.examples("test"))
    features = {k: example[k][None] for k in ("input_ids", "neighbour_ids", "neighbour_mask")}
    got = loaded.signatures["score"](**{k: tf.constant(v) for k, v in features.items()})["log_probs"].numpy()[0]
    log_probs = _log_softmax(model(features, training=False)["logits"].numpy()[0])  # [n, V]
    n = example["input_ids"].size
    expected = log_probs[np.arange(n - 1), example["input_ids"][1:]]
    np.testing.assert_allclose(got[:-1], expected, rtol=1e-4, atol=1e-4)
    assert got[-1] == 0.0


def _numpy_score_text(task, model, tokens):
    """(nll, bytes) of one text's wordpieces (cut to n): neighbours of each complete chunk from the retriever (whole
    database), log-softmax of the Keras logits, bytes of every target."""
    retro = task.cfg.retro
    m, n, k, r = retro.chunk_length, retro.sequence_length, retro.num_neighbours, 2 * retro.chunk_length
    tokens = np.asarray(tokens[:n], np.int32)
    length = -(-tokens.size // m) * m
    ids = np.full([length], task.tokenizer.pad_id, np.int32)
    ids[:tokens.size] = tokens
    neighbour_ids = np.zeros([length // m, k, r], np.int32)
    neighbour_mask = np.zeros([length // m, k, r], bool)
    complete = tokens.size // m
    if complete:
        found = task.retriever.neighbours(tokens[:complete * m], exclude_own_document=False,
                                          pad_id=task.tokenizer.pad_id)
        neighbour_ids[:complete], neighbour_mask[:complete] = found.tokens, found.mask
    logits = model({"input_ids": ids[None], "neighbour_ids": neighbour_ids[None],
                    "neighbour_mask": neighbour_mask[None]}, training=False)["logits"].numpy()[0]
    log_probs = _log_softmax(logits)
    targets = tokens[1:]
    nll = -log_probs[np.arange(targets.size), targets].sum()
    byte_lengths = retro_sequences.token_byte_lengths(task.tokenizer.vocab)
    return nll, byte_lengths[targets].sum(), tokens.size


def test_score_text_matches_numpy_with_retrieval_and_cuts_at_n(exported):
    task, model, loaded, _ = exported
    long_text = " ".join(["the history of the river and the town that grew beside it"] * 8)  # > n wordpieces
    texts = ["a short text of a few words here", long_text, ""]
    got = loaded.signatures["score_text"](text=tf.constant(texts))
    for i, text in enumerate(texts):
        tokens = task.tokenizer(tf.constant([text])).to_list()[0]
        if not tokens:
            assert got["num_tokens"].numpy()[i] == 0 and got["nll"].numpy()[i] == 0
            continue
        nll, num_bytes, scored = _numpy_score_text(task, model, tokens)
        assert got["num_tokens"].numpy()[i] == scored == min(len(tokens), task.cfg.retro.sequence_length)
        np.testing.assert_allclose(got["nll"].numpy()[i], nll, rtol=1e-4)
        assert got["bytes"].numpy()[i] == num_bytes
        np.testing.assert_allclose(got["bits_per_byte"].numpy()[i], nll / (np.log(2) * num_bytes), rtol=1e-4)


def test_retrieve_matches_the_retriever_over_the_whole_database(exported):
    task, _, loaded, _ = exported
    m = task.cfg.retro.chunk_length
    chunk_ids = [c for c in range(len(task.store)) if len(task.store.tokens(c)) == m][:6]
    chunks = np.stack([task.store.tokens(c) for c in chunk_ids]).astype(np.int32)  # [6, m]
    got = loaded.signatures["retrieve"](chunks=tf.constant(chunks))
    expected = task.retriever.neighbours(chunks.reshape(-1), exclude_own_document=False, pad_id=task.tokenizer.pad_id)
    np.testing.assert_array_equal(got["chunk_ids"].numpy(), expected.chunk_ids)
    np.testing.assert_array_equal(got["neighbour_ids"].numpy(), expected.tokens)
    np.testing.assert_array_equal(got["neighbour_mask"].numpy(), expected.mask)
    assert [d.decode() for d in got["doc_ids"].numpy()[0]] == [task.store.doc_ids[c] for c in expected.chunk_ids[0]]
    assert chunk_ids[0] in got["chunk_ids"].numpy()[0]  # a database chunk's nearest neighbour is itself


def test_generate_is_greedy_and_retrieves_after_each_complete_chunk(exported):
    task, model, loaded, _ = exported
    retro = task.cfg.retro
    m, k, r = retro.chunk_length, retro.num_neighbours, 2 * retro.chunk_length
    out = loaded.signatures["generate"](prompt=tf.constant("the river of the town"), max_tokens=tf.constant(20),
                                        temperature=tf.constant(0.0), seed=tf.constant(0))
    ids = out["ids"].numpy()
    prompt_length = int(out["prompt_length"].numpy())
    assert ids.size == prompt_length + 20
    chosen = out["chunk_ids"].numpy()  # [n / m, k]
    complete = ids.size // m
    assert (chosen[complete:] == -1).all()
    neighbour_ids = np.zeros([-(-ids.size // m), k, r], np.int32)
    neighbour_mask = np.zeros_like(neighbour_ids, bool)
    if complete:
        found = task.retriever.neighbours(ids[:complete * m], exclude_own_document=False, pad_id=task.tokenizer.pad_id)
        np.testing.assert_array_equal(chosen[:complete], found.chunk_ids)
        neighbour_ids[:complete], neighbour_mask[:complete] = found.tokens, found.mask
    # Each new token is the most likely next token given the tokens and the neighbours of complete chunks before it
    # (the causal shift makes later neighbours invisible, so one forward pass checks every step).
    padded = np.zeros([neighbour_ids.shape[0] * m], np.int32)
    padded[:ids.size] = ids
    logits = model({"input_ids": padded[None], "neighbour_ids": neighbour_ids[None],
                    "neighbour_mask": neighbour_mask[None]}, training=False)["logits"].numpy()[0]
    for t in range(prompt_length, ids.size):
        assert logits[t - 1, ids[t]] >= logits[t - 1].max() - 1e-4
    text = out["text"].numpy().decode()
    assert text == task.tokenizer.detokenize(tf.constant([ids[prompt_length:]])).numpy()[0].decode()
    sample = lambda seed: loaded.signatures["generate"](  # noqa: E731
        prompt=tf.constant("the river of the town"), max_tokens=tf.constant(12), temperature=tf.constant(1.0),
        seed=tf.constant(seed))["ids"].numpy()
    assert np.array_equal(sample(3), sample(3))  # seeded: reproducible
    assert not np.array_equal(sample(3), sample(4))


def test_export_is_published_once_with_its_facts(exported):
    task, _, _, out = exported
    meta = artifacts.read_marker(out, artifacts.RETRO_EXPORT)
    assert meta["retrieval"] and meta["searcher"] == "exact" and meta["checkpoint"].endswith("-3")
    assert meta["chunk_length"] == task.cfg.retro.chunk_length and "generate" in meta["signatures"]
    with pytest.raises(errors.UserError, match="already holds an export"):
        retro_export.export_retro(retro_export.RetroExportModule(task.cfg, exported[1], task.tokenizer, task.store,
                                                                 task.retriever.embedder, task.retriever.keys),
                                  task.cfg, out)


def test_baseline_export_scores_and_generates_without_retrieval(trained):
    root, sets = trained
    task, model, loaded, _ = _export(root, sets, "baseline", baseline=True)
    assert "retrieve" not in loaded.signatures
    ids = next(task.examples("test"))["input_ids"][None]
    got = loaded.signatures["score"](input_ids=tf.constant(ids))["log_probs"].numpy()[0]
    log_probs = _log_softmax(model({"input_ids": ids}, training=False)["logits"].numpy()[0])
    np.testing.assert_allclose(got[:-1], log_probs[np.arange(ids.shape[1] - 1), ids[0, 1:]], rtol=1e-4, atol=1e-4)
    out = loaded.signatures["generate"](prompt=tf.constant("the town"), max_tokens=tf.constant(5),
                                        temperature=tf.constant(0.0), seed=tf.constant(0))
    assert out["ids"].numpy().size == int(out["prompt_length"].numpy()) + 5 and (out["chunk_ids"].numpy() == -1).all()
