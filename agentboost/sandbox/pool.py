"""Running untrusted Python: :class:`SandboxPool` (warm workers, for throughput) and :func:`run_python`.

Each pool worker is a *zygote* (:mod:`agentboost.sandbox.zygote`): an interpreter started ahead of time,
with common modules already imported, that forks one fresh process per job and applies every limit
and namespace to it. A job therefore costs a fork, not an interpreter start-up, and still gets a process
of its own: nothing carries over from one job to the next.

The parent (this module) hands a worker four pipe ends per job: the job's code and files travel on one
pipe, stdin on another, and stdout/stderr come back on two more, read incrementally in the event loop
and capped at ``max_output_bytes`` each: a program that writes more is killed, so a 100 MB writer costs
64 KiB of memory. The worker enforces the wall-clock timeout itself and reports how the job ended.

A pool belongs to the event loop it is first used in, like an aiohttp session.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import functools
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from agentboost.errors import ConfigError
from agentboost.sandbox import zygote as protocol
from agentboost.sandbox.limits import (
    SandboxCapabilities,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    SandboxStatus,
    printable,
)

DEFAULT_PRELOAD = (
    "bisect",
    "collections",
    "copy",
    "dataclasses",
    "decimal",
    "fractions",
    "functools",
    "heapq",
    "itertools",
    "json",
    "math",
    "operator",
    "random",
    "re",
    "statistics",
    "string",
    "traceback",
    "typing",
)
"""Modules every worker imports once at start-up, so jobs that use them do not pay for the import."""

DEFAULT_UID_BASE = 2_000_000_000
"""First uid of the range programs run under when the pool runs as root; each worker locks one uid of
``DEFAULT_UID_BASE .. DEFAULT_UID_BASE + 4095`` for its lifetime. The range is outside what Linux
distributions and systemd assign (system and regular users, dynamic users, container ranges)."""
UID_COUNT = 4096

START_TIMEOUT_S = 60.0
"""How long a worker may take to start (interpreter, preloaded imports, capability probe)."""
SUPERVISION_GRACE_S = 10.0
"""Beyond a job's timeout, how long the parent waits for the worker's report before restarting it."""
EOF_GRACE_S = 0.5
"""After the report, how long to wait for stdout/stderr to close (writers outside a pid namespace)."""
READ_CHUNK = 1 << 16

_ZYGOTE_PATH = Path(protocol.__file__)
_ZYGOTE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
_MEMORY_SIGNATURE = re.compile(r"^MemoryError\b|Cannot allocate memory|std::bad_alloc|out of memory", re.M)
_probed: dict[tuple[str, bool], dict[str, Any]] = {}
"""Capability probe results per (interpreter, site): later workers skip the probe."""


class SandboxPool:
    """Warm sandbox workers. Use as ``async with SandboxPool(size=4) as pool: await pool.run_python(code)``.

    Args:
        size: Jobs that can run at once (one worker process each); default: the number of CPUs.
        limits: Default limits for jobs that do not pass their own.
        python: Interpreter the programs run in; default: this one.
        site: Make the interpreter's site-packages importable (default: standard library only).
        preload: Modules imported once per worker instead of once per job.
        uid_base: First uid of the range programs run under (root only), see :data:`DEFAULT_UID_BASE`.
    """

    def __init__(
        self,
        size: int | None = None,
        limits: SandboxLimits | None = None,
        *,
        python: str | None = None,
        site: bool = False,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        uid_base: int = DEFAULT_UID_BASE,
    ) -> None:
        self.size = size if size is not None else (os.cpu_count() or 2)
        if self.size < 1:
            raise ConfigError(f"SandboxPool size must be at least 1, got {size}")
        self.limits = limits or SandboxLimits()
        self.python = python or sys.executable
        self.site = site
        self.preload = tuple(preload)
        self.uid_base = uid_base
        self.workers_started = 0
        """Worker processes started so far: ``size`` at start-up, plus one per worker replaced."""
        self._workers: set[_Worker] = set()
        self._idle: asyncio.Queue[_Worker | None] | None = None
        self._starting: asyncio.Future[None] | None = None
        self._replacing = 0
        self._failure: BaseException | None = None
        self._jobs: set[asyncio.Task[SandboxResult]] = set()
        self._job_ids = itertools.count(1)
        self._closed = False
        self._capabilities: SandboxCapabilities | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the workers (done on first use anyway). Raises SandboxError if none can start."""
        if self._closed:
            raise SandboxError("this SandboxPool is closed; create a new one")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._starting = asyncio.ensure_future(self._start())
        elif self._loop is not asyncio.get_running_loop():
            raise SandboxError("a SandboxPool belongs to the event loop it started in; create one per loop")
        assert self._starting is not None
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        self._idle = asyncio.Queue()
        first = await self._spawn()  # probes the machine once; the others reuse its findings
        self._capabilities = first.capabilities
        rest = await asyncio.gather(*(self._spawn() for _ in range(self.size - 1)), return_exceptions=True)
        failures = [worker for worker in rest if isinstance(worker, BaseException)]
        if failures:
            await asyncio.gather(*(worker.shutdown() for worker in list(self._workers)))
            self._workers.clear()
            raise failures[0]
        for worker in (first, *rest):
            self._idle.put_nowait(worker)  # type: ignore[arg-type]

    async def close(self) -> None:
        """Stop running jobs (they end as sandbox_error), then every worker process."""
        self._closed = True
        for worker in self._workers:
            worker.request_kill()
        if self._jobs:
            await asyncio.gather(*self._jobs, return_exceptions=True)
        await asyncio.gather(*(worker.shutdown() for worker in list(self._workers)))
        self._workers.clear()

    @property
    def capabilities(self) -> SandboxCapabilities:
        """The protections jobs get on this machine (known once the pool has started)."""
        if self._capabilities is None:
            raise SandboxError("the pool has not started yet: await pool.start() first")
        return self._capabilities

    @property
    def worker_pids(self) -> list[int]:
        return sorted(worker.pid for worker in self._workers)

    # -- jobs

    async def run_python(
        self,
        code: str,
        *,
        stdin: str = "",
        limits: SandboxLimits | None = None,
        files: Mapping[str, str] | None = None,
        checker: str | None = None,
    ) -> SandboxResult:
        """Run ``code`` as ``python -c code`` would, in a fresh sandboxed process; never raises for
        anything the program does. ``files`` (relative path -> text) are written to its working directory
        first. Cancelling the call kills the program.

        ``checker``: trusted Python code (never the program's) that grades the program while it runs. It
        runs in a process of its own in the same job, under a second uid the program can neither signal
        nor trace, with the same limits; the two are connected by a Unix stream socket, file descriptor 3
        in the program and ``CHANNEL_FD`` in the checker. The checker calls ``report(verdict: dict)``;
        the verdict reaches ``result.checker_verdict`` only if it came with this run's secret, which the
        checker reads from a pipe the program never holds (see :mod:`agentboost.sandbox.testcases`)."""
        limits = limits or self.limits
        checked_files = _checked_files(files)
        await self.start()
        worker = await self._acquire()
        job_id = next(self._job_ids)
        worker.job_id = job_id
        task = asyncio.ensure_future(
            self._run_job(worker, job_id, code, stdin, limits, checked_files, checker)
        )
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            worker.request_kill()  # the job task finishes in the background and frees the worker
            raise

    async def _run_job(
        self,
        worker: _Worker,
        job_id: int,
        code: str,
        stdin: str,
        limits: SandboxLimits,
        files: dict[str, str],
        checker: str | None = None,
    ) -> SandboxResult:
        loop = asyncio.get_running_loop()
        payload_r, payload_w = os.pipe()
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        checker_r, checker_w = os.pipe() if checker is not None else (-1, -1)
        nonce = secrets.token_hex(16)
        job = {
            "op": "run",
            "job": job_id,
            "timeout_s": limits.timeout_s,
            "cpu_time_s": limits.cpu_seconds,
            "memory_mb": limits.memory_mb,
            "file_size_mb": limits.file_size_mb,
            "disk_mb": limits.disk_mb,
            "max_processes": limits.max_processes,
            "max_open_files": limits.max_open_files,
            "network": limits.network,
            "checker": checker is not None,
        }
        streams: list[_Feed | _Capture] = []
        try:
            sent_fds = [payload_r, stdin_r, stdout_w, stderr_w] + ([checker_r] if checker is not None else [])
            try:
                worker.send(job, fds=sent_fds)
            finally:
                for fd in sent_fds:
                    os.close(fd)
            worker.sent = True
            if worker.kill_requested:  # cancelled before the job was even sent
                worker.request_kill()
            payload = json.dumps({"code": code, "files": files}).encode()
            streams += [_Feed(loop, payload_w, payload), _Feed(loop, stdin_w, stdin.encode())]
            payload_w = stdin_w = -1
            if checker is not None:
                checker_payload = json.dumps({"code": checker, "nonce": nonce}).encode()
                streams.append(_Feed(loop, checker_w, checker_payload))
                checker_w = -1
            stdout = _Capture(loop, stdout_r, limits.max_output_bytes, worker.request_kill)
            stderr = _Capture(loop, stderr_r, limits.max_output_bytes, worker.request_kill)
            streams += [stdout, stderr]
            stdout_r = stderr_r = -1
            report = await asyncio.wait_for(worker.receive(), limits.timeout_s + SUPERVISION_GRACE_S)
            if report.get("job") != job_id:
                raise SandboxError(f"worker {worker.pid} answered for job {report.get('job')}, not {job_id}")
            await asyncio.wait([stdout.done, stderr.done], timeout=EOF_GRACE_S)
            network_isolated = not limits.network and self.capabilities.network_isolation
            return _result(report, limits, stdout, stderr, network_isolated, nonce)
        except (OSError, EOFError, asyncio.TimeoutError, SandboxError, ValueError) as error:
            worker.alive = False
            detail = f"the sandbox worker failed ({type(error).__name__}: {error}); it will be replaced"
            return SandboxResult(SandboxStatus.SANDBOX_ERROR, None, "", "", 0.0, detail=detail)
        finally:
            worker.job_id, worker.sent, worker.kill_requested = None, False, False
            for stream in streams:
                stream.close()
            for fd in (payload_w, stdin_w, stdout_r, stderr_r, checker_w):
                if fd >= 0:
                    os.close(fd)
            self._release(worker)

    # -- workers

    async def _acquire(self) -> _Worker:
        assert self._idle is not None
        while True:
            worker = await self._idle.get()
            if worker is not None:
                return worker
            if not self._workers and not self._replacing:
                self._idle.put_nowait(None)  # wake the next waiter too
                raise SandboxError(f"no sandbox worker is running: the last restart failed ({self._failure})")

    def _release(self, worker: _Worker) -> None:
        assert self._idle is not None
        if self._closed:
            return
        if worker.alive:
            self._idle.put_nowait(worker)
            return
        self._workers.discard(worker)
        self._replacing += 1
        task = asyncio.ensure_future(self._replace(worker))
        self._jobs.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._jobs.discard)  # type: ignore[arg-type]

    async def _replace(self, dead: _Worker) -> None:
        assert self._idle is not None
        await dead.shutdown()
        try:
            worker = await self._spawn()
        except SandboxError as error:
            self._failure = error
            self._idle.put_nowait(None)
        else:
            if self._closed:
                await worker.shutdown()
            else:
                self._idle.put_nowait(worker)
        finally:
            self._replacing -= 1

    async def _spawn(self) -> _Worker:
        worker = _Worker(*_start_zygote(self.python, self.site, self.preload, self.uid_base))
        self.workers_started += 1
        try:
            hello = await asyncio.wait_for(worker.receive(), START_TIMEOUT_S)
        except (OSError, EOFError, asyncio.TimeoutError, ValueError) as error:
            message = f"the sandbox worker did not start ({type(error).__name__}: {error})"
            stderr = await worker.shutdown(wait=True)
            raise SandboxError(message + (f"; its stderr ends with:\n{stderr}" if stderr else "")) from None
        worker.welcome(hello)
        _probed.setdefault((self.python, self.site), {"steps": hello["steps"], "notes": hello["notes"]})
        self._workers.add(worker)
        return worker


