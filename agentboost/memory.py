"""Give freed heap memory back to the operating system (glibc), so a process's RSS follows what it uses.

PyTorch's CPU allocator is the C library's ``malloc``. glibc keeps freed blocks in per-thread arenas and
returns them to the system only from the top of the heap, so after a large transient (a training
micro-batch's activations, a decoded batch's KV cache, a closed engine) the process can hold gigabytes
it no longer uses; the next transient then lands in a different arena and the peak grows. ``malloc_trim``
releases every free page of every arena. Elsewhere (macOS, musl) this is a no-op.

The opposite trade, for short spans that make and free many large blocks (a batched prefill), is
:func:`large_blocks_from_heap`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import threading
from collections.abc import Iterator

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameters (malloc.h)."""

LARGE_BLOCK_THRESHOLD = 1 << 30
"""Inside :func:`large_blocks_from_heap`: blocks under this come from the heap, and freed ones stay
there for the next, instead of being mapped and unmapped one by one."""

GLIBC_MMAP_THRESHOLD_MAX = 32 << 20
GLIBC_TRIM_THRESHOLD_MAX = 64 << 20
"""Where glibc's own dynamic thresholds end up (64-bit): the mapping threshold rises to the size of the
largest mapped block freed so far, up to 32 MiB, and the trim threshold to twice that. Restored by
:func:`large_blocks_from_heap` on its way out."""

_large_blocks_lock = threading.Lock()
_large_blocks_users = 0


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        library = ctypes.CDLL(name)
        library.malloc_trim  # noqa: B018  (glibc only)
    except (OSError, AttributeError):
        return None
    return library


def trim_heap() -> bool:
    """Return free heap pages to the system; True when something was released."""
    library = _libc()
    return bool(library.malloc_trim(0)) if library is not None else False


@contextlib.contextmanager
def large_blocks_from_heap() -> Iterator[bool]:
    """Serve large blocks from the heap, and keep freed ones there for reuse, while the block runs.

    glibc maps every block over its mapping threshold (at most 32 MiB) afresh with ``mmap`` and
    unmaps it on ``free``; each first touch of a freshly mapped page is a page fault that zeroes it.
    A batched prefill's activations are that size (16 rows x 400 tokens x 1,536 fp32 features are 39
    MB), made and freed several times a layer. Measured on this project's 2-core machine: filling a
    fresh 39 MB tensor 9.3 -> 1.5 ms, ``silu(gate) * up`` at that size 24.6 -> 9.4 ms, and SmolLM2-135M's
    prefill of 16 x 400 ids 7.0 -> 5.5 s (docs/engines.md). Inside this block those blocks come from
    the heap and are reused; what that costs is the freed blocks' pages, kept until the next
    :func:`trim_heap` (the engine trims at its next decode step).

    Yields False off glibc (nothing is changed there), True otherwise. Process-wide (``mallopt`` has no
    per-thread setting) and nestable across threads: the first entry raises both thresholds, the
    last exit sets them to where glibc's dynamic thresholds end up (``GLIBC_*_THRESHOLD_MAX``).
    """
    global _large_blocks_users
    library = _libc()
    if library is None or not hasattr(library, "mallopt"):
        yield False
        return
    with _large_blocks_lock:
        if _large_blocks_users == 0:
            library.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_THRESHOLD)
            library.mallopt(M_TRIM_THRESHOLD, LARGE_BLOCK_THRESHOLD)
        _large_blocks_users += 1
    try:
        yield True
    finally:
        with _large_blocks_lock:
            _large_blocks_users -= 1
            if _large_blocks_users == 0:
                library.mallopt(M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD_MAX)
                library.mallopt(M_TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD_MAX)


def resident_bytes() -> int:
    """This process's resident set size in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0

    return pages * os.sysconf("SC_PAGE_SIZE")


def peak_resident_bytes(pid: int | None = None) -> int:
    """The peak resident set size (VmHWM) of process ``pid`` (default: this one) in bytes; 0 where
    /proc is missing."""
    try:
        with open(f"/proc/{pid or 'self'}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
