"""SavedModel export of REALM's knowledge retriever, the artefact the asynchronous index refresh consumes.

In REALM (Guu et al., 2020, §3.4 "Asynchronous MIPS refreshes") the trainer periodically hands its current
Embed_doc to an index builder that re-embeds every block. Here that hand-over is a SavedModel with string
signatures, tokenization inside the graph (needs only TensorFlow + tensorflow_text to run):

* ``embed_query(text: string[B]) -> {"embedding": float32[B, dim]}``
* ``embed_block(title: string[B], text: string[B]) -> {"embedding": float32[B, dim]}``
* ``embed_query_ids(input_word_ids, input_mask, input_type_ids: int32[B, L]) -> {"embedding": float32[B, dim]}``:
  already packed queries, e.g. REALM's masked pre-training queries ``[CLS] x [SEP]`` (the trainer's input
  pipeline embeds them with the export that built the index it searches).
* ``embed_block_ids(input_word_ids, input_mask, input_type_ids: int32[B, block_seq_length])``: blocks packed
  outside the graph (``bert_tokenizer.join_bert_ids``, with the ``special_ids`` of ``export.json``) to one static
  length: no string op and no data-dependent shape, for an index build on an accelerator.

Each export goes to ``export_dir/<global_step>/`` atomically: written to a staging directory, ``export.json``
(step, time, config hash, embedding dim, vocab hash) written last, then renamed into place.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf

from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.index import index_publisher
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_retriever
from realm_tf.networks import bert_encoder

#: ``embed(packed query dict of int32[batch, len]) -> float32[batch, dim]``
QueryEmbedFn = Callable[[Mapping[str, tf.Tensor]], np.ndarray]


class RetrieverExportModule(tf.Module):
    """A tf.Module holding the tokenizer and both towers, with the two embedding signatures."""

    def __init__(self, retriever: knowledge_retriever.KnowledgeRetriever, tokenizer: bert_tokenizer.BertTokenizer,
                 query_seq_length: int, block_seq_length: int):
        super().__init__(name="realm_retriever")
        # The SavedModel tracks the towers' variables, not the Keras model: tracking a Keras model makes the
        # export trace and save every layer's call function as well, which nothing loads and which doubles
        # the export time (benchmarks/export_speed.py). ``retriever`` is bypassing tracking on purpose.
        self.retriever_variables = list(retriever.variables)
        object.__setattr__(self, "retriever", retriever)
        self.tokenizer = tokenizer
        self._query_seq_length = query_seq_length
        self._block_seq_length = block_seq_length

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")], autograph=False)
    def embed_query(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
        """Embed_input(x) for raw question / query strings ``[B]`` → ``[B, dim]``."""
        packed = self.tokenizer.pack_single(self.tokenizer(text), self._query_seq_length, pad_to_seq_length=False)
        return {"embedding": self.retriever.embed_queries(packed, training=False)}  # [B, dim]

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name=k) for k in bert_encoder.INPUT_KEYS],
                 autograph=False)
    def embed_query_ids(self, input_word_ids: tf.Tensor, input_mask: tf.Tensor,
                        input_type_ids: tf.Tensor) -> dict[str, tf.Tensor]:
        """Embed_input(x) for packed queries ``int32[B, L]`` (any L up to the model's positions) → ``[B, dim]``."""
        packed = {"input_word_ids": input_word_ids, "input_mask": input_mask, "input_type_ids": input_type_ids}
        return {"embedding": self.retriever.embed_queries(packed, training=False)}  # [B, dim]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="title"),
                                  tf.TensorSpec([None], tf.string, name="text")], autograph=False)
    def embed_block(self, title: tf.Tensor, text: tf.Tensor) -> dict[str, tf.Tensor]:
        """Embed_doc(z) for blocks ``[CLS] title [SEP] text [SEP]`` given as strings ``[B]`` → ``[B, dim]``."""
        packed = self.tokenizer.join_bert(self.tokenizer(title), self.tokenizer(text), self._block_seq_length,
                                          pad_to_seq_length=False)
        return {"embedding": self.retriever.embed_blocks(packed, training=False)}  # [B, dim]

    def embed_block_ids(self, input_word_ids: tf.Tensor, input_mask: tf.Tensor,
                        input_type_ids: tf.Tensor) -> dict[str, tf.Tensor]:
        """Embed_doc(z) for packed blocks ``int32[B, block_seq_length]`` (``bert_tokenizer.join_bert_ids``):
        integer ids of one static length, for an accelerator → ``[B, dim]``."""
        packed = {"input_word_ids": input_word_ids, "input_mask": input_mask, "input_type_ids": input_type_ids}
        return {"embedding": self.retriever.embed_blocks(packed, training=False)}  # [B, dim]

    def block_ids_function(self) -> Any:
        """:meth:`embed_block_ids` as a ``tf.function`` of the module's static block length (a signature)."""
        spec = [tf.TensorSpec([None, self._block_seq_length], tf.int32, name=k) for k in bert_encoder.INPUT_KEYS]
        if getattr(self, "_block_ids_function", None) is None:
            self._block_ids_function = tf.function(self.embed_block_ids, input_signature=spec, autograph=False)
        return self._block_ids_function


def _export_module(retriever: knowledge_retriever.KnowledgeRetriever, tokenizer: bert_tokenizer.BertTokenizer,
                   query_seq_length: int, block_seq_length: int) -> RetrieverExportModule:
    """The retriever's export module, built once per retriever, tokenizer and lengths: a trainer exports the same
    towers with the same tokenizer every few hundred steps, and the module's signatures, traced at the first save
    (seconds for each BERT tower), are reused by every later one (a SavedModel save reads the variables' current
    values)."""
    cached = getattr(retriever, "_realm_export_module", None)
    if (cached is None or cached.tokenizer is not tokenizer
            or (cached._query_seq_length, cached._block_seq_length) != (query_seq_length, block_seq_length)):
        cached = RetrieverExportModule(retriever, tokenizer, query_seq_length, block_seq_length)
        object.__setattr__(retriever, "_realm_export_module", cached)  # not a tracked attribute of the Keras model
    return cached


