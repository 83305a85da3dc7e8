"""Rows of one tensor of a TensorFlow checkpoint, read from its files without loading the tensor.

A TF2/TF1 checkpoint is a *tensor bundle*: ``<prefix>.index``, a sorted string table (LevelDB's table format:
data blocks of prefix-compressed entries, an index block, a 48-byte footer) whose entry for each tensor name is a
``BundleEntryProto`` (dtype, shape, data shard, byte offset and size), and ``<prefix>.data-<i>-of-<n>``, the
tensors' bytes, little-endian and contiguous. TensorFlow's own reader (``RestoreV2``) reads a whole tensor even
when asked for a slice of it, and keeps it in the process: for REALM's ``block_emb`` (13,353,718 x 128 float32,
6.8 GB) every row slice would cost the whole matrix. Here the rows are memory-mapped from the data file.
"""
from __future__ import annotations

import os
import struct

import numpy as np
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import tensor_bundle_pb2

from realm_tf import errors

_MAGIC = 0xDB4775248B80FB57  # the table footer's last 8 bytes
_FOOTER = 48
_DTYPES = {types_pb2.DT_FLOAT: np.float32, types_pb2.DT_DOUBLE: np.float64, types_pb2.DT_INT32: np.int32,
           types_pb2.DT_INT64: np.int64, types_pb2.DT_HALF: np.float16}


class BundleFormatError(errors.UserError):
    """A checkpoint's files are not a tensor bundle this reader understands (the message names the file)."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def _block(data: bytes, offset: int, size: int, path: str) -> list[tuple[bytes, bytes]]:
    """The ``(key, value)`` entries of the table block at ``offset`` (``size`` bytes, then a 5-byte trailer whose
    first byte is the compression: only uncompressed blocks, which TensorFlow writes)."""
    if data[offset + size] != 0:
        raise BundleFormatError(f"{path}: a compressed table block (type {data[offset + size]})")
    block = data[offset:offset + size]
    (restarts,) = struct.unpack_from("<I", block, size - 4)
    end, pos, key, entries = size - 4 - 4 * restarts, 0, b"", []
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        entries.append((key, block[pos:pos + length]))
        pos += length
    return entries


def _lookup(prefix: str, keys: tuple[bytes, ...]) -> list[bytes | None]:
    """The values of ``keys`` in the table ``<prefix>.index`` (None: no such key), the file read once."""
    path = f"{prefix}.index"
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != _MAGIC:
        raise BundleFormatError(f"{path}: not a checkpoint index (no table footer)")
    pos = len(data) - _FOOTER
    for _ in range(2):  # the metaindex block's handle, then the index block's
        offset, pos = _varint(data, pos)
        size, pos = _varint(data, pos)
    index = _block(data, offset, size, path)  # one entry per data block: its last key, its handle
    values: list[bytes | None] = []
    for key in keys:
        handle = next((h for last_key, h in index if key <= last_key), None)
        if handle is None:
            values.append(None)
            continue
        block_offset, at = _varint(handle, 0)
        block_size, _ = _varint(handle, at)
        values.append(dict(_block(data, block_offset, block_size, path)).get(key))
    return values


def _entry_and_header(prefix: str, name: str) -> tuple[tensor_bundle_pb2.BundleEntryProto,
                                                       tensor_bundle_pb2.BundleHeaderProto]:
    """The index entry of tensor ``name`` (dtype, shape, shard, offset, size) and the bundle's header (KeyError: no
    such tensor)."""
    value, header = _lookup(prefix, (name.encode(), b""))  # the bundle's header is the entry of the empty key
    if value is None:
        raise KeyError(f"{prefix}: no tensor {name!r}")
    return (tensor_bundle_pb2.BundleEntryProto.FromString(value),
            tensor_bundle_pb2.BundleHeaderProto.FromString(header or b""))


def memory_map(prefix: str, name: str) -> np.ndarray:
    """Tensor ``name`` of the checkpoint ``prefix``, memory-mapped read-only from its data shard (nothing is read
    until its rows are used)."""
    entry, header = _entry_and_header(prefix, name)
    if entry.slices:
        raise BundleFormatError(f"{prefix}: {name!r} was saved in slices (a partitioned variable)")
    if header.endianness != tensor_bundle_pb2.BundleHeaderProto.LITTLE or entry.dtype not in _DTYPES:
        raise BundleFormatError(f"{prefix}: {name!r} is not a little-endian {sorted(_DTYPES)} tensor")
    shape = tuple(d.size for d in entry.shape.dim)
    dtype = np.dtype(_DTYPES[entry.dtype])
    if int(np.prod(shape)) * dtype.itemsize != entry.size:
        raise BundleFormatError(f"{prefix}: {name!r} is {entry.size} bytes, its shape {list(shape)} needs "
                                f"{int(np.prod(shape)) * dtype.itemsize}")
    data = f"{prefix}.data-{entry.shard_id:05d}-of-{max(header.num_shards, 1):05d}"
    if not os.path.exists(data):
        raise BundleFormatError(f"{data}: the data shard of {name!r} is missing")
    return np.memmap(data, dtype=dtype, mode="r", offset=entry.offset, shape=shape)
