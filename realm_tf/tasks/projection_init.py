"""Initialising the retriever's projection from the corpus, so an imported embedder keeps its ranking.

REALM's Embed(x) = LayerNorm(W_proj · BERT(x)) (Guu et al., 2020, §3.2) starts W_proj at random and learns it
during ICT and pre-training. An imported sentence embedder (all-MiniLM-L6-v2: 384-d, trained for cosine
similarity) already ranks blocks well, and a random 384 → 128 matrix throws part of that away before training
starts. Here W_proj is set to the top ``projection_size`` principal directions of the pooled BERT outputs of
a sample of corpus blocks:

* ``pca``: eigenvectors of the second moment E[h hᵀ] (no centring): the rank-d orthogonal projection that
  keeps the inner products of the sample best in the least-squares sense (Eckart-Young);
* ``pca_centered``: eigenvectors of the covariance, with bias −μ·W, so the embeddings are centred first
  (a common direction shared by all vectors no longer dominates the cosine).

Both towers get the same matrix, so f(x, z) starts as (√d times) a cosine in the principal subspace.
``realm-tf init-retriever`` writes the result as a retriever run (like ``train-ict``), which
``model.retriever_checkpoint`` / ``qa.retriever_checkpoint`` and ``export-retriever --model-dir`` read.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import tensorflow as tf

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.core import warm_start
from realm_tf.data import block_store as block_store_lib
from realm_tf.data import corpus_versions
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_retriever

KINDS = config_lib.choices(config_lib.ProjectionInit)


def principal_projection(pooled: np.ndarray, size: int, centered: bool) -> tuple[np.ndarray, np.ndarray, float]:
    """``(kernel [hidden, size], bias [size], share of the energy kept)``: an orthonormal basis of the top
    ``size`` principal directions, rotated so that the direction LayerNorm discards is the ``size``-th.

    Each direction's sign is fixed (its largest-magnitude entry positive), so the result is deterministic.
    """
    x = np.asarray(pooled, np.float64)  # [num, hidden]
    if x.ndim != 2 or size > x.shape[1]:
        raise errors.UserError(f"projection_size {size} exceeds the pooled width {x.shape[-1]}: a principal "
                               f"projection cannot add dimensions (use model.projection_init=random)")
    mean = x.mean(axis=0) if centered else np.zeros(x.shape[1])  # [hidden]
    centred = x - mean
    moment = centred.T @ centred / len(x)  # [hidden, hidden]
    values, vectors = np.linalg.eigh(moment)  # ascending
    order = np.argsort(values)[::-1][:size]
    kernel = vectors[:, order]  # [hidden, size]: principal directions, most energy first
    signs = np.sign(kernel[np.argmax(np.abs(kernel), axis=0), np.arange(size)])
    kernel = kernel * np.where(signs == 0, 1.0, signs)
    if size > 1:
        # LayerNorm subtracts the mean of the `size` components, i.e. discards the part of z = Wᵀh along the
        # all-ones vector. Rotate the basis (a Householder reflection taking 1/√size to the last axis) so
        # that this part is the *least* important principal component: LayerNorm(Wᵀh) is then the normalised
        # top (size − 1) components, and f(x, z) a cosine in that subspace.
        ones = np.full(size, 1.0 / np.sqrt(size))
        last = np.zeros(size)
        last[-1] = 1.0
        w = ones - last
        householder = np.eye(size) - 2.0 * np.outer(w, w) / (w @ w)  # symmetric, orthogonal, maps ones to last
        kernel = kernel @ householder
    kept = float(values[order].sum() / max(values.sum(), 1e-30))
    return kernel.astype(np.float32), (-mean @ kernel).astype(np.float32), kept


def pooled_block_outputs(retriever: knowledge_retriever.KnowledgeRetriever, blocks: block_store_lib.BlockStore,
                         tokenizer: bert_tokenizer.BertTokenizer, block_ids: np.ndarray, seq_length: int,
                         batch_size: int = 32) -> np.ndarray:
    """Embed_doc's pooled BERT outputs ``float32[len(block_ids), hidden]`` of ``[CLS] title [SEP] body [SEP]``
    (batches of similar length, each padded to its longest)."""
    lengths = np.array([len(blocks.title_ids(b)) + len(blocks.body_ids(b)) for b in block_ids])
    order = np.argsort(lengths, kind="stable")
    rows = []

    @tf.function(reduce_retracing=True, autograph=False)
    def pool(titles: tf.RaggedTensor, bodies: tf.RaggedTensor) -> tf.Tensor:
        packed = tokenizer.join_bert(titles, bodies, seq_length, pad_to_seq_length=False)
        return retriever.doc_embedder.pool(packed, training=False)  # [batch, hidden]

    for start in range(0, len(order), batch_size):
        chosen = [int(block_ids[i]) for i in order[start:start + batch_size]]
        titles = tf.ragged.constant([blocks.title_ids(b).tolist() for b in chosen], dtype=tf.int32,
                                    row_splits_dtype=tf.int64)
        bodies = tf.ragged.constant([blocks.body_ids(b).tolist() for b in chosen], dtype=tf.int32,
                                    row_splits_dtype=tf.int64)
        rows.append(pool(titles, bodies).numpy())
    if not rows:
        raise ValueError("no blocks to pool")
    out = np.empty([len(block_ids), rows[0].shape[1]], np.float32)
    out[order] = np.concatenate(rows)
    return out


def fit_projection(retriever: knowledge_retriever.KnowledgeRetriever, pooled: np.ndarray, kind: str) -> dict:
    """Sets both towers' projection (and a plain LayerNorm) from ``pooled``; returns what was fitted."""
    if kind not in KINDS:
        raise errors.UserError(f"model.projection_init={kind!r}: one of {', '.join(KINDS)}")
    if kind == "random":
        return {"kind": kind}
    size = int(retriever.doc_embedder.projection.kernel.shape[1])
    kernel, bias, kept = principal_projection(pooled, size, centered=kind == "pca_centered")
    towers = (retriever.query_embedder,) if retriever.shares_embedders else (retriever.query_embedder,
                                                                             retriever.doc_embedder)
    for tower in towers:
        tower.projection.kernel.assign(kernel)
        tower.projection.bias.assign(bias)
        tower.layer_norm.gamma.assign(tf.ones_like(tower.layer_norm.gamma))
        tower.layer_norm.beta.assign(tf.zeros_like(tower.layer_norm.beta))
    return {"kind": kind, "energy_kept": round(kept, 6), "num_blocks": int(len(pooled))}


