"""RETRO language modelling on the tiny workspace: the chunk database, sequences with neighbours from other
documents only, the next-token loss against numpy, training the baseline, RETRO and a RETRO-fit."""
import hashlib
import json

import numpy as np
import pytest
import replica_steps  # tests/replica_steps.py
import tensorflow as tf
import xla_steps  # tests/xla_steps.py (tests/ is on the path: tests/conftest.py)

from beam_jobs import build_knn_datastore
from realm_tf import cli
from realm_tf import config
from realm_tf.retro import lm_evaluation
from realm_tf.retro import retro_lm
from realm_tf.retro import retro_sequences

TINY = "configs/tiny.yaml"


def test_training_sequences_come_from_training_documents_with_neighbours_from_others(retro_sets):
    _, sets = retro_sets
    task = retro_lm.RetroLmTask(config.load_config(TINY, sets))
    splits = {d: retro_sequences.document_split(d, 0.2, 0.1) for d in set(task.store.doc_ids)}
    assert {"train", "validation"} <= set(splits.values())
    train_docs = task.documents("train")
    assert train_docs and all(splits[d] == "train" for d, _ in train_docs)
    examples = list(task.examples("train"))
    assert len(examples) == sum(-(-len(s) // 32) for _, s in train_docs)
    stream = dict(train_docs)[train_docs[0][0]]
    first = examples[0]
    assert first["input_ids"][:first["input_mask"].sum()].tolist() == stream[:32].tolist()[:first["input_mask"].sum()]
    assert first["targets"][:-1].tolist() == first["input_ids"][1:].tolist()
    assert first["neighbour_ids"].shape == (4, 2, 16)
    # the chunk database's chunks of that sequence's document are never its neighbours
    own = task.store.document_of(train_docs[0][0])
    sources = [d for d, s in train_docs for _ in range(-(-len(s) // 32))]
    for example, doc_id in list(zip(examples, sources))[:6]:
        chunk_ids = task.retriever.neighbours(example["input_ids"], doc_id).chunk_ids
        assert (task.store.doc_index[chunk_ids[chunk_ids >= 0]] != task.store.document_of(doc_id)).all()
    assert own >= 0
    # training neighbours come from the training documents only (held-out text is never retrieved in training)
    table = task.neighbour_table("train")
    train_rows = np.flatnonzero(task.chunk_splits == "train")
    chosen = table[train_rows]
    assert (chosen >= 0).any() and (task.chunk_splits[chosen[chosen >= 0]] == "train").all()
    assert (task.store.doc_index[np.where(chosen >= 0, chosen, 0)] != task.store.doc_index[train_rows][:, None])[
        chosen >= 0].all()
    assert (table[task.chunk_splits != "train"] == -1).all()


def test_database_documents_are_retrieved_in_training_but_never_trained_on(retro_sets):
    _, sets = retro_sets
    task = retro_lm.RetroLmTask(config.load_config(TINY, sets + ["retro.training_document_fraction=0.4"]))
    splits = {d: retro_sequences.document_split(d, 0.2, 0.1, 0.4) for d in set(task.store.doc_ids)}
    assert {"train", "database", "validation"} <= set(splits.values())
    assert {d for d, _ in task.documents("train")} == {d for d, s in splits.items() if s == "train"}
    table = task.neighbour_table("train")  # [num_chunks, k]
    chosen = table[task.chunk_splits == "train"]
    found = task.chunk_splits[chosen[chosen >= 0]]
    assert "database" in set(found) and set(found) <= {"train", "database"}  # never held-out text
    np.testing.assert_array_equal(task.allowed_chunks("train_only"),
                                  np.isin(task.chunk_splits, ["train", "database"]))


def test_loss_is_the_mean_next_token_nll_over_real_tokens():
    task = retro_lm.RetroLmTask(config.load_config(TINY))
    rng = np.random.default_rng(0)
    logits = rng.normal(size=[2, 5, 7]).astype(np.float32)
    targets = rng.integers(0, 7, size=[2, 5]).astype(np.int32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    per_example, terms = task.build_losses({"targets": targets, "target_mask": mask}, {"logits": logits})
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]  # [2, 5]
    np.testing.assert_allclose(per_example.numpy(), (nll * mask).sum(1) / mask.sum(1), rtol=1e-5)
    np.testing.assert_allclose(terms["tokens"].numpy(), [3, 5])
    # bits-per-byte over real wordpieces (whole words and ## pieces; the first 7 ids are special tokens).
    vocab = task.tokenizer.vocab
    lengths = np.array([0 if (t.startswith("[") and t.endswith("]")) else
                        len(t[2:].encode()) if t.startswith("##") else len(t.encode()) + 1 for t in vocab])
    logits = rng.normal(size=[2, 5, len(vocab)]).astype(np.float32)
    targets = rng.integers(1000, len(vocab), size=[2, 5]).astype(np.int32)
    _, terms = task.build_losses({"targets": targets, "target_mask": mask}, {"logits": logits})
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]  # [2, 5]
    metrics = task.build_metrics({"targets": targets, "target_mask": mask}, terms)
    expected_bpb = (nll * mask).sum() / (np.log(2) * (lengths[targets] * mask).sum())
    np.testing.assert_allclose(metrics["bits_per_byte"].numpy(), expected_bpb, rtol=1e-5)
    np.testing.assert_allclose(metrics["tokens"].numpy(), 8)


def test_baseline_then_retro_fit_trains_only_the_retro_layers(trained, read_scalars):
    root, sets = trained
    assert tf.train.latest_checkpoint(str(root / "baseline" / "checkpoints")).endswith("-3")
    losses = [v for _, v in read_scalars(root / "baseline" / "train")["loss"]]
    assert len(losses) == 3 and all(np.isfinite(losses))
    scalars = read_scalars(root / "baseline" / "train")
    assert all(v > 0 for _, v in scalars["tokens_per_second"]) and all(v > 0 for _, v in scalars["bits_per_byte"])
    baseline_values = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(root / "baseline" / "checkpoints"))))
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(root / "fit" / "checkpoints")))
    before = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(root / "baseline" / "checkpoints")))
    shared = [n for n in baseline_values if n.startswith("model/") and "OPTIMIZER_SLOT" not in n
              and reader.has_tensor(n)]
    assert shared  # the decoder's own weights: copied from the baseline and left alone
    for name in shared:
        np.testing.assert_array_equal(reader.get_tensor(name), before.get_tensor(name))
    fitted = [n for n, _ in tf.train.list_variables(tf.train.latest_checkpoint(str(root / "fit" / "checkpoints")))
              if "cca" in n and "OPTIMIZER_SLOT" not in n]
    assert fitted  # the RETRO layers exist and were trained