class _Worker:
    """The parent's handle on one zygote process."""

    def __init__(
        self, process: subprocess.Popen[bytes], sock: socket.socket, log: IO[bytes], mount_point: str
    ) -> None:
        self.process = process
        self.sock = sock
        self.log = log  # the worker's stderr: empty unless it crashes
        self.mount_point = mount_point  # where its jobs' working directories are mounted
        self.pid = process.pid
        self.alive = True
        self.job_id: int | None = None
        self.sent = False  # the current job's message has gone out
        self.kill_requested = False
        self.capabilities: SandboxCapabilities | None = None
        self._buffer = bytearray()

    def welcome(self, hello: dict[str, Any]) -> None:
        self.capabilities = _capabilities(hello)

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        data = protocol.encode_message(message)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        # Messages are a few hundred bytes and the worker reads every one, so the send never blocks.
        sent = self.sock.sendmsg([data], ancillary, socket.MSG_NOSIGNAL)
        if sent != len(data):
            raise SandboxError(f"short write to sandbox worker {self.pid}")

    def request_kill(self) -> None:
        """Ask the worker to kill its current job (no-op when idle or already gone)."""
        if self.job_id is None or not self.alive:
            return
        self.kill_requested = True
        if not self.sent:
            return  # sent right after the job itself
        try:
            self.send({"op": "kill", "job": self.job_id})
        except OSError:
            self.alive = False

    async def receive(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        header = protocol.HEADER.size
        while len(self._buffer) < header or len(self._buffer) < header + self._length():
            chunk = await loop.sock_recv(self.sock, READ_CHUNK)
            if not chunk:
                raise EOFError(f"sandbox worker {self.pid} closed its connection")
            self._buffer += chunk
        end = header + self._length()
        message = json.loads(bytes(self._buffer[header:end]))
        del self._buffer[:end]
        return message

    def _length(self) -> int:
        return protocol.HEADER.unpack_from(self._buffer)[0]

    async def shutdown(self, wait: bool = False) -> str:
        """Close the connection (the worker kills any job and exits), make sure the process is gone, and
        return the end of its stderr (empty unless it crashed).

        ``wait``: give it time to exit on its own (to read why it failed); otherwise kill it after 5 s."""
        self.alive = False
        self.sock.close()
        deadline = time.monotonic() + (START_TIMEOUT_S if wait else 5.0)
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                self.process.kill()
                deadline = float("inf")
            await asyncio.sleep(0.005)
        shutil.rmtree(self.mount_point, ignore_errors=True)
        tail = ""
        with contextlib.suppress(OSError, ValueError):
            self.log.seek(0)
            tail = self.log.read()[-2000:].decode(errors="replace").strip()
        self.log.close()
        return tail


# --- reading and writing the job's pipes in the event loop ------------------------------------------


class _Capture:
    """Reads a pipe until EOF, keeping at most ``limit`` bytes; calls ``on_overflow`` once beyond that."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, limit: int, on_overflow: Any) -> None:
        self.loop, self.fd, self.limit, self.on_overflow = loop, fd, limit, on_overflow
        self.data = bytearray()
        self.truncated = False
        self.done: asyncio.Future[None] = loop.create_future()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            chunk = os.read(self.fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return
        room = self.limit - len(self.data)
        if len(chunk) <= room:
            self.data += chunk
            return
        self.data += chunk[: max(room, 0)]  # keep draining, store nothing more
        if not self.truncated:
            self.truncated = True
            self.on_overflow()

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        if not self.done.done():
            self.done.set_result(None)

    def text(self, name: str) -> str:
        text = self.data.decode("utf-8", errors="replace")
        if self.truncated:
            text += f"\n[{name} truncated: the program wrote more than {self.limit} bytes]"
        return text


class _Feed:
    """Writes ``data`` to a pipe without blocking the loop, then closes it; a reader that exits early
    (broken pipe) just ends the feed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, data: bytes) -> None:
        self.loop, self.fd = loop, fd
        self.view = memoryview(data)
        self.watching = False
        os.set_blocking(fd, False)
        self._write()
        if self.fd >= 0:
            loop.add_writer(fd, self._write)
            self.watching = True

    def _write(self) -> None:
        try:
            while self.view:
                written = os.write(self.fd, self.view[:READ_CHUNK])
                self.view = self.view[written:]
        except BlockingIOError:
            return
        except OSError:  # the reader is gone
            pass
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            if self.watching:
                self.loop.remove_writer(self.fd)
            os.close(self.fd)
            self.fd = -1


