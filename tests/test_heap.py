"""``large_blocks_from_heap``: inside it a block glibc would map afresh comes from the heap and its pages
are kept for the next one; after it and the next ``trim_heap``, which gives the kept pages back, such a
block is a fresh mapping again. Process-wide and nestable across threads: on until the last user leaves.

Observed through glibc itself: ``mallinfo2().hblkhd`` is the bytes held in mapped blocks. Each scenario
runs in a fresh interpreter (this file as a script): in a process that has run other tests, a free
chunk left in the heap could serve the "fresh mapping" blocks below and hide what is measured.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
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


def mapped_bytes() -> int:
    return _mallinfo2()().hblkhd


def mapped_by_a_new_block() -> int:
    """Bytes of new mappings a 48 MiB tensor costs, made, touched and freed in this thread."""
    before = mapped_bytes()
    block = torch.ones(SIZE, dtype=torch.uint8)
    grown = mapped_bytes() - before
    del block
    return grown


def inside_from_the_heap_outside_a_fresh_mapping() -> None:
    assert mapped_by_a_new_block() >= SIZE
    with large_blocks_from_heap() as changed:
        assert changed
        assert mapped_by_a_new_block() == 0
        assert mapped_by_a_new_block() == 0  # the freed block is reused
    trim_heap()  # until then, a kept free block still serves the next request that fits
    assert mapped_by_a_new_block() >= SIZE


def kept_until_trimmed() -> None:
    trim_heap()
    with large_blocks_from_heap():
        block = torch.ones(SIZE, dtype=torch.uint8)
        held = resident_bytes()
        del block
        assert resident_bytes() > held - SIZE // 2  # kept for the next block
    trim_heap()
    assert resident_bytes() < held - SIZE // 2


def on_until_the_last_thread_leaves() -> None:
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


SCENARIOS = {
    scenario.__name__: scenario
    for scenario in (
        inside_from_the_heap_outside_a_fresh_mapping,
        kept_until_trimmed,
        on_until_the_last_thread_leaves,
    )
}


@pytest.mark.skipif(_mallinfo2() is None, reason="glibc >= 2.33 only (mallinfo2)")
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_large_blocks_from_heap(scenario):
    done = subprocess.run(
        [sys.executable, __file__, scenario], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    print("ok")
