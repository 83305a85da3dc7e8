"""Fits a new masked-LM head on a frozen reader before REALM pre-training (Guu et al., 2020, §3.2 and App. A).

REALM initialises its knowledge-augmented encoder from BERT, MLM head included. An import without one
(all-MiniLM-L6-v2 was distilled and then trained as a sentence embedder) leaves the head random, and
p(y|z,x) then scores every candidate z alike: the retriever's gradient (p(z|x,y) − p(z|x), §3.3) is noise,
and on a small batch it drifts the retriever away from its warm start before the reader can read.

This is the linear-probing stage of "linear probing then fine-tuning" (Kumar et al., 2022): with the reader
BERT frozen, only the head (transform, LayerNorm, output bias; the output embedding stays tied to the word
embeddings) is fitted on BERT's own masked-LM recipe over corpus blocks (Devlin et al., 2019: 15% of the
wordpieces; 80% of them become [MASK], 10% a random wordpiece, 10% stay). The 10% that stay teach the head to
decode the wordpiece a position carries, which is what copying an entity from a retrieved block needs. The
hidden states are computed once, so fitting costs one forward pass over the sample.
"""
from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np
import tensorflow as tf
import tf_keras
import tqdm

from realm_tf.data import block_store as block_store_lib
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_augmented_encoder

#: How BERT replaces a selected wordpiece: [MASK], a random wordpiece, or itself.
MASKED, RANDOM, KEPT = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class WarmupData:
    """Masked positions of a sample of blocks: the frozen reader's hidden states and what it must predict.

    ``hidden`` ``float32[n, hidden]``, ``targets`` ``int32[n]`` (the original wordpieces), ``kinds``
    ``int32[n]`` (MASKED / RANDOM / KEPT).
    """

    hidden: np.ndarray
    targets: np.ndarray
    kinds: np.ndarray


def bert_masking(word_ids: np.ndarray, maskable: np.ndarray, rng: np.random.Generator, mask_id: int,
                 vocab_size: int, mask_probability: float = 0.15) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """BERT's 80/10/10 masking of ``word_ids`` ``int32[batch, len]`` where ``maskable`` ``bool[batch, len]``.

    Returns the corrupted ids and ``(row, position, original id, kind)`` for every selected position (at
    least one per row with a maskable position).
    """
    corrupted = word_ids.copy()
    selected = []
    for row in range(word_ids.shape[0]):
        candidates = np.flatnonzero(maskable[row])
        if not candidates.size:
            continue
        count = max(1, int(round(mask_probability * candidates.size)))
        for position in rng.choice(candidates, size=count, replace=False):
            draw = rng.random()
            kind = MASKED if draw < 0.8 else RANDOM if draw < 0.9 else KEPT
            if kind == MASKED:
                corrupted[row, position] = mask_id
            elif kind == RANDOM:
                corrupted[row, position] = rng.integers(0, vocab_size)
            selected.append((row, int(position), int(word_ids[row, position]), kind))
    return corrupted, selected