def init_retriever(cfg: config_lib.ExperimentConfig, out: str, num_blocks: int = 4096) -> dict[str, Any]:
    """``realm-tf init-retriever``: the retriever from ``model.init_checkpoint`` with its projection set by
    ``model.projection_init`` on ``num_blocks`` sampled blocks, saved as a run in ``out`` (its checkpoint,
    ``params.yaml`` and ``projection.json``)."""
    if tf.train.latest_checkpoint(os.path.join(out, "checkpoints")):
        raise errors.UserError(f"{out}: already holds a retriever run; choose another --output or delete it")
    tokenizer = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, cfg.model.lower_case)
    retriever = knowledge_retriever.build_knowledge_retriever(cfg.model)
    info: dict[str, Any] = {"kind": cfg.model.projection_init}
    if cfg.model.projection_init != "random":
        blocks = block_store_lib.BlockStore.load(corpus_versions.current_pattern(cfg.data.blocks_dir))
        rng = np.random.default_rng(cfg.data.seed)
        ids = np.sort(rng.choice(len(blocks), size=min(num_blocks, len(blocks)), replace=False))
        pooled = pooled_block_outputs(retriever, blocks, tokenizer, ids, cfg.model.block_seq_length)
        info = fit_projection(retriever, pooled, cfg.model.projection_init)
    config_lib.save_params(cfg, out)
    # An ICT-style run (model = KnowledgeRetriever): warm_start.restore_from_run and export-retriever read it.
    warm_start.write_checkpoint(out, model=retriever)
    config_lib.atomic_write_text(os.path.join(out, "projection.json"), json.dumps(info, indent=2) + "\n")
    return info
