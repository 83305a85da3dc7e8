"""Open-QA task: in-graph answer matching vs the numpy reference, answers cut from the original text,
fine-tune + evaluate through the CLI, EM / regex matching."""
import dataclasses
import functools
import itertools
import json
import re
import unicodedata

import numpy as np
import pytest
import replica_steps  # tests/replica_steps.py
import tensorflow as tf
import xla_steps  # tests/xla_steps.py (tests/ is on the path: tests/conftest.py)

from beam_jobs import embed_blocks
from realm_tf import cli
from realm_tf import config
from realm_tf import errors
from realm_tf.core import precision
from realm_tf.core import warm_start
from realm_tf.data import answer_normalization
from realm_tf.data import answer_spans
from realm_tf.data import questions
from realm_tf.export import retriever_export
from realm_tf.index import bm25_retriever
from realm_tf.index import index_publisher
from realm_tf.index import index_refresher
from realm_tf.layers import bert_tokenizer
from realm_tf.models import answer_confidence
from realm_tf.models import knowledge_retriever
from realm_tf.models import open_qa_model
from realm_tf.tasks import answer_calibration
from realm_tf.tasks import answer_errors
from realm_tf.tasks import open_qa
from realm_tf.tasks import qa_metrics
from realm_tf.tasks import selective_qa

TINY = "configs/tiny.yaml"
QUESTIONS = ["who wrote the lyrics", "when did the crisis begin", "what is the capital city", "where was he born",
             "which team won the cup", "how many people live there"]


