"""The main job (``make demo``): REALM's whole loop on the bundled Open-QA sample, sized for a small CPU.

The loop of Guu et al. (2020), each stage the real subcommand's code: a corpus subset (the gold passages of a
sample of the bundled questions plus as many other passages) → ``preprocess`` into blocks →
``generate-pretraining-data`` (salient spans) → ``pretrain`` (which exports Embed_doc, embeds every block and
publishes the first ScaNN index, then trains REALM a few steps) → a refreshed index from the pre-trained
retriever → ``finetune`` on the training questions → ``evaluate`` on held-out questions → ``export`` the
serving SavedModel → ``ask`` it sample questions. Everything goes to ``<workdir>`` (default ``runs/demo``,
recreated each run), TensorBoard logs included; the last lines print exact match, accuracy@5 and where the
outputs are.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import time
from typing import Any, Callable

from realm_tf import config as config_lib
from realm_tf.data import question_split

STAGES = ("corpus", "preprocess", "pretraining-data", "pretrain", "index", "finetune", "evaluate", "export", "ask")


def _overrides(work: str, pretrain_steps: int, finetune_steps: int) -> list[str]:
    return [
        f"data.blocks_dir={work}/blocks", f"data.pretraining_dir={work}/pretraining",
        f"index.index_dir={work}/index", f"refresh.export_dir={work}/export",
        f"trainer.model_dir={work}/pretrain", f"finetune.model_dir={work}/finetune",
        # Pre-training: a handful of steps to run the loop (REALM trains 200k steps on 64 TPUs).
        f"trainer.steps={pretrain_steps}", "trainer.warmup_steps=1", "trainer.summary_every_steps=1",
        "trainer.checkpoint_every_steps=100", "trainer.eval_examples=16", "refresh.export_every_steps=0",
        "refresh.mode=external", "data.batch_size=4", "data.shuffle_buffer=256",
        # The reader alone for half of them (after a short MLM head warm-up), then both towers too.
        f"trainer.freeze_retriever_steps={pretrain_steps // 2}", "trainer.mlm_head_warmup_blocks=256",
        # Fine-tuning: the retriever and reader from the pre-training run, a short schedule.
        f"qa.retriever_checkpoint={work}/pretrain", f"qa.reader_checkpoint={work}/pretrain",
        f"finetune.steps={finetune_steps}", "finetune.learning_rate=1e-4", "finetune.warmup_steps=5",
        "finetune.summary_every_steps=5", "finetune.checkpoint_every_steps=1000",
    ]


def run(cfg: config_lib.ExperimentConfig, main: Callable[[list[str]], int], workdir: str = "runs/demo",
        num_questions: int = 400, pretrain_steps: int = 6, finetune_steps: int = 60, samples: int = 3) -> int:
    """Runs every stage on a subset of the bundled data; returns 0 when the loop completed.

    ``main`` runs one ``realm-tf`` subcommand from its arguments and returns its exit code: ``cli.main``, passed in
    by the command line (``realm-tf demo``) so that this module does not import it back.
    """
    started = time.time()
    work = workdir.rstrip("/")
    if os.path.isdir(work):
        shutil.rmtree(work)
    os.makedirs(work)
    for item in _overrides(work, pretrain_steps, finetune_steps):
        cfg = config_lib.apply_override(cfg, item)
    params = config_lib.save_params(cfg, work)
    sets = ["--config", params]

    def stage(number: int, name: str, what: str, fn: Callable[[], Any]) -> Any:
        print(f"\n=== [{number}/{len(STAGES)}] {name}: {what}  (t={time.time() - started:.0f}s)", flush=True)
        start = time.time()
        result = fn()
        print(f"=== {name} done in {time.time() - start:.0f}s", flush=True)
        return result

    def call(*argv: str) -> None:
        code = main(list(argv))
        if code != 0:
            raise SystemExit(f"realm-tf demo: stage `realm-tf {argv[0]}` failed with exit code {code}")

    corpus, questions = f"{work}/corpus.jsonl", f"{work}/questions.jsonl"
    stats = stage(1, "corpus", "gold passages of sampled questions + as many others", lambda: _subset(
        cfg, corpus, questions, num_questions))
    print(f"  {stats['passages']} passages, {stats['questions']} questions ({stats['dev']} held out)")
    stage(2, "preprocess", "passages -> blocks of <= 288 wordpieces", lambda: call(
        "preprocess", *sets, "--input", corpus, "--output", cfg.data.blocks_dir))
    stage(3, "pretraining-data", "salient-span masked queries", lambda: call("generate-pretraining-data", *sets))
    stage(4, "pretrain", "first index from MiniLM, then REALM pre-training steps", lambda: call(
        "pretrain", *sets))

    def refresh() -> None:
        from realm_tf.index import index_refresher  # pylint: disable=import-outside-toplevel
        from realm_tf.models import knowledge_retriever  # pylint: disable=import-outside-toplevel
        from realm_tf.serving import retriever_export  # pylint: disable=import-outside-toplevel
        from realm_tf.tasks import warm_start  # pylint: disable=import-outside-toplevel

        model = knowledge_retriever.build_knowledge_retriever(cfg.model)
        warm_start.restore_from_run(cfg.trainer.model_dir, retriever=model)
        retriever_export.export_retriever(model, cfg, cfg.trainer.steps)
        index_refresher.IndexRefresher(params).refresh_once()

    stage(5, "index", "Embed_doc of the pre-trained retriever -> a new index version", refresh)
    stage(6, "finetune", "Open-QA fine-tuning (retriever + span reader)", lambda: call(
        "finetune", *sets, "--train", questions))
    metrics_path = f"{work}/metrics.json"

    def evaluate() -> dict[str, Any]:
        from realm_tf.tasks import open_qa  # pylint: disable=import-outside-toplevel

        metrics = open_qa.evaluate(cfg, questions, split="dev")
        with open(metrics_path, "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
        return metrics

    metrics = stage(7, "evaluate", "held-out questions: EM, retrieval accuracy@k", evaluate)
    served = f"{work}/served"
    stage(8, "export", "one SavedModel: tokenize, embed, ScaNN search, read, decode", lambda: call(
        "export", *sets, "--out", served))
    sample = _dev_questions(questions, cfg.data.qa_dev_fraction)[:samples]
    stage(9, "ask", "sample held-out questions", lambda: call("ask", *sample, "--model", served, "--snippet", "100"))

    minutes = (time.time() - started) / 60
    print(f"\nrealm-tf demo finished in {minutes:.1f} min on {stats['passages']} passages; "
          f"held-out questions: {metrics['num_questions']}")
    print(f"outputs: {work}/ (blocks, index, pretrain, finetune, served); metrics {metrics_path}; "
          f"predictions {metrics['predictions']}; TensorBoard: tensorboard --logdir {work}")
    print(f"EM {metrics['exact_match']:.3f}  accuracy@5 {metrics['accuracy@5']:.3f}  "
          f"(reader oracle {metrics['reader_oracle']:.3f}, accuracy@20 {metrics['accuracy@20']:.3f})")
    return 0


def _subset(cfg: config_lib.ExperimentConfig, corpus_out: str, questions_out: str, num_questions: int) -> dict:
    """The first ``num_questions`` bundled questions, their gold passages, and as many other passages."""
    with gzip.open(cfg.data.qa_train, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(num_questions), f)]
    gold = {pid for r in rows for pid in r.get("gold_passage_ids", [])}
    with gzip.open(cfg.data.corpus_pattern, "rt", encoding="utf-8") as f:
        passages = [json.loads(line) for line in f]
    others = [p for p in passages if p["id"] not in gold]
    chosen = [p for p in passages if p["id"] in gold] + random.Random(0).sample(others, min(len(gold), len(others)))
    with open(corpus_out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(p, ensure_ascii=False) + "\n" for p in chosen)
    with open(questions_out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    dev = sum(question_split.is_dev(str(r["id"]), cfg.data.qa_dev_fraction) for r in rows)
    return {"passages": len(chosen), "questions": len(rows), "dev": dev}


def _dev_questions(path: str, fraction: float) -> list[str]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [r["question"] for r in rows if question_split.is_dev(str(r["id"]), fraction)]
