"""Reader warm start: gold blocks and negatives vs brute force, the train-reader stage (its checkpoint starts
fine-tuning with the whole reader), reading on gold blocks, SQuAD F1 vs the official
formula, and length bucketing that changes neither the loss nor the predictions."""
import collections
import gzip
import json
import re
import string

import numpy as np
import pytest
import replica_steps  # tests/replica_steps.py
import tensorflow as tf
import tf_keras
import xla_steps  # tests/xla_steps.py (tests/ is on the path: tests/conftest.py)

from realm_tf import cli
from realm_tf import config
from realm_tf import errors
from realm_tf import library_logs
from realm_tf.core import precision
from realm_tf.data import answer_normalization
from realm_tf.data import block_store
from realm_tf.data import knowledge_corpus
from realm_tf.data import questions
from realm_tf.tasks import open_qa
from realm_tf.tasks import qa_metrics
from realm_tf.tasks import reader_warm_start
from realm_tf.tasks import reading_sets

TINY = "configs/tiny.yaml"


@pytest.fixture(scope="module")
def squad(tmp_path_factory, pretraining_workspace):
    """SQuAD questions whose gold passage is among the tiny workspace's 80 passages (ids 0..79)."""
    root = tmp_path_factory.mktemp("reader")
    with gzip.open("data/open_qa/qa_squad_dev.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    rows = [r for r in rows if r["gold_passage_ids"][0] < 80][::12][:36]
    rows.append({"id": "no-gold", "question": "who?", "answers": ["x"], "gold_passage_ids": []})
    rows.append({"id": "absent", "question": "what?", "answers": ["zzqx unfindable"], "gold_passage_ids": [3]})
    path = root / "questions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    blocks = block_store.BlockStore.load(f"{pretraining_workspace}/blocks/blocks-*.tfrecord*")
    sets = ["--set", f"data.blocks_dir={pretraining_workspace}/blocks", "--set", f"reader.model_dir={root}/reader",
            "--set", "data.batch_size=4", "--set", "reader.steps=3", "--set", "reader.warmup_steps=0",
            "--set", "reader.learning_rate=1e-3", "--set", "qa.reader_negatives=2",
            "--set", "data.qa_dev_fraction=0.2", "--set", "data.qa_tune_fraction=0.1"]
    return root, path, blocks, sets


def _normalized_contains(text, answers):
    norm = answer_normalization.normalize_answer
    return any(norm(a) and f" {norm(a)} " in f" {norm(text)} " for a in answers)


def test_gold_block_first_then_negatives_without_the_answer(squad):
    _, path, blocks, _ = squad
    examples = questions.read_questions(str(path))
    reading = reading_sets.gold_and_negatives(examples, blocks, num_negatives=3)
    assert reading.skipped == {"no_gold_passage": 1, "no_answer_in_gold_blocks": 1}
    assert len(reading.examples) + sum(reading.skipped.values()) == len(examples)
    assert reading.block_ids.shape == (len(reading.examples), 4)
    for example, row in zip(reading.examples, reading.block_ids):
        gold_docs = {str(g) for g in example.gold_passage_ids}
        assert blocks.doc_ids[row[0]] in gold_docs and _normalized_contains(blocks.texts[row[0]], example.answers)
        first = min(b for b in range(len(blocks)) if blocks.doc_ids[b] in gold_docs
                    and _normalized_contains(blocks.texts[b], example.answers))
        assert row[0] == first
        assert len(set(row.tolist())) == 4
        for negative in row[1:]:
            assert blocks.doc_ids[negative] not in gold_docs
            assert not _normalized_contains(blocks.texts[negative], example.answers)


def test_train_reader_then_its_reader_starts_finetuning(squad, capsys):
    root, path, blocks, sets = squad
    library_logs.show_on_stderr()  # the library logs its facts; the command line shows them on stderr
    cfg = config.load_config(TINY, [s for s in sets if s != "--set"])
    assert reader_warm_start.train_reader(cfg, [str(path)])["step"] == 3
    out = capsys.readouterr().err
    checkpoint = tf.train.latest_checkpoint(str(root / "reader" / "checkpoints"))
    assert checkpoint.endswith("-3")
    # Neither the dev nor the tune split was read: the logged counts are the train split's.
    everything = questions.read_questions(str(path))
    train, dev = open_qa.split_questions(everything, 0.2, 0.1)
    assert dev and len(train) + len(dev) < len(everything)  # some questions are in the tune split
    expected = reading_sets.gold_and_negatives(train, blocks, 2)
    assert f"train-reader: {len(expected.examples)} questions from 1 file(s)" in out
    assert f"skipped: {expected.skipped}" in out
    # qa.reader_checkpoint restores the whole reader (span MLP included), not just its BERT.
    task = open_qa.OpenQaTask(config.load_config(TINY, [s for s in sets if s != "--set"]
                                                 + [f"qa.reader_checkpoint={root}/reader"]))
    corpus = knowledge_corpus.KnowledgeCorpus(np.zeros([len(blocks), 1], np.float32), blocks, task.tokenizer)
    model = task.build_model(corpus)
    saved = dict(tf.train.list_variables(checkpoint))
    reader = tf.train.load_checkpoint(checkpoint)
    for variable, key in ((model.reader.span_hidden.kernel, "reader/span_hidden/kernel"),
                          (model.reader.span_logit.bias, "reader/span_logit/bias")):
        name = f"{key}/.ATTRIBUTES/VARIABLE_VALUE"
        assert name in saved
        np.testing.assert_array_equal(variable.numpy(), reader.get_tensor(name))
    fresh = open_qa.OpenQaTask(cfg).build_model(corpus)
    assert not np.allclose(fresh.reader.span_hidden.kernel.numpy(), model.reader.span_hidden.kernel.numpy())


def test_evaluate_on_gold_blocks_reports_f1(squad, tmp_path):
    root, path, _, sets = squad
    metrics = open_qa.evaluate(config.load_config(TINY, sets[1::2]), str(path), model_dir=str(root / "reader"),
                               retriever="gold", score_weights=(0, 2), length_biases=(0, 0.5))
    predictions = [json.loads(line) for line in open(root / "reader" / "predictions-all-gold.jsonl")]
    assert metrics["num_questions"] == len(predictions) == 36 and metrics["skipped"]["no_gold_passage"] == 1
    assert all(len(p["retrieved_block_ids"]) == 1 == len(p["read_blocks_with_answer"]) for p in predictions)
    assert metrics["accuracy@1"] == 1.0  # the gold block holds the answer by construction
    assert metrics["f1"] == pytest.approx(np.mean([qa_metrics.f1(p["prediction"], p["answers"]) for p in predictions]))
    # One block, no retrieval score: the weight on it cannot change the answer.
    assert metrics["exact_match@w=0"] == metrics["exact_match@w=2"] == metrics["exact_match"]
    assert metrics["f1@w=0"] == pytest.approx(metrics["f1"])
    # qa.span_length_bias: an evaluation configured with a bias scores what the variant of that bias reports (in
    # one evaluation: the model is the same), and the variant of no bias what the span score alone does.
    biased = open_qa.evaluate(config.load_config(TINY, [*sets[1::2], "qa.span_length_bias=0.5"]), str(path),
                              model_dir=str(root / "reader"), retriever="gold", length_biases=(0, 0.5),
                              predictions_path=str(tmp_path / "biased.jsonl"))
    assert biased["exact_match"] == biased["exact_match@len=0.5"]
    assert biased["f1"] == pytest.approx(biased["f1@len=0.5"])
    assert metrics["exact_match@len=0"] == metrics["exact_match"]
    assert metrics["f1@len=0.5"] != pytest.approx(metrics["f1"])  # the bias changed answers


def test_train_and_eval_keeps_the_reader_of_the_best_gold_block_exact_match(squad, capsys, tmp_path):
    """reader.eval_every_steps with qa.reader_eval_questions: the tune split scored on gold blocks during training,
    the best step's reader in <model_dir>/best, with the score `evaluate --experiment reader` gives that step."""
    _, path, _, sets = squad
    model_dir = tmp_path / "reader"
    sets = [*sets, "--set", f"reader.model_dir={model_dir}", "--set", "reader.steps=4", "--set",
            "reader.eval_every_steps=2", "--set", f"qa.reader_eval_questions={path}", "--set",
            "reader.checkpoint_every_steps=1", "--set", "reader.keep_checkpoints=10"]
    assert reader_warm_start.train_reader(config.load_config(TINY, sets[1::2]), [str(path)])["step"] == 4
    best = json.loads((model_dir / "best" / "best.json").read_text())
    assert best["metric"] == "exact_match" and best["step"] in (2, 4)
    assert best["value"] == best["metrics"]["exact_match"]
    tune = reading_sets.gold_only(open_qa.select_split(questions.read_questions(str(path)), "tune",
                                                       config.load_config(TINY, sets[1::2]).data), squad[2])
    assert best["metrics"]["num_questions"] == len(tune.examples) > 0
    (model_dir / "checkpoints" / "checkpoint").write_text(  # the latest checkpoint is now the best step's
        f'model_checkpoint_path: "ckpt-{best["step"]}"\nall_model_checkpoint_paths: "ckpt-{best["step"]}"\n')
    assert cli.main(["evaluate", "--experiment", "reader", "--config", TINY, *sets, "--questions", str(path),
                     "--split", "tune"]) == 0  # reader.model_dir, gold blocks: the defaults of --experiment reader
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["retriever"] == "gold" and metrics["checkpoint"].endswith(f"ckpt-{best['step']}")
    assert metrics["exact_match"] == pytest.approx(best["value"]) and metrics["f1"] == pytest.approx(
        best["metrics"]["f1"])


def _official_f1(prediction, ground_truth):
    """The SQuAD v1.1 evaluation script's F1, written out independently (Counter intersection)."""
    def normalize(s):
        s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())
    p, g = normalize(prediction).split(), normalize(ground_truth).split()
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def test_f1_matches_the_official_formula():
    rng = np.random.default_rng(0)
    words = ["the", "Beatles", "a", "band", "band", "1973", "U.S.", "oil", "crisis", ",", "an"]
    for _ in range(300):
        prediction = " ".join(rng.choice(words, rng.integers(0, 6)))
        truths = [" ".join(rng.choice(words, rng.integers(1, 6))) for _ in range(rng.integers(1, 3))]
        expected = max(_official_f1(prediction, t) for t in truths)
        assert qa_metrics.f1(prediction, truths) == pytest.approx(expected)
    assert qa_metrics.f1("actor Tim Allen", ["Tim Allen"]) == pytest.approx(0.8)


