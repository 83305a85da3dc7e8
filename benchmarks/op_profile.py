"""The op types with the largest share of TensorFlow op time, from a profiler trace (issue #20).

``tf.profiler.experimental`` writes an XSpace (``*.xplane.pb``). On CPU each executed op is an event named
``"name:OpType"`` on an executor thread (``tf_Compute/…``) lasting the op's wall time; its intra-op work runs on
the Eigen/oneDNN pool while that event is open. Summing the events by op type gives the breakdown that
TensorBoard's op profile shows, without its plugin (which is not part of this project's stack). Ops run
concurrently on the inter-op threads, so the shares are of summed op time, not of wall time.
"""
from __future__ import annotations

import collections
import glob
import os
import tempfile
from typing import Callable


def op_breakdown(logdir: str, top: int = 12,
                 key: Callable[[str, str], str] | None = None) -> list[tuple[str, float, float]]:
    """``[(op type, milliseconds, share of all op time)]`` of the traces under ``logdir``, largest first.

    ``key(op name, op type)`` groups the events another way (default: by op type)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    totals: collections.Counter = collections.Counter()
    for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        for plane in space.planes:
            for line in plane.lines:
                if not line.name.startswith("tf_Compute"):
                    continue
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    if ":" in name and "::" not in name:  # "name:OpType", not "ExecutorState::Process"
                        op_name, op_type = name.rsplit(":", 1)
                        totals[key(op_name, op_type) if key else op_type] += event.duration_ps / 1e9
    whole = sum(totals.values()) or 1.0
    return [(op, ms, ms / whole) for op, ms in totals.most_common(top)]


def profile(fn: Callable[[], object], top: int = 12,
            key: Callable[[str, str], str] | None = None) -> list[tuple[str, float, float]]:
    """Runs ``fn`` under the profiler and returns :func:`op_breakdown` of what it ran."""
    import tensorflow as tf

    logdir = tempfile.mkdtemp(prefix="op_profile_")
    tf.profiler.experimental.start(logdir)
    try:
        fn()
    finally:
        tf.profiler.experimental.stop()
    return op_breakdown(logdir, top, key)


def format_breakdown(ops: list[tuple[str, float, float]], indent: str = "    ") -> str:
    return "\n".join(f"{indent}{op:32s} {ms:10.0f} ms  {100 * share:5.1f}%" for op, ms, share in ops)
