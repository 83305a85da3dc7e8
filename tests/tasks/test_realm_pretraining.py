"""REALM pre-training task: the retrieval input pipeline, the loss against numpy, one training step."""
import dataclasses
import logging
import os
import time

import numpy as np
import pytest
import replica_steps  # tests/replica_steps.py
import tensorflow as tf
import tf_keras
import xla_steps  # tests/xla_steps.py (tests/ is on the path: tests/conftest.py)

from beam_jobs import embed_blocks
from realm_tf import config
from realm_tf import errors
from realm_tf.core import base_task
from realm_tf.core import precision
from realm_tf.data import block_store
from realm_tf.data import candidate_selection
from realm_tf.data import example_schemas
from realm_tf.index import brute_force_index
from realm_tf.index import index_loader
from realm_tf.index import index_publisher
from realm_tf.networks import bert_encoder
from realm_tf.tasks import realm_pretraining
from realm_tf.tasks import retrieval_augmented_input

TINY = "configs/tiny.yaml"


@pytest.fixture()
def setup(tmp_path, pretraining_workspace, workspace_overrides, parse_records):
    """A tiny config, the block store, the examples, and a brute-force index whose query embedder puts every
    query's own source block first (so exclusion is tested where it matters)."""
    cfg = config.load_config(TINY, workspace_overrides(tmp_path, pretraining_workspace))
    task = realm_pretraining.RealmPretrainingTask(cfg)
    blocks = block_store.BlockStore.load(f"{pretraining_workspace}/blocks/blocks-*.tfrecord*")
    files = tf.io.gfile.glob(f"{pretraining_workspace}/pretraining/pretraining-*")
    records = parse_records([r.numpy() for r in tf.data.TFRecordDataset(files)],
                            example_schemas.pretraining_feature_spec())
    dim = cfg.model.projection_size
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(len(blocks), dim)).astype(np.float32)  # [num_blocks, dim]
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)  # unit rows: a block is its own top-1
    index = brute_force_index.BruteForceIndex()
    index.build(embeddings)
    index_publisher.publish(cfg.index.index_dir, 3, embeddings, index,
                            {"vocab_hash": task.tokenizer.vocab_hash, "export_step": 3, "export_path": "none"}, 3)
    source_of = {tuple(r[example_schemas.QUERY_IDS]): r[example_schemas.SOURCE_BLOCK_ID] for r in records}
    cls, sep = task.tokenizer.cls_id, task.tokenizer.sep_id

    def embed(packed):  # query -> 10 x its source block's embedding: the source is by far the top-1
        ids = packed["input_word_ids"].numpy()
        mask = packed["input_mask"].numpy()
        out = []
        for row, m in zip(ids, mask):
            row = row[m == 1]
            assert row[0] == cls and row[-1] == sep
            out.append(10.0 * embeddings[source_of[tuple(row[1:-1].tolist())]])
        return np.stack(out)

    loader = index_loader.IndexLoader(cfg.index.index_dir, dim, task.tokenizer.vocab_hash, kind="brute_force")
    inputs = retrieval_augmented_input.RetrievalAugmentedInput(
        cfg, loader, blocks, task.tokenizer, query_embedder_for=lambda version, meta: (embed, 1234.5))
    return cfg, task, blocks, records, inputs