@pytest.fixture(scope="module")
def qa(tmp_path_factory, pretraining_workspace):
    root = tmp_path_factory.mktemp("qa")
    overrides = [f"data.blocks_dir={pretraining_workspace}/blocks", f"index.index_dir={root}/index",
                 f"refresh.export_dir={root}/export", f"finetune.model_dir={root}/model", "data.batch_size=3",
                 "finetune.steps=4", "finetune.warmup_steps=0", "finetune.learning_rate=1e-3",
                 "finetune.summary_every_steps=2", "data.qa_dev_fraction=0.3",
                 "index.num_neighbors=100"]  # every block ranked (the corpus has fewer): accuracy@100 sees them all
    # The retriever comes from a "run" (an ICT-style checkpoint) that also built the index, as in real use.
    retriever = knowledge_retriever.build_knowledge_retriever(config.load_config(TINY).model)
    tf.train.Checkpoint(model=retriever).save(str(root / "ict" / "checkpoints" / "ckpt"))
    cfg = config.load_config(TINY, overrides + [f"qa.retriever_checkpoint={root}/ict"])
    params = config.save_params(cfg, str(root))
    retriever_export.export_retriever(retriever, cfg, 0)
    assert index_refresher.IndexRefresher(params, embed_blocks.embed_and_publish).refresh_once() == 0
    task = open_qa.OpenQaTask(cfg)
    corpus, blocks, _ = open_qa.load_corpus(cfg, task.tokenizer)
    model = task.build_model(corpus)
    # Answers taken from the blocks the (random) model retrieves, so that matches exist: a title, a word of
    # the body, a two-word phrase, and something absent.
    examples = [questions.QaExample(q, ("placeholder",), f"q{i}") for i, q in enumerate(QUESTIONS)]
    batch = next(iter(task.dataset(examples, len(examples))))
    outputs = model({k: v for k, v in batch.items() if k.startswith("question_")})
    ids = outputs["block_ids"].numpy()
    with_answers = []
    for i, e in enumerate(examples):
        first, second = int(ids[i, 0]), int(ids[i, -1])
        words = re.findall(r"[A-Za-z]{4,}", blocks.texts[second])
        answers = (blocks.titles[first], words[len(words) // 2], " ".join(words[1:3]), "zzqx unfindable")
        with_answers.append(questions.QaExample(e.question, answers, e.id))
    return cfg, root, task, model, blocks, with_answers


def test_answer_span_mask_matches_the_numpy_reference(qa):
    cfg, _, task, model, _, examples = qa
    batch = next(iter(task.dataset(examples, len(examples))))
    outputs = model({k: v for k, v in batch.items() if k.startswith("question_")})
    mask = task.answer_span_mask(outputs, batch["answer_ids"]).numpy()  # [batch, k, num_spans]
    table = bert_tokenizer.continuation_table(task.tokenizer.vocab)
    valid = outputs["span_mask"].numpy()
    total = 0
    for i, e in enumerate(examples):
        answers = [a for a in task.tokenizer(tf.constant(list(e.answers))).to_list()
                   if len(a) <= cfg.model.max_span_width]
        expected = answer_spans.answer_span_mask(outputs["reader_input_word_ids"].numpy()[i],
                                                 outputs["reader_input_type_ids"].numpy()[i], answers,
                                                 cfg.model.max_span_width, table) & valid[i]
        np.testing.assert_array_equal(mask[i], expected)
        total += int(expected.sum())
    assert total >= len(examples)  # every question has matches (its titles and words were taken from its blocks)


def test_training_pads_the_reader_inputs_to_a_multiple_of_32_and_scores_the_same_spans(qa):
    cfg, _, task, model, _, examples = qa
    # The exact length is that of the longest question + block read; which blocks a random retriever reads varies,
    # so the questions grow a word at a time until that length is not already a multiple of 32.
    for extra in range(4):
        longer = [dataclasses.replace(e, question=e.question + " please" * extra) for e in examples]
        batch = next(iter(task.dataset(longer, len(longer))))
        question = {k: v for k, v in batch.items() if k.startswith("question_")}
        if model(question)["reader_input_word_ids"].shape[-1] % 32:
            break
    read = {}
    for training in (False, True):  # the tiny config has no dropout: training changes the padding only
        out = {k: v.numpy() for k, v in model(question, training=training).items()}
        spans = {(b, k, out["span_starts"][b, k, s], out["span_ends"][b, k, s]): out["span_logits"][b, k, s]
                 for b, k, s in np.argwhere(out["span_mask"])}
        read[training] = out["reader_input_word_ids"].shape[-1], spans
    (exact, evaluated), (padded, trained) = read[False], read[True]
    assert exact % 32 and padded == min(-(-exact // 32) * 32, cfg.model.reader_seq_length)
    assert trained.keys() == evaluated.keys() and evaluated
    np.testing.assert_allclose([trained[key] for key in evaluated], list(evaluated.values()), atol=1e-4)


def test_only_whole_word_spans_outside_the_title_body_sep_are_valid(qa):
    cfg, _, task, model, blocks, examples = qa
    batch = next(iter(task.dataset(examples, len(examples))))
    table = bert_tokenizer.continuation_table(task.tokenizer.vocab)
    # Read blocks whose title or body opening has "##" pieces (a random retriever may not pick any).
    split = [i for i in range(len(blocks))
             if table[np.concatenate([blocks.title_ids(i), blocks.body_ids(i)[:8]])].any()]
    assert len(split) >= 2
    chosen = tf.constant([[split[(2 * i) % len(split)], split[(2 * i + 1) % len(split)]] for i in range(len(examples))],
                         tf.int32)
    question = {k: v for k, v in batch.items() if k.startswith("question_")}
    outputs = {k: v.numpy() for k, v in model({**question, "block_ids": chosen}).items()}
    ids, mask = outputs["reader_input_word_ids"], outputs["span_mask"]
    starts, ends = outputs["span_starts"], outputs["span_ends"]
    cut_words = 0
    for b, k, s in np.ndindex(*mask.shape):
        start, end = starts[b, k, s], ends[b, k, s]
        row = ids[b, k]
        expected = (end < len(row) and row[end] != task.tokenizer.pad_id
                    and task.tokenizer.sep_id not in row[start:end + 1].tolist()
                    and row[start] != task.tokenizer.cls_id  # x and z: segment ids say which; spans lie in z
                    and not table[row[start]] and not (end + 1 < len(row) and table[row[end + 1]]))
        if mask[b, k, s]:
            assert expected, (b, k, s)
            assert outputs["reader_input_type_ids"][b, k, start] == 1
        cut_words += bool(not table[row[start]] and end + 1 < len(row) and table[row[end + 1]])
    assert cut_words > 0  # the reader inputs do have word-cutting spans, and they are masked


def test_decoded_answer_is_the_span_in_the_original_text(qa):
    _, _, task, model, _, examples = qa
    batch = next(iter(task.dataset(examples, len(examples))))
    outputs = model({k: v for k, v in batch.items() if k.startswith("question_")})
    decoded = task.decode(model, outputs)
    joint = outputs["retrieval_logits"].numpy()[:, :, None] + outputs["span_logits"].numpy()
    joint = np.where(outputs["span_mask"].numpy(), joint, -np.inf)
    for i in range(len(examples)):
        block, span = np.unravel_index(np.argmax(joint[i]), joint[i].shape)
        assert decoded["block"].numpy()[i] == block
        start, end = outputs["span_starts"].numpy()[i, block, span], outputs["span_ends"].numpy()[i, block, span]
        pieces = outputs["reader_input_word_ids"].numpy()[i, block, start:end + 1]
        assert task.tokenizer.sep_id not in pieces.tolist()
        wordpieces = task.tokenizer.detokenize(tf.constant([pieces])).numpy()[0].decode()
        answer = decoded["answer"].numpy()[i].decode()
        # Detokenized uncased wordpieces lose case, spacing and accents (the tokenizer strips them).
        squash = lambda s: re.sub(r"\W", "", "".join(
            c for c in unicodedata.normalize("NFD", s.lower()) if unicodedata.category(c) != "Mn"))
        assert squash(answer) == squash(wordpieces), (answer, wordpieces)
        probs = np.exp(joint[i] - np.logaddexp.reduce(joint[i][np.isfinite(joint[i])]))
        assert decoded["score"].numpy()[i] == pytest.approx(probs.max(), rel=1e-4)


def _aggregation_reference(outputs, texts, weight, n, bias=0.0):
    """numpy: probabilities over every valid (block, span) of S_read + b·|s| + w·S_retr, the best n, summed by
    SQuAD-normalised text; returns (answer, score, beam position) of the best group's best span, per question."""
    widths = outputs["span_ends"] - outputs["span_starts"] + 1  # [batch, k, num_spans], in wordpieces
    joint = weight * outputs["retrieval_logits"][:, :, None] + outputs["span_logits"] + bias * widths
    joint = np.where(outputs["span_mask"], joint, -np.inf).reshape(len(joint), -1)  # [batch, k * num_spans]
    num_spans = outputs["span_logits"].shape[2]
    results = []
    for i, row in enumerate(joint):
        probs = np.exp(row - np.logaddexp.reduce(row[np.isfinite(row)]))
        order = np.argsort(-probs, kind="stable")[:n]
        # An empty normalised answer is a group of its own.
        keys = {j: answer_normalization.normalize_answer(texts[i][j]) or f"empty-{j}" for j in order}
        groups: dict[str, float] = {}
        for j in order:
            groups[keys[j]] = groups.get(keys[j], 0.0) + probs[j]
        best = next(j for j in order if groups[keys[j]] == max(groups.values()))  # the best group's best span
        results.append((texts[i][best], groups[keys[best]], best // num_spans))
    return results


def _all_span_texts(model, outputs):
    """The text of every (block, span) of every question, flat in [k * num_spans] order."""
    batch, k, num_spans = outputs["span_logits"].shape
    flat = np.arange(k * num_spans)
    position = tf.constant(np.tile(flat // num_spans, [batch, 1]), tf.int32)  # [batch, k * num_spans]
    span = tf.constant(np.tile(flat % num_spans, [batch, 1]), tf.int32)
    texts, _ = model._span_answers(outputs, position, span)  # pylint: disable=protected-access
    return [[t.decode() for t in row] for row in texts.numpy()]


def _blocks_read_twice(qa, seed, scale, noise):
    """``(chosen, outputs)``: each question reads blocks (2i, 2i, 2i + 1), with random retrieval logits and span
    logits of ``scale`` where the block read twice agrees with itself up to ``noise``."""
    _, _, task, model, _, examples = qa
    batch = next(iter(task.dataset(examples, len(examples))))
    question = {k: v for k, v in batch.items() if k.startswith("question_")}
    chosen = tf.constant([[2 * i, 2 * i, 2 * i + 1] for i in range(len(examples))], tf.int32)
    outputs = dict(model({**question, "block_ids": chosen}))
    rng = np.random.default_rng(seed)
    outputs["retrieval_logits"] = tf.constant(rng.normal(size=chosen.shape), tf.float32)  # [batch, k]
    logits = rng.normal(size=outputs["span_logits"].shape) * scale  # [batch, k, num_spans]
    logits[:, 1] = logits[:, 0] + rng.normal(size=logits[:, 0].shape) * noise  # the block read twice agrees
    outputs["span_logits"] = tf.constant(logits, tf.float32)
    return chosen, outputs


def test_aggregated_answers_match_the_numpy_reference(qa):
    """qa.answer_aggregation_spans N > 1: the best N spans' probabilities summed by normalised answer text, the best
    group's best span answered, with and without a span length bias (qa.span_length_bias), against a numpy
    re-implementation on the same outputs (blocks read twice, so that equal texts exist at different beam
    positions)."""
    _, _, task, model, _, _ = qa
    chosen, outputs = _blocks_read_twice(qa, seed=0, scale=0.5, noise=0.1)
    texts = _all_span_texts(model, outputs)
    numpy_outputs = {k: v.numpy() for k, v in outputs.items()}
    changed, lengthened = 0, 0
    for n, weight, bias in itertools.product((1, 7, 60), (1.0, 0.5), (0.0, 0.3)):
        decoded = task.decode(model, outputs, weight, n, bias)
        expected = _aggregation_reference(numpy_outputs, texts, weight, n, bias)
        for i, (answer, score, position) in enumerate(expected):
            assert decoded["answer"].numpy()[i].decode() == answer, (n, weight, bias, i)
            assert decoded["score"].numpy()[i] == pytest.approx(score, rel=1e-4)
            assert decoded["block"].numpy()[i] == position
            assert decoded["block_id"].numpy()[i] == chosen.numpy()[i, position]
        base = task.decode(model, outputs, weight, 1, bias)["answer"].numpy()
        changed += int((decoded["answer"].numpy() != base).sum())
        unbiased = task.decode(model, outputs, weight, n, 0.0)["answer"].numpy()
        lengthened += int((decoded["answer"].numpy() != unbiased).sum())
    assert changed > 0 and lengthened > 0  # the grouping and the length bias did change some answers


def test_confidence_features_match_the_numpy_reference(qa):
    """answer_confidence.answer_features of decoded answers, against numpy over the same outputs: the answer's
    logit, its block's log prior, the margins to the second span and to the best other block, its length, and
    the share of blocks whose own best span is the same answer (blocks read twice, so that some agree)."""
    _, _, task, model, _, _ = qa
    _, outputs = _blocks_read_twice(qa, seed=1, scale=1.0, noise=0.0)
    texts = _all_span_texts(model, outputs)
    o = {k: v.numpy() for k, v in outputs.items()}
    num_spans = o["span_logits"].shape[2]
    for n in (1, 7):
        decoded = task.decode(model, outputs, 1.0, n)
        features = decoded["features"].numpy()
        for i, (answer, score, position) in enumerate(_aggregation_reference(o, texts, 1.0, n)):
            joint = np.where(o["span_mask"][i], o["retrieval_logits"][i][:, None] + o["span_logits"][i], -np.inf)
            log_probs = joint - np.logaddexp.reduce(joint[np.isfinite(joint)])  # [k, num_spans]
            top = np.sort(log_probs.ravel())[::-1]
            prior = o["retrieval_logits"][i] - np.logaddexp.reduce(o["retrieval_logits"][i])
            best = [texts[i][b * num_spans + int(np.argmax(log_probs[b]))] for b in range(3)]
            agree = np.mean([answer_normalization.normalize_answer(t) == answer_normalization.normalize_answer(answer)
                             for t in best])
            np.testing.assert_allclose(features[i, [0, 1, 2, 3, 5]], [
                np.log(score / (1 - score)), prior[position], top[0] - top[1],
                o["retrieval_logits"][i][position] - np.delete(o["retrieval_logits"][i], position).max(), agree],
                rtol=1e-4, atol=1e-4)
            if n == 1:  # the answer is the best span of its block
                span = int(np.argmax(log_probs[position]))
                length = o["span_ends"][i, position, span] - o["span_starts"][i, position, span] + 1
                assert features[i, 4] == length
        assert (features[:, 5] > 0.5).any() and (features[:, 5] < 0.5).any()  # blocks agree and disagree


def test_an_answer_read_twice_outranks_a_stronger_single_span(qa):
    """Two spans with the same text (the same block read at two beam positions) at logit 1.5 each beat a single
    span at 2.0 once aggregated (2·e^1.5 > e^2); the argmax picks the single span."""
    _, _, task, model, _, examples = qa
    batch = next(iter(task.dataset(examples[:1], 1)))
    question = {k: v for k, v in batch.items() if k.startswith("question_")}
    outputs = dict(model({**question, "block_ids": tf.constant([[0, 0, 1]], tf.int32)}))
    mask = outputs["span_mask"].numpy()[0]  # [k, num_spans]
    texts = _all_span_texts(model, outputs)[0]
    num_spans = mask.shape[1]
    norms = [answer_normalization.normalize_answer(t) for t in texts]
    single = next(s for s in range(num_spans) if mask[2, s] and norms[2 * num_spans + s]
                  and norms[2 * num_spans + s] not in norms[:2 * num_spans])
    twice = next(s for s in range(num_spans) if mask[0, s] and norms[s] and norms[s] != norms[2 * num_spans + single])
    logits = np.full(mask.shape, -5.0, np.float32)
    logits[2, single], logits[0, twice], logits[1, twice] = 2.0, 1.5, 1.5
    outputs["span_logits"] = tf.constant(logits[None])
    outputs["retrieval_logits"] = tf.zeros([1, 3], tf.float32)
    argmax, aggregated = task.decode(model, outputs, 1.0, 1), task.decode(model, outputs, 1.0, 10)
    assert argmax["answer"].numpy()[0].decode() == texts[2 * num_spans + single] and argmax["block"].numpy()[0] == 2
    assert aggregated["answer"].numpy()[0].decode() == texts[twice] and aggregated["block"].numpy()[0] == 0
    total = np.exp(logits)[mask].sum()  # masked spans have no probability
    assert aggregated["score"].numpy()[0] == pytest.approx(2 * np.exp(1.5) / total, rel=1e-5)
    assert argmax["score"].numpy()[0] == pytest.approx(np.exp(2.0) / total, rel=1e-5)


def test_answer_normalisation_in_the_graph_matches_squads():
    texts = ["The Beatles!", "  a  U.S.  Army ", "Kevin's \"cat\"", "Éclair THE an", "(1990–1995)", "back\\slash[x]^",
             "", "an", "Theatre the", "A.B.C. (band)"]
    graph = [t.decode() for t in open_qa_model.normalize_answers(tf.constant(texts)).numpy()]
    assert graph == [answer_normalization.normalize_answer(t) for t in texts]


def test_reader_without_the_title_reads_and_cuts_the_body(qa):
    """model.reader_block_title=false (ORQA's reader: join_BERT(x, body)): the block segment is the body alone and
    the decoded answer is cut from the body text."""
    cfg, _, task, model, blocks, examples = qa
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, reader_block_title=False))
    orqa_task = open_qa.OpenQaTask(cfg)
    orqa = orqa_task.build_model(model.corpus)
    batch = next(iter(orqa_task.dataset(examples, len(examples))))
    outputs = orqa({k: v for k, v in batch.items() if k.startswith("question_")})
    decoded = orqa_task.decode(orqa, outputs)
    for i in range(len(examples)):
        for j, block in enumerate(outputs["block_ids"].numpy()[i]):
            ids = outputs["reader_input_word_ids"].numpy()[i, j].tolist()
            types = outputs["reader_input_type_ids"].numpy()[i, j].tolist()
            body = [t for t, s in zip(ids, types) if s == 1][:-1]  # the block segment without its final [SEP]
            assert body == blocks.body_ids(int(block)).tolist()[:len(body)] and len(body) > 0
        answer = decoded["answer"].numpy()[i].decode()
        text = blocks.texts[int(decoded["block_id"].numpy()[i])]
        assert answer and answer in text, (answer, text)


def test_finetune_export_its_retriever_then_evaluate_through_the_cli(qa, capsys, read_scalars):
    cfg, root, _, _, blocks, examples = qa
    path = root / "questions.jsonl"
    path.write_text("".join(json.dumps({"id": f"id{n}-{e.id}", "question": e.question, "answers": list(e.answers)})
                            + "\n" for n in range(4) for e in examples))
    overrides = [f"data.blocks_dir={cfg.data.blocks_dir}", f"index.index_dir={cfg.index.index_dir}",
                 f"finetune.model_dir={root}/model", "data.batch_size=3", "finetune.steps=4",
                 "finetune.warmup_steps=0", "data.qa_dev_fraction=0.3",
                 f"qa.retriever_checkpoint={cfg.qa.retriever_checkpoint}"]
    run = config.load_config(TINY, overrides)
    assert open_qa.finetune(run, str(path))["step"] == 4
    checkpoint = tf.train.latest_checkpoint(str(root / "model" / "checkpoints"))
    assert checkpoint.endswith("-4")
    # The retriever exported from the fine-tuned run serves the fine-tuned query tower (it once exported fresh
    # weights from an Open-QA run without a word): the checkpoint's embeddings, not the starting retriever's.
    exporting = config.apply_override(run, f"refresh.export_dir={root}/export_finetuned")
    handed = warm_start.export_retriever_of_run(exporting, str(root / "model"))
    assert handed == {"export": str(root / "export_finetuned" / "4"), "checkpoint": checkpoint}
    exported = tf.saved_model.load(handed["export"]).signatures["embed_query_ids"]
    tokenizer = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, cfg.model.lower_case)
    packed = tokenizer.pack_single(tokenizer(tf.constant(QUESTIONS)), cfg.model.query_seq_length)
    trained = knowledge_retriever.build_knowledge_retriever(cfg.model)
    tf.train.Checkpoint(retriever=trained).read(checkpoint).assert_existing_objects_matched().expect_partial()
    start = knowledge_retriever.build_knowledge_retriever(cfg.model)
    tf.train.Checkpoint(model=start).read(tf.train.latest_checkpoint(str(root / "ict" / "checkpoints"))) \
        .assert_existing_objects_matched().expect_partial()
    served = exported(**packed)["embedding"].numpy()  # [questions, dim]
    np.testing.assert_allclose(served, trained.embed_queries(packed).numpy(), atol=1e-5)
    assert np.abs(served - start.embed_queries(packed).numpy()).max() > 1e-3
    capsys.readouterr()
    sets = [item for override in overrides for item in ("--set", override)]
    assert cli.main(["evaluate", "--config", TINY, *sets, "--questions", str(path), "--split", "dev",
                     "--errors"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    metrics = json.loads(printed[-1])
    train, dev = open_qa.split_questions(questions.read_questions(str(path)), 0.3)
    assert metrics["num_questions"] == len(dev) > 0 and metrics["checkpoint"].endswith("-4")
    for key in ("exact_match", "regex_match", "reader_oracle", "accuracy@1", "accuracy@5", "accuracy@20",
                "accuracy@100"):
        assert 0.0 <= metrics[key] <= 1.0, key
    # accuracy@k against an independent ranking: every block scored in numpy by the fine-tuned query tower.
    embeddings = index_publisher.read_embeddings(index_publisher.version_dir(cfg.index.index_dir, 0))  # [blocks, dim]
    queries = trained.embed_queries(tokenizer.pack_single(tokenizer(tf.constant([e.question for e in dev])),
                                                          cfg.model.query_seq_length)).numpy()  # [dev, dim]
    ranking = np.argsort(-(queries @ embeddings.T), axis=1)  # [dev, num_blocks], best first
    matcher = qa_metrics.AnswerMatcher(blocks.texts)  # the index's corpus: the fixture's blocks
    first_hit = np.array([next((rank for rank, row in enumerate(ranking[q], 1)
                                if matcher.has_answer(int(row), qa_metrics.normalized_answers(e.answers))), np.inf)
                          for q, e in enumerate(dev)])  # [dev]: rank of the first block holding an answer
    assert np.isfinite(first_hit).all()  # the answers were taken from the corpus
    for k in (1, 5, 20, 100):
        assert metrics[f"accuracy@{k}"] == pytest.approx(np.mean(first_hit <= k)), k
    predictions = [json.loads(line) for line in open(root / "model" / "predictions-dev.jsonl")]
    assert [p["id"] for p in predictions] == [e.id for e in dev]
    assert all(p["prediction"] and len(p["retrieved_titles"]) == cfg.model.reader_beam_size for p in predictions)
    em = np.mean([qa_metrics.exact_match(p["prediction"], p["answers"]) for p in predictions])
    assert metrics["exact_match"] == pytest.approx(em)
    # --errors: every dev question in one outcome, counted from the predictions written, and the table printed.
    outcomes = metrics["outcomes"]
    assert sum(outcomes.values()) == len(dev) and outcomes["correct"] == round(em * len(dev))
    assert outcomes == answer_errors.count_outcomes(predictions)
    # Selective QA over the written predictions: the answers' score against their exact match.
    selective = metrics["selective"]
    assert selective["confidence"] == "score" and selective["accuracy"]["value"] == pytest.approx(em)
    assert selective["aurc"]["value"] == pytest.approx(selective_qa.aurc(
        [p["score"] for p in predictions], [p["exact_match"] for p in predictions]))
    assert any(line.startswith("abstaining below a score threshold: AURC ") for line in printed)
    scalars = read_scalars(root / "model" / "eval_dev")
    assert scalars["selective/aurc"][-1][1] == pytest.approx(selective["aurc"]["value"], rel=1e-6)
    assert metrics["reliability_diagram"] == str(root / "model" / "reliability-dev.png")
    assert open(metrics["reliability_diagram"], "rb").read(4) == b"\x89PNG"
    assert open_qa._diagram_path("out/preds.jsonl") == "out/preds-reliability.png"  # pylint: disable=protected-access
    assert open_qa._diagram_path("predictions-dev-5.jsonl") == "./reliability-dev-5.png"  # pylint: disable=protected-access
    _check_target_precision(sets, path, predictions, capsys)
    for p in predictions:  # the fields the outcomes are judged by are the evaluation's own
        assert p["predicted_block"] in range(cfg.model.reader_beam_size)
        assert p["retrieved_block_ids"][p["predicted_block"]] == p["block_id"]
        assert qa_metrics.exact_match(p["prediction"], p["answers"]) == p["exact_match"]
    table = answer_errors.format_table(outcomes).splitlines()
    assert printed[-1 - len(table):-1] == table
    # NQ-open's view: the questions with a short answer, scored against those answers alone.
    short = [(p["prediction"], [a for a in p["answers"] if len(a.split()) <= 5]) for p in predictions]
    short = [(prediction, answers) for prediction, answers in short if answers]
    assert metrics["short_answers"]["num_questions"] == len(short)
    assert metrics["short_answers"]["exact_match"] == pytest.approx(
        np.mean([qa_metrics.exact_match(p, a) for p, a in short]) if short else 0.0)
    assert any(line.startswith("NQ-open's questions") for line in printed)


def _check_target_precision(sets, path, dev_predictions, capsys):
    """evaluate --target-precision: the threshold is the one the tune split's predictions give, and on dev it
    answers exactly the questions at or above it."""
    assert cli.main(["evaluate", "--config", TINY, *sets, "--questions", str(path), "--split", "dev",
                     "--target-precision", "0.3"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    abstention = json.loads(printed[-1])["abstention"]
    tune = [json.loads(line) for line in open(path.parent / "model" / "predictions-tune-for-threshold.jsonl")]
    threshold = selective_qa.threshold_for_precision([p["confidence"] for p in tune], [p["exact_match"] for p in tune],
                                                     0.3)
    assert abstention["tune"]["threshold"] == abstention["evaluated"]["threshold"] == threshold
    confidence = np.array([p["confidence"] for p in dev_predictions])
    assert abstention["evaluated"]["coverage"] == pytest.approx(np.mean(confidence >= threshold))
    assert any(line.startswith("abstaining below confidence ") for line in printed)


def test_calibrate_fits_an_evaluations_predictions_through_the_cli(tmp_path, capsys):
    """realm-tf calibrate on a predictions file whose rightness follows the agreement feature: the fit's
    confidence ranks by it, and the file it writes is what evaluate and export read."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(400):
        agreement = rng.random()
        features = dict(zip(answer_confidence.FEATURES, [0.0, -1.0, 1.0, 0.5, 2.0, agreement]))
        rows.append({"id": f"q{i}", "score": 0.5, "features": features,
                     "exact_match": float(rng.random() < agreement)})
    predictions = tmp_path / "predictions-tune.jsonl"
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "calibrator.json"
    assert cli.main(["calibrate", "--predictions", str(predictions), "--output", str(out)]) == 0
    assert "calibrator (features) fitted on 400 answers" in capsys.readouterr().out
    fitted = answer_calibration.read_calibrator(str(out))
    assert fitted.weights[5] > 0.5 and fitted.fitted_on["predictions"] == str(predictions)
    assert cli.main(["calibrate", "--predictions", str(tmp_path / "missing.jsonl"), "--output", str(out)]) == 2
    assert "no such predictions file" in capsys.readouterr().err


def test_given_block_ids_are_read_without_a_retrieval_prior(qa):
    _, _, task, model, blocks, examples = qa
    batch = next(iter(task.dataset(examples, len(examples))))
    question = {k: v for k, v in batch.items() if k.startswith("question_")}
    chosen = tf.constant([[(3 * i + j) % len(blocks) for j in range(2)] for i in range(len(examples))], tf.int32)
    outputs = model({**question, "block_ids": chosen})
    np.testing.assert_array_equal(outputs["block_ids"], chosen)
    np.testing.assert_array_equal(outputs["retrieval_logits"], np.zeros(chosen.shape))
    for i in range(len(examples)):
        for j in range(2):
            title = task.tokenizer(tf.constant([blocks.titles[int(chosen[i, j])]])).to_list()[0]
            ids = outputs["reader_input_word_ids"].numpy()[i, j].tolist()
            start = ids.index(task.tokenizer.sep_id) + 1  # join_BERT(x, title [SEP] body): z after x's [SEP]
            assert ids[start:start + len(title)] == title


def test_bm25_evaluation_reads_bm25_blocks_with_the_same_reader(qa):
    cfg, root, _, _, blocks, examples = qa
    path = root / "bm25_questions.jsonl"
    path.write_text("".join(json.dumps({"id": e.id, "question": e.question, "answers": list(e.answers)}) + "\n"
                            for e in examples))
    sets = ["--set", f"data.blocks_dir={cfg.data.blocks_dir}", "--set", f"index.index_dir={cfg.index.index_dir}",
            "--set", f"finetune.model_dir={root}/model", "--set", "data.batch_size=4",
            "--set", f"qa.retriever_checkpoint={cfg.qa.retriever_checkpoint}"]
    metrics = open_qa.evaluate(config.load_config(TINY, sets[1::2]), str(path), retriever="bm25")
    assert metrics["retriever"] == "bm25" and metrics["num_questions"] == len(examples)
    expected, _ = bm25_retriever.Bm25Retriever(blocks.titles, blocks.texts).search([e.question for e in examples],
                                                                                   cfg.model.reader_beam_size)
    predictions = [json.loads(line) for line in open(root / "model" / "predictions-all-bm25.jsonl")]
    assert [p["retrieved_block_ids"] for p in predictions] == expected.tolist()
    assert all(p["block_id"] in p["retrieved_block_ids"] for p in predictions)  # the answer is read from them
    em = np.mean([qa_metrics.exact_match(p["prediction"], p["answers"]) for p in predictions])
    assert metrics["exact_match"] == pytest.approx(em)
    # accuracy@k from BM25's own ranking (the answers came from the dense retriever's blocks, so they need not
    # be in BM25's top k), by brute-force search of the normalised answers in the normalised block texts.
    deep, _ = bm25_retriever.Bm25Retriever(blocks.titles, blocks.texts).search([e.question for e in examples], 100)
    norm = answer_normalization.normalize_answer
    for k in (1, 5, 100):
        hits = [any(f" {norm(a)} " in f" {norm(blocks.texts[r])} " for r in deep[q, :k] for a in e.answers if norm(a))
                for q, e in enumerate(examples)]
        assert metrics[f"accuracy@{k}"] == pytest.approx(np.mean(hits)), k


def test_an_index_from_other_weights_is_refused(qa):
    cfg, _, task, model, _, _ = qa
    assert open_qa.check_index_matches(task, model) < 1e-3
    other = task.build_model(model.corpus)  # restored like `model`, then its Embed_doc is changed
    kernel = other.retriever.doc_embedder.projection.kernel
    kernel.assign(tf.random.stateless_normal(kernel.shape, seed=[1, 2]))
    with pytest.raises(Exception, match="index's block embeddings differ from this model's Embed_doc"):
        open_qa.check_index_matches(task, other)


def test_a_mixed_precision_model_is_checked_against_the_index_in_float32(qa):
    _, _, task, model, _, _ = qa
    with precision.policy_scope("mixed_bfloat16"):  # as `realm-tf finetune` builds it for bfloat16 training
        mixed = task.build_model(model.corpus)
    assert mixed.retriever.doc_embedder.compute_dtype == "bfloat16"
    ids = tf.range(8)
    packed = task.tokenizer.join_bert(model.corpus.title_ids(ids), model.corpus.body_ids(ids),
                                      task.cfg.model.block_seq_length, pad_to_seq_length=False)
    rounding = tf.reduce_max(tf.abs(mixed.retriever.embed_blocks(packed) - model.corpus.block_embeddings(ids)))
    assert rounding > 1e-3  # bfloat16 alone would fail the float32 comparison
    assert open_qa.check_index_matches(task, mixed) < 1e-3
    assert mixed.retriever.doc_embedder.compute_dtype == "bfloat16"  # the model itself is unchanged
    kernel = mixed.retriever.doc_embedder.projection.kernel
    kernel.assign(tf.random.stateless_normal(kernel.shape, seed=[1, 2]))
    with pytest.raises(Exception, match="index's block embeddings differ from this model's Embed_doc"):
        open_qa.check_index_matches(task, mixed)


def test_exact_and_regex_match():
    assert qa_metrics.exact_match("The Beatles.", ["beatles"]) and not qa_metrics.exact_match("Beatle", ["beatles"])
    assert qa_metrics.exact_match("  an  Apple ", ["apple"])
    assert qa_metrics.regex_match("1973 oil crisis", [r"19\d\d"]) and not qa_metrics.regex_match("in 1973", [r"19\d\d"])
    assert qa_metrics.regex_match("C++ (language)", ["c++"])  # an invalid regex is matched literally
    assert answer_normalization.normalize_answer("U.S.A.") == "usa"


def test_finetune_trains_on_short_answers_when_asked(tmp_path):
    """``qa.train_max_answer_tokens`` in fine-tuning: the training split keeps its answers of at most that many
    tokens, the questions with none are left out and counted, and a file left with none is a clear error."""
    rows = [{"id": f"q{i}", "question": f"question {i}?", "answers": answers}
            for i, answers in enumerate([["one two three four"], ["one", "one two three four"], ["a b"]] * 8)]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config.load_config(TINY, ["data.qa_dev_fraction=0.3", "qa.train_max_answer_tokens=2"])
    train, _, facts = open_qa.OpenQaTask(cfg, str(path)).training_set()
    everything, _ = open_qa.split_questions(questions.read_questions(str(path)), 0.3, cfg.data.qa_tune_fraction)
    expected = [(e.id, tuple(a for a in e.answers if len(a.split()) <= 2)) for e in everything]
    assert [(e.id, e.answers) for e in train] == [(i, a) for i, a in expected if a]
    assert facts["left_out_long_answers"] == sum(1 for _, a in expected if not a) > 0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[::3]))  # only the four-token answers
    with pytest.raises(errors.UserError, match="train_max_answer_tokens=2"):
        open_qa.OpenQaTask(cfg, str(path)).training_set()


def test_bad_question_files_name_the_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "ok?", "answers": ["a"]}\n{"question": "", "answers": ["a"]}\n')
    with pytest.raises(Exception, match=r"q.jsonl:2: needs a non-empty string 'question'"):
        questions.read_questions(str(path))
    path.write_text('{"question": "ok?", "answers": "a"}\nnot json\n')
    with pytest.raises(Exception, match=r"q.jsonl:2: not valid JSON"):
        questions.read_questions(str(path))


def test_finetune_on_bm25_blocks_trains_the_reader_alone(qa):
    """`finetune --retriever bm25` (the baseline's reader): BM25's blocks are read, the reader trains, the
    retriever is left as it was."""
    cfg, root, task, _, _, examples = qa
    path = root / "bm25_train.jsonl"
    path.write_text("".join(json.dumps({"id": f"b{n}-{e.id}", "question": e.question, "answers": list(e.answers)})
                            + "\n" for n in range(3) for e in examples))
    model_dir = root / "model_bm25"
    sets = ["--set", f"data.blocks_dir={cfg.data.blocks_dir}", "--set", f"index.index_dir={cfg.index.index_dir}",
            "--set", f"finetune.model_dir={model_dir}", "--set", "data.batch_size=3", "--set", "finetune.steps=2",
            "--set", "finetune.warmup_steps=0", "--set", "finetune.learning_rate=1e-2",
            "--set", f"qa.retriever_checkpoint={cfg.qa.retriever_checkpoint}"]
    assert open_qa.finetune(config.load_config(TINY, sets[1::2]), str(path), retriever="bm25")["step"] == 2
    checkpoint = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    assert checkpoint.endswith("-2")
    trained = tf.train.load_checkpoint(checkpoint)
    slots = [name for name, _ in tf.train.list_variables(checkpoint) if "OPTIMIZER_SLOT" in name]
    assert not [name for name in slots if name.startswith("retriever/")]  # no update ever reached the retriever
    moment = [name for name in slots if name.startswith("reader/span_logit/kernel") and "/m/" in name]
    assert moment and np.abs(trained.get_tensor(moment[0])).max() > 0  # the reader's span scorer trained
    bert = [name for name in slots if name.startswith("reader/encoder/") and "/m/" in name]
    assert bert and any(np.abs(trained.get_tensor(name)).max() > 0 for name in bert)


def test_block_windows_read_that_part_of_each_body_and_the_title_whole(qa):
    _, _, task, model, blocks, examples = qa
    batch = next(iter(task.dataset(examples, len(examples))))
    question = {k: v for k, v in batch.items() if k.startswith("question_")}
    chosen = np.array([[(5 * i + j) % len(blocks) for j in range(2)] for i in range(len(examples))], np.int32)
    rng = np.random.default_rng(0)
    windows = np.zeros([*chosen.shape, 2], np.int32)
    for (i, j), block in np.ndenumerate(chosen):
        length = len(blocks.body_ids(int(block)))
        windows[i, j] = (rng.integers(0, length), rng.integers(1, 12))  # may run past the end: clipped
    outputs = model({**question, "block_ids": tf.constant(chosen), "block_windows": tf.constant(windows)})
    for (i, j), block in np.ndenumerate(chosen):
        title = task.tokenizer(tf.constant([blocks.titles[int(block)]])).to_list()[0]
        start, count = windows[i, j]
        expected = title + [task.tokenizer.sep_id] + blocks.body_ids(int(block)).tolist()[start:start + count]
        ids = outputs["reader_input_word_ids"].numpy()[i, j].tolist()
        types = outputs["reader_input_type_ids"].numpy()[i, j].tolist()
        read = [t for t, s in zip(ids, types) if s == 1][:-1]  # the block segment without its final [SEP]
        assert read == expected


@pytest.mark.slow  # the step compiled with XLA and trained: tens of CPU-seconds
def test_the_step_is_one_xla_program_traced_once(qa, tmp_path):
    cfg, root, _, _, blocks, examples = qa
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps({"id": f"id{n}-{e.id}", "question": e.question, "answers": list(e.answers)})
                            + "\n" for n in range(4) for e in examples))
    run = functools.reduce(config.apply_override, [f"finetune.model_dir={tmp_path}/model", "finetune.steps=3",
                                                   "data.static_padding=true", "finetune.jit_compile=true"], cfg)
    result = xla_steps.run_compiled(open_qa.OpenQaTask(run, str(path)))
    assert np.isfinite(result.result["train"]["loss"])


@pytest.mark.slow  # a child process training the job twice
def test_two_replicas_train_as_one(qa, tmp_path):
    """The retrieval before the update (query forward, search, gathers) on each replica, then AdamW, each
    replica's two questions read one at a time (gradient accumulation). The span logit's bias shifts every
    (block, span) score alike, so the softmax gives it no gradient but a rounding residue, which Adam scales to an
    update of the rate's size: its copies differ by up to about 1e-4 (against updates of 2e-3), hence 2.5e-4."""
    _, root, _, _, _, examples = qa
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps({"id": f"id{n}-{e.id}", "question": e.question, "answers": list(e.answers)})
                            + "\n" for n in range(4) for e in examples))
    replica_steps.check_two_replicas_train_as_one(
        "realm_tf.tasks.open_qa:OpenQaTask", "finetune", ["data.batch_size=4", "finetune.steps=3"], str(tmp_path),
        args=[str(path)], config=f"{root}/params.yaml", accumulation=2, atol=2.5e-4)
