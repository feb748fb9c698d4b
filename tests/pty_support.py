"""Run a command in a pseudo-terminal, as a person at a terminal would see its output."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_in_terminal(command: list[str], *, timeout_s: float = 120, env: dict[str, str] | None = None) -> str:
    """The command's stdout and stderr together, as a terminal received them (carriage returns and
    all), this checkout's agentboost imported; fails the test when the command exits non-zero."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 40 rows, 160 columns
    process = subprocess.Popen(
        command,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the command closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
        process.wait()
    text = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 0, text
    return text
