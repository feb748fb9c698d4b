"""The embedded engine's model step: prefills from the prefix cache, decode steps, sampling.

Every method runs on the scheduler thread. A pass goes through transformers' forward or the direct
forward (:mod:`agentboost.engines.embedded.direct_forward`), on oneDNN's packed linears
(:mod:`agentboost.engines.embedded.packed_linear`) where they apply; the switches are made once, by
:meth:`ModelStep._init_model_step`. Weight changes are detected here (an epoch per weights version) and
keep stale KV out of the prefix cache.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded import decode_attention
from agentboost.engines.embedded import direct_forward as direct_forward_module
from agentboost.engines.embedded.packed_linear import Linears, PackedLinears, onednn_supported
from agentboost.engines.embedded.scheduler import _Request
from agentboost.memory import GLIBC_MMAP_THRESHOLD_MAX, large_blocks_from_heap, trim_heap
from agentboost.models import precision as precision_module

logger = logging.getLogger(__name__)


REBUFFER_TRIM_INTERVAL_S = 2.0
"""At most one heap trim this often when the batch changes (the prefill's per-layer KV, freed once
copied into the batch's buffer, came from the heap): a trim costs 7-60 ms, and a trainer's rollouts
change their batch every time an agent's turn starts or ends."""
LARGE_PREFILL_BYTES = GLIBC_MMAP_THRESHOLD_MAX
"""A prefill whose widest activation (rows x width x the model's widest feature size) reaches this runs
inside :func:`~agentboost.memory.large_blocks_from_heap`, and the heap is trimmed as soon as it is done:
below it, glibc serves its blocks from the heap anyway and nothing changes."""
MIN_SHARED_PREFIX = 16
"""Requests admitted together must share at least this many uncached tokens to prefill them once."""


class ModelStep:
    """The model half of :class:`~agentboost.engines.embedded.engine.LocalEngine`: what one pass
    computes and samples, on the scheduler thread. A mixin: the state is the engine's (the
    performance switches' part made by :meth:`_init_model_step`)."""

    def _init_model_step(
        self,
        model: Any,
        *,
        packed_weights: bool,
        onednn_linears: bool,
        native_attention: bool,
        direct_forward: bool,
    ) -> None:
        """The model step's state: the performance switches of ``LocalEngine.__init__`` and what
        they hold."""
        self._logits_to_keep = True  # pass logits_to_keep=1 while the model accepts it
        self._cache_argument = _cache_argument(model)
        # one-token steps attend with grouped query heads instead of a per-head copy of the cache, in the
        # native kernel unless native_attention=False (or it cannot be built here)
        self.grouped_decode_attention = decode_attention.use_for(model, native=native_attention)
        # decode steps without transformers' module machinery, for the model families it knows (checked
        # against transformers' forward before its first use)
        self.direct_forward_reason = None if direct_forward else "direct_forward=False"
        if self._graphs is not None:
            self.direct_forward_reason = "cuda_graphs: graphed steps run transformers' forward"
        elif not self.precision.exact:
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
        self._autocast_cache = True  # off while a CUDA graph is captured (cached casts must not outlive it)

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
            with self.precision.autocast(cache=self._autocast_cache):
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
        parts: list[tuple[Any, torch.Tensor]] = [self._running_part()] if join and self._rows else []
        parts.append((None, mask))
        padding = self._padding(len(self._rows) + rows) if join else {}
        kv = BatchKV(parts, max_width, layout=self._layout(), **padding)
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

    def _running_part(self) -> tuple[Any, torch.Tensor]:
        """The running rows' KV and mask, without a graphed batch's padding rows."""
        assert self._mask is not None
        rows = len(self._rows)
        if self._mask.shape[0] == rows:
            return self._cache, self._mask
        return [(keys[:rows], values[:rows]) for keys, values in self._cache], self._mask[:rows]

    def _padding(self, rows: int) -> dict[str, Any]:
        """BatchKV's options for a batch of ``rows``: padded to its bucket and zeroed when decode steps
        are graphed and a bucket holds it, else none."""
        if self._graphs is None:
            return {}
        bucket = self._graphs.bucket_for(rows)
        if bucket is None:
            return {}
        return {"pad_rows": bucket - rows, "zeroed": True}

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
        if self._graphs is not None and kv.rows == self._graphs.bucket_for(rows):  # padded to its bucket
            kv.next_mask()
            logits = self._graphs.step(
                self._static_forward, kv, self._last_ids, self._lengths, self._current_epoch()
            )
            kv.advance()
            self._cache, self._mask = kv.layers(), kv.mask()
            self._lengths = [length + 1 for length in self._lengths]
            self.steps += 1
            self._sample(logits, first_row=0)
            return
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

    def _static_forward(self, *, cache: Any, **inputs: Any) -> torch.Tensor:
        """A graphed step's pass (:mod:`agentboost.engines.embedded.cuda_graphs`): last-position logits."""
        self._autocast_cache = False
        try:
            output = self._forward(**inputs, **{self._cache_argument: cache})
        finally:
            self._autocast_cache = True
        return output.logits[:, -1, :]

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
