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
import contextlib
import inspect
import itertools
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from agentboost.engines.base import Generation, RolloutKey, SamplingParams, check_max_new_tokens
from agentboost.engines.embedded import decode_attention
from agentboost.engines.embedded import direct_forward as direct_forward_module
from agentboost.engines.embedded.packed_linear import Linears, PackedLinears, onednn_supported
from agentboost.engines.embedded.prefix_cache import PrefixCache, PrefixCacheStats
from agentboost.errors import ConfigError, ContextLengthError, EngineError
from agentboost.memory import GLIBC_MMAP_THRESHOLD_MAX, large_blocks_from_heap, trim_heap
from agentboost.models import precision as precision_module

logger = logging.getLogger(__name__)

DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
"""1 GiB of KV: about 23k tokens of SmolLM2-135M in fp32, 18k of an 8-KV-head 7B model in bf16."""
DEFAULT_MEMORY_BUDGET_BYTES = 2 << 30
"""KV of the running batch and the prefix cache together: 2 GiB, 46k tokens of SmolLM2-135M in fp32."""
PACKED_IDLE_RELEASE_S = 1.0
"""An engine with nothing to run for this long drops its packed weights (rebuilt in ~0.2 s on demand)."""
REBUFFER_TRIM_INTERVAL_S = 2.0
"""At most one heap trim this often when the batch changes (the prefill's per-layer KV, freed once
copied into the batch's buffer, came from the heap): a trim costs 7-60 ms, and a trainer's rollouts
change their batch every time an agent's turn starts or ends."""
LARGE_PREFILL_BYTES = GLIBC_MMAP_THRESHOLD_MAX
SCHEDULER_IDLE_S = 600.0
"""How long a scheduler thread whose engine closed waits for the next engine before it ends."""
"""A prefill whose widest activation (rows x width x the model's widest feature size) reaches this runs
inside :func:`~agentboost.memory.large_blocks_from_heap`, and the heap is trimmed as soon as it is done:
below it, glibc serves its blocks from the heap anyway and nothing changes."""
MIN_SHARED_PREFIX = 16
"""Requests admitted together must share at least this many uncached tokens to prefill them once."""


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    generator: torch.Generator | None
    max_new_tokens: int
    submitted: float = field(default_factory=time.perf_counter)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cancelled: bool = False
    prefill_s: float = 0.0
    cached_tokens: int = 0
    computed_tokens: int = 0
    weights_epoch: int = 0


