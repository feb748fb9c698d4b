"""The sandbox worker ("zygote"): a warm interpreter that forks one fresh, locked-down process per job.

:class:`~agentboost.sandbox.pool.SandboxPool` starts it as ``python -I [-S] zygote.py CONFIG`` with a
scrubbed environment, then sends it jobs over a Unix socket. It imports nothing outside the standard
library: the interpreter it runs in is the interpreter the untrusted programs get.

One job, as root (the normal case on our machines and in CI)::

    zygote ──fork──> init    pid 1 of a new pid namespace; a new IPC namespace with every System V and
      (waits,           │    POSIX-queue limit at zero; a copy of the zygote's minimal root (below)
       kills on         │    with a fresh tmpfs at /job and a /proc showing only the job
       timeout)         ├──fork──> checker   (only for graded runs) trusted test code under a second uid,
                        │                    talking to the program over a socket; writes the verdict
                        └──fork──> program   rlimits (CPU, address space, file size, processes, open
                                             files, message queues, core), an unprivileged uid of its
                                             own, no_new_privs, fresh keyrings, a seccomp filter

The minimal root is built once per zygote: an empty read-only tmpfs holding only what a Python program
needs, bind-mounted read-only from the host: the interpreter, its standard library (site-packages
hidden unless the pool asked for them), /usr/bin and /usr/lib, a few public files of /etc, five device
nodes. Host files (/root, /home, /work, /tmp, /run with its sockets, datasets, checkouts) are not in it.

The zygote itself lives in an empty network namespace, which its jobs inherit (see ``Zygote.__init__``).
The program process is what a bare ``python -c CODE`` would be, except that it is forked from this warm
interpreter instead of started from scratch (no interpreter start-up on the critical path). When it
exits, init reports its status and exits, and the kernel kills everything left in the pid namespace:
no descendant outlives its job. Job contents (code, files, stdin, test code) never pass through the
zygote or init, so no job can find another job's data, or its own tests, in the memory it inherits.

Without root, or where the kernel refuses a namespace or a filter, the matching protection is skipped
and reported: the zygote probes every step once at start-up and reports what works in its hello message.
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
"""File descriptors sent with each job: payload pipe (read), stdin (read), stdout and stderr (write);
a graded job (``"checker": true``) adds a fifth, the checker's payload pipe (read)."""
MAX_JOB_FDS = JOB_FDS + 1
JOB_DIR = "/job"
"""The working directory of every job inside the minimal root."""
STEPS = (
    "pid_namespace",
    "mount_namespace",
    "minimal_filesystem",
    "ipc_namespace",
    "ipc_limits",
    "network_namespace",
    "unprivileged_uid",
    "interpreter_readable",
    "keyring_isolation",
    "seccomp_filter",
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
    "minimal_filesystem": "programs see the host's files read-only (world-readable datasets, checkouts and "
    "socket files included)",
    "ipc_limits": "System V shared memory and message queues are not capped by the memory limit",
    "interpreter_readable": "programs can import only the modules the worker preloaded",
    "keyring_isolation": "kernel keys a program adds can be read by a later job of the same worker",
    "seccomp_filter": "programs may call keyctl, unshare, mount, ptrace, bpf, memfd_create, io_uring and "
    "other system calls they have no business making (kernel attack surface; memfd memory is uncapped)",
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
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
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


MNT_DETACH = 0x2
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR = 1, 7
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5
NAMESPACE_FLAGS = 0x7E020000
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: clone() may create none of them."""

# System calls an untrusted program has no business making, with their numbers on x86_64 and aarch64:
# other processes, namespaces and mounts, kernel keyrings (not namespaced), kernel attack surface (bpf,
# perf, userfaultfd, io_uring), anonymous memory files (outside the address-space limit), the machine.
# clone and clone3 are filtered separately (see _seccomp_program).
_SYSCALL_TABLE = """
ptrace                101  117
process_vm_readv      310  270
process_vm_writev     311  271
kcmp                  312  272
pidfd_getfd           438  438
process_madvise       440  440
unshare               272   97
setns                 308  268
mount                 165   40
umount2               166   39
pivot_root            155   41
chroot                161   51
open_tree             428  428
move_mount            429  429
fsopen                430  430
fsconfig              431  431
fsmount               432  432
fspick                433  433
mount_setattr         442  442
name_to_handle_at     303  264
open_by_handle_at     304  265
keyctl                250  219
add_key               248  217
request_key           249  218
bpf                   321  280
perf_event_open       298  241
userfaultfd           323  282
io_uring_setup        425  425
io_uring_enter        426  426
io_uring_register     427  427
memfd_create          319  279
memfd_secret          447  447
kexec_load            246  104
kexec_file_load       320  294
init_module           175  105
finit_module          313  273
delete_module         176  106
reboot                169  142
swapon                167  224
swapoff               168  225
acct                  163   89
quotactl              179   60
syslog                103  116
vhangup               153   58
settimeofday          164  170
clock_settime         227  112
clock_adjtime         305  266
lookup_dcookie        212   18
nfsservctl            180   42
fanotify_init         300  262
move_pages            279  239
migrate_pages         256  238
clone                  56  220
clone3                435  435
"""
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYSCALLS = {
    machine: {row.split()[0]: int(row.split()[column]) for row in _SYSCALL_TABLE.strip().splitlines()}
    for column, machine in ((1, "x86_64"), (2, "aarch64"))
}
_SOCKET = {"x86_64": 41, "aarch64": 198}
AF_VSOCK = 40
_MACHINE = os.uname().machine
_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(_MACHINE)
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(_MACHINE)


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _seccomp_program() -> ctypes.Array[_SockFilter]:
    """A classic-BPF seccomp filter: EPERM for the denied calls and for clone() with namespace flags,
    ENOSYS for clone3() (its flags are out of the filter's reach; libc falls back to clone), kill for
    another architecture's calling convention, allow the rest."""
    if _MACHINE not in _SYSCALLS:
        raise OSError(errno.ENOSYS, f"no seccomp syscall table for {_MACHINE}")
    arch, numbers = _AUDIT_ARCH[_MACHINE], _SYSCALLS[_MACHINE]
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    code: list[tuple[int, int, int, int]] = [
        (load, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, arch),
        (ret, 0, 0, kill),
        (load, 0, 0, 0),  # seccomp_data.nr
    ]
    if _MACHINE == "x86_64":  # the x32 ABI: same numbers plus bit 30
        code += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    for name in (name for name in numbers if name not in ("clone", "clone3")):
        code += [(jeq, 0, 1, numbers[name]), (ret, 0, 0, eperm)]
    code += [(jeq, 0, 1, numbers["clone3"]), (ret, 0, 0, enosys)]
    # socket(AF_VSOCK): in a virtual machine, a way to the hypervisor's host that no namespace covers
    code += [
        (jeq, 0, 4, _SOCKET[_MACHINE]),
        (load, 0, 0, 16),  # args[0], the address family
        (jeq, 0, 1, AF_VSOCK),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]
    code += [
        (jeq, 0, 4, numbers["clone"]),
        (load, 0, 0, 16),  # low 32 bits of args[0], the flags (little-endian)
        (jset, 0, 1, NAMESPACE_FLAGS),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
        (ret, 0, 0, allow),
    ]
    return (_SockFilter * len(code))(*(_SockFilter(c, t, f, k) for c, t, f, k in code))


_SECCOMP_FILTER: ctypes.Array[_SockFilter] | None = None


def _install_seccomp() -> None:
    global _SECCOMP_FILTER
    if _SECCOMP_FILTER is None:
        _SECCOMP_FILTER = _seccomp_program()
    program = _SockFprog(len(_SECCOMP_FILTER), _SECCOMP_FILTER)
    _check(
        _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(program), 0, 0), "seccomp filter"
    )


def _fresh_keyrings() -> None:
    """A new, empty session keyring, and this uid's user keyrings emptied: nothing a previous job (or a
    previous pool with this uid) stored is left to read."""
    if _KEYCTL is None:
        raise OSError(errno.ENOSYS, f"no keyctl syscall number for {_MACHINE}")
    keyctl = ctypes.c_long(_KEYCTL)
    if _libc.syscall(keyctl, ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_void_p(None)) < 0:
        _check(-1, "keyctl(JOIN_SESSION_KEYRING)")
    for keyring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        if _libc.syscall(keyctl, ctypes.c_long(KEYCTL_CLEAR), ctypes.c_long(keyring)) < 0:
            _check(-1, "keyctl(CLEAR)")


def _pivot_root(new_root: str) -> None:
    """Make ``new_root`` (a mount point) this mount namespace's root and detach the old root."""
    if _PIVOT_ROOT is None:
        raise OSError(errno.ENOSYS, f"no pivot_root syscall number for {_MACHINE}")
    os.chdir(new_root)
    dot = ctypes.c_char_p(b".")
    if _libc.syscall(ctypes.c_long(_PIVOT_ROOT), dot, dot) != 0:
        _check(-1, "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount2(old root)")
    os.chdir("/")


def _write_sysctl(path: str, value: str) -> None:
    with open(path, "w") as file:
        file.write(value)


IPC_LIMITS = {
    "/proc/sys/kernel/shmmni": "0",
    "/proc/sys/kernel/shmall": "0",
    "/proc/sys/kernel/msgmni": "0",
    "/proc/sys/kernel/sem": "0 0 0 0",
    "/proc/sys/fs/mqueue/queues_max": "0",
}
"""Per-IPC-namespace limits written in each job's fresh namespace: no System V shared memory, message
queues, semaphores or POSIX message queues at all (their memory is not charged to the address space)."""


def _zero_ipc_limits() -> None:
    for path, value in IPC_LIMITS.items():
        _write_sysctl(path, value)


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
        # The checker of a graded job runs under a uid of its own, so the program cannot signal, trace or
        # read it: the uid of the same slot in the range just above the programs' range.
        self.checker_uid = self.uid + config["uid_count"] if self.root else self.uid
        self.expose = _inaccessible_interpreter_paths() if self.root else {}
        self.template_ns = -1
        self.template_error = _unavailable("minimal_filesystem", OSError(errno.EPERM, "needs root"))
        if self.root:
            self.template_error = ""
            try:
                self.template_ns = _build_minimal_root(self.mount_point, self.uid, self.checker_uid)
            except OSError as error:
                self.template_error = _unavailable("minimal_filesystem", error)
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

    def _template_step(self) -> None:
        if self.template_ns < 0 and self.steps.get("minimal_filesystem"):
            self.steps["minimal_filesystem"] = False
            self.notes["minimal_filesystem"] = self.template_error or (
                "minimal filesystem unavailable (not running as root): " + LOST["minimal_filesystem"]
            )

    def _network_step(self) -> None:
        self.steps["network_namespace"] = not self.network_error
        self.notes.pop("network_namespace", None)
        if self.network_error:
            self.notes["network_namespace"] = self.network_error

    def serve(self) -> None:
        self.probe()
        self._template_step()
        self._network_step()
        hello = {"pid": os.getpid(), "uid": self.uid, "root": self.root, "steps": self.steps}
        self.sock.sendall(encode_message({**hello, "notes": self.notes}))
        while True:
            received = _receive(self.sock)
            if received is None:
                return  # the pool closed the socket
            message, fds = received
            if message.get("op") != "run" or len(fds) != JOB_FDS + bool(message.get("checker")):
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
        if not probe and self.steps["minimal_filesystem"]:
            return JOB_DIR, False
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
    "max_open_files": 64,
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
        data, new_fds, _, _ = socket.recv_fds(sock, HEADER.size - len(header), MAX_JOB_FDS)
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
CHECKER_FD = 5
CHANNEL_FD = 3
"""Where a graded program finds its socket to the checker (the status pipe's number, closed by then)."""
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
    # Every descriptor init needs goes above the fixed slots (0-5) it is about to fill, so that filling
    # one slot never closes a descriptor another slot (or the namespace set-up) still needs.
    fds = [_lift(fd) for fd in fds]
    status_w = _lift(status_w)
    template_ns = _lift(zygote.template_ns) if zygote.template_ns >= 0 else -1
    payload_r, stdin_r, stdout_w, stderr_w = fds[:JOB_FDS]
    graded = len(fds) > JOB_FDS
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
        if graded:
            os.dup2(fds[JOB_FDS], CHECKER_FD)
        steps = _Steps(enabled, probe)
        steps.run("ipc_namespace", _unshare, CLONE_NEWIPC, "unshare(CLONE_NEWIPC)")  # freed with the job
        if "ipc_namespace" in steps.failed:
            steps.failed["ipc_limits"] = _unavailable("ipc_limits", OSError(errno.EPERM, "no IPC namespace"))
        steps.run("ipc_limits", _zero_ipc_limits)
        job_dir = workdir
        if template_ns >= 0 and enabled.get("pid_namespace") and "pid_namespace" not in steps.failed:
            steps.run("minimal_filesystem", _enter_minimal_root, zygote, template_ns, job)
            if enabled.get("minimal_filesystem") and "minimal_filesystem" not in steps.failed:
                job_dir = JOB_DIR
        elif probe:
            steps.failed.setdefault("minimal_filesystem", zygote.template_error or _needs_pid_namespace())
        if job_dir != JOB_DIR:
            steps.run("mount_namespace", _private_filesystem, zygote, workdir, job, enabled["pid_namespace"])
        os.closerange((CHECKER_FD if graded else PAYLOAD_FD) + 1, 1 << 20)  # zygote sockets, namespaces
        with os.fdopen(PAYLOAD_FD, "rb") as payload_file:
            payload = json.loads(payload_file.read())
        if steps.failed:
            _status({"failed": steps.failed})
    except OSError as error:
        _status({"setup_error": f"sandbox set-up failed: {error}"})
        return SETUP_FAILED
    checker = program_channel = -1
    if graded:  # the checker first, so the program never holds the checker's payload pipe or socket end
        checker_channel, program_channel = (end.detach() for end in socket.socketpair())
        checker = os.fork()
        if checker == 0:
            code = SETUP_FAILED
            try:
                os.close(program_channel)
                code = _checker_main(zygote, job, checker_channel, enabled, probe)
            finally:
                os._exit(code)
        os.close(checker_channel)
        os.close(CHECKER_FD)
    program = os.fork()
    if program == 0:
        code = SETUP_FAILED
        try:
            code = _program_main(zygote, job, payload, job_dir, enabled, probe, program_channel)
        finally:
            os._exit(code)
    del payload
    if program_channel >= 0:
        os.close(program_channel)
    ended = _reap(program, checker)
    wait_status, usage = ended[program]
    cpu_s = usage.ru_utime + usage.ru_stime
    entry = {"wait_status": wait_status, "cpu_s": cpu_s, "max_rss_kb": usage.ru_maxrss}
    if checker > 0:
        entry["checker_wait_status"] = ended[checker][0]
    _status(entry)
    return 0


CHECKER_GRACE_S = 1.0
"""Once the checker has given its verdict, how long the program has to exit before init kills it."""


def _reap(program: int, checker: int) -> dict[int, tuple[int, resource.struct_rusage]]:
    """Wait for the program (and the checker, if any); other pids (orphans adopted by init) are ignored."""
    ended: dict[int, tuple[int, resource.struct_rusage]] = {}
    wanted = {program} | ({checker} if checker > 0 else set())
    deadline = None
    while not wanted <= ended.keys():
        if checker in ended and program not in ended:
            if deadline is None:
                deadline = time.monotonic() + CHECKER_GRACE_S
            pid, status, usage = os.wait4(program, os.WNOHANG)
            if pid == 0:
                if time.monotonic() < deadline:
                    time.sleep(0.001)
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.kill(program, signal.SIGKILL)
                pid, status, usage = os.wait4(program, 0)
        else:
            pid, status, usage = os.wait4(-1, 0)
        if pid in wanted:
            ended[pid] = (status, usage)
    return ended


def _needs_pid_namespace() -> str:
    error = OSError(errno.EPERM, "needs a pid namespace for its /proc")
    return _unavailable("minimal_filesystem", error)


def _lift(fd: int) -> int:
    """A close-on-exec duplicate of ``fd`` numbered 10 or above."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


def _enter_minimal_root(zygote: Zygote, template_ns: int, job: dict) -> None:
    """Enter a private copy of the zygote's minimal root, with this job's /proc and a fresh /job tmpfs."""
    _check(_libc.setns(template_ns, CLONE_NEWNS), "setns(minimal root)")
    _unshare(CLONE_NEWNS, "unshare(CLONE_NEWNS)")  # a copy: what this job mounts stays its own
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    owner = f",uid={zygote.uid},gid={zygote.uid}" if zygote.root else ""
    _mount("tmpfs", JOB_DIR, "tmpfs", MS_NOSUID | MS_NODEV, f"size={job['disk_mb']}m,mode=0700{owner}")


def _build_minimal_root(staging: str, uid: int, checker_uid: int) -> int:
    """Build the root jobs see, in a mount namespace of its own, and return a handle on that namespace.

    The zygote enters a new mount namespace, mounts an empty tmpfs at ``staging``, binds into it, read-only,
    what a Python program needs, pivots into it and returns to the host's namespace: the namespace lives
    on through the returned file descriptor, and each job enters a copy of it."""
    host = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _unshare(CLONE_NEWNS, "unshare(CLONE_NEWNS)")
        template = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            _mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            _populate_root(staging, uid, checker_uid)
            _mount_setattr(staging, True, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0)
            _pivot_root(staging)
        except OSError:
            os.close(template)
            raise
    finally:
        try:
            _check(_libc.setns(host, CLONE_NEWNS), "setns(host mount namespace)")
        finally:
            os.close(host)
    return template


SYSTEM_DIRS = ("/usr/bin", "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32", "/usr/share/zoneinfo")
"""Host directories in the minimal root: programs, shared libraries (the interpreter's and its extension
modules'), time zones. Top-level links such as /bin -> usr/bin are copied as links."""
TOP_LEVEL = ("bin", "lib", "lib64", "lib32", "libx32", "sbin")
ETC_FILES = (
    "hosts", "resolv.conf", "nsswitch.conf", "services", "protocols", "ld.so.cache", "localtime", "ssl",
    "ca-certificates", "ca-certificates.conf", "mime.types",
)  # fmt: skip
"""Public configuration bound from the host's /etc (name resolution, the linker cache, TLS roots)."""
DEVICES = ("null", "zero", "full", "random", "urandom")
PACKAGE_DIRS = ("site-packages", "dist-packages")


def _populate_root(root: str, uid: int, checker_uid: int) -> None:
    def inside(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    def bind(source: str, target: str) -> None:
        destination = inside(target)
        if os.path.isdir(source):
            os.makedirs(destination, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(destination), mode=0o755, exist_ok=True)
            if not os.path.lexists(destination):
                os.close(os.open(destination, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        _mount(source, destination, None, MS_BIND | MS_REC)

    bound: list[str] = []
    for name in TOP_LEVEL:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), inside(host))
        elif os.path.isdir(host) and name != "sbin":
            bind(host, host)
            bound.append(host)
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # such as /usr/lib64 -> lib on some distributions
            os.makedirs(os.path.dirname(inside(path)), mode=0o755, exist_ok=True)
            os.symlink(os.readlink(path), inside(path))
        elif os.path.isdir(path):
            bind(path, path)
            bound.append(path)
    for path in _interpreter_paths():
        if not any(path == done or path.startswith(done + os.sep) for done in bound):
            bind(path, path)
            bound.append(path)
    # In a virtual environment sys.executable is a link (venv/bin/python) outside what was bound: make the
    # same path lead to the real interpreter, so a program can start `sys.executable` as a subprocess.
    if os.path.islink(sys.executable) and not os.path.lexists(inside(sys.executable)):
        os.makedirs(os.path.dirname(inside(sys.executable)), mode=0o755, exist_ok=True)
        os.symlink(os.path.realpath(sys.executable), inside(sys.executable))
    # Installed packages (and the data files they ship, datasets included) stay hidden unless the pool was
    # started with site=True, which puts their directories on sys.path.
    wanted = {os.path.realpath(path) for path in sys.path if path}
    for directory in bound:
        for parent, names, _ in os.walk(directory):  # lib/python3.X/site-packages, lib/python3/dist-...
            for name in names:
                path = os.path.join(parent, name)
                if name in PACKAGE_DIRS and os.path.realpath(path) not in wanted:
                    _mount("tmpfs", inside(path), "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=0755")
            if parent != directory:
                names.clear()
    etc = inside("/etc")
    os.makedirs(etc, mode=0o755)
    for name in ETC_FILES:
        host = os.path.join("/etc", name)
        if os.path.islink(host) and name == "localtime":
            os.symlink(os.readlink(host), os.path.join(etc, name))
        elif os.path.exists(host):
            bind(os.path.realpath(host), host)
    users = {"root": 0, "sandbox": uid, "checker": checker_uid, "nobody": 65534}
    with open(os.path.join(etc, "passwd"), "w") as passwd:
        passwd.writelines(f"{name}:x:{id_}:{id_}::{JOB_DIR}:/bin/sh\n" for name, id_ in users.items())
    with open(os.path.join(etc, "group"), "w") as group:
        group.writelines(f"{name}:x:{id_}:\n" for name, id_ in users.items())
    if not os.path.exists("/etc/hosts"):
        with open(os.path.join(etc, "hosts"), "w") as hosts:
            hosts.write("127.0.0.1 localhost\n::1 localhost\n")
    dev = inside("/dev")
    os.makedirs(dev, mode=0o755)
    for name in DEVICES:
        bind(os.path.join("/dev", name), os.path.join("/dev", name))
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, os.path.join(dev, name))
    for path in ("/proc", JOB_DIR):
        os.makedirs(inside(path), mode=0o755)


def _interpreter_paths() -> list[str]:
    """What the interpreter needs from the host: its binary's directory, the standard library, the shared
    libpython, and every sys.path entry (site-packages only when the pool asked for them)."""
    import sysconfig

    paths = {os.path.dirname(os.path.realpath(path)) for path in (sys.executable, os.__file__)}
    paths.update(os.path.realpath(path) for path in sys.path if path and os.path.exists(path))
    libdir = sysconfig.get_config_var("LIBDIR")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and os.path.isdir(libdir):
        paths.update(
            os.path.join(libdir, name) for name in os.listdir(libdir) if name.startswith("libpython")
        )
    return sorted(paths)


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


def _set_limits(job: dict, file_size_mb: int) -> None:
    megabyte = 1 << 20
    limits = {
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_CPU: job["cpu_time_s"],
        resource.RLIMIT_AS: job["memory_mb"] * megabyte,
        resource.RLIMIT_FSIZE: file_size_mb * megabyte,
        resource.RLIMIT_NPROC: job["max_processes"],
        resource.RLIMIT_NOFILE: job["max_open_files"],
        resource.RLIMIT_MSGQUEUE: 0,
    }
    for which, value in limits.items():
        # CPU: SIGXCPU at the soft limit (a signal that names the cause), SIGKILL a second later
        resource.setrlimit(which, (value, value + 1 if which == resource.RLIMIT_CPU else value))


def _lock_down(steps: _Steps, uid: int, dumpable: bool) -> None:
    """What every process running job code gets after its rlimits: its uid, no privileges, fresh keyrings,
    the syscall filter (last: it forbids keyctl)."""
    steps.run("unprivileged_uid", _drop_privileges, uid)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid binaries, no file capabilities
    _prctl(PR_SET_DUMPABLE, int(dumpable))  # the program: /proc/self readable; the checker: untraceable
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by setuid: set it again
    steps.run("keyring_isolation", _fresh_keyrings)
    steps.run("seccomp_filter", _install_seccomp)


def _program_main(
    zygote: Zygote, job: dict, payload: dict, workdir: str, enabled: dict, probe: bool, channel: int
) -> int:
    try:
        steps = _Steps(enabled if zygote.root else {**enabled, "unprivileged_uid": False}, probe)
        _set_limits(job, job["file_size_mb"])
        _lock_down(steps, zygote.uid, dumpable=True)
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
    if channel >= 0:
        os.dup2(channel, CHANNEL_FD)
        os.close(channel)
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


def _checker_main(zygote: Zygote, job: dict, channel: int, enabled: dict, probe: bool) -> int:
    """The checker of a graded job: trusted code (from the pool, never from the program) under a uid of
    its own, not traceable, reading its code and the run's secret from its own pipe. It talks to the
    program over ``channel`` and reports its verdict, with the secret, on the status pipe, which the
    program never holds."""
    try:
        _set_limits(job, 0)
        steps = _Steps(enabled if zygote.root else {**enabled, "unprivileged_uid": False}, probe)
        _lock_down(steps, zygote.checker_uid, dumpable=False)
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(null, target)
        os.close(null)
        with os.fdopen(CHECKER_FD, "rb") as payload_file:
            payload = json.loads(payload_file.read())
    except OSError as error:
        _status({"setup_error": f"sandbox set-up of the checker failed: {error}"})
        return SETUP_FAILED
    nonce = payload["nonce"]

    def report(verdict: dict) -> None:
        shortened = {key: value[:1000] if isinstance(value, str) else value for key, value in verdict.items()}
        _status({"checker": {**shortened, "nonce": nonce}})

    namespace = {"__name__": "__checker__", "__builtins__": builtins, "CHANNEL_FD": channel, "report": report}
    try:
        exec(compile(payload["code"], "<checker>", "exec"), namespace)
    except BaseException:
        report({"outcome": "checker_error", "detail": traceback.format_exc()[-1000:]})
    return 0


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