def test_null_document_first_source_block_never_a_candidate_and_packing(setup):
    cfg, task, blocks, records, inputs = setup
    k = cfg.model.num_candidates
    pattern = f"{cfg.data.pretraining_dir}/pretraining-*"
    dataset = inputs.dataset(pattern, batch_size=4, repeat=False, shuffle=False)
    by_query = {tuple(r[example_schemas.QUERY_IDS]): r for r in records}
    cls, sep, pad = task.tokenizer.cls_id, task.tokenizer.sep_id, task.tokenizer.pad_id
    seen = 0
    for batch in dataset:
        cands = batch["candidate_ids"].numpy()  # [4, k]
        assert cands.shape == (4, k) and (cands[:, 0] == candidate_selection.NULL_BLOCK).all()
        assert (batch["index_version"].numpy() == 3).all()
        assert (batch["index_age_seconds"].numpy() > time.time() - 1234.5 - 600).all()  # exported at t = 1234.5
        for i in range(4):
            q = batch["query_input_word_ids"].numpy()[i]
            x = q[1:list(q).index(sep)]  # the masked query's wordpieces
            record = by_query[tuple(x.tolist())]
            source = record[example_schemas.SOURCE_UID]
            for j in range(1, k):
                assert blocks.uids[cands[i, j]] != source  # the source (top-1 by construction) is excluded
            # Packing, checked against hand-built sequences.
            for j in range(k):
                block = batch["candidates_input_word_ids"].numpy()[i, j]
                reader = batch["reader_input_word_ids"].numpy()[i, j]
                if j == 0:
                    expect_block, doc = [cls, sep, sep], []
                else:
                    t, b = blocks.title_ids(cands[i, j]).tolist(), blocks.body_ids(cands[i, j]).tolist()
                    expect_block, doc = [cls] + t + [sep] + b + [sep], t + [sep] + b
                    expect_block = expect_block[:cfg.model.block_seq_length - 1] + [sep] \
                        if len(expect_block) > cfg.model.block_seq_length else expect_block
                assert block[block != pad].tolist() == expect_block
                budget = cfg.model.reader_seq_length - 3 - len(x)
                assert reader[reader != pad].tolist() == [cls] + x.tolist() + [sep] + doc[:budget] + [sep]
                positions = batch["masked_positions"].numpy()[i]
                weights = batch["target_weights"].numpy()[i]
                real = positions[weights > 0]
                assert real.tolist() == [p + 1 for p in record[example_schemas.MASK_POSITIONS]]
                assert (reader[real] == task.tokenizer.mask_id).all()
                assert batch["target_ids"].numpy()[i][weights > 0].tolist() == record[example_schemas.TARGET_IDS]
            seen += 1
    assert seen == len(records) // 4 * 4
    assert inputs.stats.excluded_source_blocks >= seen  # every query's source was retrieved, and dropped
    assert inputs.stats.versions == {3: seen // 4}


def test_trivial_retrieval_rate_keeps_the_source_block_of_that_share_of_queries(setup):
    cfg, _, blocks, records, inputs = setup
    pattern = f"{cfg.data.pretraining_dir}/pretraining-*"
    by_query = {tuple(r[example_schemas.QUERY_IDS]): r[example_schemas.SOURCE_UID].decode() for r in records}
    sep = inputs.tokenizer.sep_id
    kept = dropped = 0
    draws = np.random.default_rng(5)  # the pipeline draws one uniform number per query from its seed
    for batch in inputs.dataset(pattern, 4, repeat=False, shuffle=False, seed=5, trivial_retrieval_rate=0.5):
        keep = draws.random(4) < 0.5
        for i, cands in enumerate(batch["candidate_ids"].numpy()):
            q = batch["query_input_word_ids"].numpy()[i]
            source = by_query[tuple(q[1:list(q).index(sep)].tolist())]
            has_source = blocks.uids[cands[1]] == source  # top-1 by construction of the index
            assert has_source == keep[i]
            assert keep[i] or all(blocks.uids[c] != source for c in cands[1:])
            kept, dropped = kept + int(has_source), dropped + int(not has_source)
    assert kept > 0 and dropped > 0
    assert inputs.stats.trivial_retrievals_kept >= kept
    with pytest.raises(ValueError, match="trivial_retrieval_rate"):
        inputs.dataset(pattern, 4, trivial_retrieval_rate=1.5)


@pytest.mark.parametrize("split", ["heldout", "train"])
def test_evaluation_reads_the_salient_spans_of_its_split(setup, split):
    """``pretrain.eval_split``: the held-out salient spans (by source block), or the training split's in file order;
    never the random-masking fallback."""
    cfg, _, _, records, inputs = setup
    cfg = dataclasses.replace(cfg, pretrain=dataclasses.replace(cfg.pretrain, eval_split=split, eval_examples=10_000))
    task = realm_pretraining.RealmPretrainingTask(cfg)
    task.inputs, task.chief = inputs, True
    held = realm_pretraining.heldout_predicate(cfg.data.pretraining_heldout_fraction, heldout=True)(
        {example_schemas.SOURCE_UID: tf.constant([r[example_schemas.SOURCE_UID] for r in records])}).numpy()
    expected = [tuple(r[example_schemas.QUERY_IDS]) for r, h in zip(records, held)
                if h == (split == "heldout") and r[example_schemas.MASKING] == b"salient"]
    sep = inputs.tokenizer.sep_id
    read = [tuple(q[1:list(q).index(sep)].tolist())
            for features, _ in task.eval_inputs() for q in features["query_input_word_ids"].numpy()]
    batch = cfg.data.batch_size
    assert read and read == expected[:len(expected) // batch * batch]  # whole batches, in file order


@pytest.mark.parametrize("keep,force", [(False, False), (True, False), (True, True)])
def test_held_out_evaluation_keeps_the_source_block_only_when_asked(setup, keep, force):
    """``pretrain.eval_keep_source_block``: the copying test reads each held-out query's source block (the index
    ranks it first here; ``force_source_block`` puts it first anyway); REALM's evaluation never does. The
    ``source_column`` label names the candidate that is the source."""
    cfg, _, blocks, records, inputs = setup
    cfg = dataclasses.replace(cfg, pretrain=dataclasses.replace(cfg.pretrain, eval_keep_source_block=keep,
                                                                force_source_block=force))
    task = realm_pretraining.RealmPretrainingTask(cfg)
    task.inputs, task.chief = inputs, True
    by_query = {tuple(r[example_schemas.QUERY_IDS]): r[example_schemas.SOURCE_UID].decode() for r in records}
    sep = inputs.tokenizer.sep_id
    queries, forced_before = 0, inputs.stats.sources_forced
    for features, labels in task.eval_inputs():
        for q, cands in zip(features["query_input_word_ids"].numpy(), labels["candidate_ids"].numpy()):
            source = by_query[tuple(q[1:list(q).index(sep)].tolist())]
            assert (blocks.uids[cands[1]] == source) == keep
            assert keep or all(blocks.uids[c] != source for c in cands[1:])
            queries += 1
        assert labels["source_column"].numpy().tolist() == [1 if keep else -1] * len(labels["source_column"])
    forced = inputs.stats.sources_forced - forced_before  # (the pipeline may retrieve a batch ahead)
    assert queries > 0 and (forced >= queries if force else forced == 0)


def test_trivial_retrievals_need_a_frozen_retriever(tmp_path, pretraining_workspace, workspace_overrides):
    cfg = config.load_config(TINY, workspace_overrides(tmp_path, pretraining_workspace) + [
        "pretrain.trivial_retrieval_rate_while_frozen=0.5", "refresh.mode=external"])
    with pytest.raises(config.ConfigError, match="freeze_retriever_steps"):
        realm_pretraining.pretrain(cfg, evaluate=False)


def test_evaluate_against_numpy(setup):
    cfg, task, _, _, inputs = setup
    model = task.build_model()
    # Half the queries read their source block: the scores on them, reading it alone and marginally, too.
    dataset = inputs.dataset(f"{cfg.data.pretraining_dir}/pretraining-*", 4, repeat=False, shuffle=False, seed=3,
                             trivial_retrieval_rate=0.5, force_source=True).take(3)
    scores = task.evaluate(model, dataset.map(base_task.split_features(realm_pretraining.is_model_input)))
    correct = np.zeros(2)  # [with retrieval, null only]
    correct_found, count, count_found, n = np.zeros(2), 0.0, 0.0, 0
    held, correct_source, count_source = 0, np.zeros(2), 0.0  # [alone, marginal]
    for batch in dataset:
        out = model({k: v for k, v in batch.items() if k.startswith(("query_", "candidates_", "reader_", "masked"))})
        retrieval = out["retrieval_logits"].numpy().astype(np.float64)  # [b, k]
        p_z = np.exp(retrieval - np.logaddexp.reduce(retrieval, axis=1, keepdims=True))
        logits = out["mlm_logits"].numpy().astype(np.float64)  # [b, k, masked, vocab]
        p_y = np.exp(logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True))
        marginal = np.einsum("bk,bkmv->bmv", p_z, p_y).argmax(-1)  # [b, masked]
        null = p_y[:, 0].argmax(-1)  # [b, masked]
        targets, weights = batch["target_ids"].numpy(), batch["target_weights"].numpy()
        found = realm_pretraining.span_in_candidates(batch).any(axis=1)  # [b]
        for i in range(len(targets)):
            hits = np.array([((marginal[i] == targets[i]) * weights[i]).sum(),
                             ((null[i] == targets[i]) * weights[i]).sum()])
            correct += hits
            count += weights[i].sum()
            if found[i]:
                correct_found += hits
                count_found += weights[i].sum()
            column = int(batch["source_column"][i])
            if column >= 0:
                held += 1
                correct_source += [((p_y[i, column].argmax(-1) == targets[i]) * weights[i]).sum(), hits[0]]
                count_source += weights[i].sum()
            n += 1
    assert scores["num_examples"] == n == 12
    np.testing.assert_allclose([scores["mlm_accuracy"], scores["mlm_accuracy_null_only"]], correct / count, atol=1e-6)
    np.testing.assert_allclose([scores["mlm_accuracy_span_retrieved"], scores["mlm_accuracy_null_only_span_retrieved"]],
                               correct_found / max(count_found, 1.0), atol=1e-6)
    assert 0 < held < n and scores["source_in_candidates"] == held / n
    np.testing.assert_allclose([scores["mlm_accuracy_source_alone"], scores["mlm_accuracy_source_held"]],
                               correct_source / count_source, atol=1e-6)


def _numpy_log_marginal(model, batch):
    """−log p(y|x) from separate calls of each tower, combined in float64 numpy (independent of the task)."""
    keys = bert_encoder.INPUT_KEYS
    out = []
    b, k = batch["candidate_ids"].shape
    for i in range(b):
        q = model.retriever.embed_queries({key: batch["query_" + key][i:i + 1] for key in keys}).numpy()[0]
        d = model.retriever.embed_blocks({key: batch["candidates_" + key][i] for key in keys}).numpy()  # [k, dim]
        scores = (d.astype(np.float64) @ q.astype(np.float64))  # [k]
        log_pz = scores - np.logaddexp.reduce(scores)
        positions = np.tile(batch["masked_positions"][i:i + 1].numpy(), [k, 1])
        logits = model.encoder({**{key: batch["reader_" + key][i] for key in keys},
                                "masked_positions": positions})["mlm_logits"].numpy().astype(np.float64)
        log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)  # [k, masked, vocab]
        targets = batch["target_ids"].numpy()[i]
        weights = batch["target_weights"].numpy()[i]
        log_py = np.array([sum(w * log_probs[z, m, t] for m, (t, w) in enumerate(zip(targets, weights)))
                           for z in range(k)])
        out.append(-np.logaddexp.reduce(log_pz + log_py))
    return np.array(out)