# --- how a job ended ----------------------------------------------------------------------------------


def _result(
    report: dict[str, Any],
    limits: SandboxLimits,
    out: _Capture,
    err: _Capture,
    network_isolated: bool,
    nonce: str = "",
) -> SandboxResult:
    """How the job ended, from what the worker observed: its wall clock, the kernel's wait status, CPU
    time and peak memory, and the output sizes. Text the program wrote never decides a status by itself:
    stderr only names the error in ``detail`` (and confirms an allocation failure already seen in the
    memory peak)."""
    stdout, stderr = out.text("stdout"), err.text("stderr")
    wait_status = report.get("wait_status")
    exit_code: int | None = None
    signal_name: str | None = None
    if wait_status is not None:
        if os.WIFSIGNALED(wait_status):
            number = os.WTERMSIG(wait_status)
            exit_code = -number
            try:
                signal_name = signal.Signals(number).name
            except ValueError:
                signal_name = f"signal {number}"
        else:
            exit_code = os.waitstatus_to_exitcode(wait_status)
    cpu_s = float(report.get("cpu_s", 0.0))
    peak_mb = float(report.get("max_rss_kb", 0)) / 1024
    if report.get("setup_error"):
        status, detail = SandboxStatus.SANDBOX_ERROR, report["setup_error"]
    elif out.truncated or err.truncated:
        stream = "stdout" if out.truncated else "stderr"
        status = SandboxStatus.OUTPUT_TRUNCATED
        detail = f"{stream} went past the {limits.max_output_bytes}-byte limit; the program was killed"
    elif report.get("timed_out"):
        status = SandboxStatus.TIMEOUT
        detail = (
            f"wall-clock limit of {limits.timeout_s:g} s reached; the program and its children were killed"
        )
    elif wait_status is None:
        status, detail = (
            SandboxStatus.SANDBOX_ERROR,
            "the job ended without an exit status (killed on request)",
        )
    elif signal_name in ("SIGXCPU", "SIGKILL") and cpu_s >= CPU_LIMIT_FRACTION * limits.cpu_seconds:
        status, detail = SandboxStatus.TIMEOUT, f"CPU-time limit of {limits.cpu_seconds} s reached"
    elif exit_code != 0 and _out_of_memory(stderr, peak_mb, limits):
        status, detail = SandboxStatus.MEMORY_EXCEEDED, f"out of memory (limit {limits.memory_mb} MiB)"
    elif signal_name is not None:
        status, detail = SandboxStatus.KILLED, f"killed by {signal_name}"
    elif exit_code == 0:
        status, detail = SandboxStatus.OK, ""
    else:
        last_line = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
        status = SandboxStatus.RUNTIME_ERROR
        detail = f"exit code {exit_code}" + (f": {printable(last_line.strip())[:300]}" if last_line else "")
    return SandboxResult(
        status=status,
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        duration_s=float(report.get("duration_s", 0.0)),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        signal=signal_name,
        detail=detail,
        cpu_time_s=cpu_s,
        network_isolated=network_isolated,
        peak_memory_mb=peak_mb,
        checker_verdict=_verdict(report, nonce),
    )


