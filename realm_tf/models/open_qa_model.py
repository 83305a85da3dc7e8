"""REALM / ORQA Open-QA model: retrieve in the graph, read k blocks, score every answer span (Guu et al., 2020,
§3.2 "Knowledge-Augmented Encoder", Open-QA fine-tuning; Lee et al., 2019, §5).

    p(y | x) = Σ_{z ∈ top-k} p(z | x) Σ_{s ∈ S(z, y)} p(s | z, x)

One differentiable pass for a batch of questions x:

1. Embed_input(x) with the (trainable) query tower;
2. exact MIPS over the fixed Embed_doc matrix of :class:`~realm_tf.data.knowledge_corpus.KnowledgeCorpus`
   → the top ``reader_beam_size`` blocks (REALM: 5); f(x, z) = Embed_input(x)ᵀ Embed_doc(z) is recomputed from
   the gathered rows, so the gradient reaches the query tower (document embeddings are frozen, as in ORQA and
   REALM's fine-tuning; with ``recompute_doc_embeddings`` the k blocks are re-embedded with the current
   Embed_doc instead, so it trains too);
3. join_BERT(x, title [SEP] body) for each block (join_BERT(x, body) with ``reader_block_title=False``, as
   ORQA's reader, which reads the text of ``blocks.tfr`` alone), built in the graph, read by the
   :class:`~realm_tf.models.span_reader.SpanReader`; spans crossing the title/body [SEP] or cutting a word
   (starting on a ``##`` piece or stopping before one) are masked.

Everything runs in the graph, so the same model exports as one TF Serving signature.
"""
from __future__ import annotations

import string
from typing import Any, Mapping

import tensorflow as tf
import tf_keras
from official.modeling import tf_utils

from realm_tf.data import knowledge_corpus
from realm_tf.layers import bert_tokenizer
from realm_tf.models import answer_confidence
from realm_tf.models import knowledge_retriever
from realm_tf.models import span_reader
from realm_tf.networks import bert_encoder
from realm_tf.networks import length_buckets