@functools.lru_cache(maxsize=4)
def _tokenizer(vocab_file: str, lower_case: bool) -> bert_tokenizer.BertTokenizer:
    """One tokenizer per vocabulary, so that exports which are not handed one still reuse the module (and its
    traced signatures) of :func:`_export_module`."""
    return bert_tokenizer.BertTokenizer(vocab_file, lower_case)


def export_retriever(retriever: knowledge_retriever.KnowledgeRetriever, cfg: config_lib.ExperimentConfig,
                     step: int, tokenizer: bert_tokenizer.BertTokenizer | None = None,
                     export_dir: str | None = None) -> str:
    """Writes ``<export_dir>/<step>/`` atomically and prunes old exports; returns the export path."""
    tokenizer = tokenizer or _tokenizer(cfg.model.vocab_file, cfg.model.lower_case)
    export_dir = export_dir or cfg.refresh.export_dir
    module = _export_module(retriever, tokenizer, cfg.model.query_seq_length, cfg.model.block_seq_length)
    final = os.path.join(export_dir, str(int(step)))
    start = time.time()
    # A re-export of the same step (e.g. after a resume) replaces it.
    with artifacts.staged(final, artifacts.RETRIEVER_EXPORT, replace=True) as staging:
        tf.saved_model.save(module, staging.path, signatures={
            "embed_query": module.embed_query, "embed_block": module.embed_block,
            "embed_query_ids": module.embed_query_ids, "embed_block_ids": module.block_ids_function(),
            "serving_default": module.embed_query})
        staging.metadata = {
            "step": int(step),
            "exported_at": time.time(),
            "config_hash": config_lib.config_hash(cfg),
            "embedding_dim": cfg.model.projection_size,
            "vocab_hash": tokenizer.vocab_hash,
            "query_seq_length": cfg.model.query_seq_length,
            "block_seq_length": cfg.model.block_seq_length,
            "special_ids": tokenizer.special_ids(),
            "export_seconds": round(time.time() - start, 3),
        }
    # An export stays while an index version built from it may still be served (the trainer's input pipeline
    # embeds queries with the export of the index version it searches), and while an index builder may still
    # be embedding it: every export newer than the newest published version. An index builder that falls
    # behind skips to the newest export, so the older unbuilt ones are then pruned.
    published = {index_publisher.export_step(meta) for meta in index_publisher.published_metadata(cfg.index.index_dir)}
    pending = [s for s in artifacts.complete_versions(export_dir, artifacts.RETRIEVER_EXPORT)
               if published and s > max(published)]
    in_use = {int(step), *published, *pending}
    artifacts.delete_old_versions(export_dir, artifacts.RETRIEVER_EXPORT, cfg.refresh.keep_exports, protect=in_use)
    return final


def list_exports(export_dir: str) -> list[int]:
    """Steps of the complete exports (numeric directory with export.json), oldest first."""
    return list(artifacts.complete_versions(export_dir, artifacts.RETRIEVER_EXPORT))


def read_export_metadata(export_path: str) -> dict[str, Any]:
    """The ``export.json`` of one export (FileNotFoundError naming the path if it is incomplete)."""
    return artifacts.read_marker(export_path, artifacts.RETRIEVER_EXPORT, "retriever export")


def find_export(version: int, metadata: Mapping[str, Any], export_dir: str | None = None) -> tuple[str, dict[str, Any]]:
    """``(path, export.json)`` of the export that built index ``version`` (``metadata``: its ``index.json``).

    The export is looked up where ``index.json`` says (``export_path``), then as ``<export_dir>/<step>``
    (``export_step``: an index version is numbered by its export's step, a corpus update keeps the export of
    the version it updated), so a run moved or started from another directory still finds it.
    """
    recorded = metadata.get("export_path")
    step = index_publisher.export_step({"version": version, **metadata})
    candidates = [p for p in (recorded, os.path.join(export_dir, str(step)) if export_dir else None) if p]
    if not candidates:
        raise errors.UserError(f"index version {version}: index.json names no export_path")
    path, export = None, None
    for candidate in candidates:
        try:
            export = read_export_metadata(candidate)
        except FileNotFoundError:
            continue
        if int(export.get("step", step)) == step:
            path = candidate
            break
    if path is None:
        raise errors.UserError(f"index version {version} was built from the export {' or '.join(candidates)}, "
                               f"which no longer exists (raise refresh.keep_exports)")
    assert export is not None
    return path, export


def load_query_embedder(version: int, metadata: Mapping[str, Any],
                        export_dir: str | None = None) -> tuple[QueryEmbedFn, float]:
    """Embed_input of the export that built index ``version`` (its ``embed_query_ids``) and its export time
    (the export found by :func:`find_export`)."""
    path, export = find_export(version, metadata, export_dir)
    module = tf.saved_model.load(path)
    if "embed_query_ids" not in module.signatures:
        raise errors.UserError(f"{path}: the export has no embed_query_ids signature (re-export it with this "
                               f"version of realm_tf)")
    signature = module.signatures["embed_query_ids"]

    def embed(packed: Mapping[str, tf.Tensor]) -> np.ndarray:
        _ = module  # keeps the SavedModel's resources alive with the function
        return signature(**{k: packed[k] for k in bert_encoder.INPUT_KEYS})["embedding"].numpy()

    return embed, float(export["exported_at"])