def collect(model: knowledge_augmented_encoder.KnowledgeAugmentedEncoder, blocks: block_store_lib.BlockStore,
            tokenizer: bert_tokenizer.BertTokenizer, num_blocks: int, seq_length: int = 128,
            batch_size: int = 32, seed: int = 0) -> WarmupData:
    """Masks ``num_blocks`` random blocks (``[CLS] title [SEP] body [SEP]``) and runs the frozen reader BERT."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(len(blocks))[:num_blocks]
    encode = tf.function(lambda x: model.encoder(x, training=False)["sequence_output"], reduce_retracing=True,
                         autograph=False)
    hidden, targets, kinds = [], [], []
    special = np.asarray([tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id])
    for start in tqdm.trange(0, len(ids), batch_size, desc="mlm head warm-up: encode", unit="batch",
                             file=sys.stderr, mininterval=5.0):
        rows = ids[start:start + batch_size]
        packed = tokenizer.join_bert(
            tf.ragged.constant([blocks.title_ids(i).tolist() for i in rows], dtype=tf.int32, ragged_rank=1),
            tf.ragged.constant([blocks.body_ids(i).tolist() for i in rows], dtype=tf.int32, ragged_rank=1), seq_length)
        word_ids = packed["input_word_ids"].numpy()  # [batch, seq_length]
        maskable = ~np.isin(word_ids, special)  # [batch, seq_length]
        corrupted, selected = bert_masking(word_ids, maskable, rng, tokenizer.mask_id, tokenizer.vocab_size)
        sequence = encode({**packed, "input_word_ids": tf.constant(corrupted)}).numpy()  # [batch, len, hidden]
        hidden.append(np.stack([sequence[r, p] for r, p, _, _ in selected]))
        targets += [t for _, _, t, _ in selected]
        kinds += [k for _, _, _, k in selected]
    return WarmupData(np.concatenate(hidden).astype(np.float32), np.asarray(targets, np.int32),
                      np.asarray(kinds, np.int32))


def _probe(head: tf_keras.layers.Layer, hidden_size: int) -> tuple[tf_keras.layers.Layer, list[tf.Variable]]:
    """A copy of the MLM ``head`` outside any distribution strategy, sharing its tied embedding as a constant, and
    the head's own variables (all but the embedding) in the copy's order."""
    table = head.embedding_table
    head_vars = [v for v in head.weights if v is not table]
    probe = type(head)(embedding_table=tf.convert_to_tensor(table), activation="gelu", name="probe")
    probe(tf.zeros([1, 1, hidden_size]), masked_positions=tf.zeros([1, 1], tf.int32))
    if [v.shape for v in probe.weights] != [v.shape for v in head_vars]:
        raise ValueError(f"MLM head warm-up: the probe's weights {[v.name for v in probe.weights]} do not match "
                         f"the head's {[v.name for v in head_vars]}")
    for mine, theirs in zip(probe.weights, head_vars):
        mine.assign(theirs)
    return probe, head_vars


def warm_up_mlm_head(model: knowledge_augmented_encoder.KnowledgeAugmentedEncoder,
                     blocks: block_store_lib.BlockStore, tokenizer: bert_tokenizer.BertTokenizer, num_blocks: int,
                     epochs: int = 8, learning_rate: float = 1e-3, heldout_fraction: float = 0.1,
                     seed: int = 0) -> dict[str, float]:
    """Fits ``model.masked_lm`` (all but its tied embedding) with the reader BERT frozen; returns accuracies.

    The head is fitted on a copy outside any distribution strategy and copied back with ``assign``, so
    mirrored variables (MirroredStrategy, TPU) are updated on every replica. Returns the held-out accuracy
    before and after, overall and on the [MASK]ed and the kept positions (``heldout_accuracy``, ...).
    """
    start = time.time()
    data = collect(model, blocks, tokenizer, num_blocks, seed=seed)
    probe, head_vars = _probe(model.masked_lm, data.hidden.shape[1])
    n = len(data.targets)
    order = np.random.default_rng(seed + 1).permutation(n)
    cut = max(1, int(heldout_fraction * n))
    heldout, train = order[:cut], order[cut:]

    def logits(hidden: tf.Tensor) -> tf.Tensor:  # [n, hidden] -> [n, vocab]
        return probe(hidden[:, None, :], masked_positions=tf.zeros([tf.shape(hidden)[0], 1], tf.int32))[:, 0]

    def accuracy() -> dict[str, float]:
        predicted = np.concatenate([tf.argmax(logits(tf.constant(data.hidden[heldout[i:i + 2048]])), -1).numpy()
                                    for i in range(0, len(heldout), 2048)])
        right, kinds = predicted == data.targets[heldout], data.kinds[heldout]
        share = lambda rows: float(right[rows].mean()) if rows.any() else 0.0  # noqa: E731
        return {"all": share(np.ones_like(right)), "masked": share(kinds == MASKED), "kept": share(kinds == KEPT)}

    before = accuracy()
    optimizer = tf_keras.optimizers.Adam(learning_rate)

    @tf.function(autograph=False)
    def step(hidden: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(target, logits(hidden)))
        optimizer.apply_gradients(zip(tape.gradient(loss, probe.trainable_variables), probe.trainable_variables))
        return loss

    rng = np.random.default_rng(seed + 2)
    loss = float("nan")
    for _ in tqdm.trange(epochs, desc="mlm head warm-up: fit", unit="epoch", file=sys.stderr):
        shuffled = rng.permutation(train)
        for i in range(0, len(shuffled), 512):
            rows = shuffled[i:i + 512]
            loss = float(step(tf.constant(data.hidden[rows]), tf.constant(data.targets[rows])))
    after = accuracy()
    for mine, theirs in zip(probe.weights, head_vars):
        theirs.assign(mine)
    result = {"positions": float(n), "train_loss": loss, "seconds": time.time() - start}
    result.update({f"heldout_accuracy_{k}_before": v for k, v in before.items()})
    result.update({f"heldout_accuracy_{k}": v for k, v in after.items()})
    return result