CPU_LIMIT_FRACTION = 0.75
"""Share of the CPU limit the program's CPU time must reach for a SIGXCPU/SIGKILL to count as the limit
(a timeout) rather than a signal it sent itself: the kernel fires the limit on its tick-sampled clock,
which under load runs several percent ahead of the precise time wait4 reports (0.94 s seen for 1 s)."""
MEMORY_PEAK_FRACTION = 0.5
"""Share of memory_mb the program's resident peak must reach for an allocation failure to be reported as
memory_exceeded: a program cannot earn that status by printing 'MemoryError'."""


def _out_of_memory(stderr: str, peak_mb: float, limits: SandboxLimits) -> bool:
    reached = peak_mb >= MEMORY_PEAK_FRACTION * limits.memory_mb
    return reached and _MEMORY_SIGNATURE.search(stderr[-4096:]) is not None


def _verdict(report: dict[str, Any], nonce: str) -> dict[str, Any] | None:
    """The checker's verdict, if it carries this run's secret and the checker exited with status 0."""
    verdict = report.get("checker")
    if not isinstance(verdict, dict) or not nonce or report.get("checker_wait_status") != 0:
        return None
    if not secrets.compare_digest(str(verdict.get("nonce", "")), nonce):
        return None
    return {key: value for key, value in verdict.items() if key != "nonce"}


