"""Open-QA serving export: answers in a fresh process without realm_tf (ScaNN searched in the graph) equal the
Keras model's; saved_model_cli runs it; bad requests are cleaned, not crashes."""
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from beam_jobs import embed_blocks
from realm_tf import artifacts
from realm_tf import config
from realm_tf import errors
from realm_tf.export import open_qa_export
from realm_tf.export import retriever_export
from realm_tf.export import serving_warmup
from realm_tf.index import index_kinds
from realm_tf.index import index_publisher
from realm_tf.index import index_refresher
from realm_tf.index import scann_index
from realm_tf.models import knowledge_retriever
from realm_tf.serving import answerer
from realm_tf.tasks import answer_calibration
from realm_tf.tasks import open_qa

sys.path.insert(0, os.path.dirname(__file__))
import serving_protos  # noqa: E402  (next to this file; tests are not a package)

TINY = "configs/tiny.yaml"
QUESTIONS = ["who wrote the lyrics of he ain't heavy he's my brother", "when did the oil crisis begin",
             "what is the capital of kenya", "who won the world cup in 1966", "how many moons does mars have"]
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, pretraining_workspace):
    root = tmp_path_factory.mktemp("serving")
    retriever = knowledge_retriever.build_knowledge_retriever(config.load_config(TINY).model)
    tf.train.Checkpoint(model=retriever).save(str(root / "ict" / "checkpoints" / "ckpt"))  # the index's weights
    cfg = config.load_config(TINY, [f"data.blocks_dir={pretraining_workspace}/blocks", f"index.index_dir={root}/index",
                                    f"refresh.export_dir={root}/export", f"finetune.model_dir={root}/model",
                                    "index.kind=scann", f"qa.retriever_checkpoint={root}/ict"])
    params = config.save_params(cfg, str(root))
    retriever_export.export_retriever(retriever, cfg, 0)
    assert index_refresher.IndexRefresher(params, embed_blocks.embed_and_publish).refresh_once() == 0
    task, model, info = open_qa.load_for_serving(cfg, in_graph_scann=False)  # the Keras model, exact search
    assert info["searcher"] == "exact matmul" and not info["checkpoint"]
    # A fine-tuning checkpoint, so that the export (built anew) has the same weights as this Keras model.
    tf.train.Checkpoint(retriever=model.retriever,
                        reader=model.reader).save(str(root / "model" / "checkpoints" / "ckpt"))
    path = _export(cfg, str(root / "served"))
    return cfg, path, task, model


def _export(cfg, out):
    """`realm-tf export`: the fine-tuned model loaded anew (ScaNN in the graph, the blocks as records), then saved."""
    path = open_qa.export_for_serving(cfg, out)
    meta = artifacts.read_marker(path, artifacts.OPEN_QA_EXPORT)
    assert meta["searcher"] == "scann" and meta["checkpoint"] and meta["corpus_storage"] == "records"
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".")]  # the records' scratch is gone
    return path


def _keras_answers(task, model, questions):
    packed = task.tokenizer.pack_single(task.tokenizer(tf.constant(questions)), task.cfg.qa.question_seq_length,
                                        pad_to_seq_length=False)
    outputs = model({"question_" + k: v for k, v in packed.items()})
    decoded = task.decode(model, outputs)
    return [a.decode() for a in decoded["answer"].numpy()], decoded["score"].numpy(), outputs["block_ids"].numpy()