def test_loss_matches_numpy_with_fixed_candidates_and_one_step_trains_every_tower(setup):
    cfg, task, _, _, inputs = setup
    model = task.build_model()
    batch = next(iter(inputs.dataset(f"{cfg.data.pretraining_dir}/pretraining-*", 2, repeat=False, shuffle=False)))
    features, labels = base_task.split_features(realm_pretraining.is_model_input)(batch)
    per_example, terms = task.build_losses(labels, model(features, training=False))
    np.testing.assert_allclose(per_example.numpy(), _numpy_log_marginal(model, batch), rtol=1e-4, atol=1e-4)
    assert np.isfinite(terms["retrieval_utility"].numpy()).all()

    optimizer = tf_keras.optimizers.SGD(0.5)
    step = tf.Variable(7, dtype=tf.int64)
    before = {v.name: v.numpy().copy() for v in model.trainable_variables}
    logs = task.train_step((features, labels), model, optimizer, global_step=step)
    assert logs["off_policy_delay_steps"].numpy() == 7 - 3  # trainer step 7, index exported at step 3
    assert logs["off_policy_delay_seconds"].numpy() > 0
    changed = {v.name for v in model.trainable_variables if not np.array_equal(before[v.name], v.numpy())}
    for tower in ("query_embedder/", "doc_embedder/", "reader_bert/", "masked_lm/"):
        assert any(tower in n and ("layer_0" in n or "masked_lm" in tower) for n in changed), tower


