"""Stages of a long job: Python calls named by where they live, each stage run in a child process of its own.

A job of many steps (``realm-tf demo``: preprocess, pre-train, fine-tune, export, ...) holds one step's memory at a
time when each step runs in a fresh process: TensorFlow's BFC allocator keeps every region a process once mapped, so
steps run in one process hold the sum of their peaks, and in children only the largest. Light stages that follow each
other may share a child (:attr:`Stage.process`), which then starts TensorFlow once for all of them. A :class:`Call`
names its function by module and attribute (``"realm_tf.tasks.open_qa:finetune"``) and carries keyword arguments, so
the process that plans the job never imports TensorFlow or the function's module; the child calls the same function
that the command line and the tests call.
"""
from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import operator
import sys
from concurrent import futures
from typing import Any, Callable, Mapping

import numpy as np

from realm_tf import process_settings


@dataclasses.dataclass(frozen=True)
class Call:
    """``target(**kwargs)``, with ``target`` named ``"package.module:attribute[.attribute]"``.

    ``report`` (optional, named the same way) turns the call's result into the text printed after it, in the
    process that ran it (the result itself may hold what cannot leave that process, such as a Keras model).
    ``starts_tensorflow``: the call runs TensorFlow, which its child process then starts quietly before the call
    (:func:`process_settings.prepare_process`); False for a call that never does, whose child then does not pay
    TensorFlow's import.
    """

    target: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    report: str | None = None
    starts_tensorflow: bool = True

    def __post_init__(self) -> None:
        for name in (self.target, self.report):
            if name is not None and not _split(name)[1]:
                raise ValueError(f"{name!r}: a call target is 'package.module:function' (or ':object.method')")

    def __str__(self) -> str:
        return f"{self.target}({', '.join(sorted(self.kwargs))})"


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of a job: its ``name``, a line on ``what`` it does, and its calls, run in order (the stage's result
    is the last call's). ``process``: stages next to each other with the same non-empty name run in one child
    process (:class:`ChildProcesses`); an empty name, a child of the stage's own."""

    name: str
    what: str
    calls: tuple[Call, ...]
    process: str = ""


def _split(name: str) -> tuple[str, str]:
    module, _, attribute = name.partition(":")
    return module, attribute if module else ""


def resolve(name: str) -> Callable[..., Any]:
    """The function ``"package.module:attribute[.attribute]"`` names (its module imported)."""
    module, attribute = _split(name)
    return operator.attrgetter(attribute)(importlib.import_module(module))


def plain(value: Any) -> Any:
    """``value`` as data that crosses a process boundary: mappings, lists and tuples of strings, numbers, booleans
    and None (numpy scalars as Python numbers); anything else in them (a Keras model in a training result) is left
    out."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items() if _is_data(item)}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value if _is_data(item)]
    return value if _is_data(value) else None


def _is_data(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None), np.generic, Mapping, list, tuple))


def call_here(call: Call) -> Any:
    """Runs ``call`` in this process; prints its report, and returns its result as :func:`plain` data."""
    result = resolve(call.target)(**call.kwargs)
    if call.report:
        print(resolve(call.report)(result), flush=True)
    return plain(result)


def call_in_child(call: Call, verbose: bool = False) -> Any:
    """Runs ``call`` in a fresh child process (``spawn``: no state of this one is inherited) and returns its
    :func:`plain` result; the child's output goes to ours, and what it raises is raised here.

    Raises:
      concurrent.futures.process.BrokenProcessPool: the child died without a result (killed, out of memory).
    """
    return run_stage(Stage(call.target, "", (call,)), verbose=verbose)


class ChildProcesses:
    """Runs stages one after another, each in a child process (``spawn``: no state of this one is inherited), a
    stage that shares its :attr:`Stage.process` with the stage before it in that stage's child (unless it runs
    TensorFlow and that child has not started it); or all of them in this process (``in_children=False``). A
    context manager: the last child ends with it.

        with stages.ChildProcesses() as children:
            for stage in plan:
                result = children.run(stage)
    """

    def __init__(self, in_children: bool = True, verbose: bool = False) -> None:
        self.in_children = in_children
        self.verbose = verbose
        self._pool: futures.ProcessPoolExecutor | None = None
        self._process, self._tensorflow = "", False

    def __enter__(self) -> "ChildProcesses":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Ends the current child (it holds the memory of the stages it ran)."""
        if self._pool is not None:
            self._pool.shutdown()
        self._pool, self._process, self._tensorflow = None, "", False

    def run(self, stage: Stage) -> Any:
        """Runs the calls of ``stage`` in order and returns the last call's result.

        Raises:
          concurrent.futures.process.BrokenProcessPool: the child died without a result (killed, out of memory).
        """
        if not self.in_children:
            result = None
            for call in stage.calls:
                result = call_here(call)
            return result
        tensorflow = any(call.starts_tensorflow for call in stage.calls)
        if (self._pool is None or not stage.process or stage.process != self._process
                or (tensorflow and not self._tensorflow)):  # a child that did not start TensorFlow quietly
            self.close()
            sys.stdout.flush()
            sys.stderr.flush()
            self._pool = futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                initializer=process_settings.prepare_process, initargs=(self.verbose, tensorflow))
            self._process, self._tensorflow = stage.process, tensorflow
        result = None
        for call in stage.calls:
            result = self._pool.submit(call_here, call).result()
        if not stage.process:
            self.close()
        return result


def run_stage(stage: Stage, in_children: bool = True, verbose: bool = False) -> Any:
    """Runs the calls of ``stage`` in order, all in one child process of its own (``in_children``: one start of
    TensorFlow a stage) or in this one; returns the last call's result.

    Raises:
      concurrent.futures.process.BrokenProcessPool: the child died without a result (killed, out of memory).
    """
    with ChildProcesses(in_children, verbose) as children:
        return children.run(stage)