class LocalEngine:
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
        self._logits_to_keep = True  # pass logits_to_keep=1 while the model accepts it
        self._cache_argument = _cache_argument(model)
        # one-token steps attend with grouped query heads instead of a per-head copy of the cache, in the
        # native kernel unless native_attention=False (or it cannot be built here)
        self.grouped_decode_attention = decode_attention.use_for(model, native=native_attention)
        # decode steps without transformers' module machinery, for the model families it knows (checked
        # against transformers' forward before its first use)
        self.direct_forward_reason = None if direct_forward else "direct_forward=False"
        if not self.precision.exact:
            self.direct_forward_reason = f"float32 only ({self.precision.describe()})"
        if self.direct_forward_reason is None:
            self.direct_forward_reason = direct_forward_module.unsupported_reason(model)
        self._direct = None
        if self.direct_forward_reason is None:
            self._direct = direct_forward_module.DirectForward(model, native=native_attention)
        # fp32 CPU linears through oneDNN, on packed copies of the weights unless packed_weights=False; the
        # direct forward's query, key and value and its gate and up each one product
        groups = self._direct.groups() if self._direct is not None else ()
        self._linears = PackedLinears(model, groups) if onednn_linears and onednn_supported(model) else None
        self._pack_weights = packed_weights
        self._trimmed_at = 0.0  # time.monotonic() of the last heap trim after a re-buffer
        self._trim_due = False  # the batch changed since: the next decode step may trim
        self._trim_now = False  # a large prefill kept its freed blocks in the heap: trim, not rate-limited
        config = model.config
        widest = max(getattr(config, "intermediate_size", 0) or 0, getattr(config, "hidden_size", 0) or 0)
        self._activation_row_bytes = widest * next(model.parameters()).element_size()

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

    # --- scheduler thread -------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = _SCHEDULERS.run(self._serve)

    def _serve(self) -> None:
        try:
            with torch.inference_mode():
                while True:
                    with self._wake:
                        while not self._closed and not self._queue and not self._rows:
                            if self._linears is None or not self._linears.held:
                                self._wake.wait()
                            elif not self._wake.wait(timeout=PACKED_IDLE_RELEASE_S):
                                self._linears.release()  # idle: give the packed weights' memory back
                                trim_heap()
                        if self._closed:
                            break
                        self._admitting = self._take_admissible()
                    if self._admitting:
                        self._prefill(self._admitting)
                        self._admitting = []
                    if self._rows:
                        self._decode_step()
                    elif self._trim_now:  # a large prefill whose rows all ended at their first token
                        self._trim()
        except BaseException as error:  # a crash must not leave awaiting rollouts hanging
            logger.exception("the local engine's scheduler crashed")
            crash = EngineError(f"the local engine crashed: {type(error).__name__}: {error}")
            with self._wake:
                self._crash, self._closed = crash, True
            self._fail_all(crash)
            return
        self._fail_all(EngineError("the local engine was closed while this request was running"))

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

    def _fail_all(self, error: EngineError) -> None:
        with self._wake:
            pending = list(self._queue) + self._admitting + self._rows
            self._queue.clear()
        self._admitting, self._rows = [], []
        self._set_batch([])
        self._lengths, self._last_ids = [], []
        for request in pending:
            self._resolve(request, error)

    @staticmethod
    def _resolve(request: _Request, outcome: Generation | BaseException) -> None:
        def settle() -> None:
            if request.future.done():
                return
            if isinstance(outcome, BaseException):
                request.future.set_exception(outcome)
            else:
                request.future.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # the caller's event loop is gone: nobody is waiting
            request.loop.call_soon_threadsafe(settle)

    # --- weights and the prefix cache --------------------------------------------------------------

    def _weights_fingerprint(self) -> int:
        """Changes whenever a parameter is modified in place (version counter) or replaced (storage).

        Read before every pass (0.1 ms on SmolLM2): the walk goes through the modules' own dictionaries,
        which ``model.parameters()`` does at a fourth of the speed."""
        parameters: list[Any] = []
        _collect_parameters(self.model, parameters)
        try:
            return hash(tuple((parameter.data_ptr(), parameter._version) for parameter in parameters))
        except RuntimeError:  # inference tensors have no version counter
            return hash(tuple((parameter.data_ptr(), _version(parameter)) for parameter in parameters))

    def _current_epoch(self) -> int:
        """The weights epoch, bumped first if the parameters changed since the last look."""
        fingerprint = self._weights_fingerprint()
        with self._wake:
            if fingerprint != self._fingerprint:
                self._fingerprint = fingerprint
                self._weights_epoch += 1
            return self._weights_epoch

    def _sync_prefix_cache(self) -> int:
        epoch = self._current_epoch()
        if epoch != self._cache_epoch:
            if self.prefix_cache.stats.entries:
                self.prefix_cache.stats.invalidations += 1
            self.prefix_cache.clear()
            self._cache_epoch = epoch
        return epoch

    # --- model steps ------------------------------------------------------------------------------

    def _forward(self, **inputs: Any) -> Any:
        linears = self._linears_for_pass()
        with linears.active() if linears is not None else contextlib.nullcontext():
            return self._model_forward(**inputs)

    def _model_forward(self, **inputs: Any) -> Any:
        if not self.precision.exact:
            # the decoder under the policy's autocast (entered per pass: its weight casts must not outlive
            # an optimizer step), then the last position's logits in float32, as the trainer takes them
            assert self._decoder is not None
            with self.precision.autocast():
                hidden = self._decoder(**inputs).last_hidden_state[:, -1:, :]  # [B, 1, H]
            return _Logits(precision_module.head_logits(self._head, hidden))  # logits [B, 1, V] float32
        if self._logits_to_keep:
            try:
                return self.model(**inputs, logits_to_keep=1)
            except TypeError as error:
                if "logits_to_keep" not in str(error):
                    raise
                self._logits_to_keep = False
        return self.model(**inputs)

    def _prefill_rows(
        self, prompts: list[list[int]], *, max_width: int, join: bool
    ) -> tuple[torch.Tensor, Any, int, list[int]]:
        """One forward over ``prompts``, each starting from its longest cached prefix, its keys and values
        written straight into a new batch buffer (:class:`~agentboost.engines.embedded.batch_kv.BatchKV`).

        With ``join`` the buffer holds the running rows first (copied once), then the prompts' rows;
        without, the prompts' rows only. Row layout of a prompt: ``[pad | cached prefix | pad | new
        tokens]``, the cached part (copied once from the prefix cache) right-aligned in the first ``P``
        columns, the new part in the last ``S``. Returns the last position's logits, the buffer, the index
        of the prompts' part in it and the cached length of each prompt.
        """
        from agentboost.engines.embedded.batch_kv import BatchKV

        matches = [
            self.prefix_cache.match_pieces(ids, len(ids) - 1) if self.prefix_cache.enabled else (0, [])
            for ids in prompts
        ]
        cached = [length for length, _ in matches]
        rows, past = len(prompts), max(cached)
        width = max(len(ids) - length for ids, length in zip(prompts, cached, strict=True))
        input_ids = torch.zeros((rows, width), dtype=torch.long)
        mask = torch.zeros((rows, past + width), dtype=torch.long)
        for row, (ids, length) in enumerate(zip(prompts, cached, strict=True)):
            new = ids[length:]
            input_ids[row, width - len(new) :] = torch.tensor(new, dtype=torch.long)
            mask[row, past + width - len(new) :] = 1
            mask[row, past - length : past] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        mask = mask.to(self.device)
        parts: list[tuple[Any, torch.Tensor]] = [(self._cache, self._mask)] if join and self._rows else []
        parts.append((None, mask))
        kv = BatchKV(parts, max_width, layout=self._layout())
        part = len(parts) - 1
        first_row, first_column = kv.part_start(part)
        for row, (length, pieces) in enumerate(matches):
            column = first_column + past - length
            for piece in pieces:
                kv.write_prefix(first_row + row, column, piece)
                column += piece.shape[3]
        del matches
        # a large batched prefill's activations are tens of MB each, made and freed layer after layer:
        # from the heap and reused, not mapped afresh and page-faulted in each time; trimmed right after
        large = rows * width * self._activation_row_bytes >= LARGE_PREFILL_BYTES  # never, widths unknown
        input_ids, positions = input_ids.to(self.device), positions.to(self.device)
        cache = kv.prefill_cache(part, past)
        with large_blocks_from_heap() if large else contextlib.nullcontext():
            if self._use_direct():
                logits = self._direct.forward(input_ids, positions, mask, cache, self._direct_linears())
                self.direct_prefills += 1
            else:
                output = self._forward(
                    input_ids=input_ids,
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    **{self._cache_argument: cache},
                )
                logits = output.logits[:, -1, :]
                del output
        self._trim_now = self._trim_now or large
        return logits, kv, part, cached

    def _layout(self) -> Any:
        """The layout of the model's keys and values, from a one-token forward the first time."""
        if self._kv_layout is None:
            from transformers import DynamicCache

            from agentboost.engines.embedded.batch_kv import layout_of

            cache = DynamicCache()
            self._model_forward(
                input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device),
                use_cache=True,
                **{self._cache_argument: cache},
            )
            self._kv_layout = layout_of([(layer.keys, layer.values) for layer in cache.layers])
            if self._kv_token_bytes is None:
                self._kv_token_bytes = sum(
                    heads * (key_dim + value_dim) * torch.empty((), dtype=dtype).element_size()
                    for heads, key_dim, value_dim, dtype, _ in self._kv_layout
                )
        return self._kv_layout

    def _hold(self, tokens: list[int], kv: Any, row: int) -> None:
        """Insert the KV of ``tokens`` (row ``row`` of the batch buffer ``kv``) into the prefix cache."""
        held = self.prefix_cache.match_length(tokens)
        if held >= len(tokens):
            return
        if kv.row_tokens(row) != len(tokens):
            logger.warning(
                "prefix cache: a row holds %d tokens, expected %d; not cached",
                kv.row_tokens(row),
                len(tokens),
            )
            return
        self.prefix_cache.insert(tokens, kv.row_kv(row, skip=held), offset=held, owned=True)

    def _shared_prefixes(self, prompts: list[list[int]]) -> list[list[int]]:
        """Uncached prefixes shared by two or more of ``prompts``, longest first, none a prefix of another."""
        order = sorted(range(len(prompts)), key=lambda index: prompts[index])
        shared_len = [0] * len(prompts)
        for before, after in itertools.pairwise(order):
            a, b = prompts[before], prompts[after]
            limit = min(len(a), len(b))
            common = 0
            while common < limit and a[common] == b[common]:
                common += 1
            shared_len[before] = max(shared_len[before], common)
            shared_len[after] = max(shared_len[after], common)
        candidates = set()
        for index, ids in enumerate(prompts):
            length = min(shared_len[index], len(ids) - 1)
            if length - self.prefix_cache.match_length(ids[:length]) >= MIN_SHARED_PREFIX:
                candidates.add(tuple(ids[:length]))
        ordered = sorted(candidates)
        return [
            list(prefix)
            for index, prefix in enumerate(ordered)
            if index + 1 == len(ordered) or ordered[index + 1][: len(prefix)] != prefix
        ]

    def _prefill(self, requests: list[_Request]) -> None:
        """Prefill new prompts together, sample their first token, add them to the batch."""
        started = time.perf_counter()
        epoch = self._sync_prefix_cache()
        self._fit_prefix_cache([*self._rows, *requests])
        prompts = [request.prompt_ids for request in requests]
        warmed: dict[int, int] = {}  # request index -> prompt tokens it prefilled for its siblings
        if self.prefix_cache.enabled and len(requests) > 1:
            shared = self._shared_prefixes(prompts)
            if shared:
                widest = max(len(prefix) for prefix in shared)
                _, kv, _, cached = self._prefill_rows(shared, max_width=widest, join=False)
                for row, prefix in enumerate(shared):
                    self._hold(prefix, kv, row)
                    owner = next(i for i, ids in enumerate(prompts) if ids[: len(prefix)] == prefix)
                    warmed[owner] = warmed.get(owner, 0) + len(prefix) - cached[row]
                    self.prefix_cache.stats.computed_tokens += len(prefix) - cached[row]
                del kv
        max_width = self._reserved_width([*self._rows, *requests])
        logits, kv, _, cached = self._prefill_rows(prompts, max_width=max_width, join=True)
        elapsed = time.perf_counter() - started
        stats = self.prefix_cache.stats
        for index, (request, length) in enumerate(zip(requests, cached, strict=True)):
            request.prefill_s = elapsed
            request.weights_epoch = epoch
            extra = min(warmed.get(index, 0), length)
            request.cached_tokens = length - extra
            request.computed_tokens = len(request.prompt_ids) - length + extra
            stats.prompt_tokens += len(request.prompt_ids)
            stats.cached_tokens += length
            stats.computed_tokens += len(request.prompt_ids) - length
        self._join(requests, kv, [len(r.prompt_ids) for r in requests])
        self._sample(logits, first_row=len(self._rows) - len(requests))

    def _decode_step(self) -> None:
        """One token for every running sequence, its keys and values written in place (no copy)."""
        kv = self._batch_kv
        assert kv is not None
        # the batch changed since the last step: a prefill's activations and per-layer KV, copied into the
        # batch's buffer and freed when the prefill returned, came from the heap; their pages go back to
        # the system instead of staying there beside the next ones
        if self._trim_now or (
            self._trim_due and time.monotonic() - self._trimmed_at >= REBUFFER_TRIM_INTERVAL_S
        ):
            self._trim()
        rows = len(self._rows)
        input_ids = torch.tensor(self._last_ids, dtype=torch.long, device=self.device).view(rows, 1)
        positions = torch.tensor(self._lengths, dtype=torch.long, device=self.device).view(rows, 1)
        if self._use_direct():
            logits = self._direct.forward(
                input_ids, positions, kv.next_mask(), kv.cache, self._direct_linears()
            )
            self.direct_steps += 1
        else:
            output = self._forward(
                input_ids=input_ids,
                attention_mask=kv.next_mask(),
                position_ids=positions,
                use_cache=True,
                **{self._cache_argument: kv.cache},
            )
            logits = output.logits[:, -1, :]
        self._cache, self._mask = kv.layers(), kv.mask()
        self._lengths = [length + 1 for length in self._lengths]
        self.steps += 1
        self._sample(logits, first_row=0)

    def _use_direct(self) -> bool:
        """Whether this pass runs through the direct forward: checked once against transformers', and
        only while the model is still what was checked (else transformers' forward for good)."""
        direct = self._direct
        if direct is None:
            return False
        if direct.checked is None:
            try:
                direct.check(self._forward, self._cache_argument, self._direct_linears())
            except Exception as error:  # a model this code does not know after all: transformers' forward
                logger.warning(
                    "the engine keeps transformers' forward: the direct forward failed its check: %r", error
                )
                direct.checked = False
            if not direct.checked:
                self.direct_forward_reason = f"failed its check against transformers ({direct.difference})"
                self._ungroup()
        if direct.checked and not direct.unchanged():
            logger.warning(
                "the engine goes back to transformers' forward: the model's modules or hooks changed since "
                "the direct forward was checked"
            )
            direct.checked = False
            self.direct_forward_reason = "the model's modules or hooks changed after its check"
            self._ungroup()
        return bool(direct.checked)

    def _ungroup(self) -> None:
        """Transformers' forward from now on: every linear gets a pack of its own again."""
        if self._linears is not None:
            self._linears.group(())

    def _direct_linears(self) -> Linears:
        """The linears of a direct pass: the oneDNN route (packed first when packing), else PyTorch's."""
        linears = self._linears_for_pass()
        return linears if linears is not None else Linears()

    def _trim(self) -> None:
        trim_heap()
        self._trimmed_at = time.monotonic()
        self._trim_due = self._trim_now = False

    def _linears_for_pass(self) -> PackedLinears | None:
        """The oneDNN linears for one forward pass, packed first for the current weights when packing."""
        if self._linears is None:
            return None
        if self._pack_weights:
            epoch = self._current_epoch()  # packs of older weights are never used
            if not self._linears.usable(epoch):
                self._linears.pack(epoch)
            self.packed_passes += 1
        return self._linears

    def _sample(self, logits: torch.Tensor, *, first_row: int) -> None:
        """Choose the next id of rows first_row.. from their logits; retire rows that are done."""
        logits = logits.float()
        requests = self._rows[first_row:]
        temperatures = torch.tensor(
            [request.sampling.temperature or 1.0 for request in requests], device=logits.device
        ).unsqueeze(1)
        logprobs = torch.log_softmax(logits / temperatures, dim=-1)
        sampled = [offset for offset, request in enumerate(requests) if not request.sampling.greedy]
        # greedy ids: one arg-max for the batch (0.9 ms at 16 rows of 49k), skipped when no row is greedy
        tokens = logits.argmax(dim=-1).tolist() if len(sampled) < len(requests) else [0] * len(requests)
        if sampled:
            drawn = self._draw([requests[offset] for offset in sampled], logprobs, sampled)
            for offset, token in zip(sampled, drawn, strict=True):
                tokens[offset] = token
        chosen = logprobs.gather(1, torch.tensor(tokens, device=logits.device).unsqueeze(1)).squeeze(1)
        for offset, (request, token, logprob) in enumerate(
            zip(requests, tokens, chosen.tolist(), strict=True)
        ):
            request.token_ids.append(token)
            request.logprobs.append(logprob)
            self._last_ids[first_row + offset] = token
        done = [
            index
            for index, request in enumerate(self._rows)
            if request.cancelled
            or (request.token_ids and request.token_ids[-1] in request.sampling.stop_token_ids)
            or len(request.token_ids) >= request.max_new_tokens
            or (self._context_length is not None and self._lengths[index] + 1 >= self._context_length)
        ]
        if done:
            self._retire(done)

    @staticmethod
    def _draw(requests: list[_Request], logprobs: torch.Tensor, rows: list[int]) -> list[int]:
        """One id for each of ``requests`` (the sampled ``rows`` of ``logprobs``), from its tempered
        distribution after its top-k / top-p truncation, drawn with its own generator.

        Inverse-CDF sampling: each row takes one uniform ``u`` from its request's generator and gets the
        first id whose cumulative probability (float64) exceeds ``u`` times the row's total. One random
        number a row, where ``torch.multinomial`` (``argmax(p / q)``, ``q ~ Exp(1)``) draws one per
        vocabulary entry: 49k exponentials cost 0.78 ms a row, 12.5 ms of a 16-row decode step
        (docs/engines.md). A row's id depends only on its own probabilities and its generator, so the
        same seed gives the same ids whatever else is in the batch (tested); ids of zero probability
        (truncated, or underflowed) are never drawn.
        """
        scores = logprobs[rows] if len(rows) < logprobs.shape[0] else logprobs
        for index, request in enumerate(requests):
            sampling = request.sampling
            if (sampling.top_k and sampling.top_k < scores.shape[1]) or sampling.top_p < 1.0:
                if scores is logprobs:
                    scores = logprobs.clone()  # the stored logprobs are of the untruncated distribution
                scores[index] = _truncate(scores[index], sampling)
        # the rows are log-probabilities (truncated ones at -inf): their exponentials are the distribution,
        # unnormalized after truncation, which the draw below does not need
        probabilities = scores.exp()
        if not bool((probabilities.max() < math.inf) & (probabilities.min() >= 0)):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        uniforms = torch.cat(
            [torch.rand(1, dtype=torch.float64, generator=request.generator) for request in requests]
        ).to(probabilities.device)
        cumulative = probabilities.double().cumsum(dim=-1)  # [n, V]
        targets = (uniforms * cumulative[:, -1]).unsqueeze(1)
        ids = torch.searchsorted(cumulative, targets, right=True).squeeze(1)
        drawn = ids.tolist()
        last = probabilities.shape[1] - 1
        for index, token in enumerate(drawn):
            if token > last:  # u * total rounded up to the total: the last id with any probability
                drawn[index] = int(probabilities[index].nonzero()[-1])
        return drawn

    # --- batch bookkeeping -------------------------------------------------------------------------

    def _join(self, requests: list[_Request], kv: Any, lengths: list[int]) -> None:
        """Make ``kv`` (the running rows and the prefilled ones after them) the running batch."""
        self._rows.extend(requests)
        self._lengths.extend(lengths)
        self._last_ids.extend([0] * len(requests))
        self._use_batch(kv)
        self.max_batch_seen = max(self.max_batch_seen, len(self._rows))

    def _retire(self, indices: list[int]) -> None:
        finished = set(indices)
        if self.prefix_cache.enabled:
            self._fit_prefix_cache([r for i, r in enumerate(self._rows) if i not in finished])
            fresh = self._current_epoch() == self._cache_epoch
            for index in indices:
                request = self._rows[index]
                if fresh and request.weights_epoch == self._cache_epoch:  # never hold stale KV
                    read = request.prompt_ids + request.token_ids[:-1]  # the last id was never fed
                    self._hold(read, self._batch_kv, index)
        leaving = [self._rows[index] for index in indices]
        keep = [index for index in range(len(self._rows)) if index not in finished]
        self._rows = [self._rows[index] for index in keep]
        self._lengths = [self._lengths[index] for index in keep]
        self._last_ids = [self._last_ids[index] for index in keep]
        if not keep:
            self._set_batch([])
        else:  # re-pack before the callers hear back, so kv_bytes() no longer counts the rows that left
            assert self._mask is not None
            mask = self._mask[keep]
            # drop columns that are padding in every remaining row
            first_real = int((mask.cumsum(-1) == 0).sum(-1).min())
            runs: list[list[int]] = []  # kept rows in runs of consecutive indices: one view (no copy) each
            for index in keep:
                if runs and runs[-1][1] == index:
                    runs[-1][1] = index + 1
                else:
                    runs.append([index, index + 1])
            self._set_batch(
                [
                    (
                        [(k[a:b, :, first_real:], v[a:b, :, first_real:]) for k, v in self._cache],
                        self._mask[a:b, first_real:],
                    )
                    for a, b in runs
                ]
            )
        for request in leaving:
            if request.cancelled:
                continue
            stopped = bool(request.token_ids) and request.token_ids[-1] in request.sampling.stop_token_ids
            generation = Generation(
                token_ids=request.token_ids,
                logprobs=request.logprobs,
                finish_reason="stop" if stopped else "length",
                prompt_tokens=len(request.prompt_ids),
                metrics={
                    "prefill_s": request.prefill_s,
                    "total_s": time.perf_counter() - request.submitted,
                    "prompt_cached_tokens": float(request.cached_tokens),
                    "prompt_computed_tokens": float(request.computed_tokens),
                },
            )
            self._resolve(request, generation)

    def _set_batch(self, parts: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], Any]]) -> None:
        """Make ``parts`` (rows of KV and mask, in order) the running batch's buffers; none: no batch."""
        from agentboost.engines.embedded.batch_kv import BatchKV

        self._cache, self._mask, self._batch_kv = [], None, None  # the old buffer goes once parts are copied
        if not parts:
            return
        self._use_batch(BatchKV(parts, self._reserved_width(self._rows)))

    def _use_batch(self, kv: Any) -> None:
        self._batch_kv, self._cache, self._mask = kv, kv.layers(), kv.mask()
        self._trim_due = True


