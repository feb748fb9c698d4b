"""Give freed heap memory back to the operating system (glibc), so a process's RSS follows what it uses.

PyTorch's CPU allocator is the C library's ``malloc``. glibc keeps freed blocks in per-thread arenas and
returns them to the system only from the top of the heap, so after a large transient (a training
micro-batch's activations, a decoded batch's KV cache, a closed engine) the process can hold gigabytes
it no longer uses; the next transient then lands in a different arena and the peak grows. ``malloc_trim``
releases every free page of every arena. Elsewhere (macOS, musl) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os


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
