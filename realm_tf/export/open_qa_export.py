"""SavedModel of the whole Open-QA system for TF Serving: a question string in, an answer with evidence out.

REALM's Open-QA model (Guu et al., 2020, §3.2, §4) in one graph: tokenization (tensorflow_text), Embed_input,
MIPS over the corpus (ScaNN's TF op when the index is ScaNN, else an exact matmul), join_BERT with the k
retrieved blocks, the span reader and span decoding. Signatures:

* ``serving_default(question: string[B])`` → ``answer`` string[B], ``score`` float[B] (probability of the
  answer among all spans of the k blocks), ``confidence`` float[B] (the probability that the answer is right,
  :mod:`realm_tf.models.answer_confidence`, with the calibrator of ``qa.confidence_calibrator``; without one,
  ``score``), ``candidate`` string[B] and ``abstained`` bool[B] (below), ``block_title`` / ``block_text``
  string[B, k], ``block_score`` float[B, k] (f(x, z)), ``block_id`` int[B, k];
* ``answer_selectively(question: string[B], min_confidence: float[B])``: the same outputs, with ``answer`` ""
  and ``abstained`` true where ``confidence`` < ``min_confidence`` (``candidate`` still holds the best answer).
  ``serving_default`` is this with ``min_confidence`` 0, so requests without a threshold keep their format;
* ``embed_query(text: string[B])`` and ``embed_block(title, text: string[B])`` → ``embedding`` [B, dim].

``assets.extra/tf_serving_warmup_requests`` holds ``qa.serving_warmup_requests`` questions about titles spread over
the corpus (one request each, then one batch of all), which TF Serving replays before a version takes traffic
(:mod:`realm_tf.export.serving_warmup`).

Requests are cleaned, not refused: invalid UTF-8 is replaced (U+FFFD), a question longer than
``qa.question_seq_length`` wordpieces is truncated to it, an empty question gets the answer "" with score 0,
and any batch size works (cost grows linearly: k readings per question). Loading needs ``tensorflow``,
``tensorflow_text`` and, for a ScaNN index, ``scann`` imported (its custom ops); nothing from realm_tf.

**Versions** (TF Serving's model base path): :func:`export_open_qa` to ``artifacts.next_version_dir(<base>)``
writes ``<base>/<n>/``, the version after the newest; TF Serving, :class:`~realm_tf.serving.answerer.Answerer` and
``realm-tf ask`` serve the newest complete one, and a version appears complete or not at all (staged,
``realm_qa.json`` last). REALM's knowledge
is its corpus (Guu et al., 2020, §1, §4), and every corpus tensor of the graph has an unknown number of rows,
so a corpus update (``realm-tf update-corpus``) needs no new model: :func:`publish_corpus_update` copies the
newest version's graph and weights and writes only the corpus variables anew (the blocks, their text and the
Embed_doc rows of the newest index version, with its ScaNN searcher), in the time of a copy.
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from typing import Any, Iterator, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.core.protobuf import trackable_object_graph_pb2

from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.data import block_records
from realm_tf.data import block_store
from realm_tf.data import corpus_versions
from realm_tf.data import knowledge_corpus
from realm_tf.export import serving_warmup
from realm_tf.index import in_graph_scann
from realm_tf.index import index_publisher
from realm_tf.layers import bert_tokenizer
from realm_tf.models import answer_confidence
from realm_tf.models import open_qa_model

logger = logging.getLogger(__name__)

SAVED_MODEL_PB = "saved_model.pb"
VARIABLES = "variables"
FINGERPRINT_PB = "fingerprint.pb"  # hashes of the original files: not valid for a copy, and optional
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
SELECTIVE_SIGNATURE = serving_warmup.SELECTIVE_SIGNATURE


class OpenQaExportModule(tf.Module):
    """Holds the Open-QA model (with its corpus) and the tokenizer; defines the serving signatures."""

    def __init__(self, model: open_qa_model.OpenQaModel, cfg: config_lib.ExperimentConfig,
                 calibration: Mapping[str, Any] | None = None):
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
        self._aggregate_spans = cfg.qa.answer_aggregation_spans
        self._length_bias = cfg.qa.span_length_bias
        self.calibrator = answer_confidence.AnswerCalibrator(name="confidence_calibrator")
        if calibration:  # unfitted: confidence is the span probability
            self.calibrator.set_parameters(calibration)

    def _tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        clean = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        return self.tokenizer(clean)  # [B, (len)]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="question")], autograph=False)
    def answer(self, question: tf.Tensor) -> dict[str, tf.Tensor]:
        """Answers ``question`` string[B] (see the module docstring for the outputs)."""
        return self._answer(question, tf.zeros(tf.shape(question), tf.float32))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="question"),
                                  tf.TensorSpec([None], tf.float32, name="min_confidence")], autograph=False)
    def answer_selectively(self, question: tf.Tensor, min_confidence: tf.Tensor) -> dict[str, tf.Tensor]:
        """Answers ``question`` string[B], abstaining where ``confidence`` < ``min_confidence`` float[B]."""
        return self._answer(question, min_confidence)

    def _answer(self, question: tf.Tensor, min_confidence: tf.Tensor) -> dict[str, tf.Tensor]:
        ids = self._tokenize(question)  # [B, (len)]
        packed = self.tokenizer.pack_single(ids, self._question_length, pad_to_seq_length=False)
        outputs = self.model({"question_" + k: v for k, v in packed.items()}, training=False)
        decoded = self.model.decode(outputs, self._retrieval_weight, self._aggregate_spans, self._length_bias)
        empty = tf.equal(ids.row_lengths(), 0)  # [B]
        block_ids = outputs["block_ids"]  # [B, k]
        titles, texts = self.model.corpus.title_and_text(block_ids)  # [B, k], [B, k]
        candidate = tf.where(empty, tf.constant(""), decoded["answer"])  # [B]
        confidence = tf.where(empty, 0.0, self.calibrator(decoded["features"]))  # [B]
        abstained = confidence < min_confidence  # [B]
        return {
            "answer": tf.where(abstained, tf.constant(""), candidate),  # [B]: "" where it abstains
            "candidate": candidate,  # [B]: the best answer, given or not
            "confidence": confidence,  # [B]
            "abstained": abstained,  # [B]
            "score": tf.where(empty, 0.0, decoded["score"]),  # [B]
            "block_id": block_ids,  # [B, k]
            "block_title": titles,  # [B, k]
            "block_text": texts,  # [B, k]
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
        raise errors.UserError(f"{out}: already holds an export; choose another --output or delete it")
    return out


def export_open_qa(cfg: config_lib.ExperimentConfig, model: open_qa_model.OpenQaModel, out: str,
                   info: Mapping[str, Any] | None = None, calibration: Mapping[str, Any] | None = None,
                   confidence: Mapping[str, Any] | None = None) -> str:
    """Writes the serving SavedModel of ``model`` to ``out`` atomically (staging directory, ``realm_qa.json``
    last, with ``info``: e.g. the checkpoint and index version, from ``open_qa.load_for_serving``).
    ``calibration``: the confidence calibrator's parameters (:meth:`AnswerCalibrator.set_parameters`), or None
    for the span probability; ``confidence``: what the marker records of it (its kind and where it was fitted).
    """
    module = OpenQaExportModule(model, cfg, calibration)
    out = check_destination(out)
    start = time.time()
    with artifacts.staged(out, artifacts.OPEN_QA_EXPORT) as staging:
        tf.saved_model.save(module, staging.path, signatures={
            "serving_default": module.answer, SELECTIVE_SIGNATURE: module.answer_selectively,
            "embed_query": module.embed_query, "embed_block": module.embed_block})
        titles = model.corpus.title_text(serving_warmup.spread(int(model.corpus.num_blocks),
                                                               cfg.qa.serving_warmup_requests)).numpy()
        if isinstance(model.corpus, block_records.RecordCorpus):  # shard 0 is the asset, the others go beside it
            model.corpus.copy_shards(os.path.join(staging.path, "assets"), move=True)
        questions = serving_warmup.warmup_questions([t.decode("utf-8", "replace") for t in titles],
                                                    cfg.qa.question_seq_length)
        if questions:
            serving_warmup.write_warmup_requests(staging.path, questions, extra={
                SELECTIVE_SIGNATURE: lambda batch: {"min_confidence": np.full(len(batch), 0.5, np.float32)}})
        staging.metadata = {**(info or {}), "exported_at": time.time(), "config_hash": config_lib.config_hash(cfg),
                            "reader_beam_size": cfg.model.reader_beam_size, "vocab_hash": model.tokenizer.vocab_hash,
                            "warmup_requests": len(serving_warmup.read_warmup_requests(staging.path)),
                            "confidence": dict(confidence or {"calibrator": "none"}),
                            "export_seconds": round(time.time() - start, 3)}
    return out


def newest_version(path: str) -> str:
    """``path`` when it is an export, else the newest complete version under it (a model base path)."""
    found = artifacts.newest_complete(path, artifacts.OPEN_QA_EXPORT)
    if found is None:
        raise errors.UserError(f"{path}: no complete Open-QA export (run `realm-tf export --base-path {path}`)")
    return found


def publish_corpus_update(cfg: config_lib.ExperimentConfig, base_path: str, index_dir: str | None = None,
                          blocks_dir: str | None = None, pause_before_commit: float = 0.0) -> str:
    """A new version under ``base_path``: the newest version's graph and weights over the corpus of the newest
    index version (its blocks, their text and Embed_doc rows, its ScaNN searcher). Returns its path.

    Nothing is traced or re-embedded: ``saved_model.pb`` and the assets are copied (ScaNN's resource renamed, so
    that both versions can be loaded in one process), and the variables checkpoint is rewritten with every
    model weight copied as it is and every corpus variable (all of unknown row count in the graph) taken from
    the new corpus. The new version is staged and appears complete or not at all; the previous one serves
    until then.

    Raises:
      UserError: no version under ``base_path``, no index, another vocabulary, or a corpus whose variables do
        not match the graph's (e.g. the served version searches with ScaNN and the index is brute force).
    """
    start = time.time()
    previous = newest_version(base_path)
    info = artifacts.read_marker(previous, artifacts.OPEN_QA_EXPORT, "Open-QA export")
    tokenizer = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, lower_case=cfg.model.lower_case)
    if info.get("vocab_hash") != tokenizer.vocab_hash:
        raise errors.UserError(f"{previous}: exported with vocabulary {info.get('vocab_hash')}, not model.vocab_file's "
                               f"({tokenizer.vocab_hash})")
    index_path, meta = index_publisher.newest_version(index_dir or cfg.index.index_dir, tokenizer.vocab_hash)
    corpus_version = index_publisher.corpus_version(meta)
    pattern = corpus_versions.blocks_pattern(blocks_dir or cfg.data.blocks_dir, corpus_version)
    if info.get("searcher") == "scann" and meta.get("kind") != "scann":
        raise errors.UserError(f"{previous} searches with ScaNN but {index_path} is a {meta.get('kind')} index")
    records = info.get("corpus_storage") == "records"  # the blocks read on demand from the version's assets
    out = artifacts.next_version_dir(base_path, artifacts.OPEN_QA_EXPORT)
    with artifacts.staged(out, artifacts.OPEN_QA_EXPORT, pause_before_commit=pause_before_commit) as staging:
        skip = (block_records.SHARD_PREFIX, block_records.EMBEDDING_PREFIX) if records else ()
        _copy_graph(previous, staging.path, skip=skip)
        scann = info.get("searcher") == "scann"
        if records:
            corpus = served_corpus(os.path.join(staging.path, "assets"), pattern, tokenizer, index_path, meta, scann)
        else:
            corpus = knowledge_corpus.KnowledgeCorpus(
                index_publisher.read_embeddings(index_path), block_store.BlockStore.load(pattern), tokenizer,
                searcher=in_graph_scann.InGraphScannSearcher(os.path.join(index_path, meta["searcher"])) if scann
                else None)
        num_blocks = int(corpus.num_blocks)
        with _corpus_checkpoint(corpus) as fresh:
            _write_variables(previous, fresh, staging.path)
        staging.metadata = {
            **info, "confidence": _carried_confidence(info.get("confidence"), corpus_version),
            "index_version": meta["version"], "corpus_version": corpus_version,
            "export_step": index_publisher.export_step(meta), "weights_from": previous, "exported_at": time.time(),
            "export_seconds": round(time.time() - start, 3)}
    logger.info("%s: version with the weights of %s and index version %d (corpus version %d, %d blocks) in %.1fs",
                out, previous, meta["version"], corpus_version, num_blocks, time.time() - start)
    return out


def _carried_confidence(confidence: Mapping[str, Any] | None, corpus_version: int) -> dict[str, Any]:
    """The marker's record of a calibrator carried into a corpus-only version: ``fitted_on_earlier_corpus`` when
    it was fitted over another corpus version than the new one (its features' distribution may have moved)."""
    record = dict(confidence or {"calibrator": "none"})
    if record.get("calibrator", "none") != "none":
        record["fitted_on_earlier_corpus"] = record.get("corpus_version") != corpus_version
    return record


def served_corpus(directory: str, pattern: str, tokenizer: bert_tokenizer.BertTokenizer, index_path: str,
                  meta: Mapping[str, Any], scann: bool) -> block_records.RecordCorpus:
    """A served model's corpus (``data/block_records``) whose shards are written into ``directory``: the blocks
    of ``pattern`` streamed into block records (read on demand), searched by ScaNN's in-graph op over the index
    version ``index_path`` (``meta``: its index.json) when ``scann``, which then holds the only copy of Embed_doc
    in memory (an int8-re-ordered searcher re-scores from Embed_doc rows written beside the records); otherwise
    exactly, over the float matrix held in memory."""
    index = block_records.stream_records(pattern, tokenizer, directory)
    if len(index.starts) != meta.get("num_blocks", len(index.starts)):
        raise errors.UserError(f"{index_path}: {meta['num_blocks']} embeddings but {len(index.starts)} blocks in "
                               f"{pattern}: the index was built from another corpus")
    records = block_records.BlockRecords(directory, index)
    if not scann:
        return block_records.RecordCorpus(records, embeddings=index_publisher.read_embeddings(index_path))
    searcher = in_graph_scann.InGraphScannSearcher(os.path.join(index_path, meta["searcher"]))
    rows = None
    if not searcher.exact_scores:
        embeddings = index_publisher.map_embeddings(index_path)  # [num_blocks, dim], paged from disk
        block_records.write_embedding_rows(embeddings, directory)
        rows = block_records.EmbeddingRows(directory, embeddings.shape[0], embeddings.shape[1])
    return block_records.RecordCorpus(records, searcher=searcher, rows=rows)


def _copy_graph(previous: str, staging: str, skip: tuple[str, ...] = ()) -> None:
    """Copies the SavedModel's graph and assets (not its variables, nor files whose names start with one of
    ``skip``), renaming its ScaNN searcher resources."""
    for parent, _, files in tf.io.gfile.walk(previous):
        rel = os.path.relpath(parent, previous)
        if rel.split(os.sep)[0] == VARIABLES:
            continue
        target = staging if rel == "." else os.path.join(staging, rel)
        tf.io.gfile.makedirs(target)
        for name in files:
            if rel == "." and name in (SAVED_MODEL_PB, FINGERPRINT_PB, artifacts.OPEN_QA_EXPORT):
                continue
            if skip and name.startswith(skip):
                continue
            tf.io.gfile.copy(os.path.join(parent, name), os.path.join(target, name), overwrite=True)
    saved_model = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(previous, SAVED_MODEL_PB), "rb") as f:
        saved_model.ParseFromString(f.read())
    renamed: dict[bytes, bytes] = {}
    for meta_graph in saved_model.meta_graphs:
        nodes = [*meta_graph.graph_def.node, *(n for fn in meta_graph.graph_def.library.function for n in fn.node_def)]
        for node in nodes:
            name = node.attr["shared_name"].s if "shared_name" in node.attr else b""
            if name.startswith(in_graph_scann.SHARED_NAME_PREFIX.encode()):
                node.attr["shared_name"].s = renamed.setdefault(name, in_graph_scann.fresh_shared_name().encode())
    with tf.io.gfile.GFile(os.path.join(staging, SAVED_MODEL_PB), "wb") as f:
        f.write(saved_model.SerializeToString())