def test_a_mixed_bfloat16_model_gives_a_float32_loss_close_to_float32_and_trains(setup):
    cfg, task, _, _, inputs = setup
    with precision.policy_scope("mixed_bfloat16"):  # as `realm-tf pretrain` builds it for pretrain.precision
        mixed = task.build_model()
    exact = task.build_model()
    exact.set_weights(mixed.get_weights())
    batch = next(iter(inputs.dataset(f"{cfg.data.pretraining_dir}/pretraining-*", 2, repeat=False, shuffle=False)))
    features, labels = base_task.split_features(realm_pretraining.is_model_input)(batch)
    outputs = mixed(features, training=False)
    assert outputs["mlm_logits"].dtype == tf.float32
    got, _ = task.build_losses(labels, outputs)
    want, _ = task.build_losses(labels, exact(features, training=False))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0.02)
    before = {v.name: v.numpy().copy() for v in mixed.trainable_variables}
    logs = task.train_step((features, labels), mixed, tf_keras.optimizers.SGD(0.5),
                           global_step=tf.Variable(7, dtype=tf.int64))
    assert all(np.isfinite(value.numpy()).all() for value in logs.values())
    changed = {v.name for v in mixed.trainable_variables if not np.array_equal(before[v.name], v.numpy())}
    for tower in ("query_embedder/", "doc_embedder/", "reader_bert/", "masked_lm/"):
        assert any(tower in name for name in changed), tower


def test_heldout_split_is_disjoint_and_stable(setup):
    cfg, _, _, records, _ = setup
    uids = tf.constant([r[example_schemas.SOURCE_UID] for r in records])
    train = realm_pretraining.heldout_predicate(0.3, heldout=False)({example_schemas.SOURCE_UID: uids}).numpy()
    held = realm_pretraining.heldout_predicate(0.3, heldout=True)({example_schemas.SOURCE_UID: uids}).numpy()
    assert (train ^ held).all() and 0 < held.sum() < len(records)
    # Examples of the same source block land on the same side.
    side = {}
    for uid, h in zip(uids.numpy(), held):
        assert side.setdefault(uid, h) == h