def test_length_buckets_change_neither_loss_nor_predictions(squad):
    _, path, blocks, sets = squad
    overrides = [s for s in sets if s != "--set"]
    examples = questions.read_questions(str(path))
    reading = reading_sets.gold_and_negatives(examples, blocks, 2)
    results, weights = [], None
    for buckets in (1, 3):
        cfg = config.load_config(TINY, overrides + [f"model.reader_length_buckets={buckets}"])
        task = open_qa.OpenQaTask(cfg)
        corpus = knowledge_corpus.KnowledgeCorpus(np.zeros([len(blocks), 1], np.float32), blocks, task.tokenizer)
        model = task.build_model(corpus)
        if weights is None:
            weights = model.reader.get_weights()
        model.reader.set_weights(weights)  # the same reader, read in one group or in three
        batch = next(iter(task.dataset(reading.examples, 7, block_ids=reading.block_ids)))
        outputs = model(open_qa.model_inputs(batch))
        loss, _ = task.build_losses(batch, model(open_qa.model_inputs(batch), training=False))
        results.append((batch, outputs, loss.numpy(), task.decode(model, outputs)))
    (batch, one, loss_one, decoded_one), (_, three, loss_three, decoded_three) = results
    lengths = batch["question_input_mask"].numpy().sum(-1)
    assert len(set(lengths.tolist())) > 1  # questions (and blocks) of different lengths share the batch
    rows = one["reader_input_word_ids"].numpy()
    assert len({int((r != 0).sum()) for r in rows.reshape(-1, rows.shape[-1])}) > 3
    np.testing.assert_array_equal(one["span_mask"], three["span_mask"])
    valid = one["span_mask"].numpy()
    np.testing.assert_allclose(one["span_logits"].numpy()[valid], three["span_logits"].numpy()[valid], atol=1e-4)
    assert np.all(loss_one > 0)
    np.testing.assert_allclose(loss_one, loss_three, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(decoded_one["answer"].numpy(), decoded_three["answer"].numpy())


def test_source_temperature_draws_files_by_size_to_the_power_t(squad):
    """Two question files, 4:1 in questions after the split: T = 1 reads one shuffled pool (each file in
    proportion to its questions); T = 0.5 draws the small file with probability √n_b / (√n_a + √n_b) (a binomial check
    over 2,000 draws) and repeats it; T = 0 is refused."""
    root, path, _, sets = squad
    rows = [json.loads(line) for line in path.read_text().splitlines()][:36]
    small = root / "small.jsonl"
    small.write_text("".join(json.dumps(r) + "\n" for r in rows[::5]))
    overrides = [s for s in sets if s != "--set"]

    def task(temperature):
        cfg = config.load_config(TINY, overrides + [f"qa.reader_source_temperature={temperature}"])
        return reader_warm_start.ReaderWarmStartTask(cfg, [str(path), str(small)])

    def drawn(t, batches):
        indices = [b["index"].numpy() for _, b in t.build_inputs(seed=3).take(batches)]
        return np.concatenate(indices)  # [batches * 4]

    pool = task(1.0)
    _, _, facts = pool.training_set()
    n_a, n_b = facts["questions_per_file"]
    assert n_a > 2 * n_b > 0 and pool.mixture() is None

    def share_close(t, expected):
        indices = drawn(t, 500)
        share = np.mean(t.sources[indices] == 1)
        assert abs(share - expected) < 4 * np.sqrt(expected * (1 - expected) / len(indices)), (share, expected)
        return indices

    share_close(pool, n_b / (n_a + n_b))
    warm = task(0.5)
    expected = np.sqrt(n_b) / (np.sqrt(n_a) + np.sqrt(n_b))
    assert expected > n_b / (n_a + n_b) + 0.05  # the smaller file's share is raised ...
    indices = share_close(warm, expected)
    assert set(indices[warm.sources[indices] == 1].tolist()) == set(np.flatnonzero(warm.sources == 1).tolist())
    with pytest.raises(errors.UserError, match="reader_source_temperature"):
        task(0.0).mixture()


def test_train_max_answer_tokens_keeps_nq_open_answers_and_leaves_out_the_rest(squad):
    """``qa.train_max_answer_tokens``: each training question keeps its answers of at most that many whitespace
    tokens; a question with none is left out; the dev and tune splits are never read either way."""
    _, path, _, sets = squad
    overrides = [s for s in sets if s != "--set"]
    everything = reader_warm_start.read_training_questions(config.load_config(TINY, overrides), [str(path)])
    short = reader_warm_start.read_training_questions(
        config.load_config(TINY, overrides + ["qa.train_max_answer_tokens=2"]), [str(path)])
    expected = [(e.id, tuple(a for a in e.answers if len(a.split()) <= 2)) for e in everything]
    assert [(e.id, e.answers) for e in short] == [(i, a) for i, a in expected if a]
    assert 0 < len(short) < len(everything)  # some questions have only longer answers
    assert any(len(a.split()) > 2 for e in everything for a in e.answers)
    assert all(len(a.split()) <= 2 for e in short for a in e.answers)


def test_mixed_bfloat16_reader_computes_in_bfloat16_and_trains_float32_checkpoints(squad, capsys):
    """reader.precision=mixed_bfloat16: the same weights give the float32 loss up to bfloat16 rounding, the
    variables (and so the checkpoint) stay float32 and load into a float32 model, and the global policy is
    float32 again after the run."""
    root, path, blocks, sets = squad
    overrides = [s for s in sets if s != "--set"]
    examples = questions.read_questions(str(path))
    reading = reading_sets.gold_and_negatives(examples, blocks, 2)
    cfg = config.load_config(TINY, overrides)
    task = open_qa.OpenQaTask(cfg)
    corpus = knowledge_corpus.KnowledgeCorpus(np.zeros([len(blocks), 1], np.float32), blocks, task.tokenizer)
    full = task.build_model(corpus)
    with precision.policy_scope("mixed_bfloat16"):
        mixed = task.build_model(corpus)
    assert tf_keras.mixed_precision.global_policy().name == "float32"
    mixed.reader.set_weights(full.reader.get_weights())
    assert {v.dtype for v in mixed.reader.variables} == {tf.float32}
    assert mixed.reader.encoder.compute_dtype == "bfloat16" and full.reader.encoder.compute_dtype == "float32"
    batch = next(iter(task.dataset(reading.examples, 7, block_ids=reading.block_ids)))
    losses = []
    for model in (full, mixed):
        outputs = model(open_qa.model_inputs(batch), training=False)
        assert outputs["span_logits"].dtype == tf.float32
        losses.append(task.build_losses(batch, outputs)[0].numpy())
    assert np.all(np.isfinite(losses[1])) and not np.array_equal(losses[0], losses[1])  # computed apart
    np.testing.assert_allclose(losses[1], losses[0], rtol=0.05, atol=0.05)

    model_dir = root / "reader-bf16"
    reader_warm_start.train_reader(config.load_config(TINY, [*sets[1::2], f"reader.model_dir={model_dir}",
                                                              "reader.precision=mixed_bfloat16"]), [str(path)])
    assert tf_keras.mixed_precision.global_policy().name == "float32"
    checkpoint = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    reader = tf.train.load_checkpoint(checkpoint)
    dtypes = reader.get_variable_to_dtype_map()
    assert dtypes["reader/span_hidden/kernel/.ATTRIBUTES/VARIABLE_VALUE"] == tf.float32
    loaded = open_qa.OpenQaTask(config.load_config(TINY, overrides + [f"qa.reader_checkpoint={model_dir}"]))
    restored = loaded.build_model(corpus)
    np.testing.assert_array_equal(restored.reader.span_hidden.kernel.numpy(),
                                  reader.get_tensor("reader/span_hidden/kernel/.ATTRIBUTES/VARIABLE_VALUE"))
    assert not np.allclose(restored.reader.span_hidden.kernel.numpy(), full.reader.span_hidden.kernel.numpy())


def test_reading_windows_hold_the_answer_and_the_reader_trains_on_them(squad, tmp_path):
    """qa.reader_window: the training batch reads each gold body through a window that holds an answer, no
    longer than the window, and the warm start trains on them."""
    _, path, blocks, sets = squad
    window = 24
    overrides = [s for s in sets if s != "--set"] + [f"qa.reader_window={window}",
                                                       f"reader.model_dir={tmp_path}/reader"]
    task = reader_warm_start.ReaderWarmStartTask(config.load_config(TINY, overrides), [str(path)])
    examples, block_ids, _ = task.training_set()
    windows = task.block_windows()
    assert windows.shape == (*block_ids.shape, 2)
    windowed = 0
    for example, row, spans in zip(examples, block_ids, windows):
        for block, (start, count) in zip(row, spans):
            body = blocks.body_ids(int(block))
            assert count == min(window, len(body)) and 0 <= start <= len(body) - count
        start, count = spans[0]
        gold = blocks.body_ids(int(row[0]))
        whole, read = " ".join(map(str, gold)), " ".join(map(str, gold[start:start + count]))
        answers = [" ".join(map(str, a)) for a in task.tokenizer(tf.constant(list(example.answers))).to_list()
                   if len(a) <= task.cfg.model.max_span_width]
        if len(gold) > window and any(f" {a} " in f" {whole} " for a in answers):  # else: a random window
            windowed += 1
            assert any(f" {a} " in f" {read} " for a in answers)
    assert windowed > 0  # some gold bodies are longer than the window
    features, _ = next(iter(task.build_inputs(seed=0)))
    assert features["block_windows"].shape == (4, 3, 2)
    assert reader_warm_start.train_reader(task.cfg, [str(path)])["step"] == 3


@pytest.mark.slow  # the step compiled with XLA and trained: tens of CPU-seconds
def test_the_step_is_one_xla_program_traced_once(squad, tmp_path):
    root, path, blocks, sets = squad
    cfg = config.load_config(TINY, [s for s in sets if s != "--set"] + [
        f"reader.model_dir={tmp_path}/reader", "data.static_padding=true", "reader.jit_compile=true"])
    run = xla_steps.run_compiled(reader_warm_start.ReaderWarmStartTask(cfg, [str(path)]))
    assert np.isfinite(run.result["train"]["loss"])


@pytest.mark.slow  # a child process training the job twice
def test_two_replicas_train_as_one(squad, tmp_path):
    _, path, _, sets = squad
    replica_steps.check_two_replicas_train_as_one(
        "realm_tf.tasks.reader_warm_start:ReaderWarmStartTask", "reader", [s for s in sets if s != "--set"],
        str(tmp_path), args=[[str(path)]], accumulation=2)
