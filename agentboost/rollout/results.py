"""Rollout results streamed to JSONL: every line complete even if the process is killed, resumable.

Each result is written with one ``write`` of the whole line on a file opened for appending, then
flushed and fsynced, so a crash leaves at most one torn line at the end. Opening the file again
cuts that torn tail off and reports which (task, sample) pairs are already done.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from agentboost.envs.base import RolloutResult
from agentboost.errors import ConfigError

Key = tuple[str, int]
"""(task_id, sample)"""


class ResultStore:
    """Append-only JSONL of :class:`RolloutResult` lines, one per (task_id, sample)."""

    def __init__(self, path: str | os.PathLike[str], *, resume: bool = True, fsync: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.done: set[Key] = set()
        self.torn_bytes = 0
        if resume and self.path.exists():
            self.torn_bytes = self._truncate_torn_tail()
            self.done = {(task_id, sample) for task_id, sample in self._scan_keys()}
        elif self.path.exists():
            self.path.unlink()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _truncate_torn_tail(self) -> int:
        """Cut everything after the last newline (a line the previous run did not finish)."""
        size = self.path.stat().st_size
        if size == 0:
            return 0
        with open(self.path, "rb+") as handle:
            position, chunk = size, 65536
            while position > 0:
                start = max(0, position - chunk)
                handle.seek(start)
                data = handle.read(position - start)
                newline = data.rfind(b"\n")
                if newline >= 0:
                    keep = start + newline + 1
                    break
                position = start
            else:
                keep = 0
            if keep < size:
                handle.truncate(keep)
            return size - keep

    def _scan_keys(self) -> Iterator[Key]:
        with open(self.path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                    yield str(data["task_id"]), int(data["sample"])
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
                    raise ConfigError(
                        f"{self.path}:{number} is not a rollout result ({error}); "
                        "it was not written by agentboost's runner, or was edited"
                    ) from error

    def write(self, result: RolloutResult) -> None:
        key = (result.task_id, result.sample)
        if key in self.done:
            raise ConfigError(f"result for task {key[0]!r} sample {key[1]} is already in {self.path}")
        line = (json.dumps(result.to_dict(), ensure_ascii=False) + "\n").encode("utf-8")
        written = os.write(self._fd, line)
        while written < len(line):  # os.write may write less than asked; finish the same line
            written += os.write(self._fd, line[written:])
        if self.fsync:
            os.fsync(self._fd)
        self.done.add(key)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_results(path: str | os.PathLike[str]) -> Iterator[RolloutResult]:
    """Read a results file; a torn last line (a killed run) is skipped, any other bad line raises."""
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):  # no newline after it: the writer was killed mid-line
                return
            raise ConfigError(f"{path}:{number} is not a complete JSON line ({error.msg})") from error
        yield RolloutResult.from_dict(data)
