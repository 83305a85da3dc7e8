"""Gradient accumulation: one optimizer update from a replica's batch, read in micro-batches.

A paper's global batch (REALM pre-trains with 512 queries, Guu et al., 2020, App. A) may not fit on the devices
at hand. With ``gradient_accumulation_steps`` N, each replica's batch of b examples is read as N micro-batches of
b/N, one after another in a ``tf.while_loop`` inside the step (so inside its XLA program when ``jit_compile`` is
on): the activations held at once are those of b/N examples, and the gradients of the N parts are summed before
the one update. Each part's loss is averaged over the *global* batch (``tf.nn.compute_average_loss``), so the sum
is the gradient of the whole batch, and a run with N parts reaches the weights of a run with one, up to float
rounding, as long as no example's loss depends on the other examples of its batch (dropout masks differ; ICT's
in-batch negatives would be fewer, so ICT refuses accumulation).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

#: ``loss_fn(inputs) -> (per-example loss [b], per-example terms {name: [b, ...]})``.
LossFn = Callable[[Any], tuple[tf.Tensor, Any]]
#: Turns the loss into the one the tape differentiates (a ``LossScaleOptimizer``'s scaling), or None.
LossTransform = Callable[[tf.Tensor], tf.Tensor] | None


def gradients(loss_fn: LossFn, inputs: Any, variables: Sequence[tf.Variable], global_batch_size: int,
              steps: int = 1, transform: LossTransform = None) -> tuple[list[tf.Tensor | None], tf.Tensor, Any]:
    """The gradients of the batch's loss, read in ``steps`` micro-batches; returns ``(gradients, per_example,
    terms)``: one gradient per variable (None where the loss does not depend on it), and ``loss_fn``'s per-example
    outputs for the whole batch, in the batch's order. ``inputs`` is a nest of tensors whose first dimension is the
    batch."""
    if steps == 1:
        return _one(loss_fn, inputs, variables, global_batch_size, transform)
    parts = tf.nest.map_structure(lambda t: _split(t, steps), inputs)  # each [steps, b / steps, ...]
    grads, per_example, terms = _one(loss_fn, tf.nest.map_structure(lambda t: t[0], parts), variables,
                                     global_batch_size, transform)
    live = [i for i, g in enumerate(grads) if g is not None]  # a variable without a gradient keeps none
    outputs = tf.nest.flatten((per_example, terms))
    micro = per_example.shape[0]
    for t in outputs:  # a dimension known only when the batch runs (None) may be any
        if t.shape.rank == 0 or None not in (micro, t.shape[0]) and t.shape[0] != micro:
            raise ValueError(f"gradient accumulation reads the batch in parts, so every output of the loss must be "
                             f"per example (first dimension {micro}); got one of shape {t.shape}")
    arrays = [tf.TensorArray(t.dtype, size=steps, element_shape=tf.TensorShape([micro]).concatenate(t.shape[1:]))
              .write(0, t) for t in outputs]

    def body(i: tf.Tensor, sums: list[tf.Tensor], arrays: list[tf.TensorArray]) -> tuple[Any, ...]:
        part = tf.nest.map_structure(lambda t: tf.gather(t, i), parts)  # [b / steps, ...]
        g, p, e = _one(loss_fn, part, variables, global_batch_size, transform)
        flat = tf.nest.flatten((p, e))
        return (i + 1, [s + _dense(g[j]) for s, j in zip(sums, live)],
                [a.write(i, t) for a, t in zip(arrays, flat)])

    _, sums, arrays = tf.while_loop(lambda i, *_: i < steps, body,
                                    (tf.constant(1), [_dense(grads[j]) for j in live], arrays))
    summed: list[tf.Tensor | None] = [None] * len(grads)
    for j, s in zip(live, sums):
        summed[j] = s
    stacked = [_merge(a.stack()) for a in arrays]  # [steps, b / steps, ...] -> [b, ...]
    per_example, terms = tf.nest.pack_sequence_as((per_example, terms), stacked)
    return summed, per_example, terms


def _one(loss_fn: LossFn, inputs: Any, variables: Sequence[tf.Variable], global_batch_size: int,
         transform: LossTransform) -> tuple[list[tf.Tensor | None], tf.Tensor, Any]:
    """One micro-batch: its loss averaged over the global batch, and its gradients."""
    with tf.GradientTape() as tape:
        per_example, terms = loss_fn(inputs)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
        if transform is not None:
            loss = transform(loss)
    return list(tape.gradient(loss, variables)), per_example, terms


def _split(t: tf.Tensor, steps: int) -> tf.Tensor:
    """``[b, ...] -> [steps, b / steps, ...]``: micro-batch i holds examples i·b/steps ... (i+1)·b/steps − 1."""
    t = tf.convert_to_tensor(t)
    batch = t.shape[0]
    if batch is not None and batch % steps:
        raise ValueError(f"gradient_accumulation_steps={steps} must divide each replica's batch, which holds "
                         f"{batch} examples (a tensor of shape {t.shape})")
    parts = tf.reshape(t, tf.concat([[steps, -1], tf.shape(t)[1:]], 0))
    parts.set_shape(tf.TensorShape([steps, None if batch is None else batch // steps]).concatenate(t.shape[1:]))
    return parts


def _merge(t: tf.Tensor) -> tf.Tensor:
    """``[steps, m, ...] -> [steps · m, ...]``."""
    merged = tf.reshape(t, tf.concat([[-1], tf.shape(t)[2:]], 0))
    first = None if t.shape[1] is None else t.shape[0] * t.shape[1]
    merged.set_shape(tf.TensorShape([first]).concatenate(t.shape[2:]))
    return merged


def _dense(g: tf.Tensor | tf.IndexedSlices) -> tf.Tensor:
    """A gradient as a dense tensor (an embedding's ``IndexedSlices`` cannot be summed in a loop)."""
    return tf.convert_to_tensor(g)
