"""The ``[num_blocks, dim]`` matrix of Embed_doc(z) that a MIPS index is built on, assembled from the
embedding shards an index builder wrote (REALM, Guu et al., 2020, §3.4: every block is re-embedded with the
trainer's latest Embed_doc, and the new index covers the whole corpus, or it is not published).

Shards are TFRecords of ``tf.train.Example`` with ``block_id`` (int64) and ``embedding`` (float32[dim]), read
with ``tf.data`` (any TensorFlow filesystem: local, gs://). :func:`assemble_matrix` orders them by block id
and refuses a matrix with a missing, duplicated or out-of-range id, or with failed blocks.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from realm_tf import errors
from realm_tf.data import example_schemas

EMBEDDING = "embedding"  # float32[dim] feature of an embedding record (with example_schemas.BLOCK_ID)
_SHOWN_IDS = 20  # ids listed in an error message before "... and N more"


class IncompleteEmbeddingsError(errors.UserError, ValueError):
    """The embedding shards do not cover every block exactly once: the index is not published."""


def to_embedding_record(keyed: tuple[int, np.ndarray]) -> bytes:
    """``(block_id, float32[dim])`` -> a serialized tf.train.Example (deterministic bytes)."""
    block_id, vector = keyed
    return tf.train.Example(features=tf.train.Features(feature={
        example_schemas.BLOCK_ID: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(block_id)])),
        EMBEDDING: tf.train.Feature(float_list=tf.train.FloatList(value=np.asarray(vector, np.float32))),
    })).SerializeToString(deterministic=True)


def read_embedding_shards(paths: Sequence[str], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Every ``(block_id, vector)`` of the shards ``paths``: ``(ids int64 [M], vectors float32 [M, dim])``."""
    ids: list[int] = []
    vectors: list[np.ndarray] = []
    for path in paths:
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            features = tf.train.Example.FromString(record).features.feature
            vector = np.asarray(features[EMBEDDING].float_list.value, np.float32)  # [dim]
            if vector.shape != (dim,):
                raise IncompleteEmbeddingsError(f"{path}: an embedding of shape {vector.shape}, expected ({dim},)")
            ids.append(int(features[example_schemas.BLOCK_ID].int64_list.value[0]))
            vectors.append(vector)
    matrix = np.stack(vectors) if vectors else np.zeros([0, dim], np.float32)  # [M, dim]
    return np.asarray(ids, np.int64), matrix


def read_failures(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The ``{"block_id", "error"}`` lines of the failure shards ``paths``."""
    failures = []
    for path in paths:
        with tf.io.gfile.GFile(path) as f:
            failures += [json.loads(line) for line in f.read().splitlines() if line.strip()]
    return failures


def assemble_matrix(ids: np.ndarray, vectors: np.ndarray, num_blocks: int | None,
                    failures: Sequence[Mapping[str, Any]] = (), where: str = "") -> np.ndarray:
    """Orders ``vectors`` ([M, dim], row i = block ``ids[i]``) by block id into ``[num_blocks, dim]``.

    Every id 0..num_blocks-1 must occur exactly once (``num_blocks`` None: the largest id + 1) and
    ``failures`` must be empty; otherwise :class:`IncompleteEmbeddingsError` names the missing,
    duplicated and out-of-range ids and the failures (``where`` is appended to the message).
    """
    if num_blocks is None:
        num_blocks = int(ids.max()) + 1 if ids.size else 0
    in_range = (ids >= 0) & (ids < num_blocks)  # [M]
    counts = np.bincount(ids[in_range], minlength=num_blocks)  # [num_blocks]
    missing = np.flatnonzero(counts == 0)
    duplicated = np.flatnonzero(counts > 1)
    out_of_range = np.unique(ids[~in_range])
    problems = []
    if missing.size:
        problems.append(f"{missing.size} of {num_blocks} block ids missing: {format_ids(missing)}")
    if duplicated.size:
        problems.append(f"{duplicated.size} block ids embedded more than once: {format_ids(duplicated)}")
    if out_of_range.size:
        problems.append(f"{out_of_range.size} block ids outside 0..{num_blocks - 1}: {format_ids(out_of_range)}")
    if failures:
        shown = "; ".join(f"{f.get('block_id')}: {f.get('error')}" for f in list(failures)[:5])
        more = f"; ... and {len(failures) - 5} more" if len(failures) > 5 else ""
        problems.append(f"{len(failures)} block(s) failed to embed or parse ({shown}{more})")
    if num_blocks == 0:
        problems.append("no blocks at all")
    if problems:
        raise IncompleteEmbeddingsError("refusing to publish the index: " + "; ".join(problems) + where)
    matrix = np.empty([num_blocks, vectors.shape[1]], np.float32)  # [num_blocks, dim]
    matrix[ids] = vectors
    return matrix


def format_ids(ids: Sequence[int] | np.ndarray, limit: int = _SHOWN_IDS) -> str:
    """``[0, 1, 2, 5, 9, 10]`` -> ``"0-2, 5, 9-10"``, at most ``limit`` runs then ``... and N more ids``."""
    ids = sorted(int(i) for i in np.asarray(ids).ravel())
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit])
    if len(runs) > limit:
        text += f", ... and {sum(b - a + 1 for a, b in runs[limit:])} more ids"
    return text
