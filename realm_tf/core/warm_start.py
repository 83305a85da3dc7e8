"""Warm starts across REALM's stages: ICT → REALM pre-training → Open-QA fine-tuning (Guu et al., 2020, §3.4, §4).

Each stage saves a differently shaped checkpoint; :func:`restore_from_run` reads the retriever towers and/or
the reader BERT out of any of them.
"""
from __future__ import annotations

import os
from typing import Any

import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.core import checkpoint_reading
from realm_tf.export import retriever_export
from realm_tf.models import knowledge_retriever


def restore_from_run(path: str, retriever: knowledge_retriever.KnowledgeRetriever | None = None,
                     reader_bert: tf_keras.layers.Layer | None = None, reader: tf_keras.Model | None = None) -> str:
    """Loads the retriever and/or the reader BERT from the latest checkpoint of a run directory (or a prefix).

    REALM starts its retriever from ICT (Guu et al., 2020, §3.4 "Initialization") and Open-QA fine-tuning from
    the pre-trained retriever and knowledge-augmented encoder (§4.2).

    Understands REALM pre-training (``model = RealmPretrainer``: ``model.retriever``, ``model.encoder.encoder``),
    ICT (``model = KnowledgeRetriever``), reader warm-start (``reader``) and Open-QA fine-tuning (``retriever``,
    ``reader``) runs, and the imports of ``realm-tf import-realm`` (shaped like these: the released ``bert`` as
    a pre-training run's ``model.encoder`` alone). ``reader`` (a :class:`~realm_tf.models.span_reader.SpanReader`)
    is restored whole, span MLP included, from a run that trained one; from REALM pre-training only its BERT
    (``reader.encoder``) is.
    """
    checkpoint = (checkpoint_reading.newest_complete(os.path.join(path, "checkpoints"))
                  or checkpoint_reading.newest_complete(path))
    if checkpoint is None and tf.io.gfile.exists(path + ".index"):
        checkpoint = path  # a checkpoint prefix
    if checkpoint is None:
        raise errors.UserError(f"{path}: no checkpoint to start from (a run directory, e.g. of realm-tf train-ict, "
                               f"pretrain or finetune, or a checkpoint prefix)")
    keys = {name for name, _ in tf.train.list_variables(checkpoint)}
    if reader is not None:
        if any(k.startswith("reader/span_hidden/") for k in keys):  # a trained span reader: all of it
            reader_bert = None
        else:
            reader_bert, reader = reader.encoder, None
    if any(k.startswith(("model/retriever/", "model/encoder/")) for k in keys):  # REALM pre-training
        parts: dict[str, Any] = {}
        if retriever is not None:
            parts["retriever"] = retriever
        if reader_bert is not None:
            parts["encoder"] = tf.train.Checkpoint(encoder=reader_bert)
        tree = tf.train.Checkpoint(model=tf.train.Checkpoint(**parts))
    elif any(k.startswith("reader/") or k.startswith("retriever/") for k in keys):  # Open-QA fine-tuning
        parts = {}
        if retriever is not None:
            parts["retriever"] = retriever
        if reader is not None:
            parts["reader"] = reader
        elif reader_bert is not None:
            parts["reader"] = tf.train.Checkpoint(encoder=reader_bert)
        tree = tf.train.Checkpoint(**parts)
    else:  # ICT: model = KnowledgeRetriever
        if reader_bert is not None or reader is not None:
            raise errors.UserError(f"{checkpoint}: an ICT checkpoint has no reader (qa.reader_checkpoint)")
        tree = tf.train.Checkpoint(model=retriever)
    checkpoint_reading.read(tree, checkpoint).assert_existing_objects_matched().expect_partial()
    return checkpoint


def write_checkpoint(run_dir: str, **items: tf.Module) -> str:
    """Writes ``items`` as a run's only checkpoint, ``<run_dir>/checkpoints/ckpt-0`` with its state file (what
    ``tf.train.latest_checkpoint`` and :func:`restore_from_run` read); returns its prefix."""
    prefix = tf.train.Checkpoint(**items).write(os.path.join(run_dir, "checkpoints", "ckpt-0"))
    config_lib.atomic_write_text(os.path.join(run_dir, "checkpoints", "checkpoint"),
                                 'model_checkpoint_path: "ckpt-0"\nall_model_checkpoint_paths: "ckpt-0"\n')
    return prefix


def export_retriever_of_run(cfg: config_lib.ExperimentConfig, run_dir: str | None = None, from_init: bool = False,
                            step: int = 0) -> dict[str, Any]:
    """Hands the retriever of a trained run to the index builder (REALM's refresh, Guu et al., 2020, §3.4): its
    Embed_query / Embed_doc exported to ``refresh.export_dir/<step>/``.

    Args:
      run_dir: an ICT, REALM pre-training, reader or Open-QA fine-tuning run (default ``ict.model_dir``); without
        a checkpoint there (or with ``from_init``) the retriever of ``model.init_checkpoint`` is exported.
      step: the export's version (default: the checkpoint's step, 0 from the init checkpoint).

    Returns:
      ``{"export": path, "checkpoint": the one restored, or ""}``.

    Raises:
      UserError: ``run_dir`` was given, has no checkpoint, and ``from_init`` is not set.
    """
    given = run_dir
    run_dir = run_dir or cfg.ict.model_dir
    found = checkpoint_reading.newest_complete(f"{run_dir}/checkpoints")
    if given and not found and not from_init:
        raise errors.UserError(f"--model-dir {given}: no checkpoint in {given}/checkpoints (--from-init exports "
                               f"model.init_checkpoint instead)")
    model = knowledge_retriever.build_knowledge_retriever(cfg.model)
    checkpoint = ""
    if found and not from_init:
        checkpoint = restore_from_run(run_dir, retriever=model)
        step = step or int(checkpoint.rsplit("-", 1)[1])
    return {"export": retriever_export.export_retriever(model, cfg, step), "checkpoint": checkpoint}


def format_retriever_export(result: dict[str, Any]) -> str:
    """What ``realm-tf export-retriever`` prints of :func:`export_retriever_of_run`'s result."""
    restored = f"restored {result['checkpoint']}\n" if result["checkpoint"] else ""
    return f"{restored}exported retriever to {result['export']}"