def _numpy_bits_per_byte(task, model, split, neighbours):
    """Σ NLL / (ln 2 · bytes) over the real targets of ``split``, from the model's logits and numpy only."""
    vocab = task.tokenizer.vocab
    lengths = np.array([0 if (t.startswith("[") and t.endswith("]")) else
                        len(t[2:].encode()) if t.startswith("##") else len(t.encode()) + 1 for t in vocab])
    examples = list(task.examples(split, neighbours=neighbours))
    stacked = {k: np.stack([e[k] for e in examples]) for k in examples[0]}
    inputs = {k: stacked[k] for k in ("input_ids", "neighbour_ids", "neighbour_mask") if k in stacked}
    logits = np.concatenate([model({k: v[i:i + 64] for k, v in inputs.items()}, training=False)["logits"].numpy()
                             for i in range(0, len(examples), 64)]).astype(np.float64)  # [S, n, V]
    top = logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits - top).sum(-1, keepdims=True)) - top  # [S, n, V]
    real, targets = stacked["target_mask"], stacked["targets"]  # [S, n]
    nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0][real].sum()
    return nll / (np.log(2) * lengths[targets[real]].sum())


def test_evaluate_lm_and_knn_datastore_match_numpy(trained, capsys, progress_totals, portable_runner):
    from realm_tf.retro import knn_datastore
    from realm_tf.retro import lm_evaluation

    root, sets = trained
    fit = sets + [f"retro_trainer.model_dir={root}/fit", f"retro.knn_dir={root}/knn", "retro.knn_neighbours=8"]
    cfg = config.load_config(TINY, fit)
    task = retro_lm.RetroLmTask(cfg)
    model = lm_evaluation.restore_decoder(task, str(root / "fit"))
    for neighbours in (True, False):  # RETRO with retrieval on, and off (all neighbours masked)
        result = lm_evaluation.evaluate(cfg, str(root / "fit"), retrieval=True, split="validation",
                                        neighbours=neighbours)
        np.testing.assert_allclose(result["bpb_wordpieces"]["1.0"],
                                   _numpy_bits_per_byte(task, model, "validation", neighbours), rtol=1e-4)
        # bpb counts the original text's bytes: the same NLL over the documents' own UTF-8 bytes, every byte of a
        # document's blocks but those before each sequence's unscored first token (numpy: the texts' lengths)
        texts = task.document_texts
        docs = dict(task.document_chunks("validation"))
        per_sequence = cfg.retro.sequence_length // cfg.retro.chunk_length  # chunks; a sequence's first is unscored
        unscored = sum(int(task.original_bytes(int(c))[0]) for ids in docs.values() for c in ids[::per_sequence])
        assert result["bytes"] == sum(len(t.encode("utf-8")) for d in docs for t in texts[d]) - unscored
        np.testing.assert_allclose(result["bpb"]["1.0"], result["bpb_wordpieces"]["1.0"] *
                                   result["wordpiece_bytes"] / result["bytes"], rtol=1e-9)
        assert result["chunks"]["0.0"] <= result["chunks"]["0.5"] <= result["chunks"]["1.0"]
        assert sum(result["chunks_by_bucket"].values()) == result["chunks"]["1.0"]  # the buckets partition them
        documents = result["per_document"]  # the same bits and bytes, split by document
        assert sum(documents["bytes"]) == result["bytes"] and len(documents["documents"]) == len(docs)
        np.testing.assert_allclose(sum(documents["bits"]) / sum(documents["bytes"]), result["bpb"]["1.0"], rtol=1e-9)
        assert result["chunks_by_bucket"]["0"] == result["chunks"]["0.0"]
        later = result["later_chunks"]  # the chunks after each sequence's first: fewer chunks, same buckets
        first = {int(ids[i]) for ids in docs.values() for i in range(0, ids.size, per_sequence)}
        later_chunks = {c for ids in docs.values() for c in ids.tolist()} - first
        assert sum(later["chunks_by_bucket"].values()) == len(later_chunks)
        buckets = later["per_document_by_bucket"].values()  # the whole is its buckets' bits over their bytes
        np.testing.assert_allclose(later["bpb"], sum(sum(d["bits"]) for d in buckets) /
                                   sum(sum(d["bytes"]) for d in buckets), rtol=1e-9)
        whole = later["per_document"]  # and its documents' bits over their bytes, the same bytes as the buckets'
        assert sum(whole["bytes"]) == sum(sum(d["bytes"]) for d in buckets) < result["bytes"]
        np.testing.assert_allclose(later["bpb"], sum(whole["bits"]) / sum(whole["bytes"]), rtol=1e-9)
    # Chunked cross-attention reads any number of neighbours: a model trained with k = 2 is scored with k = 3
    # (RETRO evaluates with more neighbours than it trained with) by the same path as the numpy reference.
    more = config.load_config(TINY, fit + ["retro.num_neighbours=3"])
    first = next(iter(retro_lm.RetroLmTask(more).examples("validation", neighbours=True)))
    assert first["neighbour_ids"].shape[1] == 3  # [chunks, k, r]
    result = lm_evaluation.evaluate(more, str(root / "fit"), retrieval=True, split="validation")
    np.testing.assert_allclose(result["bpb_wordpieces"]["1.0"], _numpy_bits_per_byte(
        retro_lm.RetroLmTask(more), model, "validation", True), rtol=1e-4)

    # kNN-LM's datastore: one entry per real target of the training sequences, in sequence-key order
    capsys.readouterr()
    build_knn_datastore.JOB.call(portable_runner, config=TINY, overrides=fit, model_dir=str(root / "baseline"),
                                 progress_interval=1e-9)  # on Beam's portable runner
    store = knn_datastore.KnnDatastore.load(str(root / "knn"), "brute_force")
    manifest = json.loads((root / "knn" / "manifest.json").read_text())
    assert progress_totals(capsys.readouterr().err, "build_knn_datastore") == {
        "done": manifest["counts"]["sequences"], "entries": len(store.values)}  # progress lines add up
    base_task = retro_lm.RetroLmTask(cfg, retrieval=False)
    baseline = lm_evaluation.restore_decoder(base_task, str(root / "baseline"))
    expected_keys, expected_values = [], []
    for doc_id, stream in sorted(base_task.documents("train"), key=lambda d: hashlib.sha1(d[0].encode()).hexdigest()):
        ids, mask = retro_sequences.document_sequences(stream, 32, task.tokenizer.pad_id)
        keys = baseline({"input_ids": ids}, training=False)["knn_keys"].numpy()  # [S, n, width]
        for s in range(ids.shape[0]):
            real = mask[s, 1:]
            expected_keys.append(keys[s, :-1][real])
            expected_values.append(ids[s, 1:][real])
    np.testing.assert_array_equal(store.values, np.concatenate(expected_values))
    np.testing.assert_allclose(store.keys[:, :-1], np.concatenate(expected_keys), atol=1e-5)

    ten = lm_evaluation.evaluate(config.load_config(TINY, fit + ["retro.num_neighbours=10"]), str(root / "fit"),
                                 retrieval=True, split="validation")  # the CCA reads any k without retraining
    assert np.isfinite(ten["bpb"]["1.0"]) and ten["tokens"] == result["tokens"]
    result = lm_evaluation.evaluate(cfg, str(root / "baseline"), retrieval=False,
                                    split="test", knn=True)
    grid = result["knn_validation_grid"]
    assert grid[f"lambda={result['knn_lambda']:g},T={result['knn_temperature']:g}"] == min(grid.values())
    assert np.isfinite(result["knn_bpb"]["1.0"]) and np.isfinite(result["bpb"]["1.0"])



