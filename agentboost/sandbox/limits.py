"""What a sandboxed run may use (:class:`SandboxLimits`), how it ended (:class:`SandboxResult`), and
which protections this machine gives (:class:`SandboxCapabilities`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from agentboost.errors import AgentBoostError, ConfigError


class SandboxError(AgentBoostError):
    """The sandbox itself could not start or keep a worker running (not a failure of the program)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one run of untrusted code. Every run gets all of them; see the fields for meanings."""

    timeout_s: float = 10.0
    """Wall-clock seconds before the program and everything it started are killed (status timeout)."""
    cpu_time_s: int | None = None
    """CPU seconds per process (RLIMIT_CPU); None: the timeout rounded up."""
    memory_mb: int = 512
    """Address space per process in MiB (RLIMIT_AS); the interpreter itself takes about 20 MiB of it."""
    file_size_mb: int = 16
    """Largest file a process may write, in MiB (RLIMIT_FSIZE)."""
    disk_mb: int = 64
    """Size of the private working directory (a tmpfs) in MiB, where mount namespaces are available."""
    max_processes: int = 32
    """Processes and threads the program may have at once, itself included (RLIMIT_NPROC)."""
    max_output_bytes: int = 64 * 1024
    """Bytes kept of stdout and of stderr, each. A program that writes more is killed (output_truncated)."""
    max_open_files: int = 256
    """File descriptors a process may hold at once (RLIMIT_NOFILE). Bounds what a job can pin in kernel
    memory (pipes, sockets) and how long tearing it down takes."""
    network: bool = False
    """False: the program runs in an empty network namespace (not even loopback works)."""

    def __post_init__(self) -> None:
        positive = {
            "timeout_s": self.timeout_s,
            "memory_mb": self.memory_mb,
            "file_size_mb": self.file_size_mb,
            "disk_mb": self.disk_mb,
            "max_processes": self.max_processes,
            "max_output_bytes": self.max_output_bytes,
            "max_open_files": self.max_open_files,
        }
        if self.cpu_time_s is not None:
            positive["cpu_time_s"] = self.cpu_time_s
        for name, value in positive.items():
            if not value > 0:
                raise ConfigError(f"SandboxLimits.{name} must be positive, got {value!r}")
        if self.memory_mb < 64:
            raise ConfigError(
                f"SandboxLimits.memory_mb={self.memory_mb}: a Python process needs at least 64 MiB to start"
            )
        if self.max_open_files < 16:
            raise ConfigError(
                f"SandboxLimits.max_open_files={self.max_open_files}: the interpreter needs at least 16"
            )

    @property
    def cpu_seconds(self) -> int:
        """The CPU limit actually applied, in whole seconds."""
        return self.cpu_time_s if self.cpu_time_s is not None else max(1, math.ceil(self.timeout_s))


class SandboxStatus(str, Enum):
    """How a sandboxed run ended."""

    OK = "ok"
    """Exit code 0."""
    RUNTIME_ERROR = "runtime_error"
    """A non-zero exit code: an uncaught exception (traceback in stderr), sys.exit(n), a syntax error."""
    TIMEOUT = "timeout"
    """Killed at the wall-clock timeout, or at the CPU-time limit (SIGXCPU or SIGKILL with its CPU time, as
    the kernel reports it, at three quarters of the limit or more: a program that sends itself SIGXCPU
    early is ``killed``)."""
    MEMORY_EXCEEDED = "memory_exceeded"
    """The program failed with an allocation error after its resident memory, as the kernel measured it,
    reached half its limit. (A single request larger than the limit fails at once, without the memory
    ever being used: that is a ``runtime_error`` whose detail names the MemoryError.)"""
    OUTPUT_TRUNCATED = "output_truncated"
    """It wrote more than max_output_bytes to stdout or stderr and was killed; the output kept is a prefix."""
    KILLED = "killed"
    """Ended by a signal not sent by the sandbox (a crash such as SIGSEGV, or it killed itself)."""
    SANDBOX_ERROR = "sandbox_error"
    """The sandbox failed to set up or supervise the run; the program's behaviour is unknown."""


@dataclass
class SandboxResult:
    """The outcome of one run. ``stdout``/``stderr`` are decoded as UTF-8 (bad bytes replaced) and, when
    truncated, end with a line saying so."""

    status: SandboxStatus
    exit_code: int | None
    """The process's exit code, or minus the signal number that ended it (as subprocess does)."""
    stdout: str
    stderr: str
    duration_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    signal: str | None = None
    """Name of the signal that ended the program (e.g. "SIGKILL"), if one did."""
    detail: str = ""
    """One sentence on why the run ended this way, for people and models."""
    cpu_time_s: float = 0.0
    network_isolated: bool = False
    """True when the program ran with no network at all (an empty network namespace)."""
    peak_memory_mb: float = 0.0
    """The program's peak resident memory in MiB, as the kernel measured it (0 when unknown)."""
    checker_verdict: dict[str, Any] | None = None
    """For a run with a ``checker`` (see :meth:`SandboxPool.run_python`): the verdict the checker process
    reported, accepted only when it carried this run's secret and the checker exited cleanly; else None."""

    @property
    def ok(self) -> bool:
        return self.status is SandboxStatus.OK

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated


@dataclass(frozen=True)
class SandboxCapabilities:
    """Which protections the sandbox gives on this machine. Resource limits (CPU, address space, file
    size, processes, open files, POSIX message queues, no core dumps), a scrubbed environment, a private
    working directory and a wall-clock timeout that kills the whole job always apply; the fields below
    depend on privileges and the kernel."""

    running_as_root: bool
    unprivileged_uid: bool
    """Programs run under a uid of their own, not root: the process limit binds, files of other users
    stay out of reach, signalling the parent fails, and a graded run's checker (under a second uid) can
    be neither signalled nor traced by the program."""
    pid_namespace: bool
    """Programs see only their own processes, and every process they start dies with the job."""
    filesystem_isolation: bool
    """Everything outside the working directory is read-only, and /tmp writes fail."""
    ipc_namespace: bool
    """System V IPC objects (shared memory, semaphores, message queues) are private to a job and freed
    with it."""
    network_isolation: bool
    """Programs run in an empty network namespace: no network, not even loopback."""
    interpreter_readable: bool
    """The program's uid can read the interpreter's standard library (imports work)."""
    uid: int
    """The uid programs of the probing worker ran under."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Why each missing protection is missing, one sentence each."""
    minimal_filesystem: bool = False
    """Programs see a root holding only the interpreter, its standard library, /usr/bin and /usr/lib, a few
    public /etc files and their working directory: no host files (home directories, checkouts, datasets,
    installed packages unless ``site=True``, /tmp, socket files under /run)."""
    shared_memory_capped: bool = False
    """System V shared memory, message queues and semaphores and POSIX message queues are disabled in
    the job's IPC namespace (their pages would escape the address-space limit)."""
    keyring_isolation: bool = False
    """Each job starts with an empty session keyring and its uid's user keyrings cleared."""
    seccomp_filter: bool = False
    """A syscall filter refuses keyctl, unshare, setns, mount, ptrace, bpf, perf_event_open, userfaultfd,
    io_uring, memfd_create, AF_VSOCK sockets and clone() with namespace flags (so memfd memory cannot
    escape the cap, and a job in a virtual machine cannot reach the host over vsock)."""
    memory_cgroup: bool = False
    """Memory is also accounted by a cgroup (page cache, kernel memory). Not implemented: the limits above
    are per process (RLIMIT_AS) plus the zero IPC limits, fd limit and the seccomp filter."""

    @property
    def all_active(self) -> bool:
        """Every protection this implementation offers is on (``memory_cgroup`` is not one of them)."""
        return all(active for _, active in self._rows())

    def _rows(self) -> list[tuple[str, bool]]:
        return [
            ("unprivileged uid (process limit binds, parent and checker cannot be signalled)",
             self.unprivileged_uid),
            ("pid namespace (no descendant outlives its job)", self.pid_namespace),
            ("read-only filesystem outside the working directory", self.filesystem_isolation),
            ("minimal filesystem view (no host files, datasets or sockets)", self.minimal_filesystem),
            ("IPC namespace (System V IPC objects die with the job)", self.ipc_namespace),
            ("shared memory and message queues disabled (memory stays under the cap)",
             self.shared_memory_capped),
            ("network namespace (no network)", self.network_isolation),
            ("interpreter readable by the sandbox uid", self.interpreter_readable),
            ("fresh kernel keyrings per job", self.keyring_isolation),
            ("seccomp syscall filter (keyctl, unshare, mount, ptrace, bpf, memfd_create, ...)",
             self.seccomp_filter),
        ]  # fmt: skip

    def summary(self) -> str:
        lines = [f"{'on ' if active else 'OFF'} {name}" for name, active in self._rows()]
        lines.append(
            "--- memory cgroup: not used (per-process address-space limit, zero IPC limits, fd limit and "
            "the seccomp filter bound a job's memory instead)"
        )
        return "\n".join(lines + [f"note: {note}" for note in self.notes])


_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\x1b``, ``\\r``, ``\\u202e``...), newlines and tabs
    kept: program output shown in reports cannot move a terminal's cursor, recolour it, retitle it or
    reorder the text a reader sees."""
    return _UNPRINTABLE.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)
