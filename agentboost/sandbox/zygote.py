"""The sandbox worker ("zygote"): a warm interpreter that forks one fresh, locked-down process per job.

:class:`~agentboost.sandbox.pool.SandboxPool` starts it as ``python -I [-S] zygote.py CONFIG`` with a
scrubbed environment, then sends it jobs over a Unix socket. It imports nothing outside the standard
library: the interpreter it runs in is the interpreter the untrusted programs get.

One job, as root (the normal case on our machines and in CI)::

    zygote ──fork──> init    pid 1 of a new pid namespace; a new mount namespace with a tmpfs working
      (waits,           │    directory, /proc showing only the job, everything else read-only
       kills on         └──fork──> program   rlimits (CPU, address space, file size, processes, core),
       timeout)                              an unprivileged uid of its own, no_new_privs; runs the code

The zygote itself lives in an empty network namespace, which its jobs inherit (see ``Zygote.__init__``).
The program process is what a bare ``python -c CODE`` would be, except that it is forked from this warm
interpreter instead of started from scratch (no interpreter start-up on the critical path). When it
exits, init reports its status and exits, and the kernel kills everything left in the pid namespace:
no descendant outlives its job. Job contents (code, files, stdin) never pass through the zygote, so no
job can find another job's data in the memory it inherits.

The program's uid cannot traverse directories such as /root (mode 0700), where the interpreter may be
installed (pyenv): in the job's mount namespace such a directory is covered by an empty tmpfs and only
the interpreter's own directories are bind-mounted back, so the standard library stays importable.

Without root, or where the kernel refuses a namespace, the matching protection is skipped and
reported: the zygote probes every step once at start-up and reports what works in its hello message.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import ctypes
import errno
import fcntl
import gc
import io
import json
import linecache
import os
import resource
import select
import shutil
import signal
import socket
import stat
import struct
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable

# --- protocol: 4-byte big-endian length, then a JSON object ----------------------------------------

HEADER = struct.Struct(">I")
JOB_FDS = 4
"""File descriptors sent with each job: payload pipe (read), stdin (read), stdout and stderr (write)."""
STEPS = (
    "pid_namespace",
    "mount_namespace",
    "ipc_namespace",
    "network_namespace",
    "unprivileged_uid",
    "interpreter_readable",
)
"""Protection steps the probe tries; the hello message reports which of them work here."""
LOST = {
    "pid_namespace": "programs see the host's processes, and a descendant that leaves the job's process "
    "group can outlive the job",
    "mount_namespace": "programs can write wherever their uid may (such as /tmp), and the working "
    "directory has no size limit",
    "ipc_namespace": "System V shared memory, semaphores and message queues a program creates outlive "
    "its job and are visible to other jobs",
    "network_namespace": "programs can reach the network",
    "interpreter_readable": "programs can import only the modules the worker preloaded",
}
"""What is lost when a step is unavailable, for the capability notes."""


def encode_message(message: dict) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return HEADER.pack(len(body)) + body


# --- Linux system calls Python 3.10/3.11 do not wrap -------------------------------------------------

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38

_libc = ctypes.CDLL(None, use_errno=True)
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _unshare(flags: int, what: str) -> None:
    _check(_libc.unshare(flags), what)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def encode(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    _check(
        _libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), f"mount {target}"
    )


def _mount_setattr(path: str, recursive: bool, attr_set: int, attr_clr: int) -> None:
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    result = _libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.c_uint(AT_RECURSIVE if recursive else 0),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(0 if result == 0 else -1, f"mount_setattr {path}")


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, value, 0, 0, 0), f"prctl {option}")


# --- the zygote --------------------------------------------------------------------------------------


class Zygote:
    """Serves jobs one at a time. ``config`` comes from SandboxPool (see ``pool._start_zygote``)."""

    def __init__(self, config: dict) -> None:
        self.sock = socket.socket(fileno=config["sock_fd"])
        self.sock.setblocking(True)
        self.tmp_dir = config["tmp_dir"]
        self.mount_point: str = config["mount_point"]  # see _workdir; the pool creates and removes it
        self.root = os.geteuid() == 0
        self.uid, self.lock_fd = self._claim_uid(config) if self.root else (os.getuid(), None)
        self.expose = _inaccessible_interpreter_paths() if self.root else {}
        self.self_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.steps: dict[str, bool] = config.get("steps") or {}
        self.notes: dict[str, str] = config.get("notes") or {}
        # One empty network namespace per zygote, entered once: creating one per job costs 2-5 ms. Jobs
        # run one at a time and cannot configure it (no CAP_NET_ADMIN), so nothing passes between them.
        # Jobs that ask for the network go back to the host's namespace.
        self.host_net = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _unshare(CLONE_NEWNET, "unshare(CLONE_NEWNET)")
            self.network_error = ""
        except OSError as error:
            self.network_error = _unavailable("network_namespace", error)

    # -- start-up

    @staticmethod
    def _claim_uid(config: dict) -> tuple[int, int]:
        """Lock one uid of the range for this zygote's lifetime: no two running jobs ever share a uid."""
        lock_dir = config["lock_dir"]
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        info = os.lstat(lock_dir)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
            raise RuntimeError(f"{lock_dir} must be a directory owned by root with mode 0700")
        for uid in range(config["uid_base"], config["uid_base"] + config["uid_count"]):
            fd = os.open(os.path.join(lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return uid, fd
        raise RuntimeError(f"all {config['uid_count']} sandbox uids from {config['uid_base']} are in use")

    def probe(self) -> None:
        """Try every protection step once in a throw-away job and keep those that work."""
        if self.steps:  # already probed by an earlier zygote of this pool
            return
        self.steps = dict.fromkeys(STEPS, True)
        if not self.root:
            self.steps["unprivileged_uid"] = False
            self.notes["unprivileged_uid"] = (
                f"not running as root: programs run as this user (uid {self.uid}), may write wherever it "
                "can, and RLIMIT_NPROC counts all of this user's processes"
            )
        results = self._run_job({"job": 0, **PROBE_LIMITS}, _probe_fds(), probe=True)
        for name, reason in results.get("failed", {}).items():
            self.steps[name] = False
            self.notes[name] = reason
        if "setup_error" in results:
            raise RuntimeError(f"the sandbox cannot run programs here: {results['setup_error']}")

    def _network_step(self) -> None:
        self.steps["network_namespace"] = not self.network_error
        self.notes.pop("network_namespace", None)
        if self.network_error:
            self.notes["network_namespace"] = self.network_error

    def serve(self) -> None:
        self.probe()
        self._network_step()
        hello = {"pid": os.getpid(), "uid": self.uid, "root": self.root, "steps": self.steps}
        self.sock.sendall(encode_message({**hello, "notes": self.notes}))
        while True:
            received = _receive(self.sock)
            if received is None:
                return  # the pool closed the socket
            message, fds = received
            if message.get("op") != "run" or len(fds) != JOB_FDS:
                for fd in fds:
                    os.close(fd)
                continue  # a kill request for a job that already ended
            report = self._run_job(message, fds, probe=False)
            try:
                self.sock.sendall(encode_message(report))
            except OSError:
                return  # the pool is gone
            if report.get("pool_gone"):
                return

    # -- one job

    def _workdir(self, probe: bool) -> tuple[str, bool]:
        """The job's working directory, and whether it must be removed after the job.

        With a mount namespace it is only a mount point on the host (each job mounts a tmpfs of its own
        over it, gone with the job), so one directory serves every job of this zygote: creating and
        removing a directory per job costs milliseconds on some file systems."""
        if not probe and self.steps["mount_namespace"]:
            return self.mount_point, False
        path = tempfile.mkdtemp(prefix="agentboost-sandbox-", dir=self.tmp_dir)
        if self.root and (probe or self.steps["unprivileged_uid"]):
            os.chown(path, self.uid, self.uid)
        return path, True

    def _run_job(self, job: dict, fds: list[int], probe: bool) -> dict:
        status_r, status_w = os.pipe()
        workdir, temporary = self._workdir(probe)
        steps = dict.fromkeys(STEPS, True) if probe else self.steps
        report: dict = {"job": job["job"], "timed_out": False, "killed": False, "pool_gone": False}
        started = time.monotonic()
        try:
            pid = self._fork_init(steps["pid_namespace"])
        except OSError as error:
            if not probe:  # fork failed (out of memory or processes): this job fails, the zygote lives on
                for fd in (*fds, status_w, status_r):
                    os.close(fd)
                if temporary:
                    shutil.rmtree(workdir, ignore_errors=True)
                return {**report, "duration_s": 0.0, "setup_error": f"could not start the job: {error}"}
            report["failed"] = {"pid_namespace": _unavailable("pid_namespace", error)}
            steps = {**steps, "pid_namespace": False}
            pid = os.fork()
        if pid == 0:
            code = SETUP_FAILED
            try:
                code = _init_main(self, job, fds, status_w, workdir, steps, probe)
            finally:
                os._exit(code)
        for fd in (*fds, status_w):
            os.close(fd)
        self._supervise(pid, job, report)
        report["duration_s"] = time.monotonic() - started
        status = _read_status(status_r)
        report.setdefault("failed", {}).update(status.pop("failed", {}))
        report.update(status)
        os.close(status_r)
        if temporary:
            shutil.rmtree(workdir, ignore_errors=True)
        return report

    def _fork_init(self, pid_namespace: bool) -> int:
        """Fork the job's init process, as pid 1 of a new pid namespace when that step is on."""
        gc.freeze()  # collections in the child then leave the zygote's objects (and their pages) alone
        if not pid_namespace:
            return os.fork()
        _unshare(CLONE_NEWPID, "unshare(CLONE_NEWPID)")
        pid = os.fork()
        if pid != 0:  # back to our own pid namespace for the next job's fork
            _check(_libc.setns(self.self_pid_ns, CLONE_NEWPID), "setns(own pid namespace)")
        return pid

    def _supervise(self, pid: int, job: dict, report: dict) -> None:
        """Wait for the job's init, killing it on timeout or when the pool asks; then reap it."""
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(self.sock, select.POLLIN)
        deadline = time.monotonic() + job["timeout_s"]
        listening = True
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                report["timed_out"] = True
                _kill_job(pid)
                remaining = 3600.0
            ready = {fd for fd, _ in poller.poll(remaining * 1000)}
            if pidfd in ready:
                break
            if listening and self.sock.fileno() in ready:
                received = _receive(self.sock)
                if received is None:  # the pool is gone: stop the job, then exit
                    report["pool_gone"] = True
                    listening = False
                    poller.unregister(self.sock)
                    _kill_job(pid)
                    continue
                message, fds = received
                for fd in fds:
                    os.close(fd)
                if message.get("op") == "kill" and message.get("job") == job["job"]:
                    report["killed"] = True
                    _kill_job(pid)
        # init has exited but is not reaped yet, so its pid (and process group id) cannot be reused:
        # killing the group now reaches whatever the program left behind outside a pid namespace.
        _kill_job(pid)
        os.close(pidfd)
        os.waitpid(pid, 0)


PROBE_LIMITS = {
    "timeout_s": 10.0,
    "cpu_time_s": 5,
    "memory_mb": 256,
    "file_size_mb": 1,
    "max_processes": 8,
    "disk_mb": 1,
    "network": False,
}


def _probe_fds() -> list[int]:
    payload_r, payload_w = os.pipe()
    os.write(payload_w, b'{"code": "", "files": {}}')
    os.close(payload_w)
    null_in = os.open(os.devnull, os.O_RDONLY)
    return [payload_r, null_in, os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY)]


def _kill_job(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)


def _receive(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """One message and the file descriptors sent with it; None at end of stream."""
    header, fds = b"", []
    while len(header) < HEADER.size:
        data, new_fds, _, _ = socket.recv_fds(sock, HEADER.size - len(header), JOB_FDS)
        fds.extend(new_fds)
        if not data:
            for fd in fds:
                os.close(fd)
            return None
        header += data
    (length,) = HEADER.unpack(header)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            return None
        body += chunk
    return json.loads(body), fds


def _read_status(fd: int) -> dict:
    """Collect the lines init and the program wrote to the status pipe (see ``_status``)."""
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:  # a writer survived outside a pid namespace: take what is there
            break
        if not chunk:
            break
        data += chunk
    report: dict = {}
    for line in data.decode(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "failed" in entry:
            report.setdefault("failed", {}).update(entry["failed"])
        else:
            report.update(entry)
    return report


def _status(entry: dict) -> None:
    os.write(STATUS_FD, (json.dumps(entry) + "\n").encode())


# --- init: pid 1 of the job ------------------------------------------------------------------------

STATUS_FD = 3
PAYLOAD_FD = 4
SETUP_FAILED = 125


class _Steps:
    """Runs protection steps: in a probe, a failing step is recorded and skipped; in a job, it is fatal."""

    def __init__(self, enabled: dict[str, bool], probe: bool) -> None:
        self.enabled = enabled
        self.probe = probe
        self.failed: dict[str, str] = {}

    def run(self, name: str, action: Callable[..., object], *args: object) -> None:
        if not self.enabled.get(name, False) or name in self.failed:
            return
        try:
            action(*args)
        except OSError as error:
            if not self.probe:
                raise
            self.failed[name] = _unavailable(name, error)


def _unavailable(step: str, error: OSError) -> str:
    return f"{step.replace('_', ' ')} unavailable ({error}): {LOST[step]}"


def _init_main(
    zygote: Zygote, job: dict, fds: list[int], status_w: int, workdir: str, enabled: dict, probe: bool
) -> int:
    """Body of the job's init process; returns its exit code. Runs as root when the zygote does."""
    payload_r, stdin_r, stdout_w, stderr_w = fds
    try:
        # A process group of its own for killpg. Not a session: the zygote already has one without a
        # controlling terminal, and a new session per job costs ~4 ms (a scheduler autogroup each).
        os.setpgid(0, 0)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the zygote died: so does the job
        if job["network"] and not zygote.network_error:
            _check(_libc.setns(zygote.host_net, CLONE_NEWNET), "setns(host network namespace)")
        for target, fd in ((0, stdin_r), (1, stdout_w), (2, stderr_w), (STATUS_FD, status_w)):
            os.dup2(fd, target)
        os.dup2(payload_r, PAYLOAD_FD)
        os.closerange(PAYLOAD_FD + 1, 1 << 20)
        with os.fdopen(PAYLOAD_FD, "rb") as payload_file:
            payload = json.loads(payload_file.read())
        steps = _Steps(enabled, probe)
        steps.run("ipc_namespace", _unshare, CLONE_NEWIPC, "unshare(CLONE_NEWIPC)")  # freed with the job
        steps.run("mount_namespace", _private_filesystem, zygote, workdir, job, enabled["pid_namespace"])
        if steps.failed:
            _status({"failed": steps.failed})
    except OSError as error:
        _status({"setup_error": f"sandbox set-up failed: {error}"})
        return SETUP_FAILED
    program = os.fork()
    if program == 0:
        code = SETUP_FAILED
        try:
            code = _program_main(zygote, job, payload, workdir, enabled, probe)
        finally:
            os._exit(code)
    _, wait_status, usage = os.wait4(program, 0)
    _status(
        {"wait_status": wait_status, "cpu_s": usage.ru_utime + usage.ru_stime, "max_rss_kb": usage.ru_maxrss}
    )
    return 0


def _private_filesystem(zygote: Zygote, workdir: str, job: dict, pid_namespace: bool) -> None:
    """A private mount namespace: every mount read-only except a fresh tmpfs at ``workdir``."""
    _unshare(CLONE_NEWNS, "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates to the host
    _expose_interpreter(zygote.expose)
    if pid_namespace:  # /proc shows this job's processes only
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount_setattr("/", True, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0)
    owner = f",uid={zygote.uid},gid={zygote.uid}" if zygote.root else ""
    _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={job['disk_mb']}m,mode=0700{owner}")


def _expose_interpreter(expose: dict[str, list[str]]) -> None:
    """Hide each directory the program's uid cannot traverse behind an empty tmpfs, then bind the
    interpreter's own directories back inside it, so the stdlib stays importable and nothing else shows.
    """
    for hidden, keep in expose.items():
        handles = [os.open(path, os.O_PATH | os.O_CLOEXEC) for path in keep]
        _mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        for path, handle in zip(keep, handles, strict=True):
            os.makedirs(path, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{handle}", path, None, MS_BIND | MS_REC)
            os.close(handle)


def _inaccessible_interpreter_paths() -> dict[str, list[str]]:
    """The interpreter directories an unprivileged uid could not reach, grouped by the highest
    ancestor that blocks it (for example ``{"/root": ["/root/.pyenv/versions/3.11.7"]}``)."""
    wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    wanted.update(path for path in sys.path if path)
    wanted.add(os.path.dirname(sys.executable))
    real = sorted({os.path.realpath(path) for path in wanted if os.path.exists(path)})
    roots = [path for path in real if not any(path.startswith(other + os.sep) for other in real)]
    expose: dict[str, list[str]] = {}
    for path in roots:
        ancestor = "/"
        for part in path.strip("/").split("/")[:-1]:
            ancestor = os.path.join(ancestor, part)
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                expose.setdefault(ancestor, []).append(path)
                break
    return expose


# --- the program process ---------------------------------------------------------------------------


def _program_main(zygote: Zygote, job: dict, payload: dict, workdir: str, enabled: dict, probe: bool) -> int:
    try:
        steps = _Steps(enabled, probe)
        megabyte = 1 << 20
        limits = {
            resource.RLIMIT_CORE: 0,
            resource.RLIMIT_CPU: job["cpu_time_s"],
            resource.RLIMIT_AS: job["memory_mb"] * megabyte,
            resource.RLIMIT_FSIZE: job["file_size_mb"] * megabyte,
            resource.RLIMIT_NPROC: job["max_processes"],
        }
        for which, value in limits.items():
            # CPU: SIGXCPU at the soft limit (a signal that names the cause), SIGKILL a second later
            resource.setrlimit(which, (value, value + 1 if which == resource.RLIMIT_CPU else value))
        if zygote.root:
            steps.run("unprivileged_uid", _drop_privileges, zygote.uid)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid binaries, no file capabilities
        _prctl(PR_SET_DUMPABLE, 1)  # a normal process again after setuid: /proc/self stays readable
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by setuid: set it again
        if probe:
            steps.run("interpreter_readable", _check_interpreter_readable)
            if steps.failed:
                _status({"failed": steps.failed})
        os.chdir(workdir)
        _write_files(payload["files"])
    except OSError as error:
        _status({"setup_error": f"sandbox set-up failed: {error}"})
        return SETUP_FAILED
    os.close(STATUS_FD)
    os.environ.clear()
    os.environ.update(
        PATH="/usr/local/bin:/usr/bin:/bin",
        LANG="C.UTF-8",
        HOME=workdir,
        TMPDIR=workdir,
        PWD=workdir,
        PYTHONDONTWRITEBYTECODE="1",
    )
    return run_program(payload["code"])


def _drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _check_interpreter_readable() -> None:
    for path in sys.path:
        if path and os.path.isdir(path):
            os.listdir(path)


def _write_files(files: dict[str, str]) -> None:
    for name, content in files.items():
        path = os.path.normpath(name)
        if os.path.isabs(path) or path.split(os.sep)[0] == "..":
            raise OSError(errno.EINVAL, f"file name {name!r} leaves the working directory")
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as file:
            file.write(content)


def run_program(code: str) -> int:
    """Run ``code`` as ``python -c`` would: a fresh ``__main__``, tracebacks to stderr, exit code 1 on an
    uncaught exception. Source lines appear in tracebacks (the code is registered with linecache)."""
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    sys.argv = ["-c"]
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    linecache.cache["<string>"] = (len(code), None, code.splitlines(True), "<string>")
    exit_code = 0
    try:
        compiled = compile(code, "<string>", "exec")
    except SyntaxError as error:  # printed without a traceback, as python -c does
        _print_exception(error.with_traceback(None))
        exit_code = 1
    else:
        try:
            exec(compiled, main.__dict__)
        except SystemExit as exit_request:
            exit_code = _exit_code(exit_request)
        except BaseException as error:
            _print_exception(error.with_traceback(error.__traceback__.tb_next))  # type: ignore[union-attr]
            exit_code = 1
    return _finish(exit_code)


def _print_exception(error: BaseException) -> None:
    """Like the interpreter, through sys.excepthook; the default hook is replaced by the traceback
    module's, which (unlike the C one in 3.11) shows source lines of ``<string>`` from linecache."""
    if sys.excepthook is sys.__excepthook__:
        traceback.print_exception(type(error), error, error.__traceback__)
    else:
        sys.excepthook(type(error), error, error.__traceback__)


def _exit_code(exit_request: SystemExit) -> int:
    if exit_request.code is None:
        return 0
    if isinstance(exit_request.code, int):
        return exit_request.code & 0xFF
    print(exit_request.code, file=sys.stderr)
    return 1


def _finish(exit_code: int) -> int:
    """What the interpreter does at exit: join non-daemon threads, run atexit handlers, flush."""
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    except SystemExit as exit_request:
        exit_code = _exit_code(exit_request)
    except BaseException as error:
        _print_exception(error)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            exit_code = exit_code or 120
    return exit_code


def main() -> None:
    config = json.loads(sys.argv[1])
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the pool's process died: so do we
    if os.getppid() != config["parent_pid"]:
        return
    for name in config["preload"]:  # warm imports every job inherits for free
        with contextlib.suppress(ImportError):
            __import__(name)
    Zygote(config).serve()


if __name__ == "__main__":
    main()
