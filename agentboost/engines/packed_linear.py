"""Packed copies of a model's linear weights, for the embedded engine's batched CPU decode steps.

A decode step multiplies a few rows (one per running sequence) by every weight matrix of the model.
At that shape, MKL's plain ``sgemm`` spends much of its time re-arranging the weight into the blocked
layout its kernel reads; ``cblas_sgemm_pack`` does that once and the packed matrix is then reused step
after step. PyTorch exposes both (``torch.ops.mkl._mkl_reorder_linear_weight`` and
``torch.ops.mkl._mkl_linear``, what Inductor uses for frozen fp32 linears on CPU). Measured on
SmolLM2-135M fp32, 2 threads (docs/engines.md; ``benchmarks/bench_packed_weights.py`` compares whole
workloads): a decode step is about 1.13x faster at batch 16 and 1.2x at batch 8, and slower at
batch 1, where MKL takes a matrix-vector path anyway; so the engine uses the packs from
:data:`MIN_ROWS` rows up.

Nothing in the model changes. While a step runs, each packed ``nn.Linear`` gets an instance-level
``forward`` that calls the packed kernel, removed when the step ends; outside the engine's scheduler
thread, or wherever autograd is recording, it falls back to ``F.linear``. MKL packs for one row count,
so the engine packs once a batch size has lasted :data:`STEADY_STEPS` steps (a GRPO group, a batch of
conversations) and decodes other sizes unpacked. The packs are rebuilt when the weights change (the
engine's weights epoch) and cost about the size of the linear weights
(516 MiB for SmolLM2-135M), so the engine drops them when it goes idle and on
:meth:`~agentboost.engines.local.LocalEngine.release_memory`. The local trainer's engine does not pack:
its rollouts drain, so batch sizes rarely hold (docs/engines.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

MIN_ROWS = 2
"""The smallest decode batch that uses the packs (batch 1 is faster unpacked)."""

STEADY_STEPS = 8
"""MKL packs a weight for one row count: the engine packs for a batch size once it has run this many
decode steps in a row (packing SmolLM2-135M takes about 0.14 s; packed batch-8 steps save 14 ms each)."""


def packing_supported(model: Any) -> bool:
    """True where the packed path can run: PyTorch built with MKL and the model's weights fp32 on CPU."""
    if not (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")):
        return False
    try:
        parameter = next(model.parameters())
    except StopIteration:
        return False
    return parameter.device.type == "cpu" and parameter.dtype == torch.float32


class PackedLinears:
    """MKL-packed copies of a model's fp32 ``nn.Linear`` weights, active inside :meth:`active`."""

    def __init__(self, model: Any) -> None:
        # exact nn.Linear only (subclasses may compute more than x @ W.T + b); modules whose forward
        # was already replaced on the instance (accelerate's hooks) are left alone
        self._linears = [
            module
            for module in model.modules()
            if type(module) is torch.nn.Linear
            and module.weight.dtype == torch.float32
            and module.weight.device.type == "cpu"
            and "forward" not in module.__dict__
        ]
        self._packs: list[torch.Tensor] | None = None
        self._epoch: int | None = None
        self._rows = 0  # the row count the packs are for
        self._owner: int | None = None  # the thread whose steps use the packs

    @property
    def held(self) -> bool:
        return self._packs is not None

    def usable(self, rows: int, epoch: int) -> bool:
        """True when packs for ``rows`` rows of the weights of ``epoch`` are held."""
        return self._packs is not None and self._rows == rows and self._epoch == epoch

    def pack(self, rows: int, epoch: int) -> None:
        """Pack the weights as they are now (weights ``epoch``) for steps of ``rows`` rows."""
        self.release()  # the old packs go before the new ones are made
        with torch.no_grad():
            self._packs = [
                torch.ops.mkl._mkl_reorder_linear_weight(module.weight.detach(), rows)
                for module in self._linears
            ]
        self._rows, self._epoch = rows, epoch

    def release(self) -> None:
        self._packs, self._epoch, self._rows = None, None, 0

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the linears through the packs for the duration of one forward pass in this thread."""
        packs = self._packs
        if packs is None:
            yield
            return
        self._owner = threading.get_ident()
        for module, packed in zip(self._linears, packs, strict=True):
            module.forward = _packed_forward(module, packed, self._rows, self)
        try:
            yield
        finally:
            for module in self._linears:
                module.__dict__.pop("forward", None)
            self._owner = None


def _packed_forward(module: torch.nn.Linear, packed: torch.Tensor, rows: int, owner: PackedLinears) -> Any:
    weight, bias = module.weight, module.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or owner._owner != threading.get_ident() or x.dtype != torch.float32:
            return F.linear(x, weight, bias)  # another thread's pass, or one autograd must see
        # (the kernel itself falls back to the plain weight for any other row count)
        out = torch.ops.mkl._mkl_linear(x.reshape(-1, x.shape[-1]), packed, weight, bias, rows)
        return out.view(*x.shape[:-1], out.shape[-1])

    return forward
