"""Reading windows: the part of each given block's body that the reader reads in training.

A reader's cost grows with the length it reads. BERT's SQuAD reader (Devlin et al., 2019, §4.2) reads a passage
longer than its input in windows; here the reader warm start reads each block through a window of
``qa.reader_window`` body wordpieces (the title whole), so that its step costs what that length costs:

- the **gold block**'s window holds an occurrence of an answer, at an offset drawn uniformly among the windows
  that hold it, so that the answer is seen at every position of the reader's input, not only near the start;
- a **negative** block's window is drawn uniformly among its windows;
- a body no longer than the window is read whole.

Evaluation and serving read whole blocks (``OpenQaModel`` with no ``block_windows``).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def find_occurrences(body: np.ndarray, pieces: np.ndarray) -> list[int]:
    """Every position where the wordpieces ``pieces`` (``int32[n]``, n > 0) occur in ``body`` (``int32[len]``)."""
    n = len(pieces)
    if n == 0 or n > len(body):
        return []
    first = np.flatnonzero(body[:len(body) - n + 1] == pieces[0])  # [candidates]
    return [int(p) for p in first if np.array_equal(body[p:p + n], pieces)]


def choose_windows(block_ids: np.ndarray, body_of: Callable[[int], np.ndarray],
                   answer_pieces: Sequence[Sequence[np.ndarray]], length: int,
                   seed: int = 0) -> tuple[np.ndarray, dict[str, int]]:
    """``(windows int64[n, k, 2], counts)``: ``(first wordpiece, count)`` of the body read for each of the ``k``
    blocks of each of the ``n`` questions (``block_ids`` ``[n, k]``, the gold block first), at most ``length``
    wordpieces.

    Args:
      block_ids: ``int[n, k]``: each question's gold block, then its negatives.
      body_of: block id → its body wordpieces ``int32[len]``.
      answer_pieces: per question, the wordpieces of each of its answers.
      length: the window's wordpieces (> 0).
      seed: the draw of the offsets.

    ``counts``: ``whole`` (gold bodies no longer than the window), ``windowed`` (gold windows holding an
    answer), ``answer_not_in_body`` (gold blocks whose body holds no answer as wordpieces, e.g. only the title
    does: read through a random window, as a negative is) and ``negatives``."""
    if length <= 0:
        raise ValueError(f"a reading window of {length} wordpieces: it must be > 0")
    if len(block_ids) != len(answer_pieces):
        raise ValueError(f"{len(block_ids)} rows of block ids for {len(answer_pieces)} questions' answers")
    rng = np.random.default_rng(seed)
    windows = np.zeros([*np.shape(block_ids), 2], np.int64)  # [n, k, 2]
    counts = {"whole": 0, "windowed": 0, "answer_not_in_body": 0, "negatives": 0}
    for q, row in enumerate(np.asarray(block_ids)):
        for j, block in enumerate(row):
            body = np.asarray(body_of(int(block)))
            if len(body) <= length:
                windows[q, j] = (0, len(body))
                counts["whole" if j == 0 else "negatives"] += 1
                continue
            spans = [(p, len(a)) for a in answer_pieces[q] if len(a) <= length
                     for p in find_occurrences(body, np.asarray(a))] if j == 0 else []
            if spans:
                start, width = spans[int(rng.integers(len(spans)))]
                low, high = max(0, start + width - length), min(start, len(body) - length)  # windows holding it
                counts["windowed"] += 1
            else:
                low, high = 0, len(body) - length
                counts["answer_not_in_body" if j == 0 else "negatives"] += 1
            windows[q, j] = (int(rng.integers(low, high + 1)), length)
    return windows, counts
