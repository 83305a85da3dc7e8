"""The suite's shuffled test order (``tests/conftest.py``), so that a test that passes only after another shows up.

The files go in a seeded random order, then the classes within a file, then the tests within a class. A file's
tests stay together, and so do a class's, so that module and class fixtures are built once. Then the end-to-end
runs (marked ``slow``, minutes each) go first, a stable sort: with two xdist workers (``--dist loadfile``) the long
files start at once and the many short ones fill in beside them, instead of one long run finishing alone."""
from __future__ import annotations

import random
from typing import Any, Sequence


def shuffled(items: Sequence[Any], seed: int | None) -> list[Any]:
    """``items`` (pytest items: ``nodeid``, ``cls``, ``get_closest_marker``) in the seed's order; with no seed, in
    the order given (the slow files still first)."""
    if seed is None:
        return sorted(items, key=lambda item: item.get_closest_marker("slow") is None)
    rng = random.Random(seed)
    files: dict[str, dict[Any, list[Any]]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], {}).setdefault(item.cls, []).append(item)
    groups = list(files.values())
    rng.shuffle(groups)
    order = []
    for classes in groups:
        members = list(classes.values())
        rng.shuffle(members)
        for tests in members:
            rng.shuffle(tests)
            order.extend(tests)
    order.sort(key=lambda item: item.get_closest_marker("slow") is None)
    return order
