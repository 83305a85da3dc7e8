"""BM25 over the blocks: the sparse baseline that REALM and ORQA compare their learned retriever with
(Guu et al., 2020, Table 1 "BM25 + BERT"; Lee et al., 2019, §9).

``realm-tf evaluate --retriever bm25`` feeds its top-k blocks to the same span reader, so the two rows of a
comparison differ only in how the blocks were chosen. Uses ``bm25s`` (in the ``dev`` extra).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from realm_tf import errors


class Bm25Retriever:
    """Okapi BM25 (``bm25s``, English stop words) over ``title + text`` of every block, by dense block id.

    Args:
      titles: block titles, indexed by block id.
      texts: block bodies, indexed by block id.
    """

    def __init__(self, titles: Sequence[str], texts: Sequence[str]):
        if len(titles) != len(texts):
            raise ValueError(f"{len(titles)} titles but {len(texts)} texts")
        if not texts:
            raise ValueError("BM25 needs at least one block")
        try:
            import bm25s  # pylint: disable=import-outside-toplevel
        except ImportError as e:
            raise errors.UserError("the BM25 retriever needs the bm25s package: pip install bm25s "
                                   "(also in the dev extra)") from e
        self._bm25s = bm25s
        self.num_blocks = len(texts)
        self._index = bm25s.BM25()
        corpus = [f"{title} {text}" for title, text in zip(titles, texts)]
        self._index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(block_ids int64[len(questions), k], scores float32[len(questions), k])``, best first.

        ``k`` is capped at the number of blocks. A question with no indexed word scores 0 for every block
        (the order among ties is ``bm25s``'s).
        """
        k = min(k, self.num_blocks)
        tokens = self._bm25s.tokenize(list(questions), stopwords="en", show_progress=False)
        rows, scores = self._index.retrieve(tokens, k=k, show_progress=False)  # [n, k] each
        return np.asarray(rows, np.int64), np.asarray(scores, np.float32)
