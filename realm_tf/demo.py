"""The main job (``make demo``): REALM's whole loop on the bundled Open-QA sample, sized for a small CPU.

The loop of Guu et al. (2020), each stage the library calls of its ``realm-tf`` command: a corpus subset (the gold
passages of a sample of the bundled questions, the bundled SQuAD paragraphs, and as many other passages as gold
ones) → ``preprocess`` into blocks → ``generate-pretraining-data`` (salient spans) → ``init-retriever`` (the
import's projection fitted to the corpus) → ``export-retriever`` + ``refresh-index`` (Embed_doc exported, every
block embedded by the Beam job, the first ScaNN index published) → ``pretrain`` (REALM, a few steps) →
``train-reader`` (the reader warm start on gold blocks, from the pre-trained reader) → ``finetune`` on the training
questions → ``evaluate`` on held-out questions → ``export`` the serving SavedModel → ``ask`` it sample questions.

The stages are a declarative list (:func:`plan`): each names the functions it calls (``"module:function"`` and
keyword arguments, :class:`realm_tf.stages.Call`). ``realm-tf demo`` runs each call in a process of its own
(``--one-process``: all in one), so the demo holds one stage's memory at a time, under 4 GB: TensorFlow's BFC
allocator keeps what a process once took; this process plans and never imports TensorFlow.

The demo's few pre-training steps are all in REALM's reader-only phase (``pretrain.freeze_retriever_steps``, the
first 150 of ``configs/minilm.yaml``'s 500): the retriever does not change, so the first index stays current and
no refresh is needed; the time a refresh would take (re-embedding every block, about two minutes here) goes to
the reader warm start, which is what the answers depend on. The asynchronous refresh runs in ``realm-tf
pretrain`` once the retriever trains (``refresh.mode``), and in ``make test``.

Everything goes to ``<workdir>`` (default ``runs/demo``, recreated each run), TensorBoard logs included; the last
lines print exact match, F1, accuracy@5 (also on NQ-open's questions, answers of at most five tokens) and where
the outputs are.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import time
from concurrent import futures
from typing import Any

from realm_tf import config as config_lib
from realm_tf import process_settings
from realm_tf import stages
from realm_tf.data import question_split


def _overrides(work: str, pretrain_steps: int, finetune_steps: int, reader_steps: int, reader_minutes: float,
               reader_negatives: int, precision: str) -> list[str]:
    return [
        f"data.blocks_dir={work}/blocks", f"data.pretraining_dir={work}/pretraining",
        f"index.index_dir={work}/index", f"refresh.export_dir={work}/export",
        f"pretrain.model_dir={work}/pretrain", f"finetune.model_dir={work}/finetune",
        f"reader.model_dir={work}/reader", f"model.retriever_checkpoint={work}/retriever_init",
        # Pre-training: a handful of steps to run the loop (REALM trains 200k steps on 64 TPUs).
        f"pretrain.steps={pretrain_steps}", f"pretrain.precision={precision}", "pretrain.warmup_steps=1",
        "pretrain.summary_every_steps=1", "pretrain.checkpoint_every_steps=100", "pretrain.eval_examples=8",
        "refresh.export_every_steps=0", "refresh.mode=external", "data.batch_size=4", "data.shuffle_buffer=256",
        # All of them in the reader-only phase (after a short MLM head warm-up): the first index stays current.
        f"pretrain.freeze_retriever_steps={pretrain_steps}", "pretrain.mlm_head_warmup_blocks=128",
        # The reader warm start, from the pre-trained reader, for a few minutes: gold blocks only by default (twice
        # the questions of gold + one negative in the same time; the retrieval score ranks the blocks), at a
        # higher rate than the benchmark's long run (1e-4): in 100 steps of 8 questions on the demo's data the
        # training span accuracy reached 0.06 at 1e-4, 0.12-0.13 at 3e-4 and 6e-4 (benchmarks/RESULTS.md).
        f"reader.steps={reader_steps}", f"reader.max_minutes={reader_minutes:g}", "reader.learning_rate=3e-4",
        f"reader.precision={precision}",
        # On a machine too slow for all the steps in the minutes, the rate still decays to 0 when they run out
        # (a schedule cut halfway stops at half its peak rate, unannealed).
        "reader.learning_rate_decay=budget",
        "reader.warmup_steps=5", "reader.summary_every_steps=5", "reader.checkpoint_every_steps=1000",
        f"qa.reader_negatives={reader_negatives}",
        # Fine-tuning: the retriever from the pre-training run, the reader from its warm start; a short schedule.
        f"qa.retriever_checkpoint={work}/pretrain", f"qa.reader_checkpoint={work}/reader",
        # Every training stage in one precision: in bfloat16, pre-training held 0.5 GB and fine-tuning 0.4 GB less
        # than in float32 here (benchmarks/training_memory.py).
        f"finetune.steps={finetune_steps}", f"finetune.precision={precision}", "finetune.learning_rate=5e-5",
        "finetune.warmup_steps=2", "finetune.summary_every_steps=5", "finetune.checkpoint_every_steps=1000",
    ]


#: The estimate of what follows the reader warm start's training (its own start: reading blocks, tracing; then
#: fine-tuning, evaluation, export, questions): ``(share, seconds)``, that share of the time the stages before it
#: took plus that many seconds. The stages on both sides are process starts, traces and BERT passes, so they
#: scale together with the machine's speed, the later ones less than in proportion (a slow pre-training start does
#: not make fine-tuning slower); the figures behind the values are in benchmarks/RESULTS.md (make demo).
AFTER_WARM_START = (0.5, 80.0)


def reader_minutes_left(budget_minutes: float, elapsed_seconds: float, cap_minutes: float) -> float:
    """The reader warm start's minutes when the demo's stages must end within ``budget_minutes``: what is left
    once the stages before it (``elapsed_seconds``) and an estimate of those after it (:data:`AFTER_WARM_START`)
    are counted; at most ``cap_minutes``, at least one. The warm start's rate decays to 0 when its minutes run
    out (``reader.learning_rate_decay: budget``), so a slower machine reads fewer questions, annealed."""
    share, fixed = AFTER_WARM_START
    left = budget_minutes * 60.0 - elapsed_seconds * (1.0 + share) - fixed
    return max(1.0, min(cap_minutes, left / 60.0))


def run(cfg: config_lib.ExperimentConfig, workdir: str = "runs/demo", in_children: bool = True,
        verbose: bool = False, num_questions: int = 800, pretrain_steps: int = 2, finetune_steps: int = 10,
        reader_steps: int = 800, reader_minutes: float = 7.5, reader_negatives: int = 0, reader_batch_size: int = 8,
        squad_paragraphs: int | None = None, reader_nq: str = "all", samples: int = 3,
        pretrain_batch_size: int = 1, finetune_batch_size: int = 2, precision: str = "auto",
        minutes: float = 13.0) -> int:
    """Runs every stage on a subset of the bundled data; returns 0 when the loop completed.

    Each stage calls the library functions that the ``realm-tf`` commands call (:func:`plan`), in a child process
    of its own (``in_children``; :mod:`realm_tf.stages`) or in this one.

    The reader warm start draws from every bundled SQuAD question (``squad_paragraphs=None``: 10,570) and, with
    ``reader_nq="all"``, the training split of *every* bundled NQ question (about 6,000; never a held-out one), on
    the gold blocks of the whole bundled corpus, preprocessed for reading only, as the benchmark's warm start does
    (the demo's index still holds its own corpus). 800 steps of 8 read 6,400 of them, none twice, so the reader
    does not learn a small reading set by heart (with the SQuAD questions of 100 paragraphs it did, in 700 steps:
    benchmarks/RESULTS.md). ``reader_nq="sample"``: only the demo's sample of NQ questions, on its corpus.
    The 800 bundled questions are a seeded random sample (:func:`sample_corpus`); their dev split is the held-out
    set. ``minutes`` (0: none): the stages' time budget (the README's 15 minutes less the set-up's); the warm start
    gets what the others leave (:func:`reader_minutes_left`), at most ``reader_minutes``.
    """
    if reader_nq not in ("all", "sample"):
        raise ValueError(f"reader_nq={reader_nq!r}: 'all' or 'sample'")
    if precision == "auto":  # bfloat16 where the CPU has it (1.2x the steps a minute), else float32
        precision = "mixed_bfloat16" if process_settings.native_bfloat16() else "float32"
    started = time.time()
    work = workdir.rstrip("/")
    if os.path.isdir(work):
        shutil.rmtree(work)
    os.makedirs(work)
    for item in _overrides(work, pretrain_steps, finetune_steps, reader_steps, reader_minutes, reader_negatives,
                           precision):
        cfg = config_lib.apply_override(cfg, item)
    options = {"num_questions": num_questions, "squad_paragraphs": squad_paragraphs, "reader_nq": reader_nq,
               "reader_minutes": reader_minutes, "reader_batch_size": reader_batch_size, "samples": samples,
               "pretrain_batch_size": pretrain_batch_size, "finetune_batch_size": finetune_batch_size}
    params = config_lib.save_params(cfg, work)
    results = _run_stages(cfg, work, params, options, started, minutes, in_children, verbose)
    stats, metrics = results["corpus"], results["evaluate"]
    print(f"\nrealm-tf demo finished in {(time.time() - started) / 60:.1f} min on {stats['passages']} passages; "
          f"held-out questions: {metrics['num_questions']}")
    print(f"outputs: {work}/ (blocks, index, pretrain, finetune, served); metrics {work}/metrics.json; "
          f"predictions {metrics['predictions']}; TensorBoard: tensorboard --logdir {work}")
    print(f"EM {metrics['exact_match']:.3f}  F1 {metrics['f1']:.3f}  accuracy@5 {metrics['accuracy@5']:.3f}  "
          f"(reader oracle {metrics['reader_oracle']:.3f}, accuracy@20 {metrics['accuracy@20']:.3f})")
    short = metrics["short_answers"]
    print(f"on NQ-open's {short['num_questions']} questions (an answer of at most {short['max_tokens']} tokens, as "
          f"REALM's NQ): EM {short['exact_match']:.3f}  F1 {short['f1']:.3f}")
    return 0


def _run_stages(cfg: config_lib.ExperimentConfig, work: str, params: str, options: dict[str, Any], started: float,
                minutes: float, in_children: bool, verbose: bool) -> dict[str, Any]:
    """Runs :func:`plan`'s stages in order (the warm start planned again with the minutes ``minutes`` leaves it);
    ``{stage name: result}``."""
    results: dict[str, Any] = {}
    steps = plan(cfg, work, params, options)
    for number, stage in enumerate(steps, 1):
        if stage.name == "train-reader" and minutes > 0:
            left = reader_minutes_left(minutes, time.time() - started, options["reader_minutes"])
            replanned = plan(_with(cfg, f"reader.max_minutes={left:.2f}"), work, params,
                             {**options, "reader_minutes": round(left, 2)})
            stage = next(s for s in replanned if s.name == stage.name)
        print(f"\n=== [{number}/{len(steps)}] {stage.name}: {stage.what}  (t={time.time() - started:.0f}s)", flush=True)
        start = time.time()
        try:
            results[stage.name] = stages.run_stage(stage, in_children, verbose)
        except futures.process.BrokenProcessPool as e:
            raise SystemExit(f"realm-tf demo: stage {stage.name} ended without a result (its process was killed: "
                             f"out of memory?)") from e
        print(f"=== {stage.name} done in {time.time() - start:.0f}s", flush=True)
        if stage.name == "corpus":
            stats = results[stage.name]
            print(f"  {stats['passages']} passages, {stats['questions']} questions ({stats['dev']} held out), "
                  f"{stats['squad_questions']} SQuAD questions for the reader warm start")
    return results


def plan(cfg: config_lib.ExperimentConfig, work: str, params: str,
         options: dict[str, Any]) -> list[stages.Stage]:
    """The demo's stages, in order, each the library calls of its ``realm-tf`` command(s): ``cfg`` is the demo's
    config (``params``, its YAML, for the Beam jobs, which read a config file as their workers do)."""
    corpus, questions, squad = f"{work}/corpus.jsonl", f"{work}/questions.jsonl", f"{work}/squad.jsonl"
    # Small steps, each BERT in one length group: the demo's few pre-training and fine-tuning steps show the loop,
    # and each stage stays under 4 GB and traces its step in seconds (pre-training: 6.8 GB and about a minute at 4
    # queries in 4 groups; fine-tuning: 5.6 GB at 4 questions; RESULTS.md).
    one_group = ("model.reader_length_buckets=1", "model.candidate_length_buckets=1")
    pretrain = _with(cfg, f"data.batch_size={options['pretrain_batch_size']}", *one_group)
    finetune = _with(cfg, f"data.batch_size={options['finetune_batch_size']}", *one_group)
    nq = "every bundled NQ training question" if options["reader_nq"] == "all" else "the sample's NQ training questions"
    served = f"{work}/served"
    stage = lambda name, what, *calls: stages.Stage(name, what, calls)  # noqa: E731
    return [
        stage("corpus", "gold passages of sampled questions, SQuAD paragraphs + as many others", stages.Call(
            "realm_tf.demo:sample_corpus", {"cfg": cfg, "corpus_out": corpus, "questions_out": questions,
                                            "squad_out": squad, "num_questions": options["num_questions"],
                                            "squad_paragraphs": options["squad_paragraphs"]},
            starts_tensorflow=False)),
        stage("preprocess", "passages -> blocks of <= 288 wordpieces", stages.Call(
            "beam_jobs.preprocess_corpus:JOB.call", {"config": params, "input": [corpus],
                                                     "output": cfg.data.blocks_dir})),
        stage("pretraining-data", "salient-span masked queries", stages.Call(
            "beam_jobs.generate_pretraining_data:JOB.call", {"config": params})),
        stage("init-retriever", "the import's projection fitted to the corpus (model.projection_init)", stages.Call(
            "realm_tf.tasks.projection_init:init_retriever",
            {"cfg": cfg, "out": f"{work}/retriever_init", "num_blocks": 256})),
        # Pre-training finds this index and builds none (in its own process it would keep the memory).
        stage("index", "Embed_doc exported, every block embedded, the first ScaNN index published",
              stages.Call("realm_tf.core.warm_start:export_retriever_of_run",
                          {"cfg": cfg, "run_dir": f"{work}/retriever_init"},
                          report="realm_tf.core.warm_start:format_retriever_export"),
              stages.Call("beam_jobs.embed_blocks:refresh_index", {"config": params})),
        stage("pretrain", "REALM pre-training steps", stages.Call(
            "realm_tf.tasks.realm_pretraining:pretrain", {"cfg": pretrain},
            report="realm_tf.tasks.realm_pretraining:format_result")),
        stage("train-reader", f"the reader warm start on gold blocks, SQuAD + {nq} (at most "
                              f"{options['reader_minutes']:g} min)", *_warm_start(cfg, work, params, options)),
        stage("finetune", "Open-QA fine-tuning (retriever + span reader)", stages.Call(
            "realm_tf.tasks.open_qa:finetune", {"cfg": finetune, "train_path": questions})),
        stage("evaluate", "held-out questions: EM, retrieval accuracy@k", stages.Call(
            "realm_tf.tasks.open_qa:evaluate", {"cfg": cfg, "questions_path": questions, "split": "dev",
                                                "metrics_path": f"{work}/metrics.json"})),
        stage("export", "one SavedModel: tokenize, embed, ScaNN search, read, decode", stages.Call(
            "realm_tf.tasks.open_qa:export_for_serving", {"cfg": cfg, "out": served})),
        stage("ask", "sample held-out questions", stages.Call(
            "realm_tf.demo:ask_held_out", {"model": served, "questions_path": questions,
                                           "dev_fraction": cfg.data.qa_dev_fraction, "count": options["samples"]})),
    ]


def _with(cfg: config_lib.ExperimentConfig, *overrides: str) -> config_lib.ExperimentConfig:
    for item in overrides:
        cfg = config_lib.apply_override(cfg, item)
    return cfg


def _warm_start(cfg: config_lib.ExperimentConfig, work: str, params: str,
                options: dict[str, Any]) -> tuple[stages.Call, ...]:
    """The reader warm start: SQuAD and the NQ training questions (every bundled one, read on the whole bundled
    corpus preprocessed for reading, or the demo's sample) on their gold blocks."""
    calls: list[stages.Call] = []
    questions = [f"{work}/squad.jsonl"]
    # Two length groups. Where the cores are no more than the groups, each op runs on one thread and the
    # groups run side by side (reader.intra_op_threads=1): on 2 cores 96% fewer context switches and half
    # the kernel time, for 10% fewer steps/s. Three groups run faster still but held 3.8-4.1 GB, over the
    # demo's 4 GB; four held 4.0-4.2 GB (benchmarks/stage_memory.py).
    groups = 2
    threads = 1 if (os.cpu_count() or 1) <= groups else 0
    reader = _with(cfg, f"qa.reader_checkpoint={cfg.pretrain.model_dir}",
                   f"data.batch_size={options['reader_batch_size']}", f"model.reader_length_buckets={groups}",
                   f"reader.intra_op_threads={threads}")
    if options["reader_nq"] == "all":  # the gold blocks of every bundled question, for reading (not indexed)
        calls.append(stages.Call("beam_jobs.preprocess_corpus:JOB.call", {
            "config": params, "input": [cfg.data.corpus_pattern], "output": f"{work}/reading_blocks"}))
        reader = _with(reader, f"data.blocks_dir={work}/reading_blocks")
        questions.append(cfg.data.qa_train)
    else:
        questions.append(f"{work}/questions.jsonl")
    calls.append(stages.Call("realm_tf.tasks.reader_warm_start:train_reader",
                             {"cfg": reader, "question_paths": questions}))
    return tuple(calls)


def sample_corpus(cfg: config_lib.ExperimentConfig, corpus_out: str, questions_out: str, squad_out: str,
                  num_questions: int, squad_paragraphs: int | None) -> dict:
    """A seeded random sample of ``num_questions`` bundled questions (in file order) and their gold passages, the
    SQuAD questions of the first ``squad_paragraphs`` SQuAD paragraphs (all of them when None; reading-comprehension
    data for the reader warm start) and those paragraphs, and as many other passages as there are gold ones.

    A random sample, not the file's first questions: ``qa_qed_train`` is not in random order. Three readers score
    EM 0.23-0.30 on the dev questions among its first 1,600 and 0.28-0.51 on every later 800
    (``benchmarks/question_order.py``), so a prefix is a harder, unrepresentative held-out set."""
    with gzip.open(cfg.data.qa_train, "rt", encoding="utf-8") as f:
        every = [json.loads(line) for line in f]
    chosen_rows = random.Random(0).sample(range(len(every)), min(num_questions, len(every)))
    rows = [every[i] for i in sorted(chosen_rows)]
    gold = {str(pid) for r in rows for pid in r.get("gold_passage_ids", [])}
    squad_rows, paragraphs = [], set()
    squad_path = os.path.join(os.path.dirname(cfg.data.qa_train), "qa_squad_dev.jsonl.gz")
    if (squad_paragraphs is None or squad_paragraphs > 0) and os.path.exists(squad_path):
        with gzip.open(squad_path, "rt", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                ids = {str(pid) for pid in row.get("gold_passage_ids", [])}
                if (squad_paragraphs is not None and not ids <= paragraphs
                        and len(paragraphs | ids) > squad_paragraphs):
                    break
                paragraphs |= ids
                squad_rows.append(row)
    with gzip.open(cfg.data.corpus_pattern, "rt", encoding="utf-8") as f:
        passages = [json.loads(line) for line in f]
    wanted = gold | paragraphs
    others = [p for p in passages if str(p["id"]) not in wanted]
    chosen = [p for p in passages if str(p["id"]) in wanted] + random.Random(0).sample(
        others, min(len(gold), len(others)))
    for path, items in ((corpus_out, chosen), (questions_out, rows), (squad_out, squad_rows)):
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
    dev = sum(question_split.is_dev(str(r["id"]), cfg.data.qa_dev_fraction) for r in rows)
    return {"passages": len(chosen), "questions": len(rows), "dev": dev, "squad_questions": len(squad_rows)}


def ask_held_out(model: str, questions_path: str, dev_fraction: float, count: int, snippet: int = 100) -> list[str]:
    """Asks the served ``model`` the first ``count`` held-out (dev) questions of ``questions_path``
    (``realm-tf ask``); returns the answers."""
    from realm_tf.serving import answerer  # pylint: disable=import-outside-toplevel  (the planner loads no TF)

    with open(questions_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    held_out = [r["question"] for r in rows if question_split.is_dev(str(r["id"]), dev_fraction)]
    return answerer.ask(model, held_out[:count], snippet=snippet)