def test_fresh_process_without_realm_tf_answers_like_the_keras_model(exported, tmp_path):
    cfg, path, task, model = exported
    meta = json.load(open(os.path.join(path, artifacts.OPEN_QA_EXPORT)))
    assert meta["searcher"] == "scann"  # ScaNN's TF op inside the graph
    script = f"""
import json, sys
import tensorflow as tf, tensorflow_text, scann  # noqa: F401  (custom ops: tokenizer, ScaNN)
m = tf.saved_model.load({path!r})
out = m.signatures["serving_default"](question=tf.constant({QUESTIONS!r}))
assert not any(n.startswith("realm_tf") for n in sys.modules)
print(json.dumps({{"answer": [a.decode() for a in out["answer"].numpy()], "score": out["score"].numpy().tolist(),
                  "block_id": out["block_id"].numpy().tolist(), "title": out["block_title"].numpy()[0, 0].decode()}}))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), env=ENV, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    answers, scores, block_ids = _keras_answers(task, model, QUESTIONS)
    assert served["answer"] == answers and all(answers)
    np.testing.assert_allclose(served["score"], scores, rtol=1e-4)
    np.testing.assert_array_equal(served["block_id"], block_ids)
    assert served["title"] == model.corpus.titles.numpy()[block_ids[0, 0]].decode()


def test_an_int8_scann_export_holds_no_float_matrix_and_answers_alike(exported, tmp_path, monkeypatch):
    cfg, _, task, model = exported
    # The tiny random retriever scores every block within a few hundredths, about int8's error, so the int8 order
    # is close to random: every block the int8 stage returns is re-scored (the depth is fixed when the graph is
    # traced), and the served results must be exact. How few need re-scoring where embeddings have neighbourhoods:
    # tests/index/test_scann_index.py.
    monkeypatch.setattr(scann_index, "EXACT_RERANK_FACTOR", 1000)
    source, meta = index_publisher.newest_version(cfg.index.index_dir, task.tokenizer.vocab_hash)
    embeddings = index_publisher.read_embeddings(source)
    # A tree (every leaf searched) whose short list ScaNN re-orders in int8; the graph re-scores its best 4k.
    int8 = dataclasses.replace(cfg, index=dataclasses.replace(
        cfg.index, index_dir=str(tmp_path / "index"), num_leaves=8, num_leaves_to_search=8, reorder_dtype="int8"))
    index = index_kinds.build_index("scann", int8.index, embeddings)
    assert index.params["mode"] == "tree_ah" and index.params["reorder_dtype"] == "int8"
    index_publisher.publish_next(int8.index.index_dir, embeddings, index,
                                 {k: meta[k] for k in ("vocab_hash", "corpus_version") if k in meta}, 1)
    path = _export(int8, str(tmp_path / "served"))
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    assert not [name for name in reader.get_variable_to_shape_map() if "corpus/embeddings" in name]
    assets = os.listdir(os.path.join(path, "assets"))
    assert "block_embeddings-000000" in assets and "dataset.npy" not in assets
    loaded = tf.saved_model.load(path)
    out = loaded.signatures["serving_default"](question=tf.constant(QUESTIONS))
    answers, scores, block_ids = _keras_answers(task, model, QUESTIONS)  # exact search over the float matrix
    assert [a.decode() for a in out["answer"].numpy()] == answers
    np.testing.assert_array_equal(out["block_id"].numpy(), block_ids)
    np.testing.assert_allclose(out["score"].numpy(), scores, rtol=1e-4)


def test_warmup_records_replay_on_the_export(exported):
    cfg, path, _, model = exported
    records = [serving_protos.parse_prediction_log(r.numpy()) for r in
               tf.data.TFRecordDataset(os.path.join(path, "assets.extra", "tf_serving_warmup_requests"))]
    count = min(cfg.qa.serving_warmup_requests, int(tf.shape(model.corpus.titles)[0]))
    # Each question alone, then all in one batch: for serving_default, then with a threshold.
    assert [signature for signature, _ in records] == (["serving_default"] * (count + 1)
                                                      + ["answer_selectively"] * (count + 1)) and count > 1
    assert all(inputs["min_confidence"].dtype == np.float32 for _, inputs in records[count + 1:])
    assert json.load(open(os.path.join(path, artifacts.OPEN_QA_EXPORT)))["warmup_requests"] == len(records)
    loaded = tf.saved_model.load(path)
    answers = []
    for signature, inputs in records:  # what TF Serving does before the version takes traffic
        out = loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
        assert out["answer"].shape == (len(inputs["question"]),)
        answers.append([a.decode() for a in out["candidate"].numpy()])
    for part in (answers[:count + 1], answers[count + 1:]):
        assert part[-1] == [a for single in part[:-1] for a in single]  # the batch answers as one by one
    assert answerer.Answerer(path).warm_up() == len(records)  # a Python server replays them alike
    titles = {t.decode() for t in model.corpus.titles.numpy()}
    assert all(q.decode()[len("what is "):] in titles for q in records[0][1]["question"])


def test_saved_model_cli_run(exported, tmp_path):
    _, path, _, _ = exported
    # saved_model_cli itself, in a process that has registered the custom ops first (as TF Serving must).
    script = ("import sys, tensorflow_text, scann\nfrom tensorflow.python.tools import saved_model_cli\n"
              "sys.argv = ['saved_model_cli'] + sys.argv[1:]\nsaved_model_cli.main()\n")
    result = subprocess.run([sys.executable, "-c", script, "run", "--dir", path, "--tag_set", "serve",
                             "--signature_def", "serving_default", "--input_exprs", "question=['who wrote it']"],
                            env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "answer" in result.stdout and "block_title" in result.stdout


def test_bad_requests_are_cleaned_not_crashes(exported):
    _, path, _, _ = exported
    served = tf.saved_model.load(path).signatures["serving_default"]
    out = served(question=tf.constant(["", "x " * 50_000, b"\xff\xfe who \xc3\x28 wrote", "   "]))
    answers, scores = out["answer"].numpy(), out["score"].numpy()
    assert answers[0] == b"" and scores[0] == 0.0 and answers[3] == b"" and scores[3] == 0.0  # empty questions
    assert answers[1] and answers[2] and 0 < scores[1] <= 1 and 0 < scores[2] <= 1  # truncated / repaired
    big = served(question=tf.constant([f"question number {i}" for i in range(256)]))
    assert big["answer"].shape == (256,) and big["block_title"].shape[0] == 256


def test_the_request_cleaner_takes_any_bytes_in_any_batch(exported):
    """A property-based fuzzer (hypothesis) of the served signature: any bytes (invalid UTF-8, control characters,
    long runs), any batch size: an answer of valid UTF-8 and a probability per question, never an error."""
    from hypothesis import given
    from hypothesis import settings
    from hypothesis import strategies as st

    _, path, _, _ = exported
    served = tf.saved_model.load(path).signatures["serving_default"]

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(lambda t: t.encode("utf-8")),
                              st.integers(0, 5000).map(lambda n: b"why " * n)), min_size=1, max_size=9))
    def fuzz(questions):
        out = served(question=tf.constant(questions, tf.string))
        answers, scores = out["answer"].numpy(), out["score"].numpy()
        assert answers.shape == scores.shape == (len(questions),)
        assert all(np.isfinite(scores)) and all(0.0 <= s <= 1.0 + 1e-6 for s in scores)
        for answer in answers:
            answer.decode("utf-8")  # valid UTF-8 whatever came in

    fuzz()


def test_export_refuses_to_overwrite(exported):
    cfg, path, _, model = exported
    with pytest.raises(Exception, match="already holds an export"):
        open_qa_export.export_open_qa(cfg, model, path)
    with pytest.raises(Exception, match="already holds an export"):
        open_qa_export.check_destination(path + "/")


def test_ask_cli_and_python_api(exported, capsys):
    _, path, task, model = exported
    from realm_tf import cli

    result = answerer.Answerer(path).ask(QUESTIONS[0])
    answers, scores, block_ids = _keras_answers(task, model, QUESTIONS[:1])
    assert result.answer == answers[0] and result.score == pytest.approx(float(scores[0]), rel=1e-4)
    assert [b.block_id for b in result.blocks] == block_ids[0].tolist()
    assert cli.main(["ask", QUESTIONS[0], "--model", path]) == 0
    out = capsys.readouterr().out
    assert f"A: {answers[0]}" in out and f"[{result.blocks[0].title}]" in out
    assert cli.main(["ask", "x", "--model", path + "-missing"]) == 2  # a clear error, not a traceback
    assert "not a complete Open-QA export" in capsys.readouterr().err


def test_evaluate_and_the_export_decode_alike(exported, tmp_path):
    """qa.retrieval_score_weight w (answer score S_read + w·S_retr), qa.answer_aggregation_spans N (the best N
    spans' probabilities summed by answer text) and qa.span_length_bias are applied alike by `evaluate`, the
    exported model and `ask`, and the served score is the task's decoded group probability; at another w the
    answers are those of a numpy argmax over the same outputs."""
    cfg, _, task, model = exported
    decoding = cfg
    for override in ("qa.retrieval_score_weight=0.25", "qa.answer_aggregation_spans=30", "qa.span_length_bias=0.5"):
        decoding = config.apply_override(decoding, override)
    packed = task.tokenizer.pack_single(task.tokenizer(tf.constant(QUESTIONS)), cfg.qa.question_seq_length,
                                        pad_to_seq_length=False)
    outputs = model({"question_" + k: v for k, v in packed.items()})
    decoded = open_qa.OpenQaTask(decoding).decode(model, outputs)
    features = decoded["features"].numpy()  # [questions, F]
    # A hand-set calibrator over these answers' own spread, so that their confidences differ on any weights.
    calibrator = answer_calibration.Calibrator(
        "features", tuple(features.mean(0)), tuple(np.maximum(features.std(0), 0.05)), (2.4, 1.5, 1.2, 0.9, -0.6, 1.8),
        -0.2, {"predictions": "hand-set"})
    answer_calibration.write_calibrator(calibrator, str(tmp_path / "calibrator.json"))
    decoding = config.apply_override(decoding, f"qa.confidence_calibrator={tmp_path / 'calibrator.json'}")
    served = answerer.Answerer(_export(decoding, str(tmp_path / "served-decoding")))
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answers": ["unused"]}) + "\n"
                                 for i, q in enumerate(QUESTIONS)))
    open_qa.evaluate(decoding, str(questions), predictions_path=str(tmp_path / "predictions.jsonl"))
    evaluated = [json.loads(line) for line in open(tmp_path / "predictions.jsonl")]
    asked = [served.ask(q) for q in QUESTIONS]
    assert [p["prediction"] for p in evaluated] == [a.answer for a in asked] and all(a.answer for a in asked)
    assert [a.decode() for a in decoded["answer"].numpy()] == [a.answer for a in asked]
    unbiased = open_qa.OpenQaTask(cfg).decode(model, outputs, aggregate_spans=30, retrieval_weight=0.25)
    assert (decoded["answer"].numpy() != unbiased["answer"].numpy()).any()  # the bias changed some answer
    np.testing.assert_allclose([a.score for a in asked], decoded["score"].numpy(), rtol=1e-4)
    np.testing.assert_allclose([p["score"] for p in evaluated], decoded["score"].numpy(), rtol=1e-4)
    _check_confidence_and_abstention(served, evaluated, calibrator.confidence(features))
    # The weight alone, decoded by numpy at w = 0.25: argmax over valid (block, span) of S_read + 0.25·S_retr.
    weighted = config.apply_override(cfg, "qa.retrieval_score_weight=0.25")
    joint = 0.25 * outputs["retrieval_logits"].numpy()[:, :, None] + outputs["span_logits"].numpy()
    joint = np.where(outputs["span_mask"].numpy(), joint, -np.inf).reshape(len(QUESTIONS), -1)
    num_spans = outputs["span_logits"].shape[2]
    np.testing.assert_array_equal(open_qa.OpenQaTask(weighted).decode(model, outputs)["block"].numpy(),
                                  np.argmax(joint, axis=1) // num_spans)


def _check_confidence_and_abstention(served, evaluated, expected):
    """The served graph's confidence and evaluate's (the Python path) are the calibrator's over the Keras model's
    features (``expected``); a request
    without a threshold answers every question; abstaining at a threshold between two of them answers "" for exactly the
    questions below it, each still with its best candidate; the marker and the warm-up records know the
    calibrator and the threshold signature."""
    asked = served.ask_batch(QUESTIONS)
    np.testing.assert_allclose([p["confidence"] for p in evaluated], expected, atol=3e-4)
    np.testing.assert_allclose([a.confidence for a in asked], expected, atol=3e-4)
    assert not any(a.abstained for a in asked)
    ranked = np.sort(expected)
    gap = int(np.argmax(np.diff(ranked)))  # the threshold in the widest gap: far from every confidence
    assert ranked[gap + 1] - ranked[gap] > 3e-3  # ten times the tolerance: the served values fall on its sides
    threshold = float(ranked[gap] + ranked[gap + 1]) / 2
    selective = answerer.Answerer(served.path, min_confidence=threshold).ask_batch(QUESTIONS)
    below = [c < threshold for c in (a.confidence for a in selective)]
    assert [a.abstained for a in selective] == below and any(below) and not all(below)
    assert [a.answer for a in selective] == ["" if b else a.answer for a, b in zip(asked, below)]
    assert [a.candidate for a in selective] == [a.answer for a in asked]
    meta = served.metadata["confidence"]
    assert meta["calibrator"] == "features" and meta["fitted_on"]["predictions"] == "hand-set"
    signatures = {signature for signature, _ in serving_warmup.read_warmup_requests(served.path)}
    assert signatures == {"serving_default", "answer_selectively"} and served.warm_up() > 0


def _corrupt(version: str, how: str) -> str:
    """Damages a copied export in one of the ways a disk or a killed copy does; returns the file damaged."""
    variables = os.path.join(version, "variables", "variables.data-00000-of-00001")
    if how == "truncated":
        with open(variables, "r+b") as f:
            f.truncate(os.path.getsize(variables) // 2)
        return variables
    if how == "flipped":
        with open(variables, "r+b") as f:
            f.seek(os.path.getsize(variables) // 3)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        return variables
    os.remove(os.path.join(version, "saved_model.pb"))
    return os.path.join(version, "saved_model.pb")


def test_a_damaged_version_is_named_and_the_previous_one_served(exported, tmp_path, capsys, caplog):
    """Versions damaged in three ways above a good one: the base path serves the good one, naming each damaged
    version it passed; each damaged version alone is a clear error (exit code 2 from the command line)."""
    import shutil

    from realm_tf import cli

    _, path, _, _ = exported
    base = tmp_path / "served"
    damage = {"2": "truncated", "3": "flipped", "4": "no_graph"}
    for version in ("1", *damage):
        shutil.copytree(path, base / version)
    for version, how in damage.items():
        _corrupt(str(base / version), how)
    expected = answerer.Answerer(path).ask(QUESTIONS[0]).answer
    served = answerer.Answerer(str(base))  # the base path: versions 4, 3 and 2 are damaged, version 1 serves
    assert served.path == str(base / "1") and served.ask(QUESTIONS[0]).answer == expected
    for version in damage:
        assert any(str(base / version) in r.getMessage() and "previous complete version" in r.getMessage()
                   for r in caplog.records), version
        # The damaged version alone: an error that names it and says what to do.
        with pytest.raises(errors.UserError) as raised:
            answerer.Answerer(str(base / version))
        assert str(base / version) in str(raised.value) and "Export it again" in str(raised.value)
    capsys.readouterr()
    assert cli.main(["ask", QUESTIONS[0], "--model", str(base / "3")]) == 2  # no traceback, exit code 2
    err = capsys.readouterr().err
    assert str(base / "3") in err and "Traceback" not in err


def test_refresh_swaps_to_a_newer_complete_version_while_requests_keep_being_answered(exported, tmp_path, caplog):
    """TF Serving's "latest" policy in the Answerer: a newer complete version is loaded beside the served one
    and swapped in; a damaged newer one is named and skipped; no request fails or mixes versions meanwhile."""
    import shutil
    import threading

    _, path, _, _ = exported
    base = tmp_path / "served"
    shutil.copytree(path, base / "1")
    served = answerer.Answerer(str(base))
    expected = served.ask(QUESTIONS[0]).answer
    assert served.refresh() is False and served.path == str(base / "1")  # nothing newer
    answers, failures, stop = [], [], threading.Event()

    def client():
        while not stop.is_set():
            try:
                answers.append(served.ask(QUESTIONS[0]).answer)
            except Exception as e:  # pylint: disable=broad-except  # any failure is the finding
                failures.append(e)

    clients = [threading.Thread(target=client) for _ in range(3)]
    for thread in clients:
        thread.start()
    shutil.copytree(path, base / ".staging-2")  # a version being written is not listed ...
    assert served.refresh() is False
    os.rename(base / ".staging-2", base / "2")  # ... until it is complete under its number
    assert served.refresh() is True and served.path == str(base / "2")
    shutil.copytree(path, base / "3")
    _corrupt(str(base / "3"), "truncated")
    assert served.refresh() is False and served.path == str(base / "2")  # damaged: named, the current one kept
    assert any(str(base / "3") in r.getMessage() and "still serving" in r.getMessage() for r in caplog.records)
    stop.set()
    for thread in clients:
        thread.join()
    assert not failures and answers and set(answers) == {expected}


def test_a_corpus_only_version_keeps_the_calibrator_and_says_when_it_was_fitted_over_another_corpus():
    fitted = {"calibrator": "features", "file": "calibrator.json", "fitted_on": {"predictions": "tune.jsonl"},
              "corpus_version": 0}
    carried = open_qa_export._carried_confidence(fitted, 1)  # pylint: disable=protected-access
    assert carried == {**fitted, "fitted_on_earlier_corpus": True}
    assert open_qa_export._carried_confidence(fitted, 0)["fitted_on_earlier_corpus"] is False
    assert open_qa_export._carried_confidence(None, 3) == {"calibrator": "none"}  # an export from before
