"""The main job (``make demo``): REALM's whole loop on the bundled Open-QA sample, sized for a small CPU.

The loop of Guu et al. (2020), each stage the library calls of its ``realm-tf`` command: a corpus subset (the gold
passages of a sample of the bundled questions and as many other passages) → ``preprocess`` into blocks →
``generate-pretraining-data`` (salient spans) → ``init-retriever`` (the import's projection fitted to the corpus)
→ ``export-retriever`` + ``refresh-index`` (Embed_doc exported, every block embedded by the Beam job, the first
ScaNN index published) → ``pretrain`` (REALM, a few steps) → ``train-reader`` (the reader warm start on gold
blocks, from the pre-trained reader) → ``finetune`` on the training questions → ``evaluate`` on held-out questions
→ ``export`` the serving SavedModel → ``ask`` it sample questions.

The stages are a declarative list (:func:`plan`): each names the functions it calls (``"module:function"`` and
keyword arguments, :class:`realm_tf.stages.Call`). ``realm-tf demo`` runs each training stage in a process of its
own, and the light stages around them in a few shared ones (``--one-process``: all in one), so the demo holds one
stage's memory at a time, under 4 GB: TensorFlow's BFC allocator keeps what a process once took; this process
plans and never imports TensorFlow.

Every machine runs the same steps; a slower machine takes longer, and the start says how long. Pre-training and
fine-tuning train in float32; the reader warm start, in mixed bfloat16 where the CPU multiplies bfloat16 natively
(AMX, AVX-512 BF16) and float32 elsewhere (:func:`precisions`). The demo's few pre-training steps are all in REALM's
reader-only phase (``pretrain.freeze_retriever_steps``): the retriever does not change, so the first index stays
current and no refresh is needed. The asynchronous refresh runs in ``realm-tf pretrain`` once the retriever trains
(``refresh.mode``), and in ``make test``.

Everything goes to ``<workdir>`` (default ``runs/demo``, recreated each run), TensorBoard logs included, but the
bundled corpus preprocessed for reading, which is kept in ``<cache_dir>`` for the next run. The last lines are a
table (exact match, F1, accuracy@5, steps, minutes, peak memory) and the ``ask`` command for the served model.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shutil
import sys
import time
from concurrent import futures
from typing import Any

from realm_tf import config as config_lib
from realm_tf import host_machine
from realm_tf import process_settings
from realm_tf import stages
from realm_tf.data import question_split


def precisions(precision: str) -> tuple[str, str]:
    """``(the reader warm start's precision, pre-training's and fine-tuning's)`` for the demo's ``--precision``:
    ``auto`` trains the warm start in ``mixed_bfloat16`` where the CPU multiplies bfloat16 natively
    (:func:`process_settings.native_bfloat16`) and everything else in float32; ``float32`` or ``mixed_bfloat16``,
    everything in it."""
    if precision == "auto":
        return ("mixed_bfloat16" if process_settings.native_bfloat16() else "float32"), "float32"
    if precision not in ("float32", "mixed_bfloat16"):
        raise ValueError(f"precision {precision!r}: one of auto, float32, mixed_bfloat16")
    return precision, precision


def _overrides(work: str, pretrain_steps: int, finetune_steps: int, reader_steps: int, reader_window: int,
               reader_negatives: int, precision: str) -> list[str]:
    reader_precision, precision = precisions(precision)
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
        # The reader warm start, from the pre-trained reader: gold blocks only by default, each read through a
        # window of its body that holds the answer (qa.reader_window), at a higher rate than the benchmark's long
        # run (1e-4), the same steps on every machine.
        f"reader.steps={reader_steps}", "reader.learning_rate=3e-4", f"reader.precision={reader_precision}",
        f"qa.reader_window={reader_window}",
        "reader.warmup_steps=5", "reader.summary_every_steps=5", "reader.checkpoint_every_steps=1000",
        f"qa.reader_negatives={reader_negatives}",
        # Fine-tuning: the retriever from the pre-training run, the reader from its warm start; a short schedule.
        f"qa.retriever_checkpoint={work}/pretrain", f"qa.reader_checkpoint={work}/reader",
        f"finetune.steps={finetune_steps}", f"finetune.precision={precision}", "finetune.learning_rate=5e-5",
        "finetune.warmup_steps=2", "finetune.summary_every_steps=5", "finetune.checkpoint_every_steps=1000",
    ]


#: The demo's minutes (without the set-up) on a reference machine and that machine's float32 matrix-product rate
#: as :func:`host_machine.sgemm_gflops` measures it, by the reader warm start's precision: the start-up estimate
#: scales them by this machine's rate (``benchmarks/RESULTS.md``, make demo on a fresh clone).
REFERENCE_RUNS = {"float32": (19.3, 196.0), "mixed_bfloat16": (15.0, 196.0)}


def run(cfg: config_lib.ExperimentConfig, workdir: str = "runs/demo", in_children: bool = True,
        verbose: bool = False, num_questions: int = 800, pretrain_steps: int = 2, finetune_steps: int = 20,
        reader_steps: int = 800, reader_window: int = 128, reader_negatives: int = 0, reader_batch_size: int = 8,
        squad_paragraphs: int | None = None, samples: int = 3, pretrain_batch_size: int = 1,
        finetune_batch_size: int = 1, precision: str = "auto", cache_dir: str = "runs/cache") -> int:
    """Runs every stage on a subset of the bundled data; returns 0 when the loop completed.

    Each stage calls the library functions that the ``realm-tf`` commands call (:func:`plan`), in a child process
    of its own (``in_children``; :mod:`realm_tf.stages`) or in this one. Every machine runs the same steps, so a
    slower one takes longer; ``precision`` (:func:`precisions`): ``auto`` trains the reader warm start in
    ``mixed_bfloat16`` where the CPU multiplies bfloat16 natively, and everything else in float32.

    The reader warm start draws from every bundled SQuAD question (``squad_paragraphs=None``: 10,570) and the
    training split of *every* bundled NQ question (about 6,000; never a held-out one), on the gold blocks of the
    whole bundled corpus, preprocessed for reading once into ``cache_dir`` (the demo's index holds its own
    corpus). 800 steps of 8 read 6,400 of them, none twice, so the reader does not learn a small reading set by
    heart. The 800 bundled questions are a seeded random sample (:func:`sample_corpus`); their dev split is the
    held-out set.
    """
    started = time.time()
    work = workdir.rstrip("/")
    if os.path.isdir(work):
        shutil.rmtree(work)
    os.makedirs(work)
    for item in _overrides(work, pretrain_steps, finetune_steps, reader_steps, reader_window, reader_negatives,
                           precision):
        cfg = config_lib.apply_override(cfg, item)
    options = {"num_questions": num_questions, "squad_paragraphs": squad_paragraphs,
               "reader_batch_size": reader_batch_size, "samples": samples, "reading_blocks": reading_cache(
                   cfg, cache_dir), "pretrain_batch_size": pretrain_batch_size,
               "finetune_batch_size": finetune_batch_size}
    params = config_lib.save_params(cfg, work)
    gflops = host_machine.sgemm_gflops(2048)
    minutes, reference_gflops = REFERENCE_RUNS[cfg.reader.precision]
    print(f"realm-tf demo: {host_machine.cpu_summary()}; float32 matrix products at {gflops:.0f} GFLOP/s. The same "
          f"steps on every machine ({pretrain_steps} pre-training, {reader_steps} reader, {finetune_steps} "
          f"fine-tuning; the reader in {cfg.reader.precision}, the rest in {cfg.finetune.precision}): about "
          f"{minutes * reference_gflops / gflops:.0f} minutes here (estimated from this rate; each training stage's "
          f"bar gives its own from its first steps)", flush=True)
    memory = host_machine.PeakMemory().start()
    results = _run_stages(plan(cfg, work, params, options), started, in_children, verbose)
    peak = memory.stop()
    print(summary(results, cfg, work, (time.time() - started) / 60, peak, gflops))
    return 0


def reading_cache(cfg: config_lib.ExperimentConfig, cache_dir: str) -> str:
    """Where the bundled corpus preprocessed for reading lives: a directory of ``cache_dir`` named by a digest of
    the corpus file, the block settings and the preprocessing code, so that a change to any of them builds it
    anew. Its writer publishes it whole (a marker written last), so a run killed while writing it leaves none."""
    digest = hashlib.sha256()
    for path in [cfg.data.corpus_pattern, *sorted(_preprocessing_sources())]:
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(f"{cfg.model.block_seq_length} {cfg.model.vocab_file}".encode())
    return os.path.join(cache_dir, f"reading_blocks-{digest.hexdigest()[:16]}")


def _preprocessing_sources() -> list[str]:
    """The source files whose code decides the blocks: the preprocessing job and the data package."""
    package = os.path.dirname(os.path.abspath(__file__))
    job = os.path.join(os.path.dirname(package), "beam_jobs", "preprocess_corpus.py")
    data = [os.path.join(package, "data", n) for n in os.listdir(os.path.join(package, "data")) if n.endswith(".py")]
    return [p for p in [job, *data] if os.path.exists(p)]


def _run_stages(steps: list[stages.Stage], started: float, in_children: bool, verbose: bool) -> dict[str, Any]:
    """Runs the stages in order; ``{stage name: result}``."""
    results: dict[str, Any] = {}
    with stages.ChildProcesses(in_children, verbose) as children:
        for number, stage in enumerate(steps, 1):
            print(f"\n=== [{number}/{len(steps)}] {stage.name}: {stage.what}  (t={time.time() - started:.0f}s)",
                  flush=True)
            results[stage.name] = _run_stage(children, stage)
    return results


def _run_stage(children: stages.ChildProcesses, stage: stages.Stage) -> Any:
    """Runs one stage, prints its time and peak memory (and the corpus's counts), and returns its result."""
    start, memory = time.time(), host_machine.PeakMemory().start()
    try:
        result = children.run(stage)
    except futures.process.BrokenProcessPool as e:
        raise SystemExit(f"realm-tf demo: stage {stage.name} ended without a result (its process was killed: "
                         f"out of memory?)") from e
    peak = memory.stop()
    print(f"=== {stage.name} done in {time.time() - start:.0f}s (peak memory {peak / 2 ** 30:.2f} GiB)", flush=True)
    if stage.name == "corpus":
        print(f"  {result['passages']} passages, {result['questions']} questions ({result['dev']} held out), "
              f"{result['squad_questions']} SQuAD questions for the reader warm start")
    return result


def summary(results: dict[str, Any], cfg: config_lib.ExperimentConfig, work: str, minutes: float, peak_bytes: int,
            gflops: float) -> str:
    """The demo's last lines: a table of what it scored and cost, where its outputs are, and the ``ask`` command
    for its served model, runnable as printed."""
    stats, metrics = results["corpus"], results["evaluate"]
    short = metrics["short_answers"]
    rows = [("held-out questions", f"{metrics['num_questions']} (NQ-open's: {short['num_questions']})"),
            ("exact match", f"{metrics['exact_match']:.3f} (NQ-open's: {short['exact_match']:.3f})"),
            ("F1", f"{metrics['f1']:.3f} (NQ-open's: {short['f1']:.3f})"),
            ("retrieval accuracy@5", f"{metrics['accuracy@5']:.3f} of {stats['passages']} passages"),
            ("steps", f"pre-training {cfg.pretrain.steps}, reader {cfg.reader.steps}, fine-tuning "
                      f"{cfg.finetune.steps} (the reader in {cfg.reader.precision}, the rest in "
                      f"{cfg.finetune.precision})"),
            ("confidence", f"uncalibrated span probability ({metrics['num_questions']} held-out questions: too few "
                           f"to fit one); AURC {metrics['selective']['aurc']['value']:.3f}"),
            ("minutes", f"{minutes:.1f} (float32 matrix products at {gflops:.0f} GFLOP/s)"),
            ("peak memory", f"{peak_bytes / 2 ** 30:.2f} GiB (the demo and its stage processes, summed)")]
    width = max(len(name) for name, _ in rows)
    table = "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
    question = results["ask"]["questions"][0] if results["ask"]["questions"] else "who wrote hamlet"
    return (f"\nrealm-tf demo finished\n{table}\n"
            f"outputs: {work}/ (blocks, index, pretrain, reader, finetune, served); metrics {work}/metrics.json; "
            f"predictions {metrics['predictions']}; TensorBoard: tensorboard --logdir {work}\n"
            f"ask it a question:\n  {realm_tf_command()} ask --model {work}/served {json.dumps(question)}")


def realm_tf_command() -> str:
    """How to run ``realm-tf`` from here: this interpreter's own ``realm-tf`` (``.venv/bin/realm-tf`` after
    ``make demo``) when it has one, else ``python -m realm_tf.cli`` with this interpreter; relative to the working
    directory when below it."""
    script = os.path.join(os.path.dirname(sys.executable), "realm-tf")
    found = os.path.exists(script)
    path = script if found else sys.executable
    relative = os.path.relpath(path)
    path = path if relative.startswith("..") else relative
    return path if found else f"{path} -m realm_tf.cli"


def plan(cfg: config_lib.ExperimentConfig, work: str, params: str,
         options: dict[str, Any]) -> list[stages.Stage]:
    """The demo's stages, in order, each the library calls of its ``realm-tf`` command(s): ``cfg`` is the demo's
    config (``params``, its YAML, for the Beam jobs, which read a config file as their workers do)."""
    corpus, questions, squad = f"{work}/corpus.jsonl", f"{work}/questions.jsonl", f"{work}/squad.jsonl"
    # Small steps, each BERT in one length group: the demo's few pre-training and fine-tuning steps show the loop,
    # and each stage stays under 4 GB and traces its step in seconds.
    one_group = ("model.reader_length_buckets=1", "model.candidate_length_buckets=1")
    pretrain = _with(cfg, f"data.batch_size={options['pretrain_batch_size']}", *one_group)
    finetune = _with(cfg, f"data.batch_size={options['finetune_batch_size']}", *one_group)
    served, reading = f"{work}/served", options["reading_blocks"]
    preprocess = [stages.Call("beam_jobs.preprocess_corpus:JOB.call", {"config": params, "input": [corpus],
                                                                       "output": cfg.data.blocks_dir})]
    if not os.path.exists(os.path.join(reading, "manifest.json")):  # the reading corpus, once (reading_cache)
        preprocess.append(stages.Call("beam_jobs.preprocess_corpus:JOB.call", {
            "config": params, "input": [cfg.data.corpus_pattern], "output": reading}))
    stage = lambda name, what, *calls, process="": stages.Stage(name, what, calls, process)  # noqa: E731
    return [
        stage("corpus", "gold passages of sampled questions + as many others", stages.Call(
            "realm_tf.demo:sample_corpus", {"cfg": cfg, "corpus_out": corpus, "questions_out": questions,
                                            "squad_out": squad, "num_questions": options["num_questions"],
                                            "squad_paragraphs": options["squad_paragraphs"]},
            starts_tensorflow=False)),
        stage("preprocess", "passages -> blocks of <= 288 wordpieces"
              + ("" if len(preprocess) == 1 else "; the bundled corpus for reading, kept in " + reading), *preprocess,
              process="data"),
        stage("pretraining-data", "salient-span masked queries", stages.Call(
            "beam_jobs.generate_pretraining_data:JOB.call", {"config": params}), process="data"),
        stage("init-retriever", "the import's projection fitted to the corpus (model.projection_init)", stages.Call(
            "realm_tf.tasks.projection_init:init_retriever",
            {"cfg": cfg, "out": f"{work}/retriever_init", "num_blocks": 256}), process="retriever"),
        # Pre-training finds this index and builds none (in its own process it would keep the memory).
        stage("index", "Embed_doc exported, every block embedded, the first ScaNN index published",
              stages.Call("realm_tf.core.warm_start:export_retriever_of_run",
                          {"cfg": cfg, "run_dir": f"{work}/retriever_init"},
                          report="realm_tf.core.warm_start:format_retriever_export"),
              stages.Call("beam_jobs.embed_blocks:refresh_index", {"config": params}), process="retriever"),
        stage("pretrain", f"REALM pre-training, {cfg.pretrain.steps} steps: most of this stage is the MLM head's "
                          f"warm-up, the step's trace and a held-out evaluation", stages.Call(
            "realm_tf.tasks.realm_pretraining:pretrain", {"cfg": pretrain},
            report="realm_tf.tasks.realm_pretraining:format_result")),
        stage("train-reader", f"the reader warm start on gold blocks, SQuAD + every bundled NQ training question, "
                              f"{cfg.reader.steps} steps", _warm_start(cfg, work, options)),
        stage("finetune", "Open-QA fine-tuning (retriever + span reader)", stages.Call(
            "realm_tf.tasks.open_qa:finetune", {"cfg": finetune, "train_path": questions})),
        stage("evaluate", "held-out questions: EM, retrieval accuracy@k", stages.Call(
            "realm_tf.tasks.open_qa:evaluate", {"cfg": cfg, "questions_path": questions, "split": "dev",
                                                "metrics_path": f"{work}/metrics.json"}), process="serving"),
        stage("export", "one SavedModel: tokenize, embed, ScaNN search, read, decode", stages.Call(
            "realm_tf.tasks.open_qa:export_for_serving", {"cfg": cfg, "out": served}), process="serving"),
        stage("ask", "sample held-out questions", stages.Call(
            "realm_tf.demo:ask_held_out", {"model": served, "questions_path": questions,
                                           "dev_fraction": cfg.data.qa_dev_fraction, "count": options["samples"]}),
              process="serving"),
    ]


def _with(cfg: config_lib.ExperimentConfig, *overrides: str) -> config_lib.ExperimentConfig:
    for item in overrides:
        cfg = config_lib.apply_override(cfg, item)
    return cfg


def _warm_start(cfg: config_lib.ExperimentConfig, work: str, options: dict[str, Any]) -> stages.Call:
    """The reader warm start: SQuAD and every bundled NQ training question, on their gold blocks in the bundled
    corpus preprocessed for reading (not indexed)."""
    # Two length groups. Where the cores are no more than the groups, each op runs on one thread and the
    # groups run side by side (reader.intra_op_threads=1): no hand-offs between threads inside each op.
    groups = 2
    threads = 1 if (os.cpu_count() or 1) <= groups else 0
    reader = _with(cfg, f"qa.reader_checkpoint={cfg.pretrain.model_dir}",
                   f"data.batch_size={options['reader_batch_size']}", f"model.reader_length_buckets={groups}",
                   f"reader.intra_op_threads={threads}", f"data.blocks_dir={options['reading_blocks']}")
    return stages.Call("realm_tf.tasks.reader_warm_start:train_reader",
                       {"cfg": reader, "question_paths": [f"{work}/squad.jsonl", cfg.data.qa_train]})


def sample_corpus(cfg: config_lib.ExperimentConfig, corpus_out: str, questions_out: str, squad_out: str,
                  num_questions: int, squad_paragraphs: int | None) -> dict:
    """A seeded random sample of ``num_questions`` bundled questions (in file order) and their gold passages, as
    many other passages as there are gold ones (the corpus the demo indexes), and the SQuAD questions of the first
    ``squad_paragraphs`` SQuAD paragraphs (all of them when None: reading-comprehension data for the reader warm
    start, which reads them in the bundled corpus preprocessed for reading, so their paragraphs are not indexed).

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
    others = [p for p in passages if str(p["id"]) not in gold]
    chosen = [p for p in passages if str(p["id"]) in gold] + random.Random(0).sample(
        others, min(len(gold), len(others)))
    for path, items in ((corpus_out, chosen), (questions_out, rows), (squad_out, squad_rows)):
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
    dev = sum(question_split.is_dev(str(r["id"]), cfg.data.qa_dev_fraction) for r in rows)
    return {"passages": len(chosen), "questions": len(rows), "dev": dev, "squad_questions": len(squad_rows)}


def ask_held_out(model: str, questions_path: str, dev_fraction: float, count: int,
                 snippet: int = 100) -> dict[str, list[str]]:
    """Asks the served ``model`` the first ``count`` held-out (dev) questions of ``questions_path``
    (``realm-tf ask``); returns ``{"questions": ..., "answers": ...}``."""
    from realm_tf.serving import answerer  # pylint: disable=import-outside-toplevel  (the planner loads no TF)

    with open(questions_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    held_out = [r["question"] for r in rows if question_split.is_dev(str(r["id"]), dev_fraction)]
    return {"questions": held_out[:count], "answers": answerer.ask(model, held_out[:count], snippet=snippet)}