def _checked_files(files: Mapping[str, str] | None) -> dict[str, str]:
    checked = {}
    for name, content in (files or {}).items():
        path = os.path.normpath(name)
        if not name or os.path.isabs(path) or path == ".." or path.startswith(".." + os.sep):
            raise ConfigError(f"file name {name!r} must be a relative path inside the working directory")
        if not isinstance(content, str):
            raise ConfigError(f"file {name!r}: content must be text (str), got {type(content).__name__}")
        checked[name] = content
    return checked


# --- starting workers --------------------------------------------------------------------------------


def _start_zygote(
    python: str, site: bool, preload: Sequence[str], uid_base: int
) -> tuple[subprocess.Popen[bytes], socket.socket, IO[bytes], str]:
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    log = tempfile.TemporaryFile()  # noqa: SIM115  (the worker's stderr for as long as it runs)
    mount_point = tempfile.mkdtemp(prefix="agentboost-sandbox-")
    probed = _probed.get((python, site), {})
    config = {
        "sock_fd": child_sock.fileno(),
        "parent_pid": os.getpid(),
        "tmp_dir": tempfile.gettempdir(),
        "mount_point": mount_point,
        "lock_dir": os.path.join(tempfile.gettempdir(), "agentboost-sandbox-uids"),
        "uid_base": uid_base,
        "uid_count": UID_COUNT,
        "preload": list(preload),
        "steps": probed.get("steps"),
        "notes": probed.get("notes"),
    }
    flags = ["-I", "-B"] + ([] if site else ["-S"])
    try:
        process = subprocess.Popen(
            [python, *flags, str(_ZYGOTE_PATH), json.dumps(config)],
            pass_fds=(child_sock.fileno(),),
            env=_ZYGOTE_ENV,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # no controlling terminal for the worker or its jobs
        )
    except OSError as error:
        parent_sock.close()
        log.close()
        os.rmdir(mount_point)
        raise SandboxError(f"cannot start the sandbox interpreter {python!r}: {error}") from None
    finally:
        child_sock.close()
    parent_sock.setblocking(False)
    return process, parent_sock, log, mount_point