@dataclass
class _Logits:
    """The part of a transformers output the engine reads."""

    logits: torch.Tensor


def _cache_argument(model: Any) -> str:
    """The name the model's forward takes its KV cache under: ``cache`` from transformers 5.2x on
    (``past_key_values`` warns there, and goes in 5.40), ``past_key_values`` before. Read from the
    transformers model itself, which a wrapper (a PEFT model, a test's fault injector) may hold inside."""
    from transformers import PreTrainedModel

    inner = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), model)
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


class _Run:
    """One function running on a :class:`_SchedulerThreads` thread; :meth:`join` waits for it."""

    def __init__(self, function: Any) -> None:
        self.function = function
        self._done = threading.Event()

    def join(self) -> None:
        self._done.wait()


class _SchedulerThreads:
    """The threads engines' schedulers run on, kept and reused when an engine closes.

    A thread that computes owns memory beyond its tensors: glibc's arena of its own, the OpenMP worker
    threads PyTorch's and the kernels' parallel regions start for it, oneDNN's per-thread scratch. A
    new thread per engine made all of that afresh, and a process that makes engine after engine (the
    test suite, a trainer's evaluations) grew by 1-3 MiB an engine, memory left behind by the threads
    that ended; on a kept thread it is the next engine's. An idle thread waits for the next engine for
    :data:`SCHEDULER_IDLE_S`, then ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []

    def run(self, function: Any) -> _Run:
        job = _Run(function)
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = _Worker(job)
            threading.Thread(
                target=self._loop, args=(worker,), name="agentboost-local-engine", daemon=True
            ).start()
            return job
        with worker.wake:
            worker.job = job
            worker.wake.notify()
        return job

    def _loop(self, worker: _Worker) -> None:
        while True:
            job = worker.job
            assert job is not None
            try:
                job.function()
            finally:  # idle again before the engine's close() returns: the next engine finds it
                with worker.wake:
                    worker.job = None
                with self._lock:
                    self._idle.append(worker)
                job._done.set()
            with worker.wake:
                while worker.job is None:
                    if not worker.wake.wait(timeout=SCHEDULER_IDLE_S) and worker.job is None:
                        with self._lock:  # still idle, or taken by run(), whose job is on its way
                            if worker in self._idle:
                                self._idle.remove(worker)
                                return


class _Worker:
    def __init__(self, job: _Run) -> None:
        self.wake = threading.Condition()
        self.job: _Run | None = job


_SCHEDULERS = _SchedulerThreads()


def _forget_schedulers_after_fork() -> None:
    """A forked child has none of its parent's threads: its engines start their own."""
    global _SCHEDULERS
    _SCHEDULERS = _SchedulerThreads()


os.register_at_fork(after_in_child=_forget_schedulers_after_fork)


def _collect_parameters(module: Any, into: list[Any]) -> None:
    into.extend(parameter for parameter in module._parameters.values() if parameter is not None)
    for child in module._modules.values():
        if child is not None:
            _collect_parameters(child, into)


def _version(parameter: Any) -> int:
    try:
        return parameter._version
    except RuntimeError:  # an inference tensor
        return -1


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


def _truncate(scores: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """One row's scores with everything outside its top-k and top-p set to -inf."""
    if sampling.top_k and sampling.top_k < scores.numel():
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probabilities = torch.softmax(sorted_scores, dim=-1)
        drop = probabilities.cumsum(-1) - probabilities >= sampling.top_p  # keep the first past p
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(0, order, sorted_scores)
    return scores
