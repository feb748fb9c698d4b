"""Hostile programs: each one is contained, reported with the right status within its timeout plus one
second, and leaves the test process (and the machine) unharmed. Run as root, as CI does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import textwrap
import tracemalloc
from pathlib import Path

from sandbox_support import needs_root, processes_of, run, sandboxed, timed

from agentboost.sandbox import SandboxLimits, SandboxPool, SandboxStatus, sandbox_capabilities

pytestmark = needs_root


def test_capabilities_are_all_active_as_root():
    capabilities = sandbox_capabilities()
    assert capabilities.running_as_root
    assert capabilities.all_active, capabilities.summary()
    assert capabilities.uid != 0
    assert "OFF" not in capabilities.summary()


def test_an_infinite_loop_times_out_and_is_killed():
    result, seconds = timed("while True:\n    pass", limits=SandboxLimits(timeout_s=1.0))
    assert result.status is SandboxStatus.TIMEOUT
    assert result.exit_code is None or result.exit_code < 0
    assert seconds < 1.0 + 1.0


def test_a_sleeping_program_is_killed_at_the_wall_clock_timeout():
    result, seconds = timed(
        "import time\nprint('start', flush=True)\ntime.sleep(60)", limits=SandboxLimits(timeout_s=0.5)
    )
    assert result.status is SandboxStatus.TIMEOUT
    assert "wall-clock limit of 0.5 s" in result.detail
    assert result.stdout == "start\n"  # output before the kill is kept
    assert seconds < 0.5 + 1.0


def test_the_cpu_time_limit_ends_a_busy_program():
    result, seconds = timed("while True:\n    pass", limits=SandboxLimits(timeout_s=5.0, cpu_time_s=1))
    assert result.status is SandboxStatus.TIMEOUT
    assert result.signal in ("SIGXCPU", "SIGKILL")
    assert "CPU-time limit of 1 s" in result.detail
    assert seconds < 5.0 + 1.0


FORK_BOMB = """\
import os, time
print(os.getuid(), flush=True)
root = os.getpid()
failures = 0
while True:
    try:
        os.fork()  # parent and child both go on forking
    except OSError:
        failures += 1
        if os.getpid() == root and failures == 30:
            print("processes", sum(name.isdigit() for name in os.listdir("/proc")), flush=True)
        time.sleep(0.01)  # keep the bomb cheap for the shared test machine
