"""What a sandboxed run may use (:class:`SandboxLimits`), how it ended (:class:`SandboxResult`), and
which protections this machine gives (:class:`SandboxCapabilities`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from agentboost.errors import ConfigError, SandboxError

__all__ = ["SandboxError"]  # re-exported: it lives in agentboost.errors


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
    """Killed at the wall-clock timeout, or at the CPU-time limit."""
    MEMORY_EXCEEDED = "memory_exceeded"
    """The program ran out of its address space (MemoryError or an allocation failure)."""
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

    @property
    def ok(self) -> bool:
        return self.status is SandboxStatus.OK

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated


@dataclass(frozen=True)
class SandboxCapabilities:
    """Which protections the sandbox gives on this machine. Resource limits (CPU, address space, file
    size, processes, no core dumps), a scrubbed environment, a private working directory and a wall-clock
    timeout that kills the whole job always apply; the fields below depend on privileges and the kernel."""

    running_as_root: bool
    unprivileged_uid: bool
    """Programs run under a uid of their own, not root: the process limit binds, files of other users
    stay out of reach, and signalling the parent fails."""
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

    @property
    def all_active(self) -> bool:
        return all(
            (
                self.unprivileged_uid,
                self.pid_namespace,
                self.filesystem_isolation,
                self.ipc_namespace,
                self.network_isolation,
                self.interpreter_readable,
            )
        )

    def summary(self) -> str:
        lines = [
            f"{'on ' if active else 'OFF'} {name}"
            for name, active in (
                ("unprivileged uid (process limit binds, parent cannot be signalled)", self.unprivileged_uid),
                ("pid namespace (no descendant outlives its job)", self.pid_namespace),
                ("read-only filesystem outside the working directory", self.filesystem_isolation),
                ("IPC namespace (System V IPC objects die with the job)", self.ipc_namespace),
                ("network namespace (no network)", self.network_isolation),
                ("interpreter readable by the sandbox uid", self.interpreter_readable),
            )
        ]
        return "\n".join(lines + [f"note: {note}" for note in self.notes])
