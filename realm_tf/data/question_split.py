"""Deterministic train/dev split of question sets by hashing question ids.

The bundled ``qa_qed_train`` questions have no dev split; REALM (Guu et al., 2020, §4.1) evaluates on held-out
questions, so every job that trains and evaluates on them uses this one rule: a question is in dev when the
SHA1 of its id falls below ``dev_fraction``. The split does not depend on file order or on the other questions.
"""
from __future__ import annotations

import hashlib


def is_dev(question_id: str, dev_fraction: float) -> bool:
    """True when the question with this id belongs to the dev split."""
    if not 0.0 <= dev_fraction <= 1.0:
        raise ValueError(f"dev_fraction={dev_fraction} must be within [0, 1]")
    digest = hashlib.sha1(str(question_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < dev_fraction