def test_pipeline_refuses_an_index_of_another_corpus(setup, tmp_path):
    cfg, task, blocks, _, inputs = setup
    small = block_store.BlockStore([[1]], [[2]], ["u"], source="one-block")
    with pytest.raises(Exception, match="another corpus"):
        retrieval_augmented_input.RetrievalAugmentedInput(cfg, inputs.loader, small, task.tokenizer)
    assert os.path.isdir(cfg.index.index_dir)


def test_query_embedder_export_is_found_after_the_run_moved(tmp_path):
    """index.json records where its export was; a run moved (or started from another directory) falls back
    to <refresh.export_dir>/<version>, and only to an export of that very step."""
    from realm_tf.export import retriever_export  # pylint: disable=import-outside-toplevel
    from realm_tf.models import knowledge_retriever  # pylint: disable=import-outside-toplevel

    cfg = config.load_config("configs/tiny.yaml", [f"refresh.export_dir={tmp_path}/export"])
    retriever = knowledge_retriever.build_knowledge_retriever(cfg.model)
    path = retriever_export.export_retriever(retriever, cfg, 7)
    moved = {"export_path": "old/place/export/7"}
    embed, exported_at = retriever_export.load_query_embedder(7, moved, export_dir=f"{tmp_path}/export")
    assert exported_at == retriever_export.read_export_metadata(path)["exported_at"]
    packed = {"input_word_ids": tf.constant([[101, 2000, 102, 0]], tf.int32),
              "input_mask": tf.constant([[1, 1, 1, 0]], tf.int32), "input_type_ids": tf.zeros([1, 4], tf.int32)}
    np.testing.assert_allclose(embed(packed), retriever.embed_queries(packed, training=False).numpy(), atol=1e-5)
    with pytest.raises(Exception, match="which no longer exists"):
        retriever_export.load_query_embedder(7, moved)
    os.rename(path, f"{tmp_path}/export/8")  # the export of step 7 under another version's name
    with pytest.raises(Exception, match="which no longer exists"):
        retriever_export.load_query_embedder(8, moved, export_dir=f"{tmp_path}/export")


def test_query_similarity_against_numpy():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(5, 8)).astype(np.float32)  # [batch, dim]
    unit = q / np.linalg.norm(q, axis=1, keepdims=True)
    cos = unit @ unit.T
    expected = (cos.sum(1) - np.diag(cos)) / 4
    np.testing.assert_allclose(realm_pretraining.query_similarity(tf.constant(q)).numpy(), expected, atol=1e-6)
    collapsed = np.tile(q[:1], [3, 1]) * np.array([[1.0], [2.0], [3.0]], np.float32)  # one direction
    np.testing.assert_allclose(realm_pretraining.query_similarity(tf.constant(collapsed)).numpy(), 1.0, atol=1e-6)
    assert realm_pretraining.query_similarity(tf.constant(q[:1])).numpy().tolist() == [0.0]


def test_reader_only_step_leaves_the_retriever_alone(setup):
    cfg, task, _, _, inputs = setup
    model = task.build_model()
    batch = next(iter(inputs.dataset(f"{cfg.data.pretraining_dir}/pretraining-*", 2, repeat=False, shuffle=False)))
    before = {v.name: v.numpy().copy() for v in model.trainable_variables}
    task.train_step(base_task.split_features(realm_pretraining.is_model_input)(batch), model,
                    tf_keras.optimizers.SGD(0.5), global_step=tf.Variable(1, dtype=tf.int64), train_retriever=False)
    changed = {v.name for v in model.trainable_variables if not np.array_equal(before[v.name], v.numpy())}
    assert any("reader_bert/" in n for n in changed) and any("masked_lm/" in n for n in changed)
    assert not [n for n in changed if "knowledge_retriever" in n]


