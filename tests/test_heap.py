"""``large_blocks_from_heap``: inside it a block glibc would map afresh comes from the heap and its pages
are kept for the next one; after it and the next ``trim_heap``, which gives the kept pages back, such a
block is a fresh mapping again. Process-wide and nestable across threads: on until the last user leaves.

Observed through glibc itself: ``mallinfo2().hblkhd`` is the bytes held in mapped blocks.
"""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch

from agentboost.memory import _libc, large_blocks_from_heap, resident_bytes, trim_heap

SIZE = 48 << 20
"""Over glibc's largest dynamic mapping threshold (32 MiB): always a fresh mapping by default."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


def _mallinfo2():
    library = _libc()
    if library is None or not hasattr(library, "mallinfo2"):
        return None
    library.mallinfo2.restype = _MallInfo2
    return library.mallinfo2


pytestmark = pytest.mark.skipif(_mallinfo2() is None, reason="glibc >= 2.33 only (mallinfo2)")


def mapped_bytes() -> int:
    return _mallinfo2()().hblkhd


def mapped_by_a_new_block() -> int:
    """Bytes of new mappings a 48 MiB tensor costs, made, touched and freed in this thread."""
    before = mapped_bytes()
    block = torch.ones(SIZE, dtype=torch.uint8)
    grown = mapped_bytes() - before
    del block
    return grown


def test_a_large_block_comes_from_the_heap_inside_and_from_a_fresh_mapping_outside():
    assert mapped_by_a_new_block() >= SIZE
    with large_blocks_from_heap() as changed:
        assert changed
        assert mapped_by_a_new_block() == 0
        assert mapped_by_a_new_block() == 0  # the freed block is reused
    trim_heap()  # until then, a kept free block still serves the next request that fits
    assert mapped_by_a_new_block() >= SIZE


def test_the_freed_block_is_kept_until_the_heap_is_trimmed():
    trim_heap()
    with large_blocks_from_heap():
        block = torch.ones(SIZE, dtype=torch.uint8)
        held = resident_bytes()
        del block
        assert resident_bytes() > held - SIZE // 2  # kept for the next block
    trim_heap()
    assert resident_bytes() < held - SIZE // 2


def test_it_stays_on_until_the_last_thread_using_it_leaves():
    entered = [threading.Event() for _ in range(2)]
    leave = [threading.Event() for _ in range(2)]
    left = [threading.Event() for _ in range(2)]

    def user(index: int) -> None:
        with large_blocks_from_heap():
            entered[index].set()
            leave[index].wait(30)
        left[index].set()

    threads = [threading.Thread(target=user, args=(index,)) for index in range(2)]
    for thread, event in zip(threads, entered, strict=True):
        thread.start()
        assert event.wait(30)
    assert mapped_by_a_new_block() == 0
    leave[0].set()
    assert left[0].wait(30)
    assert mapped_by_a_new_block() == 0  # the second thread is still inside
    leave[1].set()
    assert left[1].wait(30)
    for thread in threads:
        thread.join(30)
    trim_heap()
    assert mapped_by_a_new_block() >= SIZE
