"""An update's long-lived tensors in one buffer each, out of the C heap where activations churn.

PyTorch's CPU tensors come from glibc's ``malloc``. Below its mmap threshold (which climbs towards
32 MiB as large blocks are freed) a tensor is carved from the heap. A model has hundreds of parameters
of 1-4 MiB: when every backward allocates their gradients one by one, and the first optimizer step
their AdamW moments, those land in the holes a micro-batch's activations left, and stay there. The
heap can then neither reuse the holes for the next micro-batch's larger activations nor give them
back: on the math demonstration's GRPO update, 1.9 GiB sat free inside the heap at the peak
(``mallinfo2``), beside 2.3 GiB in use (docs/training.md, "Peak memory of the demonstration").

Here the gradients of an update, and the optimizer's state after its first step, are views of one
buffer per dtype and device: one allocation of hundreds of MiB, which glibc always maps on its own and
unmaps when freed. Values and arithmetic are unchanged (tested bit for bit against the usual path).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from agentboost.memory import trim_heap

TRIM_EVERY_BYTES = 128 << 20
"""While state moves into its buffer, hand the freed originals back this often (RSS never doubles)."""


def _buffer_views(
    tensors: Sequence[torch.Tensor], *, zero: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Fresh buffers, one per (dtype, device) of ``tensors``, and a view of them shaped like each tensor,
    in order: (views, buffers)."""
    sizes: dict[tuple[torch.dtype, torch.device], int] = {}
    for tensor in tensors:
        key = (tensor.dtype, tensor.device)
        sizes[key] = sizes.get(key, 0) + tensor.numel()
    make = torch.zeros if zero else torch.empty
    buffers = {key: make(total, dtype=key[0], device=key[1]) for key, total in sizes.items()}
    offsets = dict.fromkeys(sizes, 0)
    views = []
    for tensor in tensors:
        key, count = (tensor.dtype, tensor.device), tensor.numel()
        start = offsets[key]
        views.append(buffers[key][start : start + count].view(tensor.shape))
        offsets[key] = start + count
    return views, list(buffers.values())


class FlatGradients:
    """Gradients of ``parameters`` as views of one zeroed buffer, for the length of an update.

    :meth:`allocate` before the update's first backward (autograd then accumulates into the views in
    place, as it accumulates into any existing ``.grad``); :meth:`drop_untouched` before each optimizer
    step, so a parameter no backward reached keeps ``grad = None`` and the optimizer skips it as usual;
    :meth:`zero` between steps; :meth:`release` after the update frees the buffer.
    """

    def __init__(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        self._views: list[torch.Tensor] = []
        self._buffers: list[torch.Tensor] = []
        self._touched: set[int] = set()
        for parameter in self.parameters:
            parameter.register_post_accumulate_grad_hook(self._mark)

    def _mark(self, parameter: torch.Tensor) -> None:
        self._touched.add(id(parameter))

    def allocate(self) -> None:
        """Zeroed gradients for every parameter, in one buffer per dtype and device."""
        self.release()
        self._views, self._buffers = _buffer_views(self.parameters, zero=True)
        self._attach()

    def zero(self) -> None:
        """Zero every gradient in place (allocating them first if released)."""
        if not self._buffers:
            self.allocate()
            return
        for buffer in self._buffers:
            buffer.zero_()
        self._attach()

    def _attach(self) -> None:
        for parameter, view in zip(self.parameters, self._views, strict=True):
            parameter.grad = view
        self._touched.clear()

    def drop_untouched(self) -> None:
        """``grad = None`` for parameters no backward reached since the last :meth:`zero`/:meth:`allocate`."""
        for parameter in self.parameters:
            if id(parameter) not in self._touched:
                parameter.grad = None

    def all_reduce(self, dist: Any) -> None:
        """Sum the gradients over the ranks of ``dist`` (``torch.distributed``), before
        :meth:`drop_untouched`: each buffer all-reduced in place, and a parameter any rank's backward
        reached counts as touched on every rank (so all ranks step the same parameters)."""
        if not self._buffers:
            self.allocate()
        for buffer in self._buffers:
            dist.all_reduce(buffer)
        device = self._buffers[0].device
        touched = torch.tensor(
            [id(p) in self._touched for p in self.parameters], dtype=torch.uint8, device=device
        )
        dist.all_reduce(touched, op=dist.ReduceOp.MAX)
        self._touched = {id(p) for p, hit in zip(self.parameters, touched.tolist(), strict=True) if hit}

    def release(self) -> None:
        for parameter in self.parameters:
            parameter.grad = None
        self._views, self._buffers = [], []
        self._touched.clear()


def compact_optimizer_state(optimizer: torch.optim.Optimizer) -> bool:
    """Move the optimizer's per-parameter state tensors (AdamW's moments) into one buffer per dtype and
    device, values copied; scalars (``step``) stay. A no-op once they share one buffer. True if moved."""
    entries = [
        (state, key)
        for state in optimizer.state.values()
        for key, value in state.items()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    ]
    if not entries:
        return False
    tensors = [state[key] for state, key in entries]
    groups = {(t.dtype, t.device) for t in tensors}
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    if len(storages) <= len(groups):
        return False
    views, _ = _buffer_views(tensors, zero=False)
    del tensors
    copied = 0
    for (state, key), view in zip(entries, views, strict=True):
        view.copy_(state[key])
        copied += view.numel() * view.element_size()
        state[key] = view  # the original is freed here
        if copied >= TRIM_EVERY_BYTES:
            trim_heap()
            copied = 0
    trim_heap()
    return True
