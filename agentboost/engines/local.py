"""The embedded engine: Hugging Face transformers with continuous batching, on CPU or one GPU.

Many agents share one model without blocking the event loop and without being served one by one:

- one scheduler thread owns the model; ``generate()`` only queues a request and awaits its future;
- new requests are prefilled together (left-padded) and join the running batch between decode
  steps; finished or cancelled sequences leave it; every step decodes one token for all sequences;
- each sequence keeps its KV cache for its whole generation (a left-padded batched cache with an
  attention mask, re-packed only when sequences join or leave);
- each request samples with its own seeded generator, so its tokens do not depend on what else is
  in the batch (greedy ids and logprobs match one-by-one runs up to float rounding).

Log-probabilities follow :mod:`agentboost.engines.base`: ``log_softmax(logits / T)`` at the
sampled id, before top-k / top-p truncation, computed in fp32.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentboost.engines.base import Generation, RolloutKey, SamplingParams
from agentboost.errors import ContextLengthError, EngineError


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    generator: torch.Generator | None
    submitted: float = field(default_factory=time.perf_counter)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cancelled: bool = False
    prefill_s: float = 0.0


class LocalEngine:
    """An :class:`~agentboost.engines.base.Engine` over a transformers causal LM, batched continuously."""

    def __init__(
        self,
        model: Any,
        *,
        max_batch_size: int = 64,
        max_prefill_tokens: int = 8192,
        context_length: int | None = None,
        name: str | None = None,
    ) -> None:
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.name = name or getattr(model.config, "name_or_path", "model")
        self._context_length = context_length or getattr(model.config, "max_position_embeddings", None)
        self._queue: deque[_Request] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        # the running batch
        self._rows: list[_Request] = []
        self._cache: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: [B, heads, L, head_dim]
        self._mask: torch.Tensor | None = None  # [B, L] 1 = real token, 0 = left padding
        self._lengths: list[int] = []  # real tokens held per row
        self._last_ids: list[int] = []  # the token each row feeds next
        self.steps = 0
        self.max_batch_seen = 0

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str = "smollm2-135m-instruct",
        *,
        device: str | None = None,
        dtype: torch.dtype | str | None = None,
        **engine_options: Any,
    ) -> LocalEngine:
        """Load any causal LM (hub id or local directory; ``smollm2-135m-instruct`` is the default)."""
        from transformers import AutoModelForCausalLM

        from agentboost.engines.models import resolve_model

        path = resolve_model(name_or_path)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype is None:
            dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        return cls(model, name=str(name_or_path), **engine_options)

    @property
    def context_length(self) -> int | None:
        return self._context_length

    def bind(self, rollout: RolloutKey) -> LocalEngine:
        """One model serves every rollout: itself."""
        return self

    def unbind(self, rollout: RolloutKey) -> None:
        return None

    # --- public API -------------------------------------------------------------------------------

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        if self._closed:
            raise EngineError("the local engine is closed")
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
            generator = torch.Generator(device=self.device)
            generator.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
        request = _Request(prompt, sampling, loop, loop.create_future(), generator)
        self._ensure_thread()
        with self._wake:
            self._queue.append(request)
            self._wake.notify()
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            request.cancelled = True  # the scheduler drops it at its next step
            raise

    async def aclose(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None

    def close(self) -> None:
        """Synchronous close, for code outside an event loop."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # --- scheduler thread -------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="agentboost-local-engine", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        try:
            with torch.inference_mode():
                while True:
                    with self._wake:
                        while not self._closed and not self._queue and not self._rows:
                            self._wake.wait()
                        if self._closed:
                            break
                        admitted = self._take_admissible()
                    if admitted:
                        self._prefill(admitted)
                    if self._rows:
                        self._decode_step()
        except BaseException as error:  # a crash must not leave awaiting rollouts hanging
            self._fail_all(EngineError(f"the local engine crashed: {type(error).__name__}: {error}"))
            raise
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
            admitted.append(self._queue.popleft())
            tokens += len(request.prompt_ids)
        return admitted

    def _fail_all(self, error: EngineError) -> None:
        with self._wake:
            pending = list(self._queue) + self._rows
            self._queue.clear()
        self._rows = []
        self._cache, self._mask = [], None
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

    # --- model steps ------------------------------------------------------------------------------

    def _prefill(self, requests: list[_Request]) -> None:
        """Prefill new prompts together (left-padded), sample their first token, add them to the batch."""
        started = time.perf_counter()
        width = max(len(request.prompt_ids) for request in requests)
        input_ids = torch.zeros((len(requests), width), dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):
            ids = request.prompt_ids
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        from transformers import DynamicCache

        output = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=DynamicCache(),
            use_cache=True,
        )
        layers = [(layer.keys, layer.values) for layer in output.past_key_values.layers]
        elapsed = time.perf_counter() - started
        for request in requests:
            request.prefill_s = elapsed
        self._join(requests, layers, mask.to(self.device), [len(r.prompt_ids) for r in requests])
        self._sample(output.logits[:, -1, :], first_row=len(self._rows) - len(requests))

    def _decode_step(self) -> None:
        """One token for every running sequence."""
        from transformers import DynamicCache

        assert self._mask is not None
        rows = len(self._rows)
        input_ids = torch.tensor(self._last_ids, dtype=torch.long, device=self.device).view(rows, 1)
        positions = torch.tensor(self._lengths, dtype=torch.long, device=self.device).view(rows, 1)
        mask = torch.cat(
            [self._mask, torch.ones((rows, 1), dtype=self._mask.dtype, device=self.device)], dim=1
        )
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=DynamicCache(self._cache),
            use_cache=True,
        )
        self._cache = [(layer.keys, layer.values) for layer in output.past_key_values.layers]
        self._mask = mask
        self._lengths = [length + 1 for length in self._lengths]
        self.steps += 1
        self._sample(output.logits[:, -1, :], first_row=0)

    def _sample(self, logits: torch.Tensor, *, first_row: int) -> None:
        """Choose the next id of rows first_row.. from their logits; retire rows that are done."""
        logits = logits.float()
        requests = self._rows[first_row:]
        temperatures = torch.tensor(
            [request.sampling.temperature or 1.0 for request in requests], device=logits.device
        ).unsqueeze(1)
        logprobs = torch.log_softmax(logits / temperatures, dim=-1)
        for offset, request in enumerate(requests):
            row_logprobs = logprobs[offset]
            if request.sampling.greedy:
                token = int(torch.argmax(logits[offset]))
            else:
                token = self._draw(row_logprobs, request)
            request.token_ids.append(token)
            request.logprobs.append(float(row_logprobs[token]))
            self._last_ids[first_row + offset] = token
        done = [
            index
            for index, request in enumerate(self._rows)
            if request.cancelled
            or (request.token_ids and request.token_ids[-1] in request.sampling.stop_token_ids)
            or len(request.token_ids) >= request.sampling.max_new_tokens
            or (self._context_length is not None and self._lengths[index] + 1 >= self._context_length)
        ]
        if done:
            self._retire(done)

    @staticmethod
    def _draw(logprobs: torch.Tensor, request: _Request) -> int:
        """Sample from the tempered distribution after top-k / top-p truncation."""
        sampling = request.sampling
        scores = logprobs
        if sampling.top_k and sampling.top_k < scores.numel():
            kth = torch.topk(scores, sampling.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if sampling.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=True)
            cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(-1)
            drop = (
                cumulative - torch.softmax(sorted_scores, dim=-1) >= sampling.top_p
            )  # keep the first past p
            sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
            scores = torch.full_like(scores, float("-inf")).scatter(0, order, sorted_scores)
        probabilities = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probabilities, 1, generator=request.generator))

    # --- batch bookkeeping -------------------------------------------------------------------------

    def _join(
        self,
        requests: list[_Request],
        layers: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
        lengths: list[int],
    ) -> None:
        if not self._rows:
            self._cache, self._mask = layers, mask
        else:
            assert self._mask is not None
            width = max(self._mask.shape[1], mask.shape[1])
            old, new = self._left_pad(self._cache, self._mask, width), self._left_pad(layers, mask, width)
            self._cache = [
                (torch.cat([old_k, new_k]), torch.cat([old_v, new_v]))
                for (old_k, old_v), (new_k, new_v) in zip(old[0], new[0], strict=False)
            ]
            self._mask = torch.cat([old[1], new[1]])
        self._rows.extend(requests)
        self._lengths.extend(lengths)
        self._last_ids.extend([0] * len(requests))
        self.max_batch_seen = max(self.max_batch_seen, len(self._rows))

    @staticmethod
    def _left_pad(
        layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor, width: int
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        extra = width - mask.shape[1]
        if extra == 0:
            return layers, mask
        padded = [
            (torch.nn.functional.pad(k, (0, 0, extra, 0)), torch.nn.functional.pad(v, (0, 0, extra, 0)))
            for k, v in layers
        ]
        return padded, torch.nn.functional.pad(mask, (extra, 0))

    def _retire(self, indices: list[int]) -> None:
        finished = set(indices)
        for index in indices:
            request = self._rows[index]
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
                },
            )
            self._resolve(request, generation)
        keep = [index for index in range(len(self._rows)) if index not in finished]
        self._rows = [self._rows[index] for index in keep]
        self._lengths = [self._lengths[index] for index in keep]
        self._last_ids = [self._last_ids[index] for index in keep]
        if not keep:
            self._cache, self._mask = [], None
            return
        assert self._mask is not None
        selector = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self._mask.index_select(0, selector)
        # drop columns that are padding in every remaining row
        first_real = int((mask.cumsum(-1) == 0).sum(-1).min())
        self._mask = mask[:, first_real:]
        self._cache = [
            (k.index_select(0, selector)[:, :, first_real:], v.index_select(0, selector)[:, :, first_real:])
            for k, v in self._cache
        ]
