"""Rollout results streamed to JSONL: identified before touched, every line complete, resumable.

File format (``format: agentboost.results``, ``version: 1``)::

    line 1     {"format": "agentboost.results", "version": 1, "agentboost": "<version>", "run": {...}}
    line 2...  one RolloutResult per line (RolloutResult.to_dict)

``run`` is the run's identity (:meth:`agentboost.rollout.spec.RunSpec.identity`): environment and its
arguments, model, sampling, limits, seed, split (see :data:`NOT_COMPARED` for the keys that may change
between a run and its resume).

Nothing is written to an existing file before its first line is read (at most 1 MiB) and found to
be such a header; anything else (a notes file, a model, a device such as ``/dev/full``) is refused
untouched. Each result is one ``write`` of the whole line on a file opened for appending, then
fsynced, so a crash leaves at most one torn line at the end; resuming cuts that tail off. Failed
rollouts stay in the file for inspection; when one is run again its new line is appended and the
last line of a (task, sample) pair is the one that counts (:func:`read_results` yields only it).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentboost.envs.base import RolloutResult
from agentboost.errors import ConfigError, LegacyResultsError, SettingsChangedError, UserPathError
from agentboost.rollout.spec import NOT_COMPARED

Key = tuple[str, int]
"""(task_id, sample)"""

RESULTS_FORMAT = "agentboost.results"
RESULTS_VERSION = 1
_HEADER_LIMIT = 1 << 20
_KEY_PREFIX = re.compile(r'^\{"task_id": ("(?:[^"\\]|\\.)*"), "sample": (-?\d+)')


class Plan:
    """The (task_id, sample) pairs of a run: its task ids and its sample count.

    ``task_ids`` is a collection, or a function that makes them again for each check (a run's
    :class:`~agentboost.rollout.runner.RunTasks`), so a plan of a million tasks holds none of them:
    :meth:`within` answers for a set of pairs in one pass. ``count`` is the number of tasks when known.
    """

    def __init__(
        self,
        task_ids: Collection[str] | Callable[[], Iterable[str]],
        samples: int,
        *,
        count: int | None = None,
    ) -> None:
        if callable(task_ids):
            self._task_ids = task_ids
            self.count = count
        else:
            held = frozenset(task_ids)
            self._task_ids = lambda: held
            self.count = len(held)
        self.samples = samples

    @property
    def size(self) -> int | None:
        """Rollouts in the run (None when the environment's tasks have no length)."""
        return None if self.count is None else self.count * self.samples

    def within(self, keys: Iterable[Key]) -> set[Key]:
        """Those of ``keys`` that are pairs of this run (one pass over its tasks)."""
        wanted: dict[str, list[Key]] = {}
        for key in keys:
            task_id, sample = key
            if isinstance(sample, int) and 0 <= sample < self.samples:
                wanted.setdefault(task_id, []).append(key)
        found: set[Key] = set()
        if not wanted:
            return found
        for task_id in self._task_ids():
            pairs = wanted.pop(task_id, None)
            if pairs is not None:
                found.update(pairs)
                if not wanted:
                    break
        return found


def _version() -> str:
    from agentboost import __version__

    return __version__


def results_header(identity: Mapping[str, Any] | None) -> dict[str, Any]:
    """The first line of a results file for a run with this identity."""
    return {
        "format": RESULTS_FORMAT,
        "version": RESULTS_VERSION,
        "agentboost": _version(),
        "run": dict(identity or {}),
    }


def _is_header(data: Any) -> bool:
    return isinstance(data, dict) and data.get("format") == RESULTS_FORMAT


def _looks_like_result(data: Any) -> bool:
    return isinstance(data, dict) and {"task_id", "sample", "trajectory"} <= data.keys()


def settings_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key: recorded -> current`` for every compared setting that differs (nested keys dotted)."""
    differences: list[str] = []

    def walk(old: Any, new: Any, key: str) -> None:
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            for name in sorted(set(old) | set(new), key=str):
                walk(old.get(name), new.get(name), f"{key}.{name}" if key else str(name))
        elif old != new:
            differences.append(f"{key}: {json.dumps(old)} -> {json.dumps(new)}")

    for name in sorted(set(recorded) | set(current)):
        if name not in NOT_COMPARED:
            walk(recorded.get(name), current.get(name), name)
    return differences


def identify(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The header of an existing results file; None if ``path`` does not exist or is empty.

    Reads at most the first MiB and changes nothing. Raises :class:`ConfigError` when the path is
    not an agentboost results file (then it must not be written to), naming what it looks like.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UserPathError.from_os_error(path, error, "use") from error
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(
            f"{path} is a directory; name a results file such as {os.path.join(path, 'rollouts.jsonl')}"
        )
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(
            f"{path} is not a regular file (a device, pipe or socket); results go to a regular file, "
            "e.g. runs/rollouts.jsonl"
        )
    if info.st_size == 0:
        return None
    try:
        with open(path, "rb") as handle:
            first = handle.readline(_HEADER_LIMIT)
    except OSError as error:
        raise UserPathError.from_os_error(path, error, "read") from error
    refuse = (
        f"{path} exists and is not an agentboost results file, so it was left untouched; "
        "choose another --out (or move the file away)"
    )
    if not first.endswith(b"\n"):
        raise ConfigError(refuse)
    try:
        data = json.loads(first)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(refuse) from error
    if _is_header(data):
        version = data.get("version")
        if not isinstance(version, int) or version > RESULTS_VERSION:
            raise ConfigError(
                f"{path} is an agentboost results file of format version {version!r}; this agentboost "
                f"({_version()}) reads version {RESULTS_VERSION}: upgrade agentboost or choose another --out"
            )
        if not isinstance(data.get("run"), dict):
            raise ConfigError(f"{path}: the header's 'run' is not an object; the file was edited")
        return data
    if _looks_like_result(data):
        raise LegacyResultsError(
            f"{path} holds results written by an agentboost older than the results header (0.1), whose "
            "settings cannot be checked; resume it with the agentboost that wrote it, or pass --fresh "
            "to start over in it, or choose another --out"
        )
    raise ConfigError(refuse)


class ResultStore:
    """Append-only results file: a header, then :class:`RolloutResult` lines.

    ``identity`` describes the run (see the module docstring); resuming a file whose recorded
    identity differs raises :class:`~agentboost.errors.SettingsChangedError` (a ConfigError) listing
    the differences, unless ``allow_different``.
    ``plan`` is the :class:`Plan` of (task_id, sample) pairs this run is made of: a resumed line outside it is
    refused. ``redo_failed`` (the default) leaves failed rollouts out of :attr:`done` so they run again.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        resume: bool = True,
        fsync: bool = True,
        identity: Mapping[str, Any] | None = None,
        allow_different: bool = False,
        plan: Plan | None = None,
        redo_failed: bool = True,
        environment_name: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.identity = dict(identity or {})
        self.done: set[Key] = set()
        """Pairs finished in the file when it was opened (failed ones excluded when ``redo_failed``)."""
        self.written = 0
        """Results written since."""
        self.failed: set[Key] = set()
        """Pairs whose last line in the file is a failed rollout."""
        self.torn_bytes = 0
        self.differences: list[str] = []
        """Settings that differ from the file's header (only non-empty with ``allow_different``)."""
        self.header: dict[str, Any] | None = None
        self._fd = -1
        self._error: UserPathError | None = None
        self._writer: ThreadPoolExecutor | None = None

        try:
            existing = identify(self.path)
        except LegacyResultsError:
            if resume:
                raise
            existing = None  # --fresh over our own legacy file: ours to replace
        if existing is not None and resume:
            self.header = existing
            if identity is not None:
                self.differences = settings_differences(existing["run"], self.identity)
                if self.differences and not allow_different:
                    raise SettingsChangedError(
                        f"{self.path} was written by a run with other settings "
                        f"({'; '.join(self.differences)}); resume with the same settings, pass "
                        "--allow-different-settings to resume anyway, or choose another --out",
                        differences=tuple(self.differences),
                    )
            keep = self._complete_length()
            self._scan(plan, redo_failed, environment_name, keep)
            self.torn_bytes = self._truncate(keep)  # only once every line was found to be ours
            self._fd = self._open(os.O_WRONLY | os.O_APPEND)
            return
        self._create(truncate=self.path.exists())

    # --- opening ----------------------------------------------------------------------------------

    def _open(self, flags: int) -> int:
        try:
            return os.open(self.path, flags, 0o644)
        except OSError as error:
            raise UserPathError.from_os_error(self.path, error, "open the results file") from error

    def _create(self, *, truncate: bool) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserPathError.from_os_error(self.path.parent, error, "create the directory") from error
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_TRUNC if truncate else 0)
        self._fd = self._open(flags)
        self.header = results_header(self.identity)
        try:
            self._append((json.dumps(self.header, ensure_ascii=False) + "\n").encode("utf-8"))
        except UserPathError:
            self.close()
            if not truncate:
                self.path.unlink(missing_ok=True)  # we made it; leave nothing half-made behind
            raise

    def _complete_length(self) -> int:
        """Bytes up to and including the last newline (after it: a line the previous run did not finish)."""
        try:
            with open(self.path, "rb") as handle:
                position = handle.seek(0, os.SEEK_END)
                while position > 0:
                    start = max(0, position - 65536)
                    handle.seek(start)
                    newline = handle.read(position - start).rfind(b"\n")
                    if newline >= 0:
                        return start + newline + 1
                    position = start
        except OSError as error:
            raise UserPathError.from_os_error(self.path, error, "resume") from error
        return 0

    def _truncate(self, keep: int) -> int:
        """Cut the torn tail after ``keep`` bytes; returns how many bytes were cut."""
        try:
            size = self.path.stat().st_size
            if keep < size:
                os.truncate(self.path, keep)
        except OSError as error:
            raise UserPathError.from_os_error(self.path, error, "resume") from error
        return size - keep

    def _scan(self, plan: Plan | None, redo_failed: bool, environment_name: str | None, length: int) -> None:
        """Validate every complete line (the first ``length`` bytes); fill :attr:`done` and :attr:`failed`.

        Reads only: nothing is cut or written until the whole file is found to be this run's."""
        last_ok: dict[Key, bool] = {}
        where: dict[Key, int] = {}
        with open(self.path, "rb") as handle:
            consumed = len(handle.readline())  # the header
            for number, raw in enumerate(handle, start=2):
                consumed += len(raw)
                if consumed > length:  # the torn tail: not a line yet
                    break
                line = raw.decode("utf-8", errors="replace")
                if not line.strip():
                    continue
                at = f"{self.path}:{number}"
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ConfigError(f"{at} is not valid JSON ({error.msg}); the file was edited") from error
                if _is_header(data):
                    raise ConfigError(f"{at} is a second header: two results files were joined")
                if not _looks_like_result(data):
                    raise ConfigError(f"{at} is not a rollout result (no task_id, sample and trajectory)")
                try:
                    result = RolloutResult.from_dict(data)
                except (ConfigError, KeyError, TypeError, ValueError) as error:
                    raise ConfigError(f"{at} is not a valid rollout result ({error})") from error
                key = (result.task_id, result.sample)
                if result.trajectory.task_id != result.task_id:
                    raise ConfigError(
                        f"{at}: the trajectory is of task {result.trajectory.task_id!r}, "
                        f"the line says {result.task_id!r}"
                    )
                line_environment = result.trajectory.info.get("environment")
                if environment_name and line_environment and line_environment != environment_name:
                    raise ConfigError(
                        f"{at} is a result of environment {line_environment!r}, not {environment_name!r}; "
                        "results of different environments cannot share a file"
                    )
                if plan is not None and not 0 <= key[1] < plan.samples:
                    self._outside(at, f"sample {key[1]} of task {key[0]!r} is beyond this run's samples")
                ok = not result.failed
                if last_ok.get(key):
                    raise ConfigError(
                        f"{at} repeats task {key[0]!r} sample {key[1]}, already finished at line "
                        f"{where[key]}; the file was edited or two files were joined"
                    )
                last_ok[key] = ok
                where[key] = number
        if plan is not None and last_ok:  # one pass over the run's tasks, none of them held
            outside = last_ok.keys() - plan.within(last_ok)
            if outside:
                key = min(outside, key=where.__getitem__)
                self._outside(f"{self.path}:{where[key]}", f"task {key[0]!r} is not one of this run's tasks")
        self.failed = {key for key, ok in last_ok.items() if not ok}
        self.done = {key for key, ok in last_ok.items() if ok or not redo_failed}

    def _outside(self, at: str, what: str) -> None:
        recorded = self.header["run"] if self.header else {}
        raise ConfigError(
            f"{at}: {what} (the file was written with -n {recorded.get('tasks')} "
            f"--samples {recorded.get('samples')}); use the same -n and --samples or larger, "
            "or choose another --out"
        )

    # --- writing ----------------------------------------------------------------------------------

    def _append(self, line: bytes) -> None:
        if self._error is not None:
            raise self._error
        try:
            written = os.write(self._fd, line)
            while written < len(line):  # os.write may write less than asked; finish the same line
                written += os.write(self._fd, line[written:])
            if self.fsync:
                os.fsync(self._fd)
        except OSError as error:
            self._error = UserPathError.from_os_error(self.path, error, "write results to")
            raise self._error from error

    def write(self, result: RolloutResult) -> None:
        """Append one result (blocking: serialises, writes, fsyncs)."""
        key = (result.task_id, result.sample)
        if key in self.done:
            raise ConfigError(f"result for task {key[0]!r} sample {key[1]} is already in {self.path}")
        self._append((json.dumps(result.to_dict(), ensure_ascii=False) + "\n").encode("utf-8"))
        self.written += 1  # not added to done: memory stays bounded however many are written
        self.failed.discard(key)
        if result.failed:
            self.failed.add(key)

    async def awrite(self, result: RolloutResult) -> None:
        """:meth:`write` on the store's own writer thread, so the event loop never waits on the disk."""
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentboost-results")
        await asyncio.get_running_loop().run_in_executor(self._writer, self.write, result)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_header(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The header of a results file (None for a file written before headers existed)."""
    try:
        return identify(path)
    except LegacyResultsError:
        return None


def read_results(path: str | os.PathLike[str]) -> Iterator[RolloutResult]:
    """The results of a results file, in file order, skipping the header.

    A torn last line (a killed run) is skipped; any other bad line raises. When a (task, sample)
    pair has several lines (a failed rollout run again on resume), only its last line is yielded.
    """
    try:
        with open(path, "rb") as handle:
            first = handle.readline(_HEADER_LIMIT)
    except OSError as error:
        raise UserPathError.from_os_error(path, error, "read") from error
    try:
        if not _is_header(json.loads(first)):
            first = b""  # a file from before headers: its first line is a result
    except (json.JSONDecodeError, UnicodeDecodeError):
        if first.endswith(b"\n") or len(first) >= _HEADER_LIMIT:
            raise ConfigError(
                f"{path} is not an agentboost results file (its first line is not JSON)"
            ) from None
    try:
        text = Path(path).read_bytes()[len(first) :].decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {path} as an agentboost results file: {error}") from error
    offset = 2 if first else 1
    lines = text.split("\n")
    last: dict[Key, int] = {}
    keys: list[Key | None] = []
    for index, line in enumerate(lines):
        key = _line_key(line)
        keys.append(key)
        if key is not None:
            last[key] = index
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        key = keys[index]
        if key is not None and last[key] != index:
            continue  # superseded by a later attempt
        number = index + offset
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            if index == len(lines) - 1:  # no newline after it: the writer was killed mid-line
                return
            raise ConfigError(f"{path}:{number} is not a complete JSON line ({error.msg})") from error
        if not _looks_like_result(data):
            raise ConfigError(f"{path}:{number} is not a rollout result (no task_id, sample and trajectory)")
        yield RolloutResult.from_dict(data)


def drop_results(path: str | os.PathLike[str], drop: Callable[[RolloutResult], bool]) -> int:
    """Rewrite the results file ``path`` without the results ``drop`` picks; returns how many went.

    The header and every other line stay as they are (a torn last line goes, as a resume would cut
    it). The new file replaces the old at once (a staging file renamed into place); nothing is
    written when nothing is dropped. Refuses a file that is not an agentboost results file.
    """
    if identify(path) is None:
        return 0
    source = Path(path)
    try:
        lines = source.read_bytes().split(b"\n")[:-1]  # after the last newline: nothing, or a torn line
    except OSError as error:
        raise UserPathError.from_os_error(source, error, "read") from error
    kept = lines[:1]
    for number, line in enumerate(lines[1:], start=2):
        try:
            data = json.loads(line) if line.strip() else {}
        except json.JSONDecodeError as error:
            raise ConfigError(f"{source}:{number} is not a complete JSON line ({error.msg})") from error
        if not (_looks_like_result(data) and drop(RolloutResult.from_dict(data))):
            kept.append(line)
    dropped = len(lines) - len(kept)
    if dropped:
        staging = source.with_name(f".{source.name}.staging")
        try:
            with open(staging, "wb") as handle:
                handle.write(b"".join(line + b"\n" for line in kept))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(staging, source)
        except OSError as error:
            raise UserPathError.from_os_error(source, error, "rewrite") from error
    return dropped


def _line_key(line: str) -> Key | None:
    """(task_id, sample) of a result line, read from its start when written by agentboost."""
    match = _KEY_PREFIX.match(line)
    if match is not None:
        return json.loads(match.group(1)), int(match.group(2))
    if not line.strip():
        return None
    try:
        data = json.loads(line)
        return str(data["task_id"]), int(data["sample"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
