"""One trace per loop: ``tf.function``s over a dataset's batches, traced for the dataset's element spec.

Batches are padded to their own length (``data.static_padding=false``) and the last one may be short, so a
function traced for the first batch's shapes is traced again for the second (``reduce_retracing`` then relaxes
the shapes that differed). For BERT-sized forward/backward graphs each trace costs seconds to minutes; tracing
once, for the spec the dataset declares (``None`` where lengths vary), halves that and leaves the steady state
as it was: the relaxed graph is the one ``reduce_retracing`` ends up with.

The functions are traced without AutoGraph (``autograph=False``): the steps use ``tf.cond`` / ``tf.while_loop``
where they branch on tensors, and converting every Python function a BERT step calls (tf-models' layers included)
to AutoGraph's form would about double the time of a trace (``docs/performance.md``). A Python ``if``/``for`` on a
tensor then fails loudly at trace time, not silently.
The exports' signatures are traced the same way.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import tensorflow as tf


def trace_once(fn: Callable[..., Any], dataset: tf.data.Dataset | Iterable | None = None,
               arguments: Callable[[Any], list[Any]] = lambda spec: [spec]) -> Callable[..., Any]:
    """``fn`` as a ``tf.function`` of the batches of ``dataset``.

    A ``tf.data.Dataset``, its iterator or a ``tf.distribute`` distributed dataset has an ``element_spec``:
    the function is traced once, for the argument specs ``arguments(element_spec)`` (by default the whole
    element as one argument; ``lambda spec: list(spec)`` for ``fn(features, labels)``). Batches of any other
    iterable (lists of arrays, generators) fall back to ``reduce_retracing``: shapes that changed are relaxed
    after a retrace.
    """
    spec = getattr(dataset, "element_spec", None)
    if spec is None:
        return tf.function(fn, reduce_retracing=True, autograph=False)
    return tf.function(fn, input_signature=arguments(spec), autograph=False)