class OpenQaModel(tf_keras.Model):
    """Knowledge retriever + in-graph corpus + span reader.

    Args:
      retriever: the two towers (Embed_input trains; Embed_doc only with ``recompute_doc_embeddings``).
      reader: the span reader.
      corpus: the blocks and their Embed_doc matrix (not trained, not part of the training checkpoint).
      tokenizer: packs join_BERT in the graph.
      reader_beam_size: k, blocks read per question.
      reader_seq_length: length of join_BERT(x, z).
      block_seq_length: length of ``[CLS] title [SEP] body [SEP]`` when re-embedding blocks.
      recompute_doc_embeddings: score the k blocks with the current Embed_doc instead of the fixed matrix.
      reader_block_title: the reader reads ``title [SEP] body`` after the question (false: the body alone).
      static_padding: join_BERT padded to ``reader_seq_length`` (and blocks to ``block_seq_length``), so that
        :meth:`read` sees one shape (``data.static_padding``; XLA); else to each batch's longest row.

    Inputs of :meth:`call`: ``question_input_word_ids`` / ``_input_mask`` / ``_input_type_ids`` ``int32[batch, q_len]``
    (``[CLS] question [SEP]``). Optional ``block_ids`` ``int32[batch, k]``: blocks chosen by another retriever
    (e.g. BM25) to read instead of searching; their ``retrieval_logits`` are 0, so the reader alone ranks the
    spans (the "BM25 + reader" baseline of REALM's Table 1). Optional ``block_windows`` ``int32[batch, k, 2]``
    (with ``block_ids``): ``(first wordpiece, count)`` of each block's body to read, the rest of the body left
    out: the reader trains on windows of its blocks (SQuAD-style reading windows, Devlin et al., 2019, §4.2), and
    the title is read whole. Decoding reads whole blocks only.

    Returns ``block_ids`` ``int32[batch, k]``, ``retrieval_logits`` ``[batch, k]``, ``span_logits`` /
    ``span_starts`` / ``span_ends`` / ``span_mask`` ``[batch, k, num_spans]`` and ``reader_input_word_ids`` /
    ``reader_input_type_ids`` ``int32[batch, k, reader_len]`` (for matching answers), and ``question_length``
    ``int32[batch]`` (wordpieces of x in the reader input).
    """

    def __init__(self, retriever: knowledge_retriever.KnowledgeRetriever, reader: span_reader.SpanReader,
                 corpus: knowledge_corpus.KnowledgeCorpus, tokenizer: bert_tokenizer.BertTokenizer,
                 reader_beam_size: int, reader_seq_length: int, block_seq_length: int,
                 recompute_doc_embeddings: bool = False, reader_block_title: bool = True,
                 static_padding: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.retriever = retriever
        self.reader = reader
        self.corpus = corpus
        self.tokenizer = tokenizer
        self.reader_beam_size = reader_beam_size
        self.reader_seq_length = reader_seq_length
        self.block_seq_length = block_seq_length
        self.recompute_doc_embeddings = recompute_doc_embeddings
        self.reader_block_title = reader_block_title
        self.static_padding = static_padding
        self._continuation = tf.constant(bert_tokenizer.continuation_table(tokenizer.vocab))  # [vocab]: "##" pieces

    def retrieve(self, question: dict[str, tf.Tensor], k: int,
                 training: bool | None = None) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``(query_embedding [batch, dim], scores [batch, k], block_ids int32 [batch, k])``, best first."""
        query = self.retriever.embed_queries(question, training=training)  # [batch, dim]
        scores, block_ids = self.corpus.search(query, k)  # [batch, k] each
        return query, scores, block_ids

    def _answer_shaped(self, read: dict[str, tf.Tensor], word_ids: tf.Tensor) -> tf.Tensor:
        """[batch, k, num_spans] bool: spans that could be an answer. A span may not cross the [SEP] between title
        and body, and an answer is whole words: a span may not start on a "##" piece nor stop before one (the
        training targets never do, so without this a prediction can cut a word, "Kirk Kerk" for "Kirk Kerkorian").

        Args:
          read: the span reader's outputs (``span_starts``/``span_ends``: [1, 1, num_spans]).
          word_ids: [batch, k, len] the reader's input wordpieces.
        """
        is_sep = tf.cast(tf.equal(word_ids, self.tokenizer.sep_id), tf.int32)  # [batch, k, len]
        seps_before = tf.cumsum(is_sep, axis=-1)  # [batch, k, len]: [SEP]s at or before each position
        length = tf.shape(is_sep)[-1]
        starts = tf.minimum(read["span_starts"][0, 0], length - 1)  # [num_spans]
        ends = tf.minimum(read["span_ends"][0, 0], length - 1)  # [num_spans]
        # [SEP]s within [start, end]: inclusive count at the end minus the count strictly before the start.
        seps_inside = (tf.gather(seps_before, ends, axis=-1) - tf.gather(seps_before, starts, axis=-1)
                       + tf.gather(is_sep, starts, axis=-1))  # [batch, k, num_spans]
        piece = tf.gather(self._continuation, word_ids)  # [batch, k, len]
        next_piece = tf.concat([piece[..., 1:], tf.zeros_like(piece[..., :1])], axis=-1)  # [batch, k, len]
        whole_words = ~tf.gather(piece, starts, axis=-1) & ~tf.gather(next_piece, ends, axis=-1)  # [b, k, spans]
        return tf.equal(seps_inside, 0) & whole_words

    def call(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> dict[str, tf.Tensor]:
        return self.read({**inputs, **self.gather_blocks(inputs, training=training)}, training=training)

    def gather_blocks(self, inputs: dict[str, tf.Tensor], training: bool | None = None,
                      search_training: bool | None = None) -> dict[str, tf.Tensor]:
        """The retrieval and packing of :meth:`call`: the search (or the given ``block_ids``), the k blocks'
        wordpieces gathered from the corpus and join_BERT(x, z) packed. Its ragged gathers and the search have
        no XLA kernel; what it returns is dense, for :meth:`read`, which does compile. ``search_training``: the
        query tower's mode for the search (default: ``training``).

        Returns ``block_ids`` ``int32[batch, k]``, ``reader_input_word_ids`` / ``_mask`` / ``_type_ids``
        ``int32[batch, k, reader_len]``, ``question_length`` ``int32[batch]``, and, to score the blocks:
        ``query_embedding`` ``[batch, dim]`` (where it searched), ``block_embeddings`` ``[batch, k, dim]`` (the
        fixed matrix's rows) or ``block_input_word_ids`` / ``_mask`` / ``_type_ids`` ``int32[batch, k, block_len]``
        (``recompute_doc_embeddings``) or ``retrieval_scores`` ``[batch, k]`` (a served corpus's exact scores).
        """
        question = {k: inputs["question_" + k] for k in bert_encoder.INPUT_KEYS}  # each [batch, q_len]
        given = inputs.get("block_ids")
        out: dict[str, tf.Tensor] = {}
        if given is None:
            query, scores, block_ids = self.retrieve(question, self.reader_beam_size,
                                                     training=training if search_training is None else search_training)
            out["query_embedding"] = query  # [batch, dim]
        else:
            block_ids = tf.cast(given, tf.int32)  # [batch, k]
        batch, k = tf_utils.get_shape_list(block_ids)  # static where known; k fewer where the corpus is smaller
        titles, bodies = self.corpus.wordpieces(tf.reshape(block_ids, [-1]))  # [b * k, (title)], [b * k, (body)]
        if given is None and self.recompute_doc_embeddings:
            packed = self.tokenizer.join_bert(titles, bodies, self.block_seq_length,
                                              pad_to_seq_length=self.static_padding)  # each [batch * k, block_len]
            out.update({"block_" + key: tf.reshape(v, [batch, k, -1]) for key, v in packed.items()})
        elif given is None and self.corpus.embeddings is None:  # a served corpus: the searcher's exact scores
            out["retrieval_scores"] = scores  # [batch, k]
        elif given is None:
            out["block_embeddings"] = self.corpus.block_embeddings(block_ids)  # [batch, k, dim]
        question_ids = _unpack(question)  # [batch, (q_len)]
        repeated = tf.gather(question_ids, tf.repeat(tf.range(batch), k))  # [batch * k, (q_len)]
        windows = inputs.get("block_windows")
        if windows is not None:
            bodies = body_windows(bodies, tf.reshape(tf.cast(windows, tf.int64), [-1, 2]))  # [batch * k, (<= len)]
        if self.reader_block_title:
            sep = tf.RaggedTensor.from_tensor(tf.fill([batch * k, 1], self.tokenizer.sep_id))  # [batch * k, 1]
            doc = tf.concat([titles, sep, bodies], axis=1)  # [batch * k, (title_len + 1 + body_len)]
        else:
            doc = bodies  # [batch * k, (body_len)]
        reader_inputs = self.tokenizer.join_bert(repeated, doc, self.reader_seq_length,
                                                 pad_to_seq_length=self.static_padding)
        if training and not self.static_padding:  # a bounded number of shapes (length_buckets.LENGTH_MULTIPLE)
            reader_inputs = length_buckets.pad_to_multiple(reader_inputs, self.reader_seq_length)
        length = self.reader_seq_length if self.static_padding else -1
        out.update({"reader_" + key: tf.reshape(v, [batch, k, length]) for key, v in reader_inputs.items()})
        out["block_ids"] = block_ids  # [batch, k]
        out["question_length"] = tf.cast(question_ids.row_lengths(), tf.int32)  # [batch]
        return out

    def read(self, inputs: dict[str, tf.Tensor], training: bool | None = None) -> dict[str, tf.Tensor]:
        """The dense part of :meth:`call`: f(x, z) for the gathered blocks and the span reader over
        join_BERT(x, z). ``inputs``: the question's and :meth:`gather_blocks`'s tensors. Without
        ``query_embedding`` (blocks gathered outside the gradient tape, or given), Embed_input(x) is computed here,
        so that the retriever's loss reaches the query tower."""
        block_ids = inputs["block_ids"]  # [batch, k]
        if "block_embeddings" in inputs or "block_input_word_ids" in inputs:
            query = inputs.get("query_embedding")
            if query is None:
                question = {k: inputs["question_" + k] for k in bert_encoder.INPUT_KEYS}  # each [batch, q_len]
                query = self.retriever.embed_queries(question, training=training)  # [batch, dim]
            if "block_embeddings" in inputs:
                docs = tf.stop_gradient(inputs["block_embeddings"])  # [batch, k, dim]: Embed_doc fixed
            else:
                packed = {k: tf.reshape(inputs["block_" + k], [-1, tf.shape(inputs["block_" + k])[-1]])
                          for k in bert_encoder.INPUT_KEYS}  # each [batch * k, block_len]
                docs = tf.reshape(self.retriever.embed_blocks(packed, training=training),
                                  tf.concat([tf.shape(block_ids), [-1]], 0))  # [batch, k, dim]
            retrieval_logits = self.retriever.score(query, docs)  # [batch, k]: f(x, z) / τ
        elif "retrieval_scores" in inputs:
            retrieval_logits = self.retriever.logits(inputs["retrieval_scores"])  # [batch, k]
        else:
            retrieval_logits = tf.zeros(tf.shape(block_ids), tf.float32)  # [batch, k]: given blocks, no prior
        reader_inputs = {key: inputs["reader_" + key] for key in bert_encoder.INPUT_KEYS}  # each [batch, k, len]
        read = self.reader(reader_inputs, training=training)
        mask = read["span_mask"] & self._answer_shaped(read, reader_inputs["input_word_ids"])  # [b, k, spans]
        logits = tf.where(mask, read["span_logits"], span_reader.MASKED_SPAN_LOGIT)  # [batch, k, num_spans]
        return {
            "block_ids": block_ids,  # [batch, k]
            "retrieval_logits": retrieval_logits,  # [batch, k]
            "span_logits": logits,  # [batch, k, num_spans]
            "span_mask": mask,  # [batch, k, num_spans]
            "span_starts": read["span_starts"],  # [batch, k, num_spans]
            "span_ends": read["span_ends"],  # [batch, k, num_spans]
            "reader_input_word_ids": reader_inputs["input_word_ids"],  # [batch, k, reader_len]
            "reader_input_type_ids": reader_inputs["input_type_ids"],  # [batch, k, reader_len]
            "question_length": inputs["question_length"],  # [batch]
        }

    def decode(self, outputs: Mapping[str, tf.Tensor], retrieval_weight: float = 1.0,
               aggregate_spans: int = 1, length_bias: float = 0.0) -> dict[str, tf.Tensor]:
        """The best answer per question: ``answer`` string[batch] (cut from the block's original text),
        ``score`` (its probability among all spans of the k blocks), ``block`` (its position in the beam),
        ``block_id`` and ``features`` ``[batch, F]``, what :class:`answer_confidence.AnswerCalibrator` turns into a
        calibrated confidence (:func:`answer_confidence.answer_features`).

        Spans are ranked by S_read(z, s) + b·|s| + w·S_retr(z, x), w = ``retrieval_weight`` (ORQA/REALM: 1),
        b = ``length_bias`` per wordpiece of the span (a log-linear length prior; ORQA/REALM: 0), and
        normalised over every span of the k blocks. ``aggregate_spans`` = 1 answers with the best span (ORQA and
        REALM's argmax). N > 1 takes the N best spans and sums the probability of those whose text is the same
        answer (SQuAD-normalised, :func:`normalize_answers`), so that an answer several blocks or spans agree on
        outranks a single slightly stronger span: the evidence aggregation of Wang et al. (2018, "Evidence
        Aggregation for Answer Re-Ranking in Open-Domain Question Answering"). The answer is then the best span
        of the best group and ``score`` the group's probability.
        """
        joint = retrieval_weight * outputs["retrieval_logits"][:, :, None] + outputs["span_logits"]
        # joint: [batch, k, num_spans]
        if length_bias:
            widths = tf.cast(outputs["span_ends"] - outputs["span_starts"] + 1, joint.dtype)  # [batch, k, num_spans]
            joint += length_bias * widths
        joint = tf.where(outputs["span_mask"], joint, span_reader.MASKED_SPAN_LOGIT)
        shape = tf.shape(joint)
        flat = tf.reshape(joint, [shape[0], -1])  # [batch, k * num_spans]
        log_probs = flat - tf.reduce_logsumexp(flat, -1, keepdims=True)  # [batch, k * num_spans]
        top_log_probs, top = tf.math.top_k(log_probs, tf.minimum(max(aggregate_spans, 2), tf.shape(flat)[1]))
        # top_log_probs, top: [batch, n], best first (n >= 2: the margin to the second span is a feature)
        positions = top // shape[2]  # [batch, n]: each span's place in the beam
        texts, blocks = self._span_answers(outputs, positions, top % shape[2])  # [batch, n] each
        probs = tf.exp(top_log_probs)  # [batch, n]
        if aggregate_spans > 1:
            valid = tf.gather(tf.reshape(outputs["span_mask"], [shape[0], -1]), top, batch_dims=1)  # [batch, n]
            norms = tf.where(valid, normalize_answers(texts), "")  # [batch, n]: a masked span is not an answer
            n = tf.shape(norms)[1]
            same = tf.equal(norms[:, :, None], norms[:, None, :]) & tf.not_equal(norms, "")[:, :, None]
            same |= tf.eye(n, dtype=tf.bool)[None]  # [batch, n, n]: an empty answer is its own group
            group_probs = tf.reduce_sum(tf.where(same, probs[:, None, :], 0.0), -1)  # [batch, n]
            # Each group is represented by its first (best) member; its members' sums are equal up to rounding.
            first = tf.argmax(tf.cast(same, tf.int32), axis=-1, output_type=tf.int32)  # [batch, n]
            best_member = tf.argmax(group_probs, -1, output_type=tf.int32)  # [batch]
            pick = tf.gather(first, best_member, batch_dims=1)  # [batch]
            score = tf.gather(group_probs, pick, batch_dims=1)  # [batch]
        else:
            pick = tf.zeros([shape[0]], tf.int32)  # [batch]
            score = probs[:, 0]  # [batch]
        answer, block = tf.gather(texts, pick, batch_dims=1), tf.gather(positions, pick, batch_dims=1)  # [batch]
        span = tf.gather(top % shape[2], pick, batch_dims=1)  # [batch]
        return {"answer": answer, "score": score, "block": block, "block_id": tf.gather(blocks, pick, batch_dims=1),
                "features": self._confidence_features(outputs, tf.reshape(log_probs, shape), top_log_probs, answer,
                                                      score, block, span)}

    def _confidence_features(self, outputs: Mapping[str, tf.Tensor], log_probs: tf.Tensor, top_log_probs: tf.Tensor,
                             answer: tf.Tensor, score: tf.Tensor, block: tf.Tensor, span: tf.Tensor) -> tf.Tensor:
        """:func:`answer_confidence.answer_features` of the decoded answers ``[batch, F]``.

        Args:
          log_probs: ``[batch, k, num_spans]`` every span's normalised log-probability.
          top_log_probs: ``[batch, n]`` the best spans', best first.
          answer, score, block, span: ``[batch]`` the answer, its probability, its block's place in the beam and
            its span's index.
        """
        batch, k = tf.shape(log_probs)[0], tf.shape(log_probs)[1]
        index = tf.stack([block, span], -1)  # [batch, 2]
        length = (tf.gather_nd(outputs["span_ends"], index, batch_dims=1)
                  - tf.gather_nd(outputs["span_starts"], index, batch_dims=1) + 1)  # [batch]
        block_best = tf.argmax(log_probs, -1, output_type=tf.int32)  # [batch, k]: each block's best span
        block_texts, _ = self._span_answers(outputs, tf.tile(tf.range(k)[None], [batch, 1]), block_best)  # [b, k]
        norm = normalize_answers(answer)  # [batch]
        same = tf.equal(normalize_answers(block_texts), norm[:, None]) & tf.not_equal(norm, "")[:, None]  # [b, k]
        return answer_confidence.answer_features(score, outputs["retrieval_logits"], top_log_probs, block, length,
                                                 same, tf.reduce_any(outputs["span_mask"], -1))

    def _span_answers(self, outputs: Mapping[str, tf.Tensor], position: tf.Tensor,
                      span: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The text of span ``span`` of beam position ``position`` (both ``int32[batch, n]``), cut from the
        block's original title or body, and that block's id: ``(string[batch, n], int32[batch, n])``."""
        batch, n = tf.shape(position)[0], tf.shape(position)[1]
        index = tf.stack([position, span], -1)  # [batch, n, 2]
        start = tf.reshape(tf.gather_nd(outputs["span_starts"], index, batch_dims=1), [-1])  # [batch * n]
        end = tf.reshape(tf.gather_nd(outputs["span_ends"], index, batch_dims=1), [-1])  # [batch * n]
        block = tf.gather(outputs["block_ids"], position, batch_dims=1)  # [batch, n]
        flat_block = tf.reshape(block, [-1])  # [batch * n]
        length = tf.shape(outputs["reader_input_word_ids"])[-1]
        word_ids = tf.reshape(tf.gather(outputs["reader_input_word_ids"], position, batch_dims=1),
                              [-1, length])  # [batch * n, len]
        type_ids = tf.reshape(tf.gather(outputs["reader_input_type_ids"], position, batch_dims=1),
                              [-1, length])  # [batch * n, len]
        question_len = tf.reduce_sum(tf.cast(tf.equal(type_ids, 0) & tf.not_equal(word_ids, self.tokenizer.pad_id),
                                             tf.int32), -1) - 2  # [batch * n]: x as read (after any truncation)
        title_start = question_len + 2  # [batch * n]
        if self.reader_block_title:
            title_len = tf.cast(self.corpus.title_ids(flat_block).row_lengths(), tf.int32)  # [batch * n]
            body_start = title_start + title_len + 1  # [batch * n]
        else:
            body_start = title_start  # [batch * n]: no title read
        in_title = start < body_start  # [batch * n]
        offset = tf.where(in_title, title_start, body_start)  # [batch * n]
        text = self.corpus.span_text(flat_block, in_title, start - offset, end - offset)  # [batch * n]
        return tf.reshape(text, [batch, n]), block

    def get_config(self) -> dict[str, Any]:
        return {"reader_beam_size": self.reader_beam_size, "reader_seq_length": self.reader_seq_length,
                "block_seq_length": self.block_seq_length,
                "recompute_doc_embeddings": self.recompute_doc_embeddings,
                "reader_block_title": self.reader_block_title, "static_padding": self.static_padding,
                "name": self.name}


def normalize_answers(texts: tf.Tensor) -> tf.Tensor:
    """SQuAD's answer normalisation in the graph (``answer_normalization.normalize_answer``): lower case, ASCII
    punctuation removed, the articles a/an/the dropped as words, whitespace collapsed. ``string[...]`` in and out.
    (RE2's word boundary is ASCII-only where Python's is Unicode-aware; this only groups answers.)"""
    texts = tf.strings.lower(texts, encoding="utf-8")
    texts = tf.strings.regex_replace(texts, _PUNCTUATION, "")
    texts = tf.strings.regex_replace(texts, r"\b(a|an|the)\b", " ")
    texts = tf.strings.regex_replace(texts, r"\s+", " ")
    return tf.strings.strip(texts)


_PUNCTUATION = "[" + "".join("\\" + c for c in string.punctuation) + "]"


def body_windows(bodies: tf.RaggedTensor, windows: tf.Tensor) -> tf.RaggedTensor:
    """``bodies[i][start_i : start_i + count_i]`` for ``windows[i] = (start_i, count_i)`` (``int64[rows, 2]``),
    clipped to each row: ``int32[rows, (<= count)]``."""
    lengths = bodies.row_lengths()  # [rows]
    starts = tf.minimum(tf.maximum(windows[:, 0], 0), lengths)  # [rows]
    counts = tf.minimum(tf.maximum(windows[:, 1], 0), lengths - starts)  # [rows]
    first = bodies.row_starts() + starts  # [rows]: where each window starts in the flat values
    return tf.gather(bodies.values, tf.ragged.range(first, first + counts))  # [rows, (count)]


def _unpack(packed: dict[str, tf.Tensor]) -> tf.RaggedTensor:
    """``[CLS] x [SEP] [PAD]…`` → the wordpieces of x ``int32[batch, (len)]``."""
    lengths = tf.reduce_sum(tf.cast(packed["input_mask"], tf.int32), axis=-1) - 2  # [batch]
    return tf.RaggedTensor.from_tensor(packed["input_word_ids"][:, 1:], lengths=lengths)
