"""Bits-per-byte of a trained decoder on held-out documents, chunk by chunk, with RETRO's leakage filter
(Borgeaud et al., 2021, §2.6 and §4) and kNN-LM's interpolation (Khandelwal et al., 2020, §2).

The evaluation documents (``validation`` or ``test``, held out of training by id) are cut into sequences of n
tokens at chunk boundaries, exactly as in training; token t + 1 of a sequence is predicted from tokens <= t
(and, for RETRO, from the neighbours of the chunks completed by then), so each sequence's first token is not
scored. Every scored token is assigned to its database chunk, and a chunk's score is the sum of its tokens'
NLL (nats) and the UTF-8 bytes they add to the detokenised text (``retro_sequences.token_byte_lengths``).

    bpb(S) = Σ_{C ∈ S} NLL(C) / (ln 2 · Σ_{C ∈ S} bytes(C))

over the chunks S whose overlap with their 10 nearest database neighbours, r(C) = max_N |LCS(C, N)| / |C| (m for
every chunk but a document's shorter last one), is at most α (§2.6: α = 1 keeps every chunk; small α keeps only chunks
that were not copied from the database).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.core import checkpoint_reading
from realm_tf.core import evaluation
from realm_tf.data import document_files
from realm_tf.retro import knn_datastore
from realm_tf.retro import knn_lm
from realm_tf.retro import retro_lm
from realm_tf.retro import retro_sequences

logger = logging.getLogger(__name__)

#: RETRO §2.6's thresholds on the chunk overlap r(C).
ALPHAS = (0.0, 0.125, 0.25, 0.5, 1.0)
#: Neighbours whose overlap with an evaluation chunk is measured (§2.6: 10).
OVERLAP_NEIGHBOURS = 10


@dataclasses.dataclass(frozen=True)
class TokenScores:
    """Every scored token of a split: ``chunk_ids`` int64 ``[T]`` (its database chunk), ``targets`` int32
    ``[T]``, ``log_probs`` float64 ``[T]`` (log p_LM of the target, nats), ``bytes`` int64 ``[T]`` (the UTF-8
    bytes of the original text the token stands for), ``wordpiece_bytes`` int64 ``[T]`` (the bytes it adds to
    the detokenised, lower-cased wordpiece text) and, if asked for, ``knn_keys`` float32 ``[T, width]`` (the
    kNN-LM key of the context that predicts it)."""

    chunk_ids: np.ndarray
    targets: np.ndarray
    log_probs: np.ndarray
    bytes: np.ndarray
    knn_keys: np.ndarray | None = None
    wordpiece_bytes: np.ndarray | None = None

    def with_log_probs(self, log_probs: np.ndarray) -> "TokenScores":
        return dataclasses.replace(self, log_probs=np.asarray(log_probs, np.float64))

    def subset(self, keep: np.ndarray) -> "TokenScores":
        """The scored tokens where bool ``keep`` ``[T]`` is True."""
        return TokenScores(*(None if v is None else v[keep] for v in dataclasses.astuple(self)))


def restore_decoder(task: retro_lm.RetroLmTask, model_dir: str) -> tf_keras.Model:
    """The task's decoder with the newest checkpoint of ``model_dir`` (a ``train-retro`` run)."""
    checkpoint = retro_lm.latest_checkpoint(model_dir)
    if checkpoint is None:
        raise errors.UserError(f"{model_dir}: no checkpoint of a trained decoder (run `realm-tf train-retro`)")
    cfg = task.cfg
    if cfg.retro.retro_fit_from:  # the fitted model is restored whole from its own run, not from the baseline
        task = retro_lm.RetroLmTask(dataclasses.replace(cfg, retro=dataclasses.replace(cfg.retro, retro_fit_from="")),
                                    retrieval=task.retrieval)
    model = task.build_model()
    status = checkpoint_reading.read(tf.train.Checkpoint(model=model), checkpoint)
    status.expect_partial()
    try:
        status.assert_existing_objects_matched()
    except AssertionError as e:
        raise errors.UserError(f"{checkpoint}: not a decoder of this architecture "
                               f"({'RETRO' if task.retrieval else 'baseline'}): {e}") from e
    logger.info("restored %s", checkpoint)
    return model


