"""Sampling from RETRO with retrieval during generation (Borgeaud et al., 2021, §2.4 and Fig. 2: "retrieval ...
at every chunk": once a chunk of m tokens is complete, its neighbours are retrieved and condition the tokens of
the next chunk through the chunked cross-attention's causal shift).

The prompt's complete chunks are keyed with the frozen BERT and searched first; then tokens are produced one at a
time, and each time the text reaches a chunk boundary the chunk just completed is searched. The database is the
whole chunk database (a prompt belongs to no document, so nothing is excluded) unless ``database`` says
``train_only``. A baseline decoder (no RETRO layers) generates the same way without retrieving.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf.retro import retro_lm
from realm_tf.retro import retro_neighbours


@dataclasses.dataclass(frozen=True)
class GeneratedChunk:
    """One chunk of the output: its ``text``, whether it is (partly) ``prompt``, and the ``neighbours`` retrieved
    once it was complete (``(chunk_id, doc_id, text)``; they condition the next chunk)."""

    text: str
    prompt: bool
    neighbours: tuple[tuple[int, str, str], ...]


class RetroGenerator:
    """Greedy or sampled continuation of a prompt by a trained RETRO (or baseline) decoder.

    Args:
      task: the RETRO task (its chunk database, retriever and tokenizer).
      model: the trained decoder.
      database: ``all`` (default) or ``train_only`` (``retro_lm.DATABASES``'s training-documents restriction).
    """

    def __init__(self, task: retro_lm.RetroLmTask, model: tf_keras.Model, database: str = "all") -> None:
        self.task, self.model = task, model
        self.allowed = task.allowed_chunks("train_only") if database == "train_only" else None
        self.m = task.cfg.retro.chunk_length
        self.n = task.cfg.retro.sequence_length
        self.k = task.cfg.retro.num_neighbours
        self.r = task.cfg.retro.chunk_length + task.cfg.retro.continuation_length
        self.retrieval = bool(getattr(model, "retro_layers", ()))
        self._forward = tf.function(lambda features: model(features, training=False)["logits"],
                                    reduce_retracing=True, autograph=False)

    def generate(self, prompt: str, max_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 seed: int = 0) -> dict[str, Any]:
        """Continues ``prompt`` by up to ``max_tokens`` wordpieces (never past n, the decoder's context).

        ``temperature`` 0 picks the most likely token; otherwise tokens are sampled from softmax(logits / T),
        restricted to the ``top_k`` most likely if ``top_k`` > 0. Returns ``{"prompt", "text", "ids",
        "chunks": [GeneratedChunk]}``.
        """
        tokenizer = self.task.tokenizer
        ids = tokenizer(tf.constant([prompt])).to_list()[0][: self.n - 1]
        prompt_length = len(ids)
        if not ids:
            raise ValueError("the prompt has no wordpieces")
        rng = np.random.default_rng(seed)
        neighbour_ids = np.zeros([self.n // self.m, self.k, self.r], np.int32)  # [C, k, r]
        neighbour_mask = np.zeros([self.n // self.m, self.k, self.r], bool)
        found: dict[int, retro_neighbours.Neighbours] = {}
        for c in range(len(ids) // self.m):
            found[c] = self._retrieve(ids, c, neighbour_ids, neighbour_mask)
        while len(ids) - prompt_length < max_tokens and len(ids) < self.n:
            length = -(-len(ids) // self.m) * self.m  # padded to whole chunks (causal: padding is never seen)
            features = {"input_ids": np.array([ids + [tokenizer.pad_id] * (length - len(ids))], np.int32)}
            if self.retrieval:
                features["neighbour_ids"] = neighbour_ids[None, : length // self.m]
                features["neighbour_mask"] = neighbour_mask[None, : length // self.m]
            logits = self._forward(features).numpy()[0, len(ids) - 1].astype(np.float64)  # [V]
            ids.append(self._pick(logits, temperature, top_k, rng))
            if len(ids) % self.m == 0:
                found[len(ids) // self.m - 1] = self._retrieve(ids, len(ids) // self.m - 1, neighbour_ids,
                                                               neighbour_mask)
        chunks = []
        for c in range(-(-len(ids) // self.m)):
            piece = ids[c * self.m:(c + 1) * self.m]
            hits = found.get(c)
            neighbours = () if hits is None else tuple(
                (int(cid), self.task.store.doc_ids[cid], self._text(hits.tokens[j][hits.mask[j]]))
                for j, cid in enumerate(hits.chunk_ids.tolist()) if cid >= 0)
            chunks.append(GeneratedChunk(self._text(piece), c * self.m < prompt_length, neighbours))
        return {"prompt": prompt, "text": self._text(ids[prompt_length:]), "ids": ids, "chunks": chunks}

    def _retrieve(self, ids: list[int], chunk: int, neighbour_ids: np.ndarray,
                  neighbour_mask: np.ndarray) -> retro_neighbours.Neighbours | None:
        if not self.retrieval:
            return None
        tokens = np.array(ids[chunk * self.m:(chunk + 1) * self.m])  # [m]
        hits = self.task.retriever.neighbours(tokens, doc_id=None, exclude_own_document=False,
                                              pad_id=self.task.tokenizer.pad_id, allowed=self.allowed)
        neighbour_ids[chunk], neighbour_mask[chunk] = hits.tokens[0], hits.mask[0]
        return retro_neighbours.Neighbours(hits.chunk_ids[0], hits.tokens[0], hits.mask[0])

    @staticmethod
    def _pick(logits: np.ndarray, temperature: float, top_k: int, rng: np.random.Generator) -> int:
        if temperature <= 0:
            return int(np.argmax(logits))
        if top_k > 0:
            logits = np.where(logits >= np.sort(logits)[-top_k], logits, -np.inf)
        p = np.exp((logits - logits.max()) / temperature)
        return int(rng.choice(logits.size, p=p / p.sum()))

    def _text(self, ids: Any) -> str:
        ids = [int(i) for i in ids]
        if not ids:
            return ""
        return self.task.tokenizer.detokenize(tf.ragged.constant([ids], dtype=tf.int32)).numpy()[0].decode("utf-8")


def format_generation(result: dict[str, Any], width: int = 160) -> str:
    """The output chunk by chunk, each followed by the neighbours retrieved after it (which condition the next)."""
    lines = [f"prompt: {result['prompt']}", f"continuation: {result['text']}"]
    for c, chunk in enumerate(result["chunks"]):
        lines.append(f"chunk {c}{' (prompt)' if chunk.prompt else ''}: {chunk.text}")
        for chunk_id, doc_id, text in chunk.neighbours:
            shown = text if len(text) <= width else text[:width - 3] + "..."
            lines.append(f"    neighbour {chunk_id} (doc {doc_id}) -> conditions chunk {c + 1}: {shown}")
    return "\n".join(lines)
