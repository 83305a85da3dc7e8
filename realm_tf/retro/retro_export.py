"""SavedModel of a trained RETRO decoder (Borgeaud et al., 2021) or its baseline: scoring and generation, with the
retrieval inside the graph.

The export holds the decoder, and for RETRO also the frozen chunk-key BERT (§2.3), the chunk database's values
(each chunk and its continuation, r tokens) and the MIPS search over its keys (ScaNN's TF op when the chunk index
is a ScaNN index, else an exact matmul over the stored keys). It searches the whole database; nothing is
excluded (a request belongs to no document of it). Signatures:

* ``score(input_ids: int32[B, L])`` (+ ``neighbour_ids`` / ``neighbour_mask`` ``[B, L / m, k, r]`` for RETRO), L a
  multiple of m, at most n → ``log_probs`` float32 ``[B, L]``: log p(x_{t+1} | x_{<=t}, neighbours of the chunks
  complete by t) (0 at the last position);
* ``score_text(text: string[B])`` → ``nll`` float32 ``[B]`` (nats, over the wordpieces after the first),
  ``bytes`` ``[B]`` (the UTF-8 bytes those wordpieces add), ``bits_per_byte`` ``[B]`` and ``num_tokens`` int32
  ``[B]``; text past n wordpieces is cut (``num_tokens`` says how much was scored). RETRO retrieves for every
  complete chunk, as in training;
* ``retrieve(chunks: int32[C, m])`` (RETRO) → ``chunk_ids`` int32 ``[C, k]``, ``neighbour_ids`` int32 ``[C, k, r]``,
  ``neighbour_mask`` bool ``[C, k, r]``, ``doc_ids`` string ``[C, k]``;
* ``generate(prompt: string[], max_tokens: int32[], temperature: float32[], seed: int32[])`` → ``ids`` int32
  ``[(len)]`` (prompt then continuation), ``prompt_length``, ``text`` (the continuation) and, for RETRO,
  ``chunk_ids`` int32 ``[n / m, k]``: the neighbours retrieved after each complete chunk (-1: none), which
  conditioned the next chunk (§2.4). ``temperature`` 0 is greedy; otherwise tokens are sampled from
  softmax(logits / T) with a stateless seed, so a request is reproducible.

Loading needs ``tensorflow``, ``tensorflow_text`` and, for a ScaNN index, ``scann`` imported (its custom ops).
"""
from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.index import in_graph_scann
from realm_tf.layers import bert_tokenizer
from realm_tf.retro import chunk_store
from realm_tf.retro import retro_sequences


