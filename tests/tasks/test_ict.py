"""ICT: in-batch loss vs numpy, the loss falls on a tiny config, gradients reach both towers, resume."""
import functools
import gzip
import itertools
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import xla_steps  # tests/xla_steps.py (tests/ is on the path: tests/conftest.py)

from realm_tf import config
from realm_tf.core import experiment
from realm_tf.data import example_schemas
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_retriever
from realm_tf.tasks import ict


def write_ict_records(path: str, tok: bert_tokenizer.BertTokenizer, count: int = 16) -> None:
    """ICT examples from real passages: the first sentence is the query, the rest the context."""
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt") as f:
        passages = [json.loads(line) for line in itertools.islice(f, 0, count * 37, 37)]
    with tf.io.TFRecordWriter(path) as writer:
        for i, p in enumerate(passages):
            first, _, rest = p["text"].partition(". ")
            ids = tok(tf.constant([first, rest or first, p["title"]]))
            writer.write(example_schemas.to_example({
                example_schemas.QUERY_IDS: ids[0].numpy().tolist(),
                example_schemas.TITLE_IDS: ids[2].numpy().tolist(),
                example_schemas.BODY_IDS: ids[1].numpy().tolist(),
                example_schemas.UID: example_schemas.block_uid(p["title"], p["text"]),
                example_schemas.BLOCK_ID: i,
                example_schemas.QUERY_REMOVED: 1,
            }))


@pytest.fixture()
def tiny(tmp_path):
    cfg = config.load_config("configs/tiny.yaml", [
        f"ict.model_dir={tmp_path}/model", f"data.ict_dir={tmp_path}/ict", "data.batch_size=8",
        "ict.steps=50", "ict.learning_rate=0.001", "ict.warmup_steps=0",
        "ict.checkpoint_every_steps=10", "data.shuffle_buffer=16", "ict.summary_every_steps=5"])
    os.makedirs(cfg.data.ict_dir)
    write_ict_records(f"{cfg.data.ict_dir}/ict-00000-of-00001.tfrecord",
                      bert_tokenizer.BertTokenizer(cfg.model.vocab_file))
    return cfg


def test_loss_matches_numpy_softmax(tiny):
    task = ict.IctTask(tiny, f"{tiny.data.ict_dir}/*.tfrecord")
    model = task.build_model()
    batch, labels = next(iter(task.build_inputs(seed=1)))
    per_example, terms = task.build_losses(labels, task.call_model(model, batch, training=False))
    metrics = task.build_metrics(labels, terms)
    q = model.embed_queries({k: batch["query_" + k] for k in ("input_word_ids", "input_mask", "input_type_ids")})
    d = model.embed_blocks({k: batch["block_" + k] for k in ("input_word_ids", "input_mask", "input_type_ids")})
    logits = q.numpy().astype(np.float64) @ d.numpy().T
    logits -= logits.max(1, keepdims=True)
    want = -np.diag(logits - np.log(np.exp(logits).sum(1, keepdims=True)))
    np.testing.assert_allclose(per_example.numpy(), want, rtol=1e-4, atol=1e-4)
    # Accuracy: query i is right when block i has the top score. The reference logits come from a separate
    # float32 forward pass, so a row whose top two scores are within 1e-5 may go either way (a random tiny model
    # gives such near-ties): the metric must lie between the clear wins and the clear-or-tied ones.
    diagonal, others = np.diag(logits), np.where(np.eye(8, dtype=bool), -np.inf, logits).max(1)
    clear_wins, wins_or_ties = np.mean(diagonal > others + 1e-5), np.mean(diagonal >= others - 1e-5)
    assert clear_wins <= metrics["accuracy"].numpy() <= wins_or_ties, (clear_wins, wins_or_ties)
    # Block packing is [CLS] title [SEP] body [SEP]; the query [CLS] sentence [SEP].
    assert (batch["block_input_word_ids"].numpy()[:, 0] == task.tokenizer.cls_id).all()
    assert batch["query_input_word_ids"].shape[1] <= tiny.model.query_seq_length  # padded to the longest row
    static = ict.IctTask(config.apply_override(tiny, "data.static_padding=true"), f"{tiny.data.ict_dir}/*.tfrecord")
    static_batch, static_labels = next(iter(static.build_inputs(seed=1)))
    assert static_batch["query_input_word_ids"].shape == (8, tiny.model.query_seq_length)
    same, _ = static.build_losses(static_labels, static.call_model(model, static_batch, training=False))
    np.testing.assert_allclose(same.numpy(), per_example.numpy(), rtol=1e-4, atol=1e-4)  # padding-invariant
    # The section's own batch (ict.batch_size) over data.batch_size's: batches of 4, 4 logits per query.
    own = ict.IctTask(config.apply_override(tiny, "ict.batch_size=4"), f"{tiny.data.ict_dir}/*.tfrecord")
    own_batch, own_labels = next(iter(own.build_inputs(seed=1)))
    assert own.global_batch_size == 4 and own_batch["query_input_word_ids"].shape[0] == 4
    assert own.build_losses(own_labels, own.call_model(model, own_batch, training=False))[0].shape == (4,)


