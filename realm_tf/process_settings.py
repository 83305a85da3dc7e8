"""Process-wide CPU settings that ``realm-tf`` applies before TensorFlow allocates its first tensor.

TensorFlow's default CPU allocator hands every tensor to glibc's ``malloc``. Tensors above glibc's mmap threshold
(at most 32 MB) are mapped on allocation and unmapped on release, so each step of REALM pre-training (attention
probabilities of 4 questions × 8 blocks × 12 heads × 320² floats are 157 MB) touches fresh pages, each a page
fault in the kernel. TensorFlow's BFC allocator
(best-fit with coalescing, the one it uses on GPUs) keeps the regions it has mapped and reuses them, so pages are
faulted in once per process. The allocator does not change any value a kernel computes.

With ``model.compiled_inference`` BERT's inference pass is compiled by XLA, once per input shape and process.
``TF_XLA_FLAGS=--tf_xla_persistent_cache_directory`` keeps the compiled programs
on disk (keyed by the program, not by the weights), so the next process (the next ``embed-blocks`` of a refresh,
a restarted server, ``evaluate``) loads them instead of compiling again.

Every setting is a default: a variable already in the environment wins (``TF_CPU_ALLOCATOR_USE_BFC=false``
restores TensorFlow's default allocator; any ``TF_XLA_FLAGS`` replaces the cache flag).
"""
from __future__ import annotations

import os
from typing import MutableMapping

from realm_tf import library_logs

#: Where compiled XLA programs are kept between processes: ``$XDG_CACHE_HOME/realm_tf/xla``.
XLA_CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "realm_tf", "xla")
#: The cache is kept under this size (``REALM_TF_XLA_CACHE_MAX_MB``, default 2 GiB): each process start drops the
#: least recently used programs beyond it, so a cache keyed by program shape cannot grow without bound.
XLA_CACHE_MAX_BYTES = int(float(os.environ.get("REALM_TF_XLA_CACHE_MAX_MB", "2048")) * (1 << 20))

# TensorFlow reads these when it creates its CPU allocator (at the first tensor) and its XLA flags (at the first
# compiled function).
DEFAULTS: dict[str, str] = {
    "TF_CPU_ALLOCATOR_USE_BFC": "true",
    "TF_XLA_FLAGS": f"--tf_xla_persistent_cache_directory={XLA_CACHE_DIR}",
}


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Sets every :data:`DEFAULTS` entry that ``environ`` (default ``os.environ``) does not already have.

    Returns:
      The settings in force afterwards, ``{name: value}``, whoever set them.
    """
    environ = os.environ if environ is None else environ
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
    if environ["TF_XLA_FLAGS"] == DEFAULTS["TF_XLA_FLAGS"]:  # our cache (another one is its owner's to keep)
        bound_cache(XLA_CACHE_DIR, XLA_CACHE_MAX_BYTES)
    return {name: environ[name] for name in DEFAULTS}


def bound_cache(directory: str, max_bytes: int) -> list[str]:
    """Deletes the least recently used files under ``directory`` (by access or modification time, whichever is
    later) until the rest take at most ``max_bytes``; returns the paths deleted. Files that vanish meanwhile (a
    concurrent process pruning too) are skipped; a missing directory is an empty cache."""
    entries = []
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                continue
            entries.append((max(stat.st_atime, stat.st_mtime), stat.st_size, path))
    total = sum(size for _, size, _ in entries)
    removed = []
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            break
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        total -= size
        removed.append(path)
    return removed


def native_bfloat16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX), where ``mixed_bfloat16`` training
    (``core/precision``) is faster than float32; elsewhere oneDNN emulates it. False when ``cpuinfo`` cannot be
    read (not Linux). Reads no TensorFlow, so a parent process (``realm-tf demo``) can decide without loading it."""
    if not os.path.exists(cpuinfo):
        return False
    with open(cpuinfo, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False


def prepare_process(verbose: bool = False, find_devices: bool = True) -> None:
    """What ``realm-tf``, a Beam job's module and a stage's child process set up before their first tensor: the
    library's messages on stderr, :data:`DEFAULTS` (:func:`apply`), and a quiet start
    (``library_logs.quiet_known_noise``; ``verbose``: everything shown)."""
    library_logs.show_on_stderr()
    apply()
    library_logs.quiet_known_noise(verbose=verbose, find_devices=find_devices)
