"""SavedModel of the whole Open-QA system for TF Serving: a question string in, an answer with evidence out.

REALM's Open-QA model (Guu et al., 2020, §3.2, §4) in one graph: tokenization (tensorflow_text), Embed_input,
MIPS over the corpus (ScaNN's TF op when the index is ScaNN, else an exact matmul), join_BERT with the k
retrieved blocks, the span reader and span decoding. Signatures:

* ``serving_default(question: string[B])`` → ``answer`` string[B], ``score`` float[B] (probability of the
  answer among all spans of the k blocks), ``block_title`` / ``block_text`` string[B, k], ``block_score``
  float[B, k] (f(x, z)), ``block_id`` int[B, k];
* ``embed_query(text: string[B])`` and ``embed_block(title, text: string[B])`` → ``embedding`` [B, dim].

Requests are cleaned, not refused: invalid UTF-8 is replaced (U+FFFD), a question longer than
``qa.question_seq_length`` wordpieces is truncated to it, an empty question gets the answer "" with score 0,
and any batch size works (cost grows linearly: k readings per question). Loading needs ``tensorflow``,
``tensorflow_text`` and, for a ScaNN index, ``scann`` imported (its custom ops); nothing from realm_tf.
"""
from __future__ import annotations

import time
from typing import Any, Mapping

import tensorflow as tf

from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.models import open_qa_model


class OpenQaExportModule(tf.Module):
    """Holds the Open-QA model (with its corpus) and the tokenizer; defines the serving signatures."""

    def __init__(self, model: open_qa_model.OpenQaModel, cfg: config_lib.ExperimentConfig):
        super().__init__(name="realm_open_qa")
        # Tracked: the variables, the corpus (titles, texts, embeddings, searcher) and the tokenizer; not the
        # Keras model, whose layer call functions would be traced and saved too (twice the export time).
        self.model_variables = list(model.variables)
        self.corpus = model.corpus
        object.__setattr__(self, "model", model)
        self.tokenizer = model.tokenizer
        self._question_length = cfg.qa.question_seq_length
        self._block_length = cfg.model.block_seq_length
        self._retrieval_weight = cfg.qa.retrieval_score_weight

    def _tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        clean = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        return self.tokenizer(clean)  # [B, (len)]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="question")], autograph=False)
    def answer(self, question: tf.Tensor) -> dict[str, tf.Tensor]:
        """Answers ``question`` string[B] (see the module docstring for the outputs)."""
        ids = self._tokenize(question)  # [B, (len)]
        packed = self.tokenizer.pack_single(ids, self._question_length, pad_to_seq_length=False)
        outputs = self.model({"question_" + k: v for k, v in packed.items()}, training=False)
        decoded = self.model.decode(outputs, self._retrieval_weight)
        empty = tf.equal(ids.row_lengths(), 0)  # [B]
        block_ids = outputs["block_ids"]  # [B, k]
        return {
            "answer": tf.where(empty, tf.constant(""), decoded["answer"]),  # [B]
            "score": tf.where(empty, 0.0, decoded["score"]),  # [B]
            "block_id": block_ids,  # [B, k]
            "block_title": tf.gather(self.model.corpus.titles, block_ids),  # [B, k]
            "block_text": tf.gather(self.model.corpus.texts, block_ids),  # [B, k]
            "block_score": outputs["retrieval_logits"],  # [B, k]
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")], autograph=False)
    def embed_query(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
        """Embed_input(x) ``[B, dim]``."""
        packed = self.tokenizer.pack_single(self._tokenize(text), self._question_length, pad_to_seq_length=False)
        return {"embedding": self.model.retriever.embed_queries(packed, training=False)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="title"),
                                  tf.TensorSpec([None], tf.string, name="text")], autograph=False)
    def embed_block(self, title: tf.Tensor, text: tf.Tensor) -> dict[str, tf.Tensor]:
        """Embed_doc(z) ``[B, dim]`` of ``[CLS] title [SEP] text [SEP]``."""
        packed = self.tokenizer.join_bert(self._tokenize(title), self._tokenize(text), self._block_length,
                                          pad_to_seq_length=False)
        return {"embedding": self.model.retriever.embed_blocks(packed, training=False)}


def check_destination(out: str) -> str:
    """``out`` without a trailing slash; UserError when it already holds a complete export (check it before
    building the model: that takes a while)."""
    out = out.rstrip("/")
    if artifacts.is_complete(out, artifacts.OPEN_QA_EXPORT):
        raise errors.UserError(f"{out}: already holds an export; choose another --out or delete it")
    return out


def export_open_qa(cfg: config_lib.ExperimentConfig, model: open_qa_model.OpenQaModel, out: str,
                   info: Mapping[str, Any] | None = None) -> str:
    """Writes the serving SavedModel of ``model`` to ``out`` atomically (staging directory, ``realm_qa.json``
    last, with ``info``: e.g. the checkpoint and index version, from ``open_qa.load_for_serving``)."""
    module = OpenQaExportModule(model, cfg)
    out = check_destination(out)
    start = time.time()
    with artifacts.staged(out, artifacts.OPEN_QA_EXPORT) as staging:
        tf.saved_model.save(module, staging.path, signatures={
            "serving_default": module.answer, "embed_query": module.embed_query, "embed_block": module.embed_block})
        staging.metadata = {**(info or {}), "exported_at": time.time(), "config_hash": config_lib.config_hash(cfg),
                            "reader_beam_size": cfg.model.reader_beam_size, "vocab_hash": model.tokenizer.vocab_hash,
                            "export_seconds": round(time.time() - start, 3)}
    return out
