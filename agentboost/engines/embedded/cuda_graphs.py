"""Decode steps as CUDA graphs, for a few batch-size buckets: UNVERIFIED on CUDA, off by default.

On a GPU the embedded engine's decode step is a chain of a few hundred small kernel launches driven from
Python (131 tok/s for 64 math rollouts of SmolLM2 on an H100, issue 43). A CUDA graph records that chain
once and replays it with one launch. A graph replays fixed shapes at fixed addresses, so a graphed step
(``LocalEngine(..., cuda_graphs=True)``, ``rollout.cuda_graphs: true`` in a training config):

- pads the running batch to the smallest bucket that holds it (:data:`DEFAULT_BUCKETS`): the batch's KV
  buffer (:class:`~agentboost.engines.embedded.batch_kv.BatchKV`) is built with the padding rows, which
  feed token 0 at position 0 and attend only to their own columns; a batch over the largest bucket
  runs the ordinary eager step;
- attends over the buffer's whole capacity, not its filled width: the mask is a ``[rows, 1, 1,
  capacity]`` boolean buffer (columns past the width are 0, and zeroed in the buffer, so masked
  columns add exact zeros), and each layer writes its new column at an index held in a device tensor
  (:class:`_StaticLayer`), so the same kernels serve every step;
- is captured once per (bucket, KV buffer, weights epoch): a request joining or leaving, the buffer
  growing (every ``HEADROOM`` steps) or a weight update makes the next step capture again (two warm-up
  passes on a side stream, then the capture). Steps between those replay.

What stays as it is: sampling (per-request CPU generators, after the graph), the prefix cache (the same
buffer), cancellation (rows leave between steps), and the logprobs: rows are independent in every
operation of a decode step, so padding rows never change a real row's logits (tested on CPU by running
the padded step eagerly, ``capture=False``, against the unpadded one). Graphed steps run transformers'
forward (not the CPU-only direct forward), with autocast's weight cache off inside the capture.

Only under ``torch.cuda.is_available()`` and a model on a CUDA device; elsewhere asking for it is a
:class:`~agentboost.errors.ConfigError` (a switch that silently did nothing would hide that the speed-up
is not there). This has never run on a GPU: keep it off until ``benchmarks/gpu_check.py`` shows its
logprobs within the exactness bound and its tokens per second on a device (docs/engines.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from agentboost.errors import ConfigError

DEFAULT_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
"""Batch sizes with a graph of their own: a batch of ``b`` rows runs in the smallest bucket >= ``b``."""
WARMUP_PASSES = 2
"""Eager passes on a side stream before a capture (lazy initialisation, allocator warm-up)."""


def check_buckets(buckets: Sequence[int]) -> tuple[int, ...]:
    """``buckets`` sorted, or a :class:`ConfigError` when one is not a positive whole number."""
    if not buckets or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in buckets):
        raise ConfigError(f"CUDA graph buckets must be positive batch sizes, got {list(buckets)!r}")
    return tuple(sorted(set(buckets)))


def bucket_for(rows: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``rows`` rows; None over the largest (the step runs eagerly)."""
    return next((bucket for bucket in buckets if bucket >= rows), None)


class _StaticLayer(DynamicLayer):
    """One layer's keys and values over the whole capacity of the batch's buffer; a step writes its
    column at the index in ``column`` (a one-element device tensor), so the kernels never change."""

    def __init__(self, buffer: torch.Tensor, index: int, column: torch.Tensor) -> None:
        super().__init__()
        self.dtype, self.device = buffer.dtype, buffer.device
        self.is_initialized = True
        self.keys, self.values = buffer[index, 0], buffer[index, 1]  # [rows, kv_heads, capacity, D]
        self._column = column

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # (cast as the eager layer's slice assignment casts: bfloat16 autocast states into the cache's dtype)
        self.keys.index_copy_(2, self._column, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, self._column, value_states.to(self.values.dtype))
        return self.keys, self.values


@dataclass
class _Static:
    """The fixed inputs and output of one bucket's step, and its graph once captured."""

    key: tuple[Any, ...]
    input_ids: torch.Tensor  # [bucket, 1]
    positions: torch.Tensor  # [bucket, 1]
    mask: torch.Tensor  # [bucket, 1, 1, capacity] bool, True = attended
    column: torch.Tensor  # [1] the column this step writes
    cache: Cache
    logits: torch.Tensor | None = None  # [bucket, V] float32: the graph's output buffer
    graph: Any = None
    steps: int = field(default=0)


StepForward = Callable[..., torch.Tensor]
"""The engine's pass: keyword inputs of a transformers forward -> last-position logits ``[rows, V]``."""


