"""Reading a run's checkpoints when some of them are damaged: the newest whose files are all there, and errors
that name the checkpoint and say what to do.

A run keeps its last few checkpoints (``tf.train.CheckpointManager``) and a small state file, ``checkpoint``,
that lists them. A copy interrupted, a disk error or a file deleted by hand can leave the newest one without its
``.index`` or data shards, or the state file unreadable; ``tf.train.latest_checkpoint`` then returns None and a
reader would go on with freshly initialised weights. Here the previous complete checkpoint is used instead, with
a warning naming the damaged one, as TF Serving serves the previous complete version of a model.
"""
from __future__ import annotations

import logging
import os
import re

import tensorflow as tf

from realm_tf import errors

logger = logging.getLogger(__name__)

_NUMBERED = re.compile(r"^(.*)-(\d+)\.index$")


def _complete(prefix: str) -> bool:
    """True when ``prefix.index`` and every data shard it names are there."""
    if not tf.io.gfile.exists(prefix + ".index"):
        return False
    shards = tf.io.gfile.glob(prefix + ".data-*-of-*")
    if not shards:
        return False
    count = int(shards[0].rsplit("-of-", 1)[1])
    return len(shards) == count


def _listed(directory: str) -> list[str]:
    """The checkpoints the state file lists, newest first (none when it is missing or unreadable)."""
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (tf.errors.OpError, ValueError) as e:  # a damaged state file: a text proto that does not parse
        logger.warning("%s/checkpoint cannot be read (%s): looking for checkpoint files instead", directory,
                       str(e).splitlines()[0] if str(e) else type(e).__name__)
        return []
    if state is None:
        if tf.io.gfile.exists(os.path.join(directory, "checkpoint")):  # TensorFlow could not parse it
            logger.warning("%s/checkpoint cannot be read: looking for checkpoint files instead", directory)
        elif tf.io.gfile.glob(os.path.join(directory, "*.index")):
            logger.warning("%s/checkpoint is missing: looking for checkpoint files instead", directory)
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    if state.model_checkpoint_path and state.model_checkpoint_path not in paths:
        paths.append(state.model_checkpoint_path)
    return list(reversed(paths))  # TensorFlow has joined relative entries to ``directory`` already


def newest_complete(directory: str) -> str | None:
    """The prefix of the newest checkpoint in ``directory`` whose files are all present, or None when there is no
    checkpoint at all. Those the state file lists come first, newest first; a listed checkpoint with files
    missing is skipped with a warning; without a readable state file, the highest-numbered complete ``ckpt-N``."""
    if not tf.io.gfile.isdir(directory):
        return None
    listed = _listed(directory)
    for prefix in listed:
        if _complete(prefix):
            return prefix
        logger.warning("%s: files missing (a damaged or partly deleted checkpoint); using the previous one", prefix)
    found = []
    for name in tf.io.gfile.listdir(directory):
        match = _NUMBERED.match(name)
        if match:
            prefix = os.path.join(directory, name[: -len(".index")])
            if _complete(prefix):
                found.append((int(match.group(2)), prefix))
    if found:
        prefix = max(found)[1]
        if listed:
            logger.warning("%s: none of the checkpoints %s/checkpoint lists is complete; using %s", directory,
                           directory, prefix)
        return prefix
    if listed:
        raise errors.UserError(f"{directory}: every checkpoint is damaged (files missing: {listed[0]}.index or "
                               f"its data). Copy the run again, or train it again")
    return None


def read(tree: tf.train.Checkpoint, prefix: str, resume: bool = False) -> tf.train.CheckpointLoadStatus:
    """``tree.read(prefix)`` (``resume``: ``tree.restore``, the save counter too, as a trainer resuming does), a
    damaged file (truncated, corrupted: TensorFlow's CRC, a short read) an error that names the checkpoint and
    says what to do."""
    try:
        return tree.restore(prefix) if resume else tree.read(prefix)
    except DAMAGE_ERRORS as e:
        raise damaged(prefix, e) from e


#: What reading a damaged checkpoint raises.
DAMAGE_ERRORS = (tf.errors.OpError, ValueError, IndexError, OSError)


def damaged(prefix: str, error: BaseException) -> errors.UserError:
    """The error for the checkpoint ``prefix`` that could not be read: it names it and says what to do."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return errors.UserError(
        f"{prefix}: the checkpoint cannot be read ({type(error).__name__}: {first[:300]}): it is damaged. Delete "
        f"its files ({os.path.basename(prefix)}.*) so that the previous checkpoint in {os.path.dirname(prefix)} is "
        f"used, or copy or train the run again")