def test_staged_pretraining_warms_the_head_freezes_then_trains_the_retriever(tmp_path, pretraining_workspace,
                                                                             workspace_overrides, read_scalars,
                                                                             parse_records, caplog):
    """Head warm-up, a frozen retriever, then a trained one; and the held-out evaluation at the end scores the
    held-out salient spans of the shards given as ``eval_pattern`` (here: a strict subset of them)."""
    cfg = config.load_config(TINY, workspace_overrides(tmp_path, pretraining_workspace) + [
        "pretrain.steps=4", "pretrain.freeze_retriever_steps=2", "pretrain.mlm_head_warmup_blocks=16",
        "pretrain.checkpoint_every_steps=1", "pretrain.keep_checkpoints=10", "pretrain.summary_every_steps=1",
        "refresh.mode=external", "refresh.export_every_steps=1", "pretrain.trivial_retrieval_rate_while_frozen=1.0",
        "pretrain.eval_examples=1000", "data.pretraining_heldout_fraction=0.5"])
    files = tf.io.gfile.glob(f"{pretraining_workspace}/pretraining/pretraining-*")
    serialized = [r.numpy() for r in tf.data.TFRecordDataset(files)]
    records = parse_records(serialized, example_schemas.pretraining_feature_spec())
    uids = tf.constant([r[example_schemas.SOURCE_UID] for r in records])
    held = realm_pretraining.heldout_predicate(0.5, heldout=True)({example_schemas.SOURCE_UID: uids}).numpy()
    salient_held = [s for s, r, h in zip(serialized, records, held)
                    if h and r[example_schemas.MASKING] == b"salient"]
    batch = cfg.data.batch_size  # the held-out batches are whole ones
    kept = salient_held[:(len(salient_held) // 2 // batch + 1) * batch]
    assert batch <= len(kept) < len(salient_held)  # a strict subset: only the given shards are read
    os.makedirs(tmp_path / "eval")
    with tf.io.TFRecordWriter(str(tmp_path / "eval" / "pretraining-00000-of-00001.tfrecord")) as writer:
        for record in kept:
            writer.write(record)
    result = realm_pretraining.pretrain(cfg, eval_pattern=str(tmp_path / "eval" / "pretraining-*"),
                                        index_builder=embed_blocks.embed_and_publish)
    assert result["step"] == 4
    assert result["eval"]["num_examples"] == len(kept)
    assert result["trivial_retrievals_kept"] >= 0 and result["index_versions"]
    # Exports only once the retriever trains (the bootstrap export of step 0 built the first index).
    assert sorted(int(n) for n in os.listdir(cfg.refresh.export_dir) if n.isdigit()) == [0, 3]

    def weights(step, prefix):
        reader = tf.train.load_checkpoint(f"{cfg.pretrain.model_dir}/checkpoints/ckpt-{step}")
        keys = [k for k in reader.get_variable_to_shape_map() if k.startswith(prefix)
                and k.endswith("/.ATTRIBUTES/VARIABLE_VALUE") and "OPTIMIZER_SLOT" not in k]
        assert keys, prefix
        return {k: reader.get_tensor(k) for k in keys}

    def same(a, b):
        return all(np.array_equal(a[k], b[k]) for k in a)

    retriever = {s: weights(s, "model/retriever/") for s in (1, 2, 3)}
    reader = {s: weights(s, "model/encoder/") for s in (1, 2)}
    assert same(retriever[1], retriever[2]) and not same(retriever[2], retriever[3])
    assert not same(reader[1], reader[2])
    scalars = read_scalars(f"{cfg.pretrain.model_dir}/train")
    assert scalars["mlm_head_warmup/positions"][0][1] > 0
    assert len(scalars["query_similarity"]) == 4

    # --eval-only (``evaluate --experiment pretrain``): the latest checkpoint scored again; nothing trained or saved.
    params = (tmp_path / "model" / "params.yaml").read_text()
    checkpoints = sorted(os.listdir(f"{cfg.pretrain.model_dir}/checkpoints"))
    again = realm_pretraining.pretrain(cfg, eval_pattern=str(tmp_path / "eval" / "pretraining-*"), train=False)
    assert again["step"] == 4 and sorted(os.listdir(f"{cfg.pretrain.model_dir}/checkpoints")) == checkpoints
    assert again["eval"] == pytest.approx(result["eval"], rel=1e-5)
    assert (tmp_path / "model" / "params.yaml").read_text() == params
    # The copying test on the training split: its own TensorBoard run, named in the printed summary. Each query's
    # source block is forced among its candidates, whatever the (random, tiny) retriever ranks first.
    copying = dataclasses.replace(cfg, pretrain=dataclasses.replace(
        cfg.pretrain, eval_split="train", eval_keep_source_block=True, force_source_block=True, eval_examples=16))
    other = realm_pretraining.pretrain(copying, eval_pattern=f"{pretraining_workspace}/pretraining/pretraining-*",
                                       train=False)
    assert other["eval_name"] == "eval_train_source_forced" and result["eval_name"] == "eval"
    assert other["eval"]["num_examples"] == 16 and other["eval"]["span_recall"] == 1.0
    assert other["eval"]["source_in_candidates"] == 1.0
    assert set(read_scalars(f"{cfg.pretrain.model_dir}/eval_train_source_forced")) >= {"mlm_accuracy", "span_recall"}
    assert read_scalars(f"{cfg.pretrain.model_dir}/eval")["mlm_accuracy"][-1][1] == pytest.approx(
        result["eval"]["mlm_accuracy"], rel=1e-5)  # the held-out curve holds only held-out scores
    assert "training-split salient spans" in realm_pretraining.format_result(other)
    assert "source block forced in" in realm_pretraining.format_result(other)
    assert "held-out salient spans" in realm_pretraining.format_result(again)
    with caplog.at_level(logging.WARNING, logger="realm_tf.tasks.realm_pretraining"):
        # The eval shards hold held-out spans only: nothing of the training split to score, and the log says so.
        empty = realm_pretraining.pretrain(copying, eval_pattern=str(tmp_path / "eval" / "pretraining-*"), train=False)
    assert empty["eval"]["num_examples"] == 0 and "scored no example" in caplog.text
    elsewhere = dataclasses.replace(cfg, pretrain=dataclasses.replace(cfg.pretrain, model_dir=str(tmp_path / "none")))
    with pytest.raises(errors.UserError, match="no checkpoint to evaluate"):
        realm_pretraining.pretrain(elsewhere, train=False)


def test_span_in_candidates_against_the_blocks_themselves(setup):
    cfg, task, blocks, _, inputs = setup
    sep = task.tokenizer.sep_id
    budget = cfg.model.reader_seq_length - 3
    checked = 0
    for batch in inputs.dataset(f"{cfg.data.pretraining_dir}/pretraining-*", 4, repeat=False, shuffle=False):
        found = realm_pretraining.span_in_candidates(batch)
        for b, cands in enumerate(batch["candidate_ids"].numpy()):
            span = [t for t, w in zip(batch["target_ids"].numpy()[b], batch["target_weights"].numpy()[b]) if w > 0]
            query_len = int(batch["query_input_mask"].numpy()[b].sum()) - 2
            for j in range(1, len(cands)):
                doc = blocks.title_ids(cands[j]).tolist() + [sep] + blocks.body_ids(cands[j]).tolist()
                doc = doc[:min(len(doc), max(budget - query_len, budget // 2))] + [sep]
                expected = any(doc[i:i + len(span)] == span for i in range(len(doc) - len(span) + 1))
                assert found[b, j - 1] == expected, (b, j)
                checked += 1
    assert checked > 0
    # And on a hand-made batch where candidate 2 holds the span and candidate 1 holds it out of order.
    words = np.array([[[101, 7, 103, 103, 102, 0, 0, 0, 0], [101, 7, 103, 103, 102, 9, 5, 6, 102],
                       [101, 7, 103, 103, 102, 5, 6, 9, 102]]])  # [1, 3, 9]
    types = np.array([[[0] * 5 + [1] * 4] * 3])
    mask = (words > 0).astype(np.int32)
    batch = {"reader_input_word_ids": tf.constant(words), "reader_input_type_ids": tf.constant(types),
             "reader_input_mask": tf.constant(mask), "target_ids": tf.constant([[6, 9, 0]]),
             "target_weights": tf.constant([[1.0, 1.0, 0.0]])}
    assert realm_pretraining.span_in_candidates(batch).tolist() == [[False, True]]


@pytest.mark.parametrize("start,frozen,every,steps,expected", [
    (0, 0, 2, 4, [2]),  # never at the run's last step
    (0, 100, 100, 200, []),  # the retriever trains from 101, and 200 is the last step: no refresh at all
    (200, 100, 100, 400, [300]),  # a resumed run: only the steps after its start
    (400, 100, 50, 600, [450, 500, 550]),
    (0, 3, 2, 10, [4, 6, 8]),  # not while frozen
    (0, 0, 0, 10, []),  # 0: never
])
def test_export_steps_are_strictly_inside_the_run_and_after_the_freeze(start, frozen, every, steps, expected):
    cfg = config.load_config(TINY, [f"pretrain.freeze_retriever_steps={frozen}", f"refresh.export_every_steps={every}",
                                    f"pretrain.steps={steps}"])
    assert list(realm_pretraining.export_steps(cfg, start)) == expected
    # The hook's rule, counted step by step: after the freeze, before the last step, on a multiple of the interval.
    assert expected == [s for s in range(start + 1, steps + 1) if every and s % every == 0 and frozen < s < steps]


def test_the_step_compiles_with_xla_on_a_static_batch_and_updates_as_without(setup):
    """The step compiled with XLA computes what the uncompiled step does: with plain gradient descent (whose
    update is the gradient itself, so rounding is not amplified as in Adam's first step, which moves every weight
    by the rate whatever its gradient) it gives the uncompiled step's weights to rounding of the largest update.
    (The contract with AdamW, through the product's loop: ``test_the_step_is_one_xla_program_traced_once``.)"""
    cfg, task, blocks, _, _ = setup
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, static_padding=True))
    inputs = retrieval_augmented_input.RetrievalAugmentedInput(
        cfg, setup[4].loader, blocks, task.tokenizer, query_embedder_for=setup[4]._query_embedder_for)
    dataset = inputs.dataset(f"{cfg.data.pretraining_dir}/pretraining-*", 2, repeat=False, shuffle=False)
    for key, spec in dataset.element_spec.items():
        assert spec.dtype not in (tf.string, tf.float64), key
        assert all(d is not None for d in spec.shape[1:]), (key, spec.shape)
    batch = base_task.split_features(realm_pretraining.is_model_input)(next(iter(dataset)))
    task = realm_pretraining.RealmPretrainingTask(cfg)
    model = task.build_model()
    model(batch[0], training=False)
    start = [v.numpy() for v in model.trainable_variables]
    updates = []
    for jit in (False, True):
        for variable, value in zip(model.trainable_variables, start):
            variable.assign(value)
        sgd = tf_keras.optimizers.SGD(1.0)
        step = tf.function(lambda b, sgd=sgd: task.train_step(b, model, sgd), jit_compile=jit, autograph=False)
        logs = step(batch)
        assert np.isfinite(logs["loss"].numpy()) and logs["off_policy_delay_seconds"].numpy() > 0
        updates.append([v.numpy() - value for v, value in zip(model.trainable_variables, start)])
    scale = max(np.abs(u).max() for u in updates[0])  # a small gradient (the retriever's, whose candidates
    # all read alike at initialisation) is a cancellation residue: compare rounding to the largest update
    assert scale > 0
    for eager, xla in zip(*updates):
        np.testing.assert_allclose(xla, eager, rtol=0, atol=1e-4 * scale)


@pytest.mark.slow  # the step compiled with XLA and trained: tens of CPU-seconds
@pytest.mark.parametrize("frozen, precision", [(True, "mixed_bfloat16"), (False, "float32")])
def test_the_step_is_one_xla_program_traced_once(tmp_path, pretraining_workspace, workspace_overrides, frozen,
                                                 precision):
    """The product's loop with ``jit_compile``: the retriever frozen for the whole run (the reader's phase) or
    trained from step 1, in each precision."""
    cfg = config.load_config(TINY, workspace_overrides(tmp_path, pretraining_workspace) + [
        "data.static_padding=true", "pretrain.jit_compile=true", "pretrain.steps=3", "refresh.mode=external",
        f"pretrain.freeze_retriever_steps={3 if frozen else 0}", f"pretrain.precision={precision}"])
    task = realm_pretraining.RealmPretrainingTask(cfg, evaluate=False, index_builder=embed_blocks.embed_and_publish)
    run = xla_steps.run_compiled(task)
    retriever = [i for i, v in enumerate(run.result["model"].variables) if "knowledge_retriever" in v.name]
    assert retriever and all(np.array_equal(run.states[0][i], run.states[-1][i]) for i in retriever) == frozen


@pytest.mark.slow  # a child process training the job twice
@pytest.mark.parametrize("frozen", [True, False])
def test_two_replicas_train_as_one(tmp_path, pretraining_workspace, workspace_overrides, frozen):
    """AdamW through the product's driver, the retriever frozen (the reader's phase) or trained. Trained, the
    retriever's gradients at initialisation are a cancellation residue (its candidates read alike), which Adam
    normalises to updates of the rate's size: their rounding, not only the reader's, reaches the weights, so the
    tolerance is an eighth of the largest update (the reader and the frozen run agree to 1e-6 or better). Trained,
    each replica also reads its two queries one at a time (gradient accumulation)."""
    replica_steps.check_two_replicas_train_as_one(
        "realm_tf.tasks.realm_pretraining:RealmPretrainingTask", "pretrain",
        workspace_overrides(tmp_path, pretraining_workspace) + [
            "data.batch_size=4", "pretrain.steps=3", "pretrain.learning_rate=1e-3", "refresh.mode=external",
            f"pretrain.freeze_retriever_steps={3 if frozen else 0}"],
        str(tmp_path), kwargs={"evaluate": False},
        callables={"index_builder": "beam_jobs.embed_blocks:embed_and_publish"}, atol=1e-4 if frozen else 2.5e-4,
        accumulation=1 if frozen else 2)