class RetroExportModule(tf.Module):
    """The decoder (and, for RETRO, the chunk database and its retriever) with the serving signatures.

    Args:
      cfg: the experiment (``retro.*``).
      model: the trained decoder (``lm_evaluation.restore_decoder``).
      tokenizer: the decoder's wordpiece tokenizer.
      store: RETRO's chunk database (None for a baseline decoder).
      embedder: the frozen chunk-key BERT that keyed ``store``.
      keys: float32 ``[num_chunks, hidden]``, the database keys (searched by an exact matmul unless ``scann_dir``).
      scann_dir: the chunk index version's ScaNN searcher directory, searched with ScaNN's TF op.
    """

    def __init__(self, cfg: config_lib.ExperimentConfig, model: tf_keras.Model,
                 tokenizer: bert_tokenizer.BertTokenizer, store: chunk_store.ChunkStore | None = None,
                 embedder: tf_keras.Model | None = None, keys: np.ndarray | None = None,
                 scann_dir: str | None = None) -> None:
        super().__init__(name="retro_lm")
        retro = cfg.retro
        # Tracked: variables, tokenizer, database; not the Keras models (their call graphs would be saved too).
        self.model_variables = list(model.variables)
        object.__setattr__(self, "model", model)
        self.tokenizer = tokenizer
        self.retrieval = bool(getattr(model, "retro_layers", ()))
        self._m, self._n, self._k = retro.chunk_length, retro.sequence_length, retro.num_neighbours
        self._r = retro.chunk_length + retro.continuation_length
        self._pad, self._cls, self._sep = tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id
        self.byte_lengths = tf.Variable(retro_sequences.token_byte_lengths(tokenizer.vocab).astype(np.float32),
                                        trainable=False, name="byte_lengths")  # [vocab]
        self.searcher_kind = "none"
        if self.retrieval:
            if store is None or embedder is None or (keys is None and scann_dir is None):
                raise ValueError("a RETRO export needs the chunk database, its embedder and its keys or searcher")
            self.embedder_variables = list(embedder.variables)
            object.__setattr__(self, "embedder", embedder)
            tokens, mask = store.values(np.arange(len(store)), self._r, self._pad)  # [N, r] each
            self.values = tf.Variable(tokens, trainable=False, name="neighbour_values")  # [N, r]
            self.value_mask = tf.Variable(mask, trainable=False, name="neighbour_value_mask")  # [N, r]
            self.doc_ids = tf.Variable(np.array(store.doc_ids, dtype=object), trainable=False, name="doc_ids")
            if scann_dir:
                self.searcher = in_graph_scann.InGraphScannSearcher(scann_dir)
                self.searcher_kind = "scann"
            else:
                self.keys = tf.Variable(keys, trainable=False, name="chunk_keys")  # [N, hidden]
                self.searcher_kind = "exact"

    # ---- pieces ---------------------------------------------------------------------------------------------

    def _log_probs(self, input_ids: tf.Tensor, neighbour_ids: tf.Tensor | None,
                   neighbour_mask: tf.Tensor | None) -> tf.Tensor:
        """``[B, L]``: log p of each next token (0 at the last position)."""
        features = {"input_ids": input_ids}
        if self.retrieval:
            features.update(neighbour_ids=neighbour_ids, neighbour_mask=neighbour_mask)
        logits = tf.cast(self.model(features, training=False)["logits"], tf.float32)  # [B, L, vocab]
        targets = tf.concat([input_ids[:, 1:], tf.fill([tf.shape(input_ids)[0], 1], self._pad)], 1)  # [B, L]
        picked = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)  # [B, L]
        not_last = tf.range(tf.shape(input_ids)[1]) < tf.shape(input_ids)[1] - 1  # [L]
        return tf.where(not_last[None, :], picked, 0.0)

    def _retrieve(self, chunks: tf.Tensor) -> dict[str, tf.Tensor]:
        """k neighbours of each chunk ``int32[C, m]`` (all real tokens): ids, values, masks, documents."""
        count = tf.shape(chunks)[0]
        word_ids = tf.concat([tf.fill([count, 1], self._cls), chunks, tf.fill([count, 1], self._sep)], 1)  # [C, m+2]
        keys = self.embedder({"input_word_ids": word_ids, "input_mask": tf.ones_like(word_ids),
                              "input_type_ids": tf.zeros_like(word_ids)})  # [C, hidden]
        if self.searcher_kind == "scann":
            _, chunk_ids = self.searcher.search(keys, self._k)  # [C, k]
        else:
            _, chunk_ids = tf.math.top_k(tf.matmul(keys, self.keys, transpose_b=True), k=self._k)  # [C, k]
        chunk_ids = tf.cast(chunk_ids, tf.int32)
        return {"chunk_ids": chunk_ids, "neighbour_ids": tf.gather(self.values, chunk_ids),  # [C, k, r]
                "neighbour_mask": tf.gather(self.value_mask, chunk_ids), "doc_ids": tf.gather(self.doc_ids, chunk_ids)}

    def _tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        clean = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        return self.tokenizer(clean)  # [B, (len)]

    # ---- signatures -----------------------------------------------------------------------------------------

    def score(self, input_ids: tf.Tensor, neighbour_ids: tf.Tensor | None = None,
              neighbour_mask: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
        return {"log_probs": self._log_probs(input_ids, neighbour_ids, neighbour_mask)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")], autograph=False)
    def score_text(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
        """Bits-per-byte of each text (see the module docstring)."""
        ids = self._tokenize(text)[:, :self._n]  # [B, (len <= n)]
        lengths = tf.cast(ids.row_lengths(), tf.int32)  # [B]
        padded_length = tf.maximum((tf.reduce_max(lengths) + self._m - 1) // self._m, 1) * self._m
        dense = tf.cast(ids.to_tensor(default_value=self._pad), tf.int32)  # [B, max len]
        dense = tf.pad(dense, [[0, 0], [0, padded_length - tf.shape(dense)[1]]], constant_values=self._pad)  # [B, L]
        batch, chunks = tf.shape(dense)[0], padded_length // self._m
        neighbour_ids = neighbour_mask = None
        if self.retrieval:
            found = self._retrieve(tf.reshape(dense, [-1, self._m]))  # [B * C, ...]
            complete = tf.range(chunks)[None, :] < (lengths // self._m)[:, None]  # [B, C]
            shape = [batch, chunks, self._k, self._r]
            neighbour_ids = tf.reshape(found["neighbour_ids"], shape)  # [B, C, k, r]
            neighbour_mask = tf.reshape(found["neighbour_mask"], shape) & complete[:, :, None, None]
        log_probs = self._log_probs(dense, neighbour_ids, neighbour_mask)  # [B, L]
        scored = tf.sequence_mask(lengths - 1, padded_length)  # [B, L]: position t predicts t + 1 < length
        nll = -tf.reduce_sum(tf.where(scored, log_probs, 0.0), axis=1)  # [B]
        target_bytes = tf.gather(self.byte_lengths, tf.concat([dense[:, 1:], tf.fill([batch, 1], self._pad)], 1))
        num_bytes = tf.reduce_sum(tf.where(scored, target_bytes, 0.0), axis=1)  # [B]
        return {"nll": nll, "bytes": num_bytes, "num_tokens": lengths,
                "bits_per_byte": nll / (float(np.log(2.0)) * tf.maximum(num_bytes, 1.0))}

    def retrieve(self, chunks: tf.Tensor) -> dict[str, tf.Tensor]:
        return self._retrieve(tf.cast(chunks, tf.int32))

    @tf.function(input_signature=[tf.TensorSpec([], tf.string, name="prompt"),
                                  tf.TensorSpec([], tf.int32, name="max_tokens"),
                                  tf.TensorSpec([], tf.float32, name="temperature"),
                                  tf.TensorSpec([], tf.int32, name="seed")], autograph=False)
    def generate(self, prompt: tf.Tensor, max_tokens: tf.Tensor, temperature: tf.Tensor,
                 seed: tf.Tensor) -> dict[str, tf.Tensor]:
        """Continues ``prompt`` (see the module docstring); retrieval after each completed chunk."""
        m, n, k, r = self._m, self._n, self._k, self._r
        ids = self._tokenize(prompt[None])[0][:n - 1]  # [(len)]
        prompt_length = tf.size(ids)
        buffer = tf.concat([tf.cast(ids, tf.int32), tf.fill([n - prompt_length], self._pad)], 0)  # [n]
        chunks = n // m
        neighbour_ids = tf.zeros([chunks, k, r], tf.int32)  # [C, k, r]
        neighbour_mask = tf.zeros([chunks, k, r], tf.bool)
        chosen = tf.fill([chunks, k], -1)  # [C, k]
        if self.retrieval:  # the prompt's complete chunks, at once
            found = self._retrieve(tf.reshape(buffer, [chunks, m]))
            complete = tf.range(chunks) < prompt_length // m  # [C]
            neighbour_ids = tf.where(complete[:, None, None], found["neighbour_ids"], neighbour_ids)
            neighbour_mask = complete[:, None, None] & found["neighbour_mask"]
            chosen = tf.where(complete[:, None], found["chunk_ids"], chosen)
        end = tf.minimum(prompt_length + tf.maximum(max_tokens, 0), n)
        end = tf.where(prompt_length > 0, end, 0)  # nothing to continue from an empty prompt

        def step(length, buffer, neighbour_ids, neighbour_mask, chosen):
            features = {"input_ids": buffer[None]}
            if self.retrieval:
                features.update(neighbour_ids=neighbour_ids[None], neighbour_mask=neighbour_mask[None])
            logits = tf.cast(self.model(features, training=False)["logits"][0, length - 1], tf.float32)  # [V]
            sampled = tf.random.stateless_categorical(logits[None] / tf.maximum(temperature, 1e-6), 1,
                                                      seed=tf.stack([seed, length]))[0, 0]
            token = tf.cast(tf.where(temperature > 0, sampled, tf.argmax(logits)), tf.int32)
            buffer = tf.tensor_scatter_nd_update(buffer, [[length]], [token])
            length += 1
            if self.retrieval:
                def fetch():
                    c = length // m - 1
                    found = self._retrieve(tf.reshape(buffer[c * m:(c + 1) * m], [1, m]))
                    return (tf.tensor_scatter_nd_update(neighbour_ids, [[c]], found["neighbour_ids"]),
                            tf.tensor_scatter_nd_update(neighbour_mask, [[c]], found["neighbour_mask"]),
                            tf.tensor_scatter_nd_update(chosen, [[c]], found["chunk_ids"]))

                neighbour_ids, neighbour_mask, chosen = tf.cond(
                    tf.equal(length % m, 0), fetch, lambda: (neighbour_ids, neighbour_mask, chosen))
            return length, buffer, neighbour_ids, neighbour_mask, chosen

        length, buffer, _, _, chosen = tf.while_loop(
            lambda length, *_: length < end, step, (prompt_length, buffer, neighbour_ids, neighbour_mask, chosen))
        continuation = buffer[prompt_length:length]  # [(len)]
        text = self.tokenizer.detokenize(tf.RaggedTensor.from_tensor(continuation[None]))[0]
        return {"ids": buffer[:length], "prompt_length": prompt_length, "text": text, "chunk_ids": chosen}


def check_destination(out: str) -> str:
    """``out`` without a trailing slash; UserError when it already holds a complete export (check it before
    building the export: reading the database takes a while)."""
    out = out.rstrip("/")
    if artifacts.is_complete(out, artifacts.RETRO_EXPORT):
        raise errors.UserError(f"{out}: already holds an export; choose another --output or delete it")
    return out


def export_retro(module: RetroExportModule, cfg: config_lib.ExperimentConfig, out: str,
                 info: Mapping[str, Any] | None = None) -> str:
    """Writes the SavedModel of ``module`` to ``out`` atomically (staging directory, ``retro_lm.json`` last, with
    ``info``, e.g. the checkpoint); UserError if ``out`` already holds an export."""
    out = check_destination(out)
    retro = cfg.retro
    n, m, k = retro.sequence_length, retro.chunk_length, retro.num_neighbours
    r = retro.chunk_length + retro.continuation_length
    ids_spec = tf.TensorSpec([None, None], tf.int32, name="input_ids")
    if module.retrieval:
        score = tf.function(module.score, input_signature=[
            ids_spec, tf.TensorSpec([None, None, k, r], tf.int32, name="neighbour_ids"),
            tf.TensorSpec([None, None, k, r], tf.bool, name="neighbour_mask")], autograph=False)
    else:
        score = tf.function(lambda input_ids: module.score(input_ids), input_signature=[ids_spec], autograph=False)
    signatures = {"serving_default": module.score_text, "score": score, "score_text": module.score_text,
                  "generate": module.generate}
    if module.retrieval:
        signatures["retrieve"] = tf.function(module.retrieve,
                                             input_signature=[tf.TensorSpec([None, m], tf.int32, name="chunks")],
                                             autograph=False)
    start = time.time()
    with artifacts.staged(out, artifacts.RETRO_EXPORT) as staging:
        tf.saved_model.save(module, staging.path, signatures=signatures)
        staging.metadata = {**(info or {}), "exported_at": time.time(), "config_hash": config_lib.config_hash(cfg),
                            "retrieval": module.retrieval, "searcher": module.searcher_kind,
                            "sequence_length": n, "chunk_length": m, "num_neighbours": k, "neighbour_length": r,
                            "vocab_hash": module.tokenizer.vocab_hash, "signatures": sorted(signatures),
                            "export_seconds": round(time.time() - start, 3)}
    return out
