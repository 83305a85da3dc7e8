"""The knowledge corpus Z inside the TensorFlow graph: MIPS over Embed_doc(z), block wordpieces and text.

Open-QA fine-tuning in REALM (Guu et al., 2020, §3.2, §4) and ORQA (Lee et al., 2019, §5) keeps the
document embeddings fixed: the MIPS index is then exact and never stale, and retrieval can run inside the
model (ORQA searched its whole corpus with one matmul on TPU). :class:`KnowledgeCorpus` holds, as
non-trainable variables (so a SavedModel carries them and a checkpoint does not have to):

* ``embeddings`` ``float32[num_blocks, dim]``: Embed_doc(z) of every block (an index version's matrix);
* every block's title and body wordpieces (ragged, as values + row splits) to build join_BERT(x, z);
* every block's title and body text, and the UTF-8 byte offsets of each body/title wordpiece, so that an
  answer span is cut from the original text ("Bob Russell", not the wordpieces "bob russell").

:meth:`search` is exact maximum inner product search (a matmul and top-k); :meth:`swap_embeddings` replaces
the matrix in place when a refreshed index is published (fine-tuning with ``qa.refresh_doc_embeddings``).
Every variable has an unknown number of rows, so a served graph takes any corpus: a corpus update writes new
values into a copy of it (``export.open_qa_export.publish_corpus_update``) instead of exporting anew.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from realm_tf.data import block_store as block_store_lib
from realm_tf.layers import bert_tokenizer


class SearchableCorpus(tf.Module):
    """Maximum inner product search over Embed_doc(z) of every block: what every corpus of a model shares, whether
    its blocks are in memory (:class:`KnowledgeCorpus`) or read from disk on demand
    (``data/block_records.RecordCorpus``).

    The search is exact (one matmul over the embedding matrix, a variable) unless :meth:`use_searcher` installs
    another one (e.g. ScaNN's in-graph op). A searcher whose scores are not exact inner products
    (``searcher.exact_scores`` false: int8 re-ordering) returns ``searcher.depth(k)`` candidates
    (``searcher.search(queries, k, depth=...)``), which are
    re-scored exactly with :meth:`block_embeddings` and cut to k: ScaNN's own "re-order the short list in full
    precision", with the float rows wherever the subclass keeps them.

    Args:
      embeddings: ``float32[num_blocks, dim]`` Embed_doc of block i in row i, held as a variable; None for a
        corpus searched only by its searcher (``searcher``), whose block_embeddings come from elsewhere.
      num_blocks: the blocks the rows must cover; ``source`` names them in the error.
      searcher: the searcher to install (:meth:`use_searcher`).
    """

    def __init__(self, embeddings: np.ndarray | None, num_blocks: int, source: str, name: str,
                 searcher: Any = None) -> None:
        super().__init__(name=name)
        self.embeddings: tf.Variable | None = None
        if embeddings is None:
            if searcher is None:
                raise ValueError(f"{source}: a corpus without an embedding matrix needs a searcher")
        else:
            embeddings = np.asarray(embeddings, np.float32)
            if embeddings.ndim != 2 or embeddings.shape[0] != num_blocks:
                raise ValueError(f"embeddings {embeddings.shape} do not cover the {num_blocks} blocks of {source}")
            self.embeddings = tf.Variable(embeddings, dtype=tf.float32, trainable=False,
                                          shape=[None, embeddings.shape[1]])  # [num_blocks, dim]
        if searcher is not None:
            self.use_searcher(searcher)

    @property
    def num_blocks(self) -> tf.Tensor:
        return tf.shape(self.embeddings)[0]

    def use_searcher(self, searcher: Any) -> None:
        """Searches with ``searcher.search(queries, k) -> (scores, ids)`` (e.g. the in-graph ScaNN op of
        :mod:`realm_tf.index.in_graph_scann`) instead of the exact matmul."""
        self.searcher = searcher

    def search(self, queries: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
        """MIPS: ``(scores float32[batch, k], block_ids int32[batch, k])`` for ``queries [batch, dim]``, best
        first; the scores are exact inner products (see the class docstring)."""
        searcher = getattr(self, "searcher", None)
        if searcher is None:
            scores = tf.matmul(queries, self.embeddings, transpose_b=True)  # [batch, num_blocks]
            top = tf.math.top_k(scores, k=tf.minimum(k, self.num_blocks))
            return top.values, top.indices
        if getattr(searcher, "exact_scores", True):
            return searcher.search(queries, k)
        approximate, candidates = searcher.search(queries, k, depth=searcher.depth(k))  # [batch, depth] each
        rows = self.block_embeddings(candidates)  # [batch, depth, dim]
        exact = tf.einsum("bd,bkd->bk", queries, rows)  # [batch, depth]
        # A slot the searcher could not fill (score -inf, a repeated id) stays last.
        exact = tf.where(tf.math.is_finite(approximate), exact, tf.constant(-np.inf, exact.dtype))
        top = tf.math.top_k(exact, k=tf.minimum(k, tf.shape(exact)[1]))
        return top.values, tf.gather(candidates, top.indices, batch_dims=1)

    def block_embeddings(self, block_ids: tf.Tensor) -> tf.Tensor:
        """Rows of the embedding matrix: ``[..., dim]`` for ``block_ids [...]``."""
        return tf.gather(self.embeddings, block_ids)

    def swap_embeddings(self, embeddings: np.ndarray | tf.Tensor) -> None:
        """Replaces Embed_doc of every block (same number of blocks and dim), e.g. from a refreshed index."""
        if self.embeddings is None:
            raise ValueError("this corpus holds no embedding matrix (its searcher has them)")
        embeddings = tf.convert_to_tensor(embeddings, tf.float32)
        if embeddings.shape[0] != int(self.num_blocks) or embeddings.shape[1] != self.embeddings.shape[1]:
            raise ValueError(f"new embeddings {embeddings.shape} != [{int(self.num_blocks)}, "
                             f"{self.embeddings.shape[1]}]")
        self.embeddings.assign(embeddings)


class KnowledgeCorpus(SearchableCorpus):
    """Blocks, their embeddings and their text as graph variables.

    Args:
      embeddings: ``float32[num_blocks, dim]`` Embed_doc of block i in row i.
      blocks: the corpus (wordpieces, titles, texts) the rows refer to.
      tokenizer: used once to compute the wordpieces' byte offsets in the title and body text.
      searcher: as :meth:`SearchableCorpus.use_searcher`.
    """

    def __init__(self, embeddings: np.ndarray, blocks: block_store_lib.BlockStore,
                 tokenizer: bert_tokenizer.BertTokenizer, name: str = "knowledge_corpus", searcher: Any = None) -> None:
        super().__init__(embeddings, len(blocks), blocks.source, name=name, searcher=searcher)
        if blocks.titles is None or blocks.texts is None:
            raise ValueError(f"{blocks.source}: the block store has no text (load it with BlockStore.load)")
        n = len(blocks)
        var = lambda value, dtype, shape: tf.Variable(value, dtype=dtype, trainable=False, shape=shape)
        titles = [blocks.title_ids(i) for i in range(n)]
        bodies = [blocks.body_ids(i) for i in range(n)]
        title_starts, title_ends = byte_offsets(tokenizer, blocks.titles, titles)
        body_starts, body_ends = byte_offsets(tokenizer, blocks.texts, bodies)
        self.title_values, self.title_splits = (var(v, t, [None]) for v, t in
                                                zip(_flat(titles), (tf.int32, tf.int64)))
        self.body_values, self.body_splits = (var(v, t, [None]) for v, t in zip(_flat(bodies), (tf.int32, tf.int64)))
        self.title_starts = var(np.concatenate(title_starts) if n else [], tf.int64, [None])  # byte offsets
        self.title_ends = var(np.concatenate(title_ends) if n else [], tf.int64, [None])
        self.body_starts = var(np.concatenate(body_starts) if n else [], tf.int64, [None])
        self.body_ends = var(np.concatenate(body_ends) if n else [], tf.int64, [None])
        self.titles = var(blocks.titles, tf.string, [None])  # [num_blocks]
        self.texts = var(blocks.texts, tf.string, [None])  # [num_blocks]

    @classmethod
    def without_index(cls, blocks: block_store_lib.BlockStore,
                      tokenizer: bert_tokenizer.BertTokenizer) -> "KnowledgeCorpus":
        """The blocks alone, for a reader given the blocks to read (never searched: one zero column stands in for
        the embeddings)."""
        return cls(np.zeros([len(blocks), 1], np.float32), blocks, tokenizer)

    def title_text(self, block_ids: tf.Tensor) -> tf.Tensor:
        """Titles ``string[...]`` of ``block_ids int[...]``."""
        return tf.gather(self.titles, block_ids)

    def body_text(self, block_ids: tf.Tensor) -> tf.Tensor:
        """Body texts ``string[...]`` of ``block_ids int[...]``."""
        return tf.gather(self.texts, block_ids)

    def title_ids(self, block_ids: tf.Tensor) -> tf.RaggedTensor:
        """Title wordpieces ``int32[n, (len)]`` of ``block_ids int[n]``."""
        return tf.gather(self._ragged(self.title_values, self.title_splits), block_ids)

    def wordpieces(self, block_ids: tf.Tensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
        """``(title_ids, body_ids)`` of ``block_ids int[n]``, each ``int32[n, (len)]``."""
        return self.title_ids(block_ids), self.body_ids(block_ids)

    def title_and_text(self, block_ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(titles, body texts)`` ``string[...]`` of ``block_ids int[...]``."""
        return self.title_text(block_ids), self.body_text(block_ids)

    def body_ids(self, block_ids: tf.Tensor) -> tf.RaggedTensor:
        """Body wordpieces ``int32[n, (len)]`` of ``block_ids int[n]``."""
        return tf.gather(self._ragged(self.body_values, self.body_splits), block_ids)

    def span_text(self, block_ids: tf.Tensor, in_title: tf.Tensor, first: tf.Tensor, last: tf.Tensor) -> tf.Tensor:
        """The original text of wordpieces ``first..last`` of each block's title (``in_title``) or body.

        All arguments ``[n]``; returns ``string[n]``. Pieces without an offset (normalisation produced them)
        fall back to the neighbouring ones.
        """
        block_ids = tf.cast(block_ids, tf.int64)
        first, last = tf.cast(first, tf.int64), tf.cast(last, tf.int64)
        title_base = tf.gather(self.title_splits, block_ids)  # [n]
        body_base = tf.gather(self.body_splits, block_ids)  # [n]
        # tf.where evaluates both branches: clip each gather into its own array (the unused one may overrun it).
        _at = lambda offsets, at: tf.gather(offsets, tf.clip_by_value(at, 0, tf.size(offsets, tf.int64) - 1))
        starts = tf.where(in_title, _at(self.title_starts, title_base + first),
                          _at(self.body_starts, body_base + first))  # [n] bytes
        ends = tf.where(in_title, _at(self.title_ends, title_base + last),
                        _at(self.body_ends, body_base + last))  # [n] bytes
        text = tf.where(in_title, tf.gather(self.titles, block_ids), tf.gather(self.texts, block_ids))  # [n]
        # Pieces past the block's end (a masked span's) take another block's offsets: keep them inside the text.
        size = tf.cast(tf.strings.length(text), tf.int64)  # [n] bytes
        starts = tf.clip_by_value(starts, 0, size)  # [n]
        return tf.strings.substr(text, starts, tf.clip_by_value(ends - starts, 0, size - starts))

    @staticmethod
    def _ragged(values: tf.Variable, splits: tf.Variable) -> tf.RaggedTensor:
        return tf.RaggedTensor.from_row_splits(tf.convert_to_tensor(values), tf.convert_to_tensor(splits),
                                               validate=False)


def _flat(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(r) for r in rows), np.int64, count=len(rows))
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = np.concatenate(rows).astype(np.int32) if rows else np.zeros([0], np.int32)
    return values, splits


def byte_offsets(tokenizer: bert_tokenizer.BertTokenizer, texts: list[str],
                 stored: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Byte offsets of each stored wordpiece in its text; where re-tokenizing the text does not give the
    stored wordpieces, offsets are spread proportionally so an answer is still cut from real text."""
    starts_out: list[np.ndarray] = []
    ends_out: list[np.ndarray] = []
    for i in range(0, len(texts), 1024):
        chunk = texts[i:i + 1024]
        ids, starts, ends = tokenizer.tokenize_with_offsets(tf.constant(chunk, tf.string))
        for j, (piece_ids, s, e) in enumerate(zip(ids.to_list(), starts.to_list(), ends.to_list())):
            expected = stored[i + j]
            if list(expected) == piece_ids:
                starts_out.append(np.asarray(s, np.int64))
                ends_out.append(np.asarray(e, np.int64))
            else:  # should not happen for blocks written by preprocess_corpus; degrade, don't fail
                size = len(chunk[j].encode("utf-8"))
                edges = np.linspace(0, size, len(expected) + 1).astype(np.int64)
                starts_out.append(edges[:-1])
                ends_out.append(edges[1:])
    return starts_out, ends_out