@contextlib.contextmanager
def _corpus_checkpoint(corpus: knowledge_corpus.KnowledgeCorpus) -> Iterator[Any]:
    """The new corpus written as ``tf.train.Checkpoint(corpus=...)`` (the path the export module gives it),
    opened for reading."""
    with tempfile.TemporaryDirectory(prefix="realm-corpus-") as scratch:
        prefix = tf.train.Checkpoint(corpus=corpus).write(os.path.join(scratch, "corpus"))
        yield tf.train.load_checkpoint(prefix)


def _variable_keys(reader: Any, root_child: str) -> dict[str, str]:
    """``{path below root_child: checkpoint key}`` of every variable reachable from the root's ``root_child``."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
    start = [child.node_id for child in graph.nodes[0].children if child.local_name == root_child]
    keys: dict[str, str] = {}
    stack = [(node_id, "") for node_id in start]
    seen: set[int] = set()
    while stack:
        node_id, path = stack.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        for attribute in graph.nodes[node_id].attributes:
            if attribute.name == "VARIABLE_VALUE":
                keys[path] = attribute.checkpoint_key
        stack.extend((child.node_id, f"{path}/{child.local_name}" if path else child.local_name)
                     for child in graph.nodes[node_id].children)
    return keys


def _write_variables(previous: str, fresh: Any, staging: str) -> None:
    """``<staging>/variables/variables``: every tensor of the previous version's checkpoint, the corpus ones
    replaced by ``fresh``'s (same object graph, so the copied graph restores them)."""
    old = tf.train.load_checkpoint(os.path.join(previous, VARIABLES, VARIABLES))
    old_keys, new_keys = _variable_keys(old, "corpus"), _variable_keys(fresh, "corpus")
    if set(old_keys) != set(new_keys):
        raise errors.UserError(f"{previous}: its corpus variables {sorted(old_keys)} differ from the new corpus's "
                               f"{sorted(new_keys)}: export the model anew (realm-tf export --base-path)")
    replaced = {old_keys[path]: new_keys[path] for path in old_keys}
    names = sorted(old.get_variable_to_shape_map())
    tensors = [fresh.get_tensor(replaced[name]) if name in replaced else old.get_tensor(name) for name in names]
    tf.io.gfile.makedirs(os.path.join(staging, VARIABLES))
    tf.raw_ops.SaveV2(prefix=os.path.join(staging, VARIABLES, VARIABLES), tensor_names=names,
                      shape_and_slices=[""] * len(names), tensors=tensors)