"""


def test_a_fork_bomb_is_held_to_the_process_limit_and_killed_entirely():
    limits = SandboxLimits(timeout_s=1.5, max_processes=8)
    result, seconds = timed(FORK_BOMB, limits=limits)
    assert result.status is SandboxStatus.TIMEOUT
    assert seconds < 1.5 + 1.0
    uid_line, count_line = result.stdout.splitlines()[:2]
    # /proc shows the job's pid namespace: its init (root, not counted) plus at most 8 bomb processes
    assert count_line.startswith("processes ")
    assert int(count_line.split()[1]) <= limits.max_processes + 1
    assert processes_of(int(uid_line)) == []  # nothing of the bomb survives the job


def test_a_daemonised_grandchild_dies_with_its_job():
    code = textwrap.dedent(
        """\
        import os, sys, time
        print(os.getuid(), flush=True)
        if os.fork() == 0:
            os.setsid()  # leave the process group, like a daemon
            if os.fork() == 0:
                os.closerange(0, 3)  # and stop holding the output pipes
                time.sleep(60)
            os._exit(0)
        os.wait()
        """
    )
    result, seconds = timed(code, limits=SandboxLimits(timeout_s=5.0))
    assert result.status is SandboxStatus.OK
    assert seconds < 5.0
    assert processes_of(int(result.stdout.split()[0])) == []


def test_a_memory_bomb_is_reported_as_memory_exceeded():
    # one request beyond the limit fails at once, before any memory is used: an ordinary MemoryError
    result = sandboxed("data = bytearray(4 * 1024 ** 3)", limits=SandboxLimits(memory_mb=256))
    assert result.status is SandboxStatus.RUNTIME_ERROR
    assert result.detail == "exit code 1: MemoryError" and result.peak_memory_mb < 128
    # memory actually used up to the limit is what the kernel measured: memory_exceeded
    growing = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 * 1024))"
    result, seconds = timed(growing, limits=SandboxLimits(memory_mb=256, timeout_s=5.0))
    assert result.status is SandboxStatus.MEMORY_EXCEEDED
    assert "out of memory (limit 256 MiB)" in result.detail
    assert result.peak_memory_mb >= 128
    assert seconds < 5.0 + 1.0


def test_100_megabytes_of_output_are_cut_at_the_limit_without_filling_the_parents_memory():
    code = "import sys\nline = 'x' * 999_999 + '\\n'\nfor _ in range(100):\n    sys.stdout.write(line)"
    tracemalloc.start()
    try:
        result, seconds = timed(code, limits=SandboxLimits(timeout_s=10.0, max_output_bytes=64 * 1024))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.status is SandboxStatus.OUTPUT_TRUNCATED
    assert result.stdout_truncated and not result.stderr_truncated
    assert result.stdout.startswith("x" * 1000)
    assert result.stdout.endswith("[stdout truncated: the program wrote more than 65536 bytes]")
    assert len(result.stdout) < 64 * 1024 + 100
    assert peak < 8 * 1024 * 1024  # the parent kept a 64 KiB prefix, not 100 MB
    assert seconds < 10.0


def test_a_stderr_flood_is_cut_too():
    result = sandboxed(
        "import sys\nwhile True:\n    sys.stderr.write('e' * 10000)",
        limits=SandboxLimits(max_output_bytes=1000),
    )
    assert result.status is SandboxStatus.OUTPUT_TRUNCATED
    assert result.stderr_truncated
    assert result.stderr.startswith("e" * 1000 + "\n[stderr truncated")


def test_writing_outside_the_working_directory_fails(tmp_path):
    escape = f"/tmp/agentboost-escape-{secrets.token_hex(8)}"
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text("root only")
    targets = [
        escape,
        str(tmp_path / "escape.txt"),
        "/var/tmp/agentboost-escape",
        "/dev/shm/agentboost-escape",
    ]
    code = textwrap.dedent(
        f"""\
        for path in {targets!r}:
            try:
                open(path, "w").write("escaped")
                print("WROTE", path)
            except OSError as error:
                print("blocked", path, error.strerror)
        try:
            print("READ", open({str(secret_file)!r}).read())
        except OSError as error:
            print("blocked read", error.strerror)
        open("inside.txt", "w").write("fine")
        print("inside", open("inside.txt").read())
        """
    )
    result = sandboxed(code)
    assert result.status is SandboxStatus.OK, result.stderr
    assert "WROTE" not in result.stdout and "READ" not in result.stdout
    assert result.stdout.count("blocked") == len(targets) + 1
    assert "inside fine" in result.stdout
    assert not os.path.exists(escape)
    assert not (tmp_path / "escape.txt").exists()


def test_connecting_to_a_loopback_listener_fails_without_network():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = textwrap.dedent(
            f"""\
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"hello")
                print("CONNECTED")
            except OSError as error:
                print("refused", error)
            """
        )
        result = sandboxed(code)
        assert result.status is SandboxStatus.OK, result.stderr
        assert result.network_isolated
        assert "CONNECTED" not in result.stdout and "refused" in result.stdout
        try:
            listener.accept()
            accepted = True
        except BlockingIOError:
            accepted = False
        assert not accepted
        # the same program connects when the limits allow the network: the test above is meaningful
        allowed = sandboxed(code, limits=SandboxLimits(network=True))
        assert "CONNECTED" in allowed.stdout
        assert not allowed.network_isolated


def test_the_parents_environment_is_not_visible(monkeypatch):
    secret = f"agentboost-secret-{secrets.token_hex(8)}"
    monkeypatch.setenv("AGENTBOOST_TEST_SECRET", secret)
    code = textwrap.dedent(
        f"""\
        import os
        print(dict(os.environ))
        for path in ("/proc/self/environ", "/proc/1/environ", "/proc/{os.getpid()}/environ"):
            try:
                print(path, open(path, "rb").read())
            except OSError as error:
                print(path, "blocked", error.strerror)
        """
    )
    result = sandboxed(code)
    assert result.status is SandboxStatus.OK, result.stderr
    assert secret not in result.stdout
    assert "AGENTBOOST_TEST_SECRET" not in result.stdout
    assert f"/proc/{os.getpid()}/environ blocked" in result.stdout


def test_signalling_the_parent_or_the_worker_fails():
    async def main():
        async with SandboxPool(size=1) as pool:
            [worker] = pool.worker_pids
            code = textwrap.dedent(
                f"""\
                import os, signal
                for pid in ({os.getpid()}, {worker}, -1):
                    for sig in (signal.SIGTERM, signal.SIGKILL):
                        try:
                            os.kill(pid, sig)
                            print("sent", pid, sig)
                        except OSError as error:
                            print("blocked", pid, error.strerror)
                print("still here")
                """
            )
            result = await pool.run_python(code)
            after = await pool.run_python("print('worker alive')")
            return result, after, pool.worker_pids, worker

    result, after, worker_pids, worker = run(main())
    # os.kill(-1) "succeeds" on the empty set of processes it may signal; the others fail
    assert result.stdout.count("blocked") >= 4, result.stdout
    assert "still here" in result.stdout
    assert after.stdout == "worker alive\n"
    assert worker_pids == [worker]  # the worker survived and was not replaced
    os.kill(os.getpid(), 0)  # and so did we


def test_system_v_ipc_objects_cannot_be_created_and_the_host_is_untouched():
    code = textwrap.dedent(
        """\
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        key = 0x61627374  # a fixed key another job (or the host) could look up
        print(libc.shmget(key, 4096, 0o1000 | 0o666), ctypes.get_errno())  # IPC_CREAT
        print(libc.msgget(key, 0o1000 | 0o666), ctypes.get_errno())
        print(open("/proc/sysvipc/shm").read().count("\\n") - 1)
        """
    )
    result = sandboxed(code)
    assert result.status is SandboxStatus.OK, result.stderr
    shm, msg, segments_seen = result.stdout.splitlines()
    assert shm == "-1 28" and msg == "-1 28"  # ENOSPC: the job's IPC namespace allows none
    assert segments_seen == "0"  # and the host's segments are not visible
    host_keys = [line.split()[0] for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
    assert str(0x61627374) not in host_keys


def test_setuid_binaries_and_root_files_are_out_of_reach():
    code = textwrap.dedent(
        """\
        import os, subprocess
        print(os.getuid(), os.geteuid(), os.getgroups())
        print(sorted(os.listdir("/root")))
        print(subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip())
        """
    )
    result = sandboxed(code)
    assert result.status is SandboxStatus.OK, result.stderr
    ids, root_listing, id_output = result.stdout.splitlines()
    uid, euid, groups = ids.split(" ", 2)
    assert uid == euid == id_output and uid != "0" and groups == "[]"
    assert ".bashrc" not in root_listing  # /root shows only the interpreter's own directories


def test_cancelling_a_run_kills_the_program_and_frees_the_worker():
    async def main():
        async with SandboxPool(size=1, limits=SandboxLimits(timeout_s=30.0)) as pool:
            sleeper = asyncio.ensure_future(
                pool.run_python("import os, time\nprint(os.getuid(), flush=True)\ntime.sleep(30)")
            )
            await asyncio.sleep(0.3)
            sleeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sleeper
            started = asyncio.get_running_loop().time()
            after = await pool.run_python("import os\nprint(os.getuid())")
            return after, asyncio.get_running_loop().time() - started

    after, seconds = run(main())
    assert after.status is SandboxStatus.OK
    assert seconds < 2.0  # the cancelled sleeper did not hold the worker for its 30 s
    assert processes_of(int(after.stdout)) == []


def test_a_crashed_worker_fails_its_job_and_is_replaced():
    async def main():
        async with SandboxPool(size=1, limits=SandboxLimits(timeout_s=10.0)) as pool:
            [worker] = pool.worker_pids
            job = asyncio.ensure_future(pool.run_python("import time\ntime.sleep(10)"))
            await asyncio.sleep(0.3)
            os.kill(worker, signal.SIGKILL)
            failed = await job
            after = await pool.run_python("print('ok')")
            return failed, after, pool.workers_started

    failed, after, started = run(main())
    assert failed.status is SandboxStatus.SANDBOX_ERROR
    assert "will be replaced" in failed.detail
    assert after.stdout == "ok\n"
    assert started == 2