class DecodeGraphs:
    """The graphed decode steps of one engine: a static step per bucket, captured when ``capture``.

    ``capture=False`` runs the very same padded, full-capacity step eagerly: what a CPU can check of it.
    """

    def __init__(self, buckets: Sequence[int] = DEFAULT_BUCKETS, *, capture: bool) -> None:
        self.buckets = check_buckets(buckets)
        self.capture = capture
        self.captures = 0  # graphs captured (each batch change, buffer growth or weight update)
        self.replays = 0  # steps that replayed a graph
        self.padded_steps = 0  # steps that ran padded to a bucket (replayed or eager)
        self._statics: dict[int, _Static] = {}
        self._pool: Any = None  # the graphs' shared memory pool

    @classmethod
    def for_device(cls, device: torch.device, buckets: Sequence[int] = DEFAULT_BUCKETS) -> DecodeGraphs:
        """Graphs for a model on ``device``: a :class:`ConfigError` unless it is a CUDA device."""
        if device.type != "cuda" or not torch.cuda.is_available():
            raise ConfigError(
                f"cuda_graphs needs a model on a CUDA GPU; this one is on {device} "
                f"(torch sees {'a' if torch.cuda.is_available() else 'no'} GPU); leave cuda_graphs off here"
            )
        return cls(buckets, capture=True)

    def bucket_for(self, rows: int) -> int | None:
        return bucket_for(rows, self.buckets)

    def release(self) -> None:
        """Drop every graph and its views of the batch's buffers (the batch ended, or the engine closed)."""
        self._statics.clear()
        self._pool = None

    def step(
        self,
        forward: StepForward,
        kv: Any,
        last_ids: list[int],
        lengths: list[int],
        epoch: int,
    ) -> torch.Tensor:
        """One decode step of ``len(last_ids)`` real rows over ``kv`` (padded to its bucket, its next
        column already opened by ``kv.next_mask()``): the real rows' logits ``[rows, V]``."""
        rows, bucket = len(last_ids), kv.rows
        full_mask = kv.full_mask()  # [bucket, capacity]
        buffers = kv.layer_buffers()
        key = (bucket, full_mask.shape[1], tuple(buffer.data_ptr() for buffer, _ in buffers), epoch)
        static = self._statics.get(bucket)
        if static is None or static.key != key:
            self._statics.pop(bucket, None)  # its buffers go before the new ones are made
            static = self._new_static(key, bucket, full_mask, buffers)
            self._statics[bucket] = static
        static.input_ids.zero_()
        static.input_ids[:rows, 0] = torch.tensor(last_ids, dtype=torch.long)
        static.positions.zero_()
        static.positions[:rows, 0] = torch.tensor(lengths, dtype=torch.long)
        static.mask.copy_(full_mask.view(bucket, 1, 1, -1))
        static.column.fill_(kv.width - 1)
        self.padded_steps += 1
        if static.graph is not None:
            static.graph.replay()
            self.replays += 1
        elif self.capture:
            self._capture(static, forward)
        else:
            static.logits = self._run(static, forward)
        assert static.logits is not None
        return static.logits[:rows]

    @staticmethod
    def _new_static(
        key: tuple[Any, ...], bucket: int, full_mask: torch.Tensor, buffers: list[tuple[torch.Tensor, int]]
    ) -> _Static:
        device = full_mask.device
        column = torch.zeros(1, dtype=torch.long, device=device)
        return _Static(
            key=key,
            input_ids=torch.zeros((bucket, 1), dtype=torch.long, device=device),
            positions=torch.zeros((bucket, 1), dtype=torch.long, device=device),
            mask=torch.zeros((bucket, 1, 1, full_mask.shape[1]), dtype=torch.bool, device=device),
            column=column,
            cache=Cache(layers=[_StaticLayer(buffer, index, column) for buffer, index in buffers]),
        )

    @staticmethod
    def _run(static: _Static, forward: StepForward) -> torch.Tensor:
        return forward(
            input_ids=static.input_ids,
            attention_mask=static.mask,
            position_ids=static.positions,
            use_cache=True,
            cache=static.cache,
        )

    def _capture(self, static: _Static, forward: StepForward) -> None:
        """Warm up on a side stream, capture, replay: the warm-ups write this step's column with the
        values the replay writes again, so nothing is computed twice into the batch's KV."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_PASSES):
                self._run(static, forward)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread-local: the scheduler thread captures; CUDA work on another thread must not void it
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            static.logits = self._run(static, forward)
        self._pool = graph.pool()
        static.graph = graph
        self.captures += 1
        graph.replay()
        self.replays += 1
