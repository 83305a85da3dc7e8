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

import os
import time
from typing import Any

import tensorflow as tf

from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.index import index_publisher
from realm_tf.models import open_qa_model
from realm_tf.tasks import open_qa


class OpenQaExportModule(tf.Module):
    """Holds the Open-QA model (with its corpus) and the tokenizer; defines the serving signatures."""

    def __init__(self, task: open_qa.OpenQaTask, model: open_qa_model.OpenQaModel):
        super().__init__(name="realm_open_qa")
        # Tracked: the variables, the corpus (titles, texts, embeddings, searcher) and the tokenizer; not the
        # Keras model, whose layer call functions would be traced and saved too (twice the export time).
        self.model_variables = list(model.variables)
        self.corpus = model.corpus
        object.__setattr__(self, "model", model)
        self.tokenizer = task.tokenizer
        self._task = task
        self._question_length = task.cfg.qa.question_seq_length
        self._block_length = task.cfg.model.block_seq_length

    def _tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        clean = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        return self.tokenizer(clean)  # [B, (len)]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="question")])
    def answer(self, question: tf.Tensor) -> dict[str, tf.Tensor]:
        """Answers ``question`` string[B] (see the module docstring for the outputs)."""
        ids = self._tokenize(question)  # [B, (len)]
        packed = self.tokenizer.pack_single(ids, self._question_length, pad_to_seq_length=False)
        outputs = self.model({"question_" + k: v for k, v in packed.items()}, training=False)
        decoded = self._task.decode(self.model, outputs)
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

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def embed_query(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
        """Embed_input(x) ``[B, dim]``."""
        packed = self.tokenizer.pack_single(self._tokenize(text), self._question_length, pad_to_seq_length=False)
        return {"embedding": self.model.retriever.embed_queries(packed, training=False)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="title"),
                                  tf.TensorSpec([None], tf.string, name="text")])
    def embed_block(self, title: tf.Tensor, text: tf.Tensor) -> dict[str, tf.Tensor]:
        """Embed_doc(z) ``[B, dim]`` of ``[CLS] title [SEP] text [SEP]``."""
        packed = self.tokenizer.join_bert(self._tokenize(title), self._tokenize(text), self._block_length,
                                          pad_to_seq_length=False)
        return {"embedding": self.model.retriever.embed_blocks(packed, training=False)}


def build_model(cfg: config_lib.ExperimentConfig, model_dir: str | None = None, index_dir: str | None = None,
                in_graph_scann: bool = True) -> tuple[open_qa.OpenQaTask, open_qa_model.OpenQaModel, dict[str, Any]]:
    """The fine-tuned Open-QA model (``finetune.model_dir``) over the newest index version, searching with
    ScaNN's TF op when that index is a ScaNN index (and ``in_graph_scann``)."""
    task = open_qa.OpenQaTask(cfg)
    corpus, _, meta = open_qa.load_corpus(cfg, task.tokenizer, index_dir)
    model = task.build_model(corpus)
    model_dir = model_dir or cfg.finetune.model_dir
    checkpoint = open_qa.load_finetuned(task, model, model_dir)
    searcher = "exact matmul"
    if in_graph_scann and meta.get("kind") == "scann":
        from realm_tf.index import in_graph_scann as scann_lib  # pylint: disable=import-outside-toplevel

        path = index_publisher.version_dir(index_dir or cfg.index.index_dir, meta["version"])
        corpus.use_searcher(scann_lib.InGraphScannSearcher(os.path.join(path, meta["searcher"])))
        searcher = "scann"
    return task, model, {"checkpoint": checkpoint or "", "index_version": meta["version"], "searcher": searcher}


def export_open_qa(cfg: config_lib.ExperimentConfig, out: str, model_dir: str | None = None,
                   index_dir: str | None = None) -> str:
    """Writes the serving SavedModel to ``out`` atomically (staging directory, ``realm_qa.json`` last)."""
    task, model, info = build_model(cfg, model_dir, index_dir)
    module = OpenQaExportModule(task, model)
    out = out.rstrip("/")
    if artifacts.is_complete(out, artifacts.OPEN_QA_EXPORT):
        raise errors.UserError(f"{out}: already holds an export; choose another --out or delete it")
    start = time.time()
    with artifacts.staged(out, artifacts.OPEN_QA_EXPORT) as staging:
        tf.saved_model.save(module, staging.path, signatures={
            "serving_default": module.answer, "embed_query": module.embed_query, "embed_block": module.embed_block})
        staging.metadata = {**info, "exported_at": time.time(), "config_hash": config_lib.config_hash(cfg),
                            "reader_beam_size": cfg.model.reader_beam_size, "vocab_hash": task.tokenizer.vocab_hash,
                            "export_seconds": round(time.time() - start, 3)}
    return out