def test_generate_retrieves_after_each_chunk_and_is_consistent_with_scoring(trained, capsys):
    from realm_tf.retro import lm_evaluation
    from realm_tf.retro import retro_generation

    root, sets = trained
    task = retro_lm.RetroLmTask(config.load_config(TINY, sets))
    model = lm_evaluation.restore_decoder(task, str(root / "fit"))
    generator = retro_generation.RetroGenerator(task, model)
    result = generator.generate("the quick brown fox jumps", max_tokens=14)
    ids, m = result["ids"], 8
    prompt_length = len(ids) - 14
    assert len(result["chunks"]) == -(-len(ids) // m)
    for c, chunk in enumerate(result["chunks"]):
        complete = (c + 1) * m <= len(ids)
        assert bool(chunk.neighbours) == complete  # every completed chunk was searched, the open one not yet
        assert len(chunk.neighbours) in ((2,) if complete else (0,))
    # greedy tokens are the argmax of one scoring pass over the whole text with every chunk's neighbours:
    # neighbours retrieved later never change earlier predictions (the causal shift)
    neighbour_ids = np.zeros([4, 2, 16], np.int32)
    neighbour_mask = np.zeros([4, 2, 16], bool)
    for c, chunk in enumerate(result["chunks"]):
        for j, (chunk_id, _, _) in enumerate(chunk.neighbours):
            value, mask = task.store.values(np.array([chunk_id]), 16, task.tokenizer.pad_id)
            neighbour_ids[c, j], neighbour_mask[c, j] = value[0], mask[0]
    padded = np.array([ids + [0] * (32 - len(ids))], np.int32)
    logits = model({"input_ids": padded, "neighbour_ids": neighbour_ids[None], "neighbour_mask": neighbour_mask[None]},
                   training=False)["logits"].numpy()[0]
    np.testing.assert_array_equal(logits[prompt_length - 1:len(ids) - 1].argmax(-1), ids[prompt_length:])
    assert cli.main(["generate", "--config", TINY, "--model", str(root / "fit"), "--prompt", "the fox",
                     "--max-tokens", "9", *sum((["--set", s] for s in sets), [])]) == 0
    out = capsys.readouterr().out
    assert "chunk 0 (prompt)" in out and "-> conditions chunk 1" in out


def test_evaluate_lm_scores_a_documents_file_and_withholds_database_copies(trained, pretraining_workspace, tmp_path,
                                                                         capsys):
    from realm_tf.retro import lm_evaluation

    root, sets = trained
    fit = sets + [f"retro_trainer.model_dir={root}/fit"]
    cfg = config.load_config(TINY, fit)
    task = retro_lm.RetroLmTask(cfg)
    train_ids = {doc_id for doc_id, _ in task.documents("train")}
    rows = [json.loads(line) for line in open(pretraining_workspace / "corpus.jsonl", encoding="utf-8")]
    copy = next(r for r in rows if str(r["id"]) in train_ids and len(r["text"]) > 200)
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"id": "copy", "text": copy["text"]}) + "\n\n" + json.dumps(
        {"id": "new", "text": "The lighthouse keeper counted ships every evening, writing each name in a ledger "
                              "that his daughter later gave to the harbour museum in 1931."}) + "\n")
    flags = ["evaluate-lm", "--config", TINY, *sum((["--set", s] for s in fit), []), "--model", str(root / "fit")]
    capsys.readouterr()
    assert cli.main([*flags, "--documents", str(path)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["documents"] == 2 and result["withheld"] == [str(copy["id"])]  # the copy is found and reported
    # The same held-out documents through numpy, and none of their neighbours from the withheld copy.
    held = retro_lm.RetroLmTask(cfg)
    lm_evaluation.hold_out(held, str(path))
    assert sorted(d for d, _ in held.documents("test")) == ["held_out:copy", "held_out:new"]
    model = lm_evaluation.restore_decoder(held, str(root / "fit"))
    np.testing.assert_allclose(result["bpb_wordpieces"]["1.0"], _numpy_bits_per_byte(held, model, "test", True),
                               rtol=1e-4)
    # the held-out documents' bytes are those of the file's text (less each sequence's unscored first token)
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    per_sequence = cfg.retro.sequence_length // cfg.retro.chunk_length
    firsts = sum(int(held.original_bytes(int(c))[0]) for _, ids in held.document_chunks("test")
                 for c in ids[::per_sequence])
    assert result["bytes"] == sum(len(t.encode("utf-8")) for t in texts) - firsts
    copy_rows = held.store.doc_index == held.store.document_of(str(copy["id"]))
    for database in ("train_only", "all_but_own"):
        chosen = held.neighbour_table("test", database)[held.chunk_splits == "test"]
        assert (chosen >= 0).any() and not copy_rows[chosen[chosen >= 0]].any()
        assert (held.chunk_splits[chosen[chosen >= 0]] != "test").all()  # never each other either
    # A malformed line: a clear error naming the file and line, exit code 2, no result.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    assert cli.main([*flags, "--documents", str(bad)]) == 2
    out = capsys.readouterr()
    assert "bad.jsonl:2: not valid JSON" in out.err and not out.out.strip()


def test_the_positive_control_puts_each_chosen_chunks_own_entry_first(retro_sets):
    _, sets = retro_sets
    controlled = retro_lm.RetroLmTask(config.load_config(TINY, sets + ["retro.own_neighbour_rate=1.0"]))
    plain = retro_lm.RetroLmTask(config.load_config(TINY, sets))
    r = controlled.cfg.retro.chunk_length + controlled.cfg.retro.continuation_length
    checked = 0
    for forced, normal in zip(controlled.examples("train"), plain.examples("train")):
        for position, chunk_id in enumerate(forced["chunk_ids"].tolist()):
            if chunk_id < 0:
                assert not forced["neighbour_mask"][position].any()  # padding chunks get nothing
                continue
            own = np.concatenate([controlled.store.tokens(chunk_id), controlled.store.continuation(chunk_id)])[:r]
            first = forced["neighbour_ids"][position, 0][forced["neighbour_mask"][position, 0]]
            assert first.tolist() == own.tolist()  # [C_u, C_{u+1}]: the chunk, then what follows it
            np.testing.assert_array_equal(forced["neighbour_ids"][position, 1:], normal["neighbour_ids"][position, 1:])
            checked += 1
    assert checked > 20
    ids = np.arange(10_000)
    share = retro_lm.own_neighbour_chunks(ids, 0.1).mean()
    assert 0.09 < share < 0.11 and not retro_lm.own_neighbour_chunks(np.array([-1]), 1.0).any()
    np.testing.assert_array_equal(retro_lm.own_neighbour_chunks(ids, 0.1), retro_lm.own_neighbour_chunks(ids, 0.1))
    assert (retro_lm.own_neighbour_chunks(ids, 0.03) <= retro_lm.own_neighbour_chunks(ids, 0.1)).all()  # nested doses


def test_a_forced_neighbours_continuation_is_what_the_positions_reading_it_must_predict(retro_sets):
    """RETRO §2.4: the last token of chunk u and the first m-1 of chunk u+1 read the neighbours of chunk u. With the
    chunk's own entry [C_u, C_{u+1}] forced in, the continuation half holds, slot by slot, the very targets those
    positions predict, in ``examples`` and through the ``tf.data`` batches alike: a perfect copy is possible."""
    _, sets = retro_sets
    task = retro_lm.RetroLmTask(config.load_config(TINY, sets + ["retro.own_neighbour_rate=1.0"]))
    m, n = task.cfg.retro.chunk_length, task.cfg.retro.sequence_length
    copyable = first_chunk = 0
    for example in task.examples("train"):
        for t in np.flatnonzero(example["target_mask"]):
            if t < m - 1:  # chunk 0's positions read no neighbour
                first_chunk += 1
                continue
            u, i = (t - (m - 1)) // m, (t - (m - 1)) % m  # the chunk whose neighbours position t reads; its slot
            assert example["neighbour_mask"][u, 0, m + i], (t, u)
            assert example["neighbour_ids"][u, 0, m + i] == example["targets"][t], (t, u)
            copyable += 1
    assert copyable > 3 * first_chunk > 0
    features, labels = next(iter(task.dataset("train", batch_size=4)))
    ids, targets, mask = features["neighbour_ids"].numpy(), labels["targets"].numpy(), labels["target_mask"].numpy()
    for b in range(ids.shape[0]):
        for u in range(n // m - 1):
            window = slice(u * m + m - 1, u * m + 2 * m - 1)
            np.testing.assert_array_equal(ids[b, u, 0, m:][mask[b, window]], targets[b, window][mask[b, window]])


def test_bpb_difference_is_paired_over_documents():
    first = {"documents": [0, 3, 7], "bits": [10.0, 40.0, 7.0], "bytes": [10, 30, 5]}
    assert lm_evaluation.bpb_difference(first, first) == (0.0, 0.0, 0.0)
    # Half a bit fewer on every byte of every document: exactly -0.5, in every resample too.
    shifted = {**first, "bits": [bits - 0.5 * n for bits, n in zip(first["bits"], first["bytes"])]}
    assert lm_evaluation.bpb_difference(first, shifted) == pytest.approx((-0.5, -0.5, -0.5))
    # One document alone better: the difference is its share, and the interval reaches 0 (resamples without it).
    one = {**first, "bits": [10.0, 10.0, 7.0]}
    diff, low, high = lm_evaluation.bpb_difference(first, one)
    assert diff == pytest.approx(-30.0 / 45) and low < diff < high == pytest.approx(0.0)
    with pytest.raises(ValueError, match="not of the same documents"):
        lm_evaluation.bpb_difference(first, {**first, "documents": [0, 3, 8]})


def test_per_document_buckets_add_up_to_the_bucket_and_positions_restart_each_sequence(retro_sets):
    rng = np.random.default_rng(0)
    chunk_ids = np.repeat(np.arange(12), 5)  # [60]: 12 chunks of 5 scored tokens
    scores = lm_evaluation.TokenScores(chunk_ids, rng.integers(0, 9, 60).astype(np.int32), -rng.random(60) * 3,
                                       rng.integers(1, 4, 60))
    overlaps = {c: [0.0, 0.1, 0.3, 0.9][c % 4] for c in range(12)}
    doc_index = np.arange(12) // 3  # [12]: four documents of three chunks
    by_bucket = lm_evaluation.bits_per_byte_by_bucket(scores, overlaps)
    for bucket, docs in lm_evaluation.per_document_by_bucket(scores, overlaps, doc_index).items():
        bpb, count = by_bucket[bucket]
        if not count:
            assert docs["documents"] == []
            continue
        assert sum(docs["bits"]) / sum(docs["bytes"]) == pytest.approx(bpb)
        expected = sorted({int(doc_index[c]) for c in range(12) if bucket == lm_evaluation.bucket_name(
            *{0.0: (None, 0.0), 0.1: (0.0, 0.125), 0.3: (0.25, 0.5), 0.9: (0.5, 1.0)}[overlaps[c]])})
        assert docs["documents"] == expected
    _, sets = retro_sets
    task = retro_lm.RetroLmTask(config.load_config(TINY, sets))  # n / m = 4 chunks per sequence
    positions = task.sequence_positions()
    for doc_id, ids in task.document_chunks(None)[:20]:
        assert positions[ids].tolist() == [i % 4 for i in range(ids.size)], doc_id


def test_a_resumed_run_sees_the_batches_an_uninterrupted_run_would(retro_sets):
    from realm_tf.core import experiment

    _, sets = retro_sets
    task = retro_lm.RetroLmTask(config.load_config(TINY, sets), retrieval=False)
    strategy = tf.distribute.get_strategy()

    def batches(step, count):  # the training input as run_experiment builds it for a run (re)started at `step`
        iterator = iter(experiment._distributed_inputs(task, strategy, step, {}))  # pylint: disable=protected-access
        return [next(iterator)[0]["input_ids"].numpy() for _ in range(count)]

    straight, resumed = batches(0, 7), batches(4, 3)
    for expected, got in zip(straight[4:], resumed):
        np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(straight[0], straight[4])  # the skipped batches were real, different ones
    other_seed = iter(experiment._distributed_inputs(task, strategy, 0, {"seed": 99}))  # pylint: disable=protected-access
    assert not np.array_equal(next(other_seed)[0]["input_ids"].numpy(), straight[0])


@pytest.mark.slow  # the step compiled with XLA and trained: tens of CPU-seconds
@pytest.mark.parametrize("retrieval, precision", [(False, "float32"), (True, "mixed_bfloat16")])
def test_the_step_is_one_xla_program_traced_once(trained, tmp_path, retrieval, precision):
    """The decoder alone in float32, and RETRO-fitted from it with its neighbours in mixed_bfloat16 (static
    shapes: sequences and chunks are of fixed length)."""
    root, sets = trained
    cfg = config.load_config(TINY, sets + [f"retro_trainer.model_dir={tmp_path}/run", "retro_trainer.jit_compile=true",
                                           "data.static_padding=true", f"retro_trainer.precision={precision}"]
                             + ([f"retro.retro_fit_from={root}/baseline"] if retrieval else []))
    run = xla_steps.run_compiled(retro_lm.RetroLmTask(cfg, retrieval=retrieval))
    assert np.isfinite(run.result["train"]["loss"])


@pytest.mark.slow  # a child process training the job twice
@pytest.mark.parametrize("retrieval", [False, True])
def test_two_replicas_train_as_one(trained, tmp_path, retrieval):
    root, sets = trained
    replica_steps.check_two_replicas_train_as_one(
        "realm_tf.retro.retro_lm:RetroLmTask", "retro_trainer",
        sets + ["data.batch_size=4", "retro_trainer.learning_rate=1e-3"]
        + ([f"retro.retro_fit_from={root}/baseline"] if retrieval else []),
        str(tmp_path), kwargs={"retrieval": retrieval}, accumulation=2 if retrieval else 1)