def test_gradients_reach_both_towers(tiny):
    task = ict.IctTask(tiny)
    model = task.build_model()
    batch, labels = next(iter(task.build_inputs(seed=1)))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(task.build_losses(labels, task.call_model(model, batch, training=True))[0])
    variables = model.trainable_variables
    grads = dict(zip([v.name for v in variables], tape.gradient(loss, variables)))
    for tower in ("query_embedder", "doc_embedder"):
        nonzero = [n for n, g in grads.items() if f"{tower}/" in n and g is not None
                   and float(tf.reduce_sum(tf.abs(tf.convert_to_tensor(g)))) > 0]
        assert any("transformer/layer_0" in n for n in nonzero), tower
        assert any("projection" in n for n in nonzero), tower


def test_training_lowers_loss_and_resumes(tiny):
    losses = []
    result = experiment.run_experiment(ict.IctTask(tiny), hooks=(lambda s, l: losses.append(l.get("loss")),))
    assert result["step"] == 50
    recorded = [x for x in losses if x is not None]
    assert np.mean(recorded[:5]) > np.log(8) - 0.05  # chance level with 8 in-batch candidates
    assert np.mean(recorded[-5:]) < np.mean(recorded[:5]) - 0.4, recorded
    assert os.path.exists(os.path.join(tiny.ict.model_dir, "params.yaml"))
    assert tf.io.gfile.glob(os.path.join(tiny.ict.model_dir, "train", "events.out.tfevents.*"))
    # Rerunning with more steps resumes from the last checkpoint instead of starting over.
    more = config.apply_override(tiny, "ict.steps=53")
    seen = []
    result = experiment.run_experiment(ict.IctTask(more), hooks=(lambda s, l: seen.append(s),))
    assert result["step"] == 53 and seen == [51, 52, 53]
    # train_ict (realm-tf train-ict) hands the trained retriever to the index builder: an export of its step whose
    # query tower is the trained one.
    last = config.apply_override(config.apply_override(more, "ict.steps=54"),
                                 f"refresh.export_dir={tiny.ict.model_dir}/export")
    result = ict.train_ict(last)
    assert result["step"] == 54 and result["export"] == f"{tiny.ict.model_dir}/export/54"
    tok = bert_tokenizer.BertTokenizer(last.model.vocab_file)
    packed = tok.pack_single(tok(tf.constant(["who wrote the republic"])), last.model.query_seq_length)
    served = tf.saved_model.load(result["export"]).signatures["embed_query_ids"](**packed)["embedding"]
    np.testing.assert_allclose(served.numpy(), result["model"].embed_queries(packed).numpy(), atol=1e-5)


def test_ict_starts_from_the_retriever_checkpoint_when_given(tiny, tmp_path):
    first = config.apply_override(tiny, "ict.steps=2")
    experiment.run_experiment(ict.IctTask(first))
    checkpoint = tf.train.latest_checkpoint(f"{tiny.ict.model_dir}/checkpoints")
    expected = knowledge_retriever.build_knowledge_retriever(first.model)
    tf.train.Checkpoint(model=expected).read(checkpoint).expect_partial()
    started = config.apply_override(config.apply_override(first, f"model.retriever_checkpoint={tiny.ict.model_dir}"),
                                    f"ict.model_dir={tmp_path}/second")
    model = ict.IctTask(started).build_model()
    fresh = ict.IctTask(first).build_model()  # without the setting: the import with a new projection
    assert len(model.weights) == len(expected.weights) == len(fresh.weights)
    for got, want in zip(model.weights, expected.weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert any(not np.array_equal(a.numpy(), b.numpy()) for a, b in zip(fresh.weights, expected.weights))


@pytest.mark.slow  # the step compiled with XLA and trained: tens of CPU-seconds
@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_the_step_is_one_xla_program_traced_once(tiny, precision):
    cfg = functools.reduce(config.apply_override, ["data.static_padding=true", "ict.jit_compile=true", "ict.steps=3",
                                        f"ict.precision={precision}"], tiny)
    run = xla_steps.run_compiled(ict.IctTask(cfg, f"{cfg.data.ict_dir}/*.tfrecord"))
    assert np.isfinite(run.result["train"]["loss"])
