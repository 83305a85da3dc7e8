"""RETRO language modelling (Borgeaud et al., 2021): the decoder trained on sequences of the training documents,
each chunk conditioned on neighbours from the chunk database; the same task trains the baseline (no retrieval)
and RETRO-fits a trained baseline (§4.2: only the chunked cross-attention and the neighbour encoder train).

Sequences of n tokens are cut from the training documents' token streams (the chunk database's chunks of each
document, in order; ``retro/retro_sequences``); validation and test documents are held out by id. Neighbours
come from ``retro/retro_neighbours`` inside the input pipeline, with the sequence's own document excluded.
The loss is the next-token cross-entropy over the real tokens; ``logits[:, t]`` predicts token t + 1.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import time
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.core import base_task
from realm_tf.core import checkpoint_reading
from realm_tf.data import block_store as block_store_lib
from realm_tf.data import corpus_versions
from realm_tf.index import index_loader
from realm_tf.index import index_publisher
from realm_tf.index import mips_index
from realm_tf.layers import bert_tokenizer
from realm_tf.retro import chunk_key_embedder
from realm_tf.retro import chunk_store as chunk_store_lib
from realm_tf.retro import retro_decoder
from realm_tf.retro import retro_neighbours
from realm_tf.retro import retro_sequences

logger = logging.getLogger(__name__)

#: Databases searched for neighbours (RETRO §4): ``train_only``, the chunks of every document outside the held-out
#: splits (the training documents and the ``database`` split's, ``retro_sequences.RETRIEVABLE``; used in training
#: and in the "no leakage" evaluation); ``all_but_own``, every chunk but those of the query's own document (held-out
#: documents' other paragraphs are then retrievable, as in the paper's Wikipedia setting).
DATABASES = ("train_only", "all_but_own")

#: The split of a database document withheld from every database (a copy of a document being scored).
WITHHELD = "withheld"

#: Variables RETRO-fitting trains (§4.2): the chunked cross-attention and the neighbour encoder.
RETRO_FIT_VARIABLES = ("cca", "neighbour_encoder")


def latest_checkpoint(model_dir: str) -> str | None:
    """The newest checkpoint of a ``train-retro`` run (``<model_dir>/checkpoints``), or of ``model_dir`` itself."""
    return (checkpoint_reading.newest_complete(f"{model_dir}/checkpoints")
            or checkpoint_reading.newest_complete(model_dir))


def own_neighbour_chunks(chunk_ids: np.ndarray, rate: float) -> np.ndarray:
    """bool ``[len(chunk_ids)]``: the chunks whose first neighbour is their own database entry
    (``retro.own_neighbour_rate``): a fraction ``rate`` of all chunk ids, chosen by a hash of the id (Knuth's
    multiplicative hash), so the same chunks in every process, epoch and split; -1 (padding) never."""
    chunk_ids = np.asarray(chunk_ids, np.int64)
    position = ((np.maximum(chunk_ids, 0).astype(np.uint64) * np.uint64(2654435761)) % np.uint64(2 ** 32)) / 2 ** 32
    return (chunk_ids >= 0) & (position < rate)


class RetroLmTask(base_task.Task):
    """The decoder, its input pipeline with neighbours, loss and metrics (trainer section ``retro_trainer``).

    Args:
      cfg: the experiment (``retro.*``; the chunk database in ``retro.chunks_dir`` / ``retro.index_dir``).
      retrieval: RETRO (True) or the baseline decoder (False: no neighbours are retrieved).
    """

    trainer_section = "retro_trainer"

    def __init__(self, cfg: config_lib.ExperimentConfig, retrieval: bool = True):
        super().__init__(cfg)
        self.retrieval = retrieval
        self._neighbour_tables: dict[tuple[str, str, bool, int], np.ndarray] = {}
        self._held_out_texts: dict[str, list[str]] = {}  # doc id -> its text, for documents held out from outside
        self._original_bytes: dict[int, np.ndarray] = {}  # chunk id -> int64 [its tokens]
        self._chunk_index: dict[str, np.ndarray] | None = None  # doc id -> its chunk ids, in order
        # [vocab]: UTF-8 bytes each wordpiece adds to the detokenised text (for bits-per-byte).
        self._byte_lengths = tf.constant(retro_sequences.token_byte_lengths(self.tokenizer.vocab), tf.float32)

    # ---- data -------------------------------------------------------------------------------------------------

    @functools.cached_property
    def store(self) -> chunk_store_lib.ChunkStore:
        return chunk_store_lib.ChunkStore.load(f"{self.cfg.retro.chunks_dir}/chunks-*")

    @functools.cached_property
    def chunk_index(self) -> tuple[int, mips_index.MipsIndex, dict[str, Any]]:
        """``(version, index, index.json metadata)``: the newest chunk index version, loaded once (it never goes
        stale: its BERT is frozen)."""
        return index_loader.IndexLoader(self.cfg.retro.index_dir, self.cfg.model.encoder.hidden_size,
                                        self.tokenizer.vocab_hash, kind=self.cfg.index.kind).current()

    def chunk_searcher_dir(self) -> str | None:
        """The newest chunk index version's ScaNN searcher directory (for ScaNN's TF op), None if not ScaNN."""
        version, _, meta = self.chunk_index
        if meta.get("kind") != "scann":
            return None
        return os.path.join(index_publisher.version_dir(self.cfg.retro.index_dir, version), meta["searcher"])

    @functools.cached_property
    def retriever(self) -> retro_neighbours.RetroNeighbourRetriever:
        """Neighbours from the newest chunk index version (keyed by the frozen BERT), with its key matrix."""
        embedder = chunk_key_embedder.build_chunk_key_embedder(self.cfg)
        version, index, _ = self.chunk_index
        if index.num_blocks != len(self.store):
            raise errors.UserError(f"{self.cfg.retro.index_dir}: the chunk index covers {index.num_blocks} chunks, "
                                   f"{self.cfg.retro.chunks_dir} holds {len(self.store)}: rebuild them together "
                                   "(realm-tf build-chunk-database)")
        keys = index_publisher.read_embeddings(
            index_publisher.version_dir(self.cfg.retro.index_dir, version))  # [num_chunks, hidden]
        return retro_neighbours.RetroNeighbourRetriever(self.cfg, self.store, index, embedder,
                                                        self.tokenizer.cls_id, self.tokenizer.sep_id, keys=keys)

    @functools.cached_property
    def chunk_splits(self) -> np.ndarray:
        """str ``[num_chunks]``: the split (``retro_sequences.SPLITS``) of each database chunk's document."""
        retro = self.cfg.retro
        by_doc = {d: retro_sequences.document_split(d, retro.validation_fraction, retro.test_fraction,
                                                    retro.training_document_fraction)
                  for d in set(self.store.doc_ids)}
        return np.array([by_doc[d] for d in self.store.doc_ids])

    def allowed_chunks(self, database: str) -> np.ndarray | None:
        """The database chunks a search may return (``DATABASES``): ``train_only`` the chunks outside the
        held-out splits (bool ``[num_chunks]``), ``all_but_own`` all (None; the own document is excluded per query) but
        those withheld by :meth:`hold_out_documents`."""
        if database not in DATABASES:
            raise errors.UserError(f"unknown database {database!r}: one of {', '.join(DATABASES)}")
        if database == "train_only":
            return np.isin(self.chunk_splits, retro_sequences.RETRIEVABLE)
        return self.chunk_splits != WITHHELD if (self.chunk_splits == WITHHELD).any() else None

    def hold_out_documents(self, documents: Sequence[tuple[str, Sequence[int]]],
                           texts: Sequence[str] | None = None) -> dict[str, Any]:
        """Makes ``documents`` (``(doc_id, token stream)``, text from outside the database; ``texts``: the text
        each stream was tokenized from, for :meth:`original_bytes`) the ``test`` split.

        Each is cut into chunks as the database is (``retro_chunks.chunk_document``) and keyed with the frozen
        BERT; the chunks join the store after the database's, where no search returns them. A database document
        with the same token stream as one of them is withheld from every database (counted and returned), so
        that no document is scored against its own copy; the database's own test documents move to
        ``validation``. Returns ``{"documents", "document_chunks", "withheld": [database doc ids]}``.
        """
        from realm_tf.retro import retro_chunks  # pylint: disable=import-outside-toplevel

        retro, store, retriever = self.cfg.retro, self.store, self.retriever
        streams: dict[bytes, list[str]] = {}
        for doc_id, chunk_ids in self._document_chunk_index.items():
            streams.setdefault(self._stream(chunk_ids).astype(np.int32).tobytes(), []).append(doc_id)
        withheld = sorted({d for _, tokens in documents
                           for d in streams.get(np.asarray(tokens, np.int32).tobytes(), [])})
        new_chunks = [chunk for doc_id, tokens in documents for chunk in retro_chunks.chunk_document(
            doc_id, [int(t) for t in tokens], retro.chunk_length, retro.continuation_length).chunks]
        keys = [retriever.keys]
        for start in range(0, len(new_chunks), 64):
            batch = [list(c.tokens) for c in new_chunks[start:start + 64]]
            keys.append(retriever.embedder(chunk_key_embedder.pack_chunks(
                batch, self.tokenizer.cls_id, self.tokenizer.sep_id)).numpy())  # [B, hidden]
        extended = store.extended([c.tokens for c in new_chunks], [c.continuation for c in new_chunks],
                                  [c.doc_id for c in new_chunks])
        splits = np.where(self.chunk_splits == "test", "validation", self.chunk_splits).astype(object)
        splits[np.isin(np.asarray(store.doc_ids, object), withheld)] = WITHHELD
        self.__dict__["chunk_splits"] = np.concatenate([splits, np.full(len(new_chunks), "test", object)]).astype(str)
        self.__dict__["store"] = extended
        self.__dict__["retriever"] = retro_neighbours.RetroNeighbourRetriever(
            self.cfg, extended, retriever.index, retriever.embedder, self.tokenizer.cls_id, self.tokenizer.sep_id,
            keys=np.concatenate(keys).astype(np.float32))
        self._neighbour_tables.clear()
        self._original_bytes.clear()
        self._chunk_index = None
        if texts is not None:
            self._held_out_texts.update((doc_id, [text]) for (doc_id, _), text in zip(documents, texts))
        return {"documents": len(documents), "document_chunks": len(new_chunks), "withheld": withheld}

    @functools.cached_property
    def document_texts(self) -> dict[str, list[str]]:
        """Document id → the texts of its blocks, in order: the text the chunk database's tokens were cut from
        (``data.blocks_dir``'s current corpus version, which ``build-chunk-database`` reads)."""
        blocks = block_store_lib.BlockStore.load(corpus_versions.current_pattern(self.cfg.data.blocks_dir))
        return {doc_id: [blocks.texts[b] for b in ids] for doc_id, ids in blocks.blocks_of_documents().items()}

    def original_bytes(self, chunk_id: int) -> np.ndarray:
        """int64 ``[tokens of the chunk]``: the UTF-8 bytes of the original text each of its tokens stands for
        (``retro_sequences.original_byte_lengths`` over its document's text), so that bits-per-byte counts the
        text as written, not its lower-cased, re-spaced wordpieces."""
        if chunk_id not in self._original_bytes:
            doc_id = self.store.doc_ids[chunk_id]
            chunk_ids = self._document_chunk_index[doc_id]
            texts = self._held_out_texts.get(doc_id) or self.document_texts.get(doc_id)
            if not texts:
                raise errors.UserError(f"document {doc_id!r} of the chunk database has no blocks in "
                                       f"{self.cfg.data.blocks_dir}: rebuild the chunk database from that corpus")
            ids, _, ends = bert_tokenizer.traced_tokenize_with_offsets(self.tokenizer)(tf.constant(texts))
            stream = np.concatenate([np.asarray(row, np.int64) for row in ids.to_list()])
            lengths = np.concatenate([retro_sequences.original_byte_lengths(row) for row in ends.to_list()])
            if not np.array_equal(stream, self._stream(chunk_ids)):
                raise errors.UserError(f"document {doc_id!r}: its text in {self.cfg.data.blocks_dir} does not "
                                       f"tokenize to the chunk database's tokens: rebuild the chunk database")
            start = 0
            for c in chunk_ids.tolist():
                size = len(self.store.tokens(c))
                self._original_bytes[c] = lengths[start:start + size]
                start += size
        return self._original_bytes[chunk_id]

    @property
    def _document_chunk_index(self) -> dict[str, np.ndarray]:
        """Document id → its chunk ids in order (built once per store; :meth:`hold_out_documents` resets it)."""
        if self._chunk_index is None:
            self._chunk_index = dict(self.document_chunks(None))
        return self._chunk_index

    def document_chunks(self, split: str | None) -> list[tuple[str, np.ndarray]]:
        """``(doc_id, int64 chunk ids in order)`` of the documents of ``split`` (``retro_sequences.SPLITS``; None:
        every document of the store)."""
        if split is not None and split not in retro_sequences.SPLITS:
            raise errors.UserError(f"unknown split {split!r}: one of {', '.join(retro_sequences.SPLITS)}")
        rows = np.arange(len(self.store)) if split is None else np.flatnonzero(self.chunk_splits == split)
        chunks: dict[str, list[int]] = {}
        for chunk_id in rows.tolist():  # ids run through a document in order
            chunks.setdefault(self.store.doc_ids[chunk_id], []).append(chunk_id)
        return [(doc_id, np.asarray(ids, np.int64)) for doc_id, ids in chunks.items()]

    def sequence_positions(self) -> np.ndarray:
        """int64 ``[num_chunks]``: each chunk's place in the sequence it is cut into (documents are cut into
        sequences of n/m chunks from their first chunk). Place 0 has no neighbours to read: the causal shift
        (RETRO §2.4) lets chunk u attend only the neighbours of chunk u − 1 of the same sequence."""
        per_sequence = self.cfg.retro.sequence_length // self.cfg.retro.chunk_length
        out = np.zeros(len(self.store), np.int64)
        for ids in self._document_chunk_index.values():
            out[ids] = np.arange(ids.size) % per_sequence
        return out

    def documents(self, split: str) -> list[tuple[str, np.ndarray]]:
        """``(doc_id, int32 token stream)`` of the documents of ``split`` (``retro_sequences.SPLITS``)."""
        return [(doc_id, self._stream(ids)) for doc_id, ids in self.document_chunks(split)]

    def _stream(self, chunk_ids: np.ndarray) -> np.ndarray:
        """int32 ``[T]``: the tokens of ``chunk_ids`` (a document's chunks, in order), one after the other."""
        return np.concatenate([self.store.tokens(c) for c in chunk_ids])

    def neighbour_table(self, split: str, database: str = "train_only", exclude_own_document: bool = True,
                        count: int | None = None) -> np.ndarray:
        """int64 ``[num_chunks, count]`` (default k): the neighbours of every chunk of ``split``'s documents
        (-1 elsewhere), searched once with the stored keys in ``database`` and kept for the run."""
        key = (split, database, exclude_own_document, count or self.cfg.retro.num_neighbours)
        if key not in self._neighbour_tables:
            started = time.perf_counter()
            chunk_ids = np.flatnonzero(self.chunk_splits == split)  # [C]
            table = np.full([len(self.store), key[3]], -1, np.int64)  # [num_chunks, count]
            for start in range(0, chunk_ids.size, 4096):
                rows = chunk_ids[start:start + 4096]
                table[rows] = self.retriever.neighbours_of_chunks(
                    rows, exclude_own_document, allowed=self.allowed_chunks(database), count=key[3]).chunk_ids
            self._neighbour_tables[key] = table
            logger.info("neighbours of the %d %s chunks (database %s): %.1fs", chunk_ids.size, split, database,
                        time.perf_counter() - started)
        return self._neighbour_tables[key]

    def examples(self, split: str, exclude_own_document: bool = True, neighbours: bool | None = None,
                 database: str = "train_only") -> Iterator[dict[str, np.ndarray]]:
        """One dict per sequence of ``split``: ``input_ids`` / ``input_mask`` ``[n]``, ``targets`` /
        ``target_mask`` ``[n]`` (the next token), ``chunk_ids`` ``[n / m]`` (database chunk of each sequence
        chunk; -1: padding) and, for RETRO, ``neighbour_ids`` / ``neighbour_mask`` ``[n / m, k, r]`` from
        ``database``. ``neighbours`` False gives all-masked neighbours (RETRO "with retrieval off")."""
        retro = self.cfg.retro
        with_neighbours = self.retrieval if neighbours is None else neighbours
        pad = self.tokenizer.pad_id
        per_sequence = retro.sequence_length // retro.chunk_length
        table = self.neighbour_table(split, database, exclude_own_document) if self.retrieval and with_neighbours \
            else None
        for doc_id, chunk_ids in self.document_chunks(split):
            stream = self._stream(chunk_ids)
            ids, mask = retro_sequences.document_sequences(stream, retro.sequence_length, pad)  # [S, n] each
            padded = np.full([ids.shape[0] * per_sequence], -1, np.int64)
            padded[:chunk_ids.size] = chunk_ids
            for s in range(ids.shape[0]):
                sequence_chunks = padded[s * per_sequence:(s + 1) * per_sequence]  # [n / m]
                targets = np.concatenate([ids[s, 1:], [pad]]).astype(np.int32)  # [n]
                example = {"input_ids": ids[s], "input_mask": mask[s], "targets": targets,
                           "target_mask": np.concatenate([mask[s, 1:], [False]]), "chunk_ids": sequence_chunks}
                if self.retrieval:
                    chosen = np.where(sequence_chunks[:, None] >= 0, table[np.maximum(sequence_chunks, 0)], -1) \
                        if table is not None else np.full([per_sequence, retro.num_neighbours], -1, np.int64)
                    if table is not None and retro.own_neighbour_rate > 0:  # the positive control: controlled leakage
                        forced = own_neighbour_chunks(sequence_chunks, retro.own_neighbour_rate)  # [n / m]
                        chosen[forced, 0] = sequence_chunks[forced]
                    found = self.retriever.read(chosen, pad) if table is not None else None
                    example["neighbour_ids"], example["neighbour_mask"] = (
                        (found.tokens, found.mask) if found is not None else
                        self.store.values(chosen, retro.chunk_length + retro.continuation_length, pad))
                yield example

    def _signature(self) -> dict[str, tf.TensorSpec]:
        retro = self.cfg.retro
        n = retro.sequence_length
        spec = {"input_ids": tf.TensorSpec([n], tf.int32), "input_mask": tf.TensorSpec([n], tf.bool),
                "targets": tf.TensorSpec([n], tf.int32), "target_mask": tf.TensorSpec([n], tf.bool),
                "chunk_ids": tf.TensorSpec([n // retro.chunk_length], tf.int64)}
        if self.retrieval:
            shape = [n // retro.chunk_length, retro.num_neighbours, retro.chunk_length + retro.continuation_length]
            spec["neighbour_ids"] = tf.TensorSpec(shape, tf.int32)
            spec["neighbour_mask"] = tf.TensorSpec(shape, tf.bool)
        return spec

    def dataset(self, split: str, exclude_own_document: bool = True, neighbours: bool | None = None,
                repeat: bool = False, shuffle: bool = False, seed: int | None = None,
                batch_size: int | None = None, database: str = "train_only") -> tf.data.Dataset:
        """Batches of ``(features, labels)`` of ``split``; labels are ``targets``, ``target_mask``,
        ``input_mask`` and ``chunk_ids``."""
        if self.retrieval and neighbours is not False:
            self.neighbour_table(split, database, exclude_own_document)  # searched here, not in the first step
        ds = tf.data.Dataset.from_generator(
            lambda: self.examples(split, exclude_own_document, neighbours, database),
            output_signature=self._signature())
        if repeat:
            ds = ds.repeat()
        if shuffle:
            ds = ds.shuffle(self.cfg.data.shuffle_buffer, seed=seed)
        ds = ds.batch(batch_size or self.global_batch_size, drop_remainder=repeat)
        labels = ("targets", "target_mask", "input_mask", "chunk_ids")
        return ds.map(base_task.split_features(lambda k: k not in labels)).prefetch(2)

    resumes_exactly = True

    def build_inputs(self, input_context: tf.distribute.InputContext | None = None, seed: int | None = None,
                     start_step: int = 0, **options: Any) -> tf.data.Dataset:
        """Shuffled training batches, repeated; the order is a function of ``seed`` alone (the generator reads
        the documents in a fixed order), so a run resumed at ``start_step`` skips the batches it has trained on
        and sees the ones an uninterrupted run would."""
        batch_size = self.global_batch_size
        if input_context is not None:
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        ds = self.dataset("train", repeat=True, shuffle=True, seed=seed, batch_size=batch_size)
        if input_context is not None and input_context.num_input_pipelines > 1:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.skip(start_step)

    # ---- model, loss ------------------------------------------------------------------------------------------

    def build_model(self) -> retro_decoder.RetroDecoder:
        model = retro_decoder.build_retro_decoder(self.cfg, retrieval=self.retrieval)
        # Variables are made here, eagerly: not inside the first traced step, nor after a restore.
        model({k: tf.zeros(v.shape, v.dtype)[None] for k, v in self._signature().items()
               if k in ("input_ids", "neighbour_ids", "neighbour_mask")})
        source = self.cfg.retro.retro_fit_from
        if source:
            if not self.retrieval:
                raise errors.UserError("retro.retro_fit_from fits RETRO layers onto a baseline: train with retrieval")
            checkpoint = latest_checkpoint(source)
            if checkpoint is None:
                raise errors.UserError(f"retro.retro_fit_from={source}: no checkpoint of a baseline decoder there")
            status = checkpoint_reading.read(tf.train.Checkpoint(model=model), checkpoint)
            status.expect_partial()  # the checkpoint's optimizer slots and step are not wanted here
            try:
                status.assert_nontrivial_match()
            except AssertionError as e:
                raise errors.UserError(f"{checkpoint}: not a baseline decoder of this architecture: {e}") from e
            logger.info("retro-fitting from the baseline %s", checkpoint)
        return model

    def call_model(self, model: tf_keras.Model, features: Mapping[str, tf.Tensor],
                   training: bool) -> Mapping[str, tf.Tensor]:
        return model(dict(features), training=training)

    def build_losses(self, labels: Mapping[str, tf.Tensor],
                     outputs: Mapping[str, tf.Tensor]) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """Per-sequence mean next-token NLL ``[batch]``; terms ``nll_sum``, ``tokens``, ``bytes`` (UTF-8 bytes
        the targets add to the detokenised text), ``correct`` ``[batch]``."""
        logits = tf.cast(outputs["logits"], tf.float32)  # [batch, n, vocab]
        mask = tf.cast(labels["target_mask"], tf.float32)  # [batch, n]
        nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels["targets"], logits=logits)  # [b, n]
        nll_sum = tf.reduce_sum(nll * mask, axis=1)  # [batch]
        tokens = tf.reduce_sum(mask, axis=1)  # [batch]
        target_bytes = tf.gather(self._byte_lengths, labels["targets"])  # [batch, n]
        num_bytes = tf.reduce_sum(target_bytes * mask, axis=1)  # [batch]
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels["targets"]),
                                        tf.float32) * mask, axis=1)  # [batch]
        return nll_sum / tf.maximum(tokens, 1.0), {"nll_sum": nll_sum, "tokens": tokens, "bytes": num_bytes,
                                                   "correct": correct}

    def build_metrics(self, labels: Mapping[str, tf.Tensor], terms: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """``token_accuracy``, ``nll_per_token`` (nats) and ``bits_per_byte`` (RETRO §4: Σ NLL / (ln 2 · bytes))
        over the batch's real tokens, and ``tokens`` (their count; the loop turns it into ``tokens_per_second``)."""
        tokens = tf.maximum(tf.reduce_sum(terms["tokens"]), 1.0)
        num_bytes = tf.maximum(tf.reduce_sum(terms["bytes"]), 1.0)
        return {"token_accuracy": tf.reduce_sum(terms["correct"]) / tokens,
                "nll_per_token": tf.reduce_sum(terms["nll_sum"]) / tokens,
                "bits_per_byte": tf.reduce_sum(terms["nll_sum"]) / (math.log(2.0) * num_bytes),
                "tokens": tf.reduce_sum(terms["tokens"])}

    def trainable_variables(self, model: tf_keras.Model, **options: Any) -> Sequence[tf.Variable]:
        if self.cfg.retro.retro_fit_from:
            return [v for v in model.trainable_variables if any(p in v.name for p in RETRO_FIT_VARIABLES)]
        return model.trainable_variables
