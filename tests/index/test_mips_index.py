"""mips_index helpers: a memory map's pages leave the process's resident memory once a pass is done."""
import os

import numpy as np

from realm_tf.index import mips_index


def _resident_kib(path):
    """KiB of ``path``'s mappings resident in this process (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0]:  # a mapping's header line
                inside = fields[-1] == path
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_drop_pages_finds_the_map_behind_a_view_and_empties_it(tmp_path):
    path = str(tmp_path / "matrix.npy")
    np.save(path, np.random.default_rng(0).normal(size=[4096, 256]).astype(np.float32))  # 4 MiB
    mapped = np.load(path, mmap_mode="r")
    view = np.ascontiguousarray(mapped, dtype=np.float32)  # a plain ndarray view: no _mmap of its own
    assert not isinstance(view, np.memmap) and float(view.sum()) != 0.0  # every page read
    assert _resident_kib(os.path.realpath(path)) > 3000
    mips_index.drop_pages(view)
    assert _resident_kib(os.path.realpath(path)) < 100
    np.testing.assert_array_equal(view[-1], np.load(path)[-1])  # read again from the page cache
    mips_index.drop_pages(np.zeros([3]))  # not a map: nothing to do
