"""Deterministic train/dev split of question sets by hashing question ids.

The bundled ``qa_qed_train`` questions have no dev split; REALM (Guu et al., 2020, §4.1) evaluates on held-out
questions, so every job that trains and evaluates on them uses this one rule: a question is in dev when the
SHA1 of its id falls below ``dev_fraction``. The split does not depend on file order or on the other questions.
"""
from __future__ import annotations

import hashlib


def position(question_id: str) -> float:
    """The question's place in [0, 1): the first 8 bytes of SHA1(id)."""
    digest = hashlib.sha1(str(question_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def is_dev(question_id: str, dev_fraction: float) -> bool:
    """True when the question with this id belongs to the dev split."""
    if not 0.0 <= dev_fraction <= 1.0:
        raise ValueError(f"dev_fraction={dev_fraction} must be within [0, 1]")
    return position(question_id) < dev_fraction


def split_of(question_id: str, dev_fraction: float, tune_fraction: float = 0.0) -> str:
    """``dev`` (SHA1 position below ``dev_fraction``), ``tune`` (the next ``tune_fraction``) or ``train``.

    The tune split is held out of training like dev, and is where settings such as the answer-scoring weights
    are chosen, so that the dev split is only ever measured.
    """
    if not 0.0 <= dev_fraction + tune_fraction <= 1.0 or tune_fraction < 0.0:
        raise ValueError(f"dev_fraction={dev_fraction} + tune_fraction={tune_fraction} must be within [0, 1]")
    place = position(question_id)
    if place < dev_fraction:
        return "dev"
    return "tune" if place < dev_fraction + tune_fraction else "train"
