"""The embedded engine: Hugging Face transformers with continuous batching and a prefix cache, CPU or GPU.

Many agents share one model without blocking the event loop and without being served one by one:

- one scheduler thread owns the model; ``generate()`` only queues a request and awaits its future;
- new requests are prefilled together (left-padded) and join the running batch between decode
  steps; finished or cancelled sequences leave it; every step decodes one token for all sequences;
- each sequence keeps its KV cache for its whole generation (a left-padded batched cache with an
  attention mask, re-packed only when sequences join or leave);
- each request samples with its own CPU generator (seeded from the request, or from the OS when it has
  no seed; the global torch RNG is never touched), so its tokens do not depend on what else is in the
  batch (greedy ids and logprobs match one-by-one runs up to float rounding).

**Prefix cache** (:mod:`agentboost.engines.embedded.prefix_cache`). When a sequence finishes, the KV of every
token the model read (prompt and generated ids but the last) goes into a token-level radix tree; a new
prompt is matched against it and only the rest is prefilled: turn k of an agent prefills what was
appended since turn k-1 (plus the previous turn's last generated id, which the model sampled but never
read). Requests admitted together that share a prefix the cache lacks (the samples of a GRPO group,
tasks with one system prompt) have that prefix prefilled once, inserted, then reused. A cached prefix
sits left of a gap in the row's attention mask; positions are explicit, so the model computes the same
thing as without the cache (tested: greedy ids equal, logprobs within 1e-5 in fp32). Memory is bounded
by ``prefix_cache_bytes`` (LRU eviction of leaves) and, with the running batch's KV, by
``memory_budget_bytes``. Weight updates clear it: call
:meth:`LocalEngine.weights_updated` after changing the model (the trainer does), and in-place changes
through the parameters themselves (optimizer steps, ``load_state_dict``) are detected automatically from
their version counters; KV computed under older weights is never inserted.

**Why not transformers' own continuous batching** (``transformers.generation.continuous_batching``,
read and run with 5.10.4 on this 2-core CPU; details in docs/engines.md). It takes token ids, per-request
stop ids, per-request temperature/top-k/top-p (with ``per_request_processors``) and cancellation, and it
runs on CPU (SmolLM2-135M fp32, 16 prompts of 200 ids, 32 new tokens: 37.9 s, 13.5 tokens/s, machine at
load ~6). But it fails two contracts the trainer rests on: it samples with the global torch RNG under
one seed per manager (set with ``torch.manual_seed``), so there are no per-request seeds and a request's
tokens depend on its batch; and its log-probabilities are taken after its logits processors (after
top-k/top-p), not ``log_softmax(logits / T)`` before truncation. Its prefix sharing reuses whole
256-token blocks only, so a turn that appends a tool result reuses little, and block hashes outlive a
weight update unless the manager is destroyed. We keep our scheduler and add the prefix cache to it.

Log-probabilities follow :mod:`agentboost.engines.base`: ``log_softmax(logits / T)`` at the
sampled id, before top-k / top-p truncation, computed in fp32.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from agentboost.engines.base import Generation, RolloutKey, SamplingParams, check_max_new_tokens
from agentboost.engines.embedded.model_step import ModelStep
from agentboost.engines.embedded.prefix_cache import PrefixCache, PrefixCacheStats
from agentboost.engines.embedded.scheduler import Scheduler, _Request, _Run
from agentboost.errors import ConfigError, ContextLengthError, EngineError
from agentboost.memory import trim_heap
from agentboost.models import precision as precision_module

DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
"""1 GiB of KV: about 23k tokens of SmolLM2-135M in fp32, 18k of an 8-KV-head 7B model in bf16."""
DEFAULT_MEMORY_BUDGET_BYTES = 2 << 30
"""KV of the running batch and the prefix cache together: 2 GiB, 46k tokens of SmolLM2-135M in fp32."""


class LocalEngine(Scheduler, ModelStep):
    """An :class:`~agentboost.engines.base.Engine` over a transformers causal LM, batched continuously.

    ``prefix_cache_bytes`` bounds the KV kept for reuse across requests (0 disables the cache);
    ``memory_budget_bytes`` bounds the KV of the running batch and the prefix cache together: a request
    joins the batch only while the batch's projected KV (every row at its prompt plus ``max_new_tokens``,
    padded to the longest) fits beside the prefix cache, which gives up its least recently used entries
    to make room. :meth:`close` frees all of it.

    On CPU with fp32 weights the engine's forward passes run the model's linear layers through oneDNN
    (``onednn_linears=False``: PyTorch's own ``F.linear``), on packed copies of the weights made once per
    weights version and dropped when idle (``packed_weights=False``: no copies, oneDNN reorders each
    weight inside each call); see :mod:`agentboost.engines.embedded.packed_linear`. One-token decode steps
    attend over the cache in a small C kernel compiled for this machine on first use
    (:mod:`agentboost.engines.embedded.native_attention`; ``native_attention=False``, or no C compiler:
    PyTorch's attention). For Llama, Mistral, Qwen2 and Qwen3 models prefills and decode steps run the model's
    layers in one function instead of through its modules (:mod:`agentboost.engines.embedded.direct_forward`,
    checked against transformers' forward before its first use; ``direct_forward=False``: transformers'
    forward).

    ``cuda_graphs=True`` (a model on a CUDA GPU only; UNVERIFIED on CUDA, off by default) captures decode
    steps as CUDA graphs, the batch padded to the smallest of ``cuda_graph_buckets`` (None: 1, 2, 4, ..., 64)
    that holds it (:mod:`agentboost.engines.embedded.cuda_graphs`).
    """

    def __init__(
        self,
        model: Any,
        *,
        max_batch_size: int = 64,
        max_prefill_tokens: int = 8192,
        context_length: int | None = None,
        name: str | None = None,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
        packed_weights: bool = True,
        onednn_linears: bool = True,
        native_attention: bool = True,
        direct_forward: bool = True,
        precision: precision_module.Precision | None = None,
        cuda_graphs: bool = False,
        cuda_graph_buckets: Sequence[int] | None = None,
    ) -> None:
        if memory_budget_bytes <= 0:
            raise ConfigError(f"memory_budget_bytes must be > 0, got {memory_budget_bytes}")
        if prefix_cache_bytes < 0:
            raise ConfigError(f"prefix_cache_bytes must be >= 0 (0 disables it), got {prefix_cache_bytes}")
        self.model = model.eval()
        self.device = next(model.parameters()).device
        # what the forward passes compute in (None: the weights' dtype); the trainer passes its own policy
        # so the engine samples with the numerics the trainer recomputes with (bfloat16 autocast on CUDA)
        self.precision = precision or precision_module.of_model(model)
        self._decoder = self._head = None  # the body and the float32 head of a pass outside float32
        if not self.precision.exact:  # the CPU float32 fast paths below compute in float32: not these
            direct_forward = onednn_linears = False
            causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
            self._decoder, self._head = causal_lm.get_decoder(), causal_lm.get_output_embeddings()
        # decode steps as CUDA graphs (None: eager steps, the default and the only choice off CUDA)
        self._graphs = None
        if cuda_graphs:  # imported here: it imports transformers, which `import agentboost` does not
            from agentboost.engines.embedded import cuda_graphs as graphs_module

            buckets = graphs_module.DEFAULT_BUCKETS if cuda_graph_buckets is None else cuda_graph_buckets
            self._graphs = graphs_module.DecodeGraphs.for_device(self.device, buckets)
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.name = name or getattr(model.config, "name_or_path", "model")
        self._context_length = context_length or getattr(model.config, "max_position_embeddings", None)
        self._queue: deque[_Request] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._crash: EngineError | None = None
        self._thread: _Run | None = None  # the scheduler loop, on a thread of _SCHEDULERS
        self._admitting: list[_Request] = []  # taken from the queue, not yet in the running batch
        # the running batch
        self._rows: list[_Request] = []
        self._cache: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: [B, heads, L, head_dim]
        self._mask: torch.Tensor | None = None  # [B, L] 1 = real token, 0 = padding
        self._batch_kv: Any = None  # BatchKV holding _cache and _mask; a decode step writes it in place
        self._lengths: list[int] = []  # real tokens held per row
        self._last_ids: list[int] = []  # the token each row feeds next
        self.steps = 0
        self.packed_passes = 0  # forward passes (prefills and decode steps) that ran on packed weights
        self.direct_steps = 0  # decode steps that ran through agentboost/engines/embedded/direct_forward.py
        self.direct_prefills = 0  # prefills that did
        self.max_batch_seen = 0
        # the prefix cache and the weights it was computed with
        self.memory_budget_bytes = memory_budget_bytes
        self._prefix_cache_cap = min(prefix_cache_bytes, memory_budget_bytes)
        self.prefix_cache = PrefixCache(self._prefix_cache_cap)
        self._kv_token_bytes = _kv_bytes_per_token(model)  # None until measured when the config is silent
        self._kv_layout: Any = None  # per layer, its keys' and values' shapes: measured at the first prefill
        self._weights_epoch = 0  # bumped by weights_updated() and by detected parameter changes
        self._cache_epoch = 0  # the epoch the prefix cache's entries belong to
        self._fingerprint = self._weights_fingerprint()
        self.weight_version = 0  # counted by sync_weights(), the trainer's hook
        self._init_model_step(
            model,
            packed_weights=packed_weights,
            onednn_linears=onednn_linears,
            native_attention=native_attention,
            direct_forward=direct_forward,
        )

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str = "smollm2-135m-instruct",
        *,
        device: str | None = None,
        dtype: torch.dtype | str | None = None,
        compute_dtype: torch.dtype | str | None = None,
        **engine_options: Any,
    ) -> LocalEngine:
        """Load any causal LM (hub id or local directory; ``smollm2-135m-instruct`` is the default).

        ``dtype`` / ``compute_dtype`` (None: ``auto``) follow :mod:`agentboost.models.precision` for a
        model that is served, not trained: bfloat16 weights and compute on a CUDA GPU, float32 on CPU.
        """
        from transformers import AutoModelForCausalLM

        from agentboost.models.weights import quiet_loading, resolve_model

        path = resolve_model(name_or_path)
        quiet_loading()
        device = device or precision_module.default_device()
        precision = precision_module.resolve_precision(
            precision_module.setting(dtype), precision_module.setting(compute_dtype), device, trains=False
        )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=precision.weights).to(device)
        return cls(model, name=str(name_or_path), precision=precision, **engine_options)

    @property
    def context_length(self) -> int | None:
        return self._context_length

    def bind(self, rollout: RolloutKey) -> LocalEngine:
        """One model serves every rollout: itself."""
        return self

    def unbind(self, rollout: RolloutKey) -> None:
        return None

    # --- public API -------------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        prompt = list(prompt_ids)
        if not prompt:
            raise EngineError("the prompt is empty; a generation needs at least one token")
        if self._context_length is not None and len(prompt) >= self._context_length:
            raise ContextLengthError(
                f"the prompt has {len(prompt)} tokens; the model's context holds {self._context_length}"
            )
        loop = asyncio.get_running_loop()
        generator = None
        if not sampling.greedy:
            # on the CPU whatever the model's device: a row draws one uniform a step (see _draw), and a seed
            # then gives the same uniforms on a GPU as on a laptop
            generator = torch.Generator()
            if sampling.seed is not None:
                generator.manual_seed(sampling.seed)
            else:
                generator.seed()  # from the OS; the global RNG stays as the caller left it
        request = _Request(prompt, sampling, loop, loop.create_future(), generator, max_new_tokens)
        with self._wake:
            self._raise_if_closed()
            self._ensure_thread()
            self._queue.append(request)
            self._wake.notify()
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            request.cancelled = True  # the scheduler drops it at its next step
            raise

    def weights_updated(self) -> None:
        """Say the model's weights changed: cached prefixes are dropped before the next prefill.

        Call it after every change made outside autograd's view (writes through ``.data``, swapping
        tensors); optimizer steps and ``load_state_dict`` are also detected without it.
        """
        with self._wake:
            self._weights_epoch += 1

    def sync_weights(self) -> int:
        """The trainer's sync (:class:`~agentboost.engines.base.TrainableEngine`): this engine holds the
        very model object being trained, so it serves its current weights already; the sync drops the
        prefixes cached with the old ones (:meth:`weights_updated`) and returns the new version."""
        self.weights_updated()
        self.weight_version += 1
        return self.weight_version

    def release_memory(self) -> None:
        """Drop what the engine rebuilds on demand, for code that shares the model with other work (an
        update between rollouts): the packed weights of its forward passes (about the size of the
        model's linear weights; an idle engine drops them by itself after ``PACKED_IDLE_RELEASE_S``) and,
        when no request is queued or running, the prefix cache (an update makes its entries stale anyway,
        but they would otherwise be dropped only at the next prefill)."""
        released = False
        with self._wake:  # with nothing queued or running the scheduler does not touch the cache
            if not self._queue and not self._rows and not self._admitting and self.prefix_cache.stats.entries:
                self.prefix_cache.clear()
                released = True
        if self._linears is not None and self._linears.held:
            self._linears.release()
            released = True
        if released:
            trim_heap()

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """A snapshot of the prefix cache's counters (hit rate, tokens, bytes, evictions)."""
        return replace(self.prefix_cache.stats)

    def kv_bytes(self) -> int:
        """Bytes of KV held now: the running batch's cache and the prefix cache."""
        if self._batch_kv is not None:
            running = self._batch_kv.buffer_bytes()
        else:
            running = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self._cache)
        return running + self.prefix_cache.stats.bytes

    async def aclose(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None
        self._release()

    def close(self) -> None:
        """Synchronous close, for code outside an event loop."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._release()

    def _release(self) -> None:
        """Free every KV tensor (a closed engine may stay referenced) and give the pages back."""
        self._set_batch([])
        self.prefix_cache.clear()
        if self._linears is not None:
            self._linears.release()
        trim_heap()

    def _raise_if_closed(self) -> None:
        if self._crash is not None:
            raise EngineError(f"{self._crash}; create a new engine to go on")
        if self._closed:
            raise EngineError("the local engine is closed")

    # --- admission ---------------------------------------------------------------------------------

    def _take_admissible(self) -> list[_Request]:
        admitted: list[_Request] = []
        tokens = 0
        while self._queue and len(self._rows) + len(admitted) < self.max_batch_size:
            request = self._queue[0]
            if request.cancelled:
                self._queue.popleft()
                continue
            if admitted and tokens + len(request.prompt_ids) > self.max_prefill_tokens:
                break
            projected = self._reserved_bytes([*self._rows, *admitted, request])
            if projected > self.memory_budget_bytes:
                if self._rows or admitted:
                    break  # it waits for rows to finish
                self._queue.popleft()
                budget, need = self.memory_budget_bytes / 2**20, projected / 2**20
                message = (
                    f"the request needs {need:.0f} MiB of KV ({len(request.prompt_ids)} prompt tokens + "
                    f"max_new_tokens={request.max_new_tokens}) but the engine's "
                    f"memory_budget_bytes is {budget:.0f} MiB; raise the budget or lower max_new_tokens"
                )
                self._resolve(request, EngineError(message))
                continue
            admitted.append(self._queue.popleft())
            tokens += len(request.prompt_ids)
        return admitted

    def _reserved_bytes(self, requests: Sequence[_Request]) -> int:
        """The KV ``requests`` may hold together: each at its prompt plus max_new_tokens, padded."""
        if not requests or self._kv_token_bytes is None:
            return 0
        return len(requests) * self._reserved_width(requests) * self._kv_token_bytes

    def _reserved_width(self, requests: Sequence[_Request]) -> int:
        """The most tokens any of ``requests`` may hold: prompt plus max_new_tokens, within the context."""
        longest = max(len(r.prompt_ids) + r.max_new_tokens for r in requests)
        if self._context_length is not None:
            longest = min(longest, self._context_length)
        return longest

    def _fit_prefix_cache(self, running: Sequence[_Request]) -> None:
        """Shrink the prefix cache's budget to what the running batch leaves of the memory budget."""
        if self._prefix_cache_cap:
            room = max(0, self.memory_budget_bytes - self._reserved_bytes(running))
            self.prefix_cache.resize(min(self._prefix_cache_cap, room))


def _kv_bytes_per_token(model: Any) -> int | None:
    """KV bytes one token costs across all layers, from the model's config (None when it does not say)."""
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    layers = getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or (
        text.hidden_size // heads if heads and getattr(text, "hidden_size", None) else None
    )
    if not (layers and kv_heads and head_dim):
        return None
    element = next(model.parameters()).element_size()
    return int(layers * 2 * kv_heads * head_dim * element)