def _capabilities(hello: dict[str, Any]) -> SandboxCapabilities:
    steps, notes = hello["steps"], hello.get("notes") or {}
    return SandboxCapabilities(
        running_as_root=bool(hello["root"]),
        unprivileged_uid=bool(steps["unprivileged_uid"]),
        pid_namespace=bool(steps["pid_namespace"]),
        filesystem_isolation=bool(steps["mount_namespace"]),
        ipc_namespace=bool(steps["ipc_namespace"]),
        network_isolation=bool(steps["network_namespace"]),
        interpreter_readable=bool(steps["interpreter_readable"]),
        uid=int(hello["uid"]),
        notes=tuple(notes[name] for name in protocol.STEPS if name in notes),
        minimal_filesystem=bool(steps["minimal_filesystem"]),
        shared_memory_capped=bool(steps["ipc_limits"]),
        keyring_isolation=bool(steps["keyring_isolation"]),
        seccomp_filter=bool(steps["seccomp_filter"]),
    )


# --- one-off runs ------------------------------------------------------------------------------------


async def run_python(
    code: str,
    *,
    stdin: str = "",
    limits: SandboxLimits | None = None,
    files: Mapping[str, str] | None = None,
    checker: str | None = None,
) -> SandboxResult:
    """Run ``code`` once in a fresh sandbox (one worker started and stopped for it). For many runs, a
    :class:`SandboxPool` is several times faster: it keeps its workers warm."""
    async with SandboxPool(size=1, limits=limits, preload=()) as pool:
        return await pool.run_python(code, stdin=stdin, files=files, checker=checker)


def run_python_sync(
    code: str,
    *,
    stdin: str = "",
    limits: SandboxLimits | None = None,
    files: Mapping[str, str] | None = None,
) -> SandboxResult:
    """:func:`run_python` for code that has no event loop running."""
    return asyncio.run(run_python(code, stdin=stdin, limits=limits, files=files))


@functools.lru_cache(maxsize=1)
def sandbox_capabilities() -> SandboxCapabilities:
    """Which protections sandboxed programs get on this machine (probed once per process, ~0.1 s)."""

    async def probe() -> SandboxCapabilities:
        async with SandboxPool(size=1, preload=()) as pool:
            return pool.capabilities

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(probe())
    raise SandboxError("sandbox_capabilities() blocks: inside an event loop, use `pool.capabilities`")
