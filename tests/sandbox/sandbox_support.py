"""Helpers for the sandbox tests: run a program in a fresh pool, find processes left behind."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from agentboost.sandbox import SandboxLimits, SandboxPool, SandboxResult

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="uid drop and namespaces need root (CI and our machines run as root)"
)


def run(coroutine):
    return asyncio.run(coroutine)


def sandboxed(code: str, *, limits: SandboxLimits | None = None, **kwargs) -> SandboxResult:
    """Run ``code`` in a pool of one worker (the same path as every pooled job)."""
    return timed(code, limits=limits, **kwargs)[0]


def timed(code: str, *, limits: SandboxLimits | None = None, **kwargs) -> tuple[SandboxResult, float]:
    """Like :func:`sandboxed`, also returning the wall-clock seconds the job took (pool start excluded)."""

    async def main() -> tuple[SandboxResult, float]:
        async with SandboxPool(size=1, limits=limits) as pool:
            started = time.monotonic()
            result = await pool.run_python(code, **kwargs)
            return result, time.monotonic() - started

    return run(main())


def processes_of(uid: int) -> list[int]:
    """Host pids of the processes whose real uid is ``uid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:  # exited meanwhile
            continue
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        if int(uid_line.split()[1]) == uid:
            pids.append(int(entry.name))
    return pids