def score_tokens(task: retro_lm.RetroLmTask, model: tf_keras.Model, split: str, neighbours: bool = True,
                 database: str = "train_only", with_knn_keys: bool = False, batch_size: int = 8,
                 limit_sequences: int = 0) -> TokenScores:
    """log p(target) of every scored token of ``split``'s documents under ``model`` (RETRO with ``neighbours``
    from ``database``, or all neighbours masked; the baseline ignores both); the first ``limit_sequences``
    sequences only when > 0."""
    dataset = task.dataset(split, exclude_own_document=True, neighbours=neighbours, batch_size=batch_size,
                           database=database)
    if limit_sequences:
        dataset = dataset.take(-(-limit_sequences // batch_size))
    scores = evaluation.run_evaluation(TokenScoring(task, with_knn_keys), model, dataset)
    if scores is None:
        raise errors.UserError(f"split {split!r} has no documents (retro.validation_fraction / test_fraction)")
    return scores


class TokenScoring:
    """Token scoring in the evaluation protocol (:mod:`realm_tf.core.evaluation`): per batch the log-probability
    of each target under the decoder (and its kNN-LM key), gathered on the host with the chunk it lies in and the
    UTF-8 bytes of the original text it stands for (bits-per-byte, RETRO §2.6), into one :class:`TokenScores`."""

    def __init__(self, task: retro_lm.RetroLmTask, with_knn_keys: bool = False) -> None:
        self.task, self.with_knn_keys = task, with_knn_keys
        self.byte_lengths = retro_sequences.token_byte_lengths(task.tokenizer.vocab)
        m = task.cfg.retro.chunk_length
        self.offsets = (np.arange(task.cfg.retro.sequence_length) + 1) % m  # [n]: each target's place in its chunk

    def validation_step(self, inputs: tuple[Mapping[str, tf.Tensor], Mapping[str, tf.Tensor]],
                        model: tf_keras.Model) -> dict[str, tf.Tensor]:
        features, labels = inputs
        outputs = model(features, training=False)
        log_probs = tf.nn.log_softmax(tf.cast(outputs["logits"], tf.float32), axis=-1)  # [b, n, V]
        picked = tf.gather(log_probs, labels["targets"], batch_dims=2)  # [b, n]: log p(target)
        return {"log_probs": picked, "keys": outputs["knn_keys"], "targets": labels["targets"],
                "target_mask": labels["target_mask"], "chunk_ids": labels["chunk_ids"]}

    def aggregate_logs(self, state: dict[str, list[np.ndarray]] | None,
                       step_outputs: Mapping[str, tf.Tensor]) -> dict[str, list[np.ndarray]]:
        parts = state or {k: [] for k in ("chunk_ids", "targets", "log_probs", "bytes", "wordpiece_bytes", "keys")}
        m = self.task.cfg.retro.chunk_length
        targets = step_outputs["targets"].numpy()  # [b, n]
        mask = step_outputs["target_mask"].numpy()  # [b, n]
        # target t + 1 lies in chunk (t + 1) // m; the last position's target is never real (mask False), so its
        # chunk index wraps to 0 harmlessly
        chunk_of = step_outputs["chunk_ids"].numpy()[:, (np.arange(targets.shape[1]) + 1) // m
                                                     % (targets.shape[1] // m)]  # [b, n]
        parts["chunk_ids"].append(chunk_of[mask])
        parts["targets"].append(targets[mask])
        parts["log_probs"].append(step_outputs["log_probs"].numpy()[mask].astype(np.float64))
        parts["wordpiece_bytes"].append(self.byte_lengths[targets[mask]])
        scored_chunks, scored_offsets = chunk_of[mask], np.broadcast_to(self.offsets, targets.shape)[mask]  # [t]
        distinct, where = np.unique(scored_chunks, return_inverse=True)  # [u], [t]
        chunk_bytes = np.zeros([distinct.size, m], np.int64)  # [u, m]: a document's last chunk may be shorter
        for row, chunk_id in enumerate(distinct.tolist()):
            lengths = self.task.original_bytes(int(chunk_id))
            chunk_bytes[row, :lengths.size] = lengths
        parts["bytes"].append(chunk_bytes[where.reshape(-1), scored_offsets])
        if self.with_knn_keys:
            parts["keys"].append(step_outputs["keys"].numpy()[mask])
        return parts

    def reduce_aggregated_logs(self, state: dict[str, list[np.ndarray]] | None) -> TokenScores | None:
        if not state or not state["targets"]:
            return None
        cat = {k: np.concatenate(v) for k, v in state.items() if v}
        return TokenScores(cat["chunk_ids"], cat["targets"], cat["log_probs"], cat["bytes"], cat.get("keys"),
                           cat["wordpiece_bytes"])


def chunk_overlaps(task: retro_lm.RetroLmTask, chunk_ids: np.ndarray, database: str = "train_only",
                   count: int = OVERLAP_NEIGHBOURS) -> np.ndarray:
    """float64 ``[C]``: r(C) of each database chunk in ``chunk_ids`` against its ``count`` nearest neighbours in
    ``database`` (its own document excluded), their values being the chunk and its continuation (RETRO §2.6)."""
    chunk_ids = np.asarray(chunk_ids, np.int64)
    out = np.zeros(chunk_ids.size, np.float64)
    for start in range(0, chunk_ids.size, 1024):
        rows = chunk_ids[start:start + 1024]
        found = task.retriever.neighbours_of_chunks(rows, allowed=task.allowed_chunks(database), count=count)
        for i, chunk_id in enumerate(rows.tolist()):
            values = [found.tokens[i, j][found.mask[i, j]] for j in range(count) if found.chunk_ids[i, j] >= 0]
            out[start + i] = knn_lm.chunk_overlap_ratio(task.store.tokens(chunk_id), values)
    return out


def _per_chunk(scores: TokenScores, overlaps: dict[int, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct chunk of ``scores``: its NLL (nats), its bytes and its r(C), each ``[C]``."""
    chunks, inverse = np.unique(scores.chunk_ids, return_inverse=True)
    nll = np.bincount(inverse, weights=-scores.log_probs, minlength=chunks.size)  # [C]
    num_bytes = np.bincount(inverse, weights=scores.bytes, minlength=chunks.size)  # [C]
    return nll, num_bytes, np.array([overlaps[int(c)] for c in chunks.tolist()])


def bits_per_byte_by_alpha(scores: TokenScores, overlaps: dict[int, float],
                           alphas: Sequence[float] = ALPHAS) -> dict[float, tuple[float, int]]:
    """``{α: (bpb over the chunks with r(C) <= α, number of those chunks)}``; ``overlaps`` maps chunk id to r(C).
    bpb is NaN where no chunk qualifies."""
    nll, num_bytes, r = _per_chunk(scores, overlaps)  # each [C]
    out = {}
    for alpha in alphas:
        keep = r <= alpha + 1e-9
        out[alpha] = (retro_sequences.bits_per_byte(nll[keep].sum(), int(num_bytes[keep].sum())), int(keep.sum()))
    return out


def bucket_name(low: float | None, high: float) -> str:
    """``"0"`` for r(C) = 0, else ``"(low, high]"``."""
    return f"{high:g}" if low is None else f"({low:g}, {high:g}]"


def bits_per_byte_by_bucket(scores: TokenScores, overlaps: dict[int, float],
                            alphas: Sequence[float] = ALPHAS) -> dict[str, tuple[float, int]]:
    """Like :func:`bits_per_byte_by_alpha`, but over the chunks *between* consecutive thresholds: ``r(C) <=
    alphas[0]``, then ``alphas[i-1] < r(C) <= alphas[i]`` (RETRO Fig. 6 plots these buckets, not cumulative
    sets: a gain on the leaked chunks alone is hidden in the cumulative figure of every larger α)."""
    nll, num_bytes, r = _per_chunk(scores, overlaps)  # each [C]
    return {name: (retro_sequences.bits_per_byte(nll[keep].sum(), int(num_bytes[keep].sum())), int(keep.sum()))
            for name, keep in _buckets(r, alphas)}


def _buckets(r: np.ndarray, alphas: Sequence[float]) -> Iterator[tuple[str, np.ndarray]]:
    """``(bucket name, bool mask of r in it)`` for each bucket between consecutive thresholds (``r``: r(C) values)."""
    for low, high in zip([None, *alphas[:-1]], alphas):
        yield bucket_name(low, high), (r <= high + 1e-9) & (r > (low if low is not None else -np.inf) + 1e-9)


def per_document_by_bucket(scores: TokenScores, overlaps: dict[int, float], doc_index: np.ndarray,
                           alphas: Sequence[float] = ALPHAS) -> dict[str, dict[str, list]]:
    """:func:`per_document` over each bucket's chunks (:func:`bits_per_byte_by_bucket`): the documents with a
    chunk in the bucket, and their bits and bytes there, for intervals over documents within a bucket."""
    r = np.array([overlaps[int(c)] for c in scores.chunk_ids.tolist()])  # [T]: each token's chunk's r(C)
    return {name: per_document(scores.subset(keep), doc_index) for name, keep in _buckets(r, alphas)}


def per_document(scores: TokenScores, doc_index: np.ndarray) -> dict[str, list]:
    """Each scored document's bits and UTF-8 bytes, for intervals over documents: ``{"documents": [ordinal, ...],
    "bits": [...], "bytes": [...]}`` in ordinal order (``doc_index``: the database's document ordinal per chunk)."""
    documents, inverse = np.unique(doc_index[scores.chunk_ids], return_inverse=True)
    bits = np.bincount(inverse, weights=-scores.log_probs, minlength=documents.size) / np.log(2.0)  # [D]
    num_bytes = np.bincount(inverse, weights=scores.bytes, minlength=documents.size)  # [D]
    return {"documents": documents.tolist(), "bits": bits.tolist(), "bytes": num_bytes.astype(np.int64).tolist()}


def bpb_difference(first: Mapping[str, list], second: Mapping[str, list], samples: int = 10_000,
                   seed: int = 0) -> tuple[float, float, float]:
    """bpb of ``second`` minus bpb of ``first`` (two :func:`per_document` results on the same documents), and its
    95% paired bootstrap interval: documents resampled together, each sample's bpb the ratio of its summed bits
    to its summed bytes (as the whole split's is)."""
    if first["documents"] != second["documents"] or first["bytes"] != second["bytes"]:
        raise ValueError("bpb_difference: the two scorings are not of the same documents")
    a, b = np.asarray(first["bits"]), np.asarray(second["bits"])  # [D] each
    num_bytes = np.asarray(first["bytes"], np.float64)  # [D]
    draws = np.random.default_rng(seed).integers(0, a.size, size=(samples, a.size))  # [samples, D]
    sampled = (b[draws].sum(1) - a[draws].sum(1)) / num_bytes[draws].sum(1)  # [samples]
    return float((b.sum() - a.sum()) / num_bytes.sum()), float(np.percentile(sampled, 2.5)), float(
        np.percentile(sampled, 97.5))


#: kNN-LM's λ and distance temperature, chosen on the validation split (kNN-LM §3: λ tuned on validation).
KNN_LAMBDAS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6)
KNN_TEMPERATURES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def knn_log_probs(scores: TokenScores, datastore: knn_datastore.KnnDatastore, k: int, lam: float,
                  temperature: float, found: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """float64 ``[T]``: log(λ p_kNN + (1 − λ) p_LM) of each scored token's target (kNN-LM eq. 3), the K nearest
    datastore entries to its context's key voting (``found``: a previous :meth:`KnnDatastore.search`)."""
    distances, tokens = found if found is not None else search_datastore(scores, datastore, k)
    p_knn = knn_lm.knn_target_probs(distances, tokens, scores.targets, temperature).numpy()  # [T]
    return knn_lm.interpolate_log_probs(scores.log_probs, p_knn.astype(np.float64), lam).numpy()


def search_datastore(scores: TokenScores, datastore: knn_datastore.KnnDatastore,
                     k: int) -> tuple[np.ndarray, np.ndarray]:
    """The K nearest datastore entries of every scored token's key: ``(distances [T, K], tokens [T, K])``."""
    if scores.knn_keys is None:
        raise ValueError("kNN-LM needs the tokens' keys: score_tokens(..., with_knn_keys=True)")
    parts = [datastore.search(scores.knn_keys[i:i + 4096], k) for i in range(0, len(scores.targets), 4096)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def tune_knn(scores: TokenScores, datastore: knn_datastore.KnnDatastore, k: int,
             lambdas: Sequence[float] = KNN_LAMBDAS,
             temperatures: Sequence[float] = KNN_TEMPERATURES) -> tuple[float, float, dict[str, float]]:
    """``(λ, T, {"λ=..,T=..": bpb})``: the pair with the lowest bits-per-byte on ``scores`` (a validation split)."""
    found = search_datastore(scores, datastore, k)
    total_bytes = int(scores.bytes.sum())
    grid = {}
    for temperature in temperatures:
        for lam in lambdas:
            nll = -knn_log_probs(scores, datastore, k, lam, temperature, found).sum()
            grid[f"lambda={lam:g},T={temperature:g}"] = (retro_sequences.bits_per_byte(nll, total_bytes), lam,
                                                         temperature)
    best = min(grid.values())
    return best[1], best[2], {name: v[0] for name, v in grid.items()}


def hold_out(task: retro_lm.RetroLmTask, path: str) -> dict[str, Any]:
    """Makes the documents of ``path`` (:func:`realm_tf.data.document_files.read_documents`) the task's ``test``
    split (``RetroLmTask.hold_out_documents``: copies of them in the database are withheld and reported)."""
    documents = document_files.read_documents(path)
    streams = task.tokenizer(tf.constant([d.text for d in documents])).to_list()  # [documents, (wordpieces)]
    empty = [d.id for d, s in zip(documents, streams) if not s]
    if empty:
        raise errors.UserError(f"{path}: documents without a wordpiece: {', '.join(empty[:5])}")
    held = task.hold_out_documents([(f"held_out:{d.id}", s) for d, s in zip(documents, streams)],
                                   texts=[d.text for d in documents])
    if held["withheld"]:
        logger.info("%s: %d of its documents are in the database too; withheld from it: %s", path,
                    len(held["withheld"]), ", ".join(held["withheld"][:10]))
    return {"documents_file": path, **held}


def evaluate(cfg: config_lib.ExperimentConfig, model_dir: str, retrieval: bool, split: str = "test",
             database: str = "train_only", neighbours: bool = True, knn: bool = False,
             alphas: Sequence[float] = ALPHAS, batch_size: int = 8, documents: str | None = None) -> dict[str, Any]:
    """Bits-per-byte of the decoder of ``model_dir`` on ``split``'s documents, at every α.

    Args:
      retrieval: a RETRO model (True) or a baseline decoder.
      database: where neighbours (RETRO) and the leakage overlaps r(C) are searched (``retro_lm.DATABASES``).
      neighbours: False masks RETRO's neighbours ("retrieval off").
      knn: also kNN-LM (``retro.knn_dir``'s datastore; λ and T tuned on the validation split).
      documents: score the documents of this file instead of the ``split`` (:func:`hold_out`).

    Returns ``{"bpb": {α: bpb}, "chunks": {α: count}, "bpb_by_bucket": {bucket: bpb}, "chunks_by_bucket":
    {bucket: count}, "tokens", "bytes", ...}`` (and ``knn_*`` with ``knn``); buckets as
    :func:`bits_per_byte_by_bucket`. ``bpb`` counts the documents' original UTF-8 bytes; ``bpb_wordpieces`` the
    bytes of their detokenised wordpieces (lower-cased and re-spaced by the uncased tokenizer), as the training
    metric ``bits_per_byte`` does.
    """
    task = retro_lm.RetroLmTask(cfg, retrieval=retrieval)
    model = restore_decoder(task, model_dir)
    held = hold_out(task, documents) if documents else {}
    split = "test" if documents else split
    scores = score_tokens(task, model, split, neighbours=neighbours, database=database, with_knn_keys=knn,
                          batch_size=batch_size)
    chunks = np.unique(scores.chunk_ids)
    overlaps = dict(zip(chunks.tolist(), chunk_overlaps(task, chunks, database).tolist()))
    by_alpha = bits_per_byte_by_alpha(scores, overlaps, alphas)
    by_bucket = bits_per_byte_by_bucket(scores, overlaps, alphas)
    result: dict[str, Any] = {
        "model_dir": model_dir, "split": split, "database": database, "retrieval": retrieval,
        "neighbours": neighbours, "tokens": int(scores.targets.size), "bytes": int(scores.bytes.sum()),
        "wordpiece_bytes": int(scores.wordpiece_bytes.sum()),
        "bpb_wordpieces": {str(a): v[0] for a, v in bits_per_byte_by_alpha(
            dataclasses.replace(scores, bytes=scores.wordpiece_bytes), overlaps, alphas).items()},
        "bpb": {str(a): v[0] for a, v in by_alpha.items()}, "chunks": {str(a): v[1] for a, v in by_alpha.items()},
        "bpb_by_bucket": {b: v[0] for b, v in by_bucket.items()},
        "chunks_by_bucket": {b: v[1] for b, v in by_bucket.items()},
        "per_document": per_document(scores, task.store.doc_index), **held}
    # the chunks after a sequence's first, which read neighbours (RETRO §2.4's causal shift): the paper's Fig. 6
    reading = task.sequence_positions()[scores.chunk_ids] >= 1  # [T]
    result["later_chunks"] = _bucket_summary(scores.subset(reading), overlaps, task.store.doc_index, alphas)
    if knn:
        datastore = knn_datastore.KnnDatastore.load(cfg.retro.knn_dir, cfg.index.kind)
        validation = score_tokens(task, model, "validation", neighbours=neighbours, database=database,
                                  with_knn_keys=True, batch_size=batch_size)
        lam, temperature, grid = tune_knn(validation, datastore, cfg.retro.knn_neighbours)
        interpolated = scores.with_log_probs(knn_log_probs(scores, datastore, cfg.retro.knn_neighbours, lam,
                                                           temperature))
        result.update({"knn_lambda": lam, "knn_temperature": temperature, "knn_validation_grid": grid,
                       "knn_entries": len(datastore),
                       "knn_bpb": {str(a): v[0] for a, v in
                                   bits_per_byte_by_alpha(interpolated, overlaps, alphas).items()},
                       "knn_bpb_by_bucket": {b: v[0] for b, v in
                                             bits_per_byte_by_bucket(interpolated, overlaps, alphas).items()}})
        result["knn_later_chunks"] = _bucket_summary(interpolated.subset(reading), overlaps, task.store.doc_index,
                                                     alphas)
    return result


def _bucket_summary(scores: TokenScores, overlaps: dict[int, float], doc_index: np.ndarray,
                    alphas: Sequence[float]) -> dict[str, Any]:
    """bpb over all of ``scores`` and their per-document bits and bytes, then bpb, chunk counts and per-document
    bits and bytes of each r(C) bucket."""
    by_bucket = bits_per_byte_by_bucket(scores, overlaps, alphas)
    return {"bpb": retro_sequences.bits_per_byte(-scores.log_probs.sum(), int(scores.bytes.sum())),
            "per_document": per_document(scores, doc_index),
            "bpb_by_bucket": {b: v[0] for b, v in by_bucket.items()},
            "chunks_by_bucket": {b: v[1] for b, v in by_bucket.items()},
            "per_document_by_bucket": per_document_by_bucket(scores, overlaps, doc_index, alphas)}
