"""The running batch's KV cache in preallocated buffers, written in place by each decode step.

transformers' ``DynamicCache`` appends a step's keys and values with ``torch.cat``: every decode step
re-allocates and copies the whole cache of every layer (31% of a step at batch 1 in the profile of
docs/engines.md, and it grows with the cache). Here the keys and values of every layer live in one
buffer ``[layers, 2, rows, kv_heads, capacity, head_dim]`` (one per group of layers of the same shape:
one for the usual model); a step writes its column at the current width and the model attends over a
view of the first ``width`` columns. The buffer grows by :data:`HEADROOM` columns when full, so a copy
happens once every ``HEADROOM`` steps instead of every step. The attention mask lives in a buffer of
the same capacity.

One buffer rather than one per layer keeps the batch's KV out of the C heap: glibc maps an allocation
of that size (tens to hundreds of MiB) on its own and gives it back when it is freed, where 60
per-layer tensors of a few MiB each are carved from the heap and leave holes it cannot return (the
math demonstration's rollouts held 1.3 GiB free inside the heap at their peak; docs/training.md). A
batch is built straight from its parts (the rows already running, the rows just prefilled, the rows
that stay after some leave), each copied once into place: no concatenated or re-indexed intermediate.

Imported lazily by :mod:`agentboost.engines.local` (it imports transformers).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer

HEADROOM = 64
"""Columns allocated past the current width: one growth (a copy of the cache) every 64 decode steps."""

Layers = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, keys and values ``[rows, kv_heads, width, head_dim]``."""


class _InPlaceLayer(DynamicLayer):
    """One layer's keys and values, views of its group's buffer; ``keys``/``values`` the filled columns."""

    def __init__(self, owner: BatchKV, buffer: torch.Tensor, index: int, width: int) -> None:
        super().__init__()
        # a weak reference: a cycle would keep the batch's buffer alive until the cyclic collector ran
        self._owner = weakref.ref(owner)
        self._index = index
        self.dtype, self.device = buffer.dtype, buffer.device
        self.is_initialized = True
        self.point(buffer, width)

    def point(self, buffer: torch.Tensor, width: int) -> None:
        """Use the group's ``buffer`` (a new one after a growth) and view its first ``width`` columns."""
        self._key_buffer, self._value_buffer = buffer[self._index, 0], buffer[self._index, 1]
        self.keys, self.values = self._key_buffer[..., :width, :], self._value_buffer[..., :width, :]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            owner = self._owner()
            if owner is None:
                raise RuntimeError("a BatchKV layer outlived its batch")
            owner.reserve(end)  # grows every layer's buffer at once
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.keys, self.values = self._key_buffer[..., :end, :], self._value_buffer[..., :end, :]
        return self.keys, self.values


class BatchKV:
    """The KV and attention mask of a running batch, extended one column per decode step without copies.

    Built from ``parts``: groups of rows, each its per-layer ``[rows, kv_heads, width, head_dim]`` keys
    and values (views are fine: each is copied once into place) and its ``[rows, width]`` mask. Rows
    are stacked in order, right-aligned to the widest part; the columns left of a narrower part are
    zeros with mask 0. Buffers have ``width + HEADROOM`` columns, or fewer when the batch will never
    need them (``max_width`` is the widest the caller reserved memory for). Pass :attr:`cache` to the
    model with the mask from :meth:`next_mask`; the model's forward writes the new keys and values in
    place.
    """

    def __init__(self, parts: Sequence[tuple[Layers, torch.Tensor]], max_width: int) -> None:
        first_layers, first_mask = parts[0]
        self.rows = sum(mask.shape[0] for _, mask in parts)
        self.width = max(mask.shape[1] for _, mask in parts)
        capacity = max(self.width + 1, min(self.width + HEADROOM, max_width))
        # layers whose keys and values share a shape (but the width) and dtype share a buffer
        self._slots: list[tuple[int, int]] = []  # per layer: (group, index in the group)
        shapes: list[tuple[tuple[int, ...], torch.dtype, torch.device]] = []
        counts: list[int] = []
        for keys, values in first_layers:
            shape = (keys.shape[1], keys.shape[3], values.shape[3])
            key = (shape, keys.dtype, keys.device)
            if keys.shape[3] != values.shape[3] or values.dtype != keys.dtype:
                key = ((*shape, len(shapes)), keys.dtype, keys.device)  # never shared
            if key not in shapes:
                shapes.append(key)
                counts.append(0)
            group = shapes.index(key)
            self._slots.append((group, counts[group]))
            counts[group] += 1
        self._buffers = [
            torch.empty((count, 2, self.rows, shape[0], capacity, shape[1]), dtype=dtype, device=device)
            for (shape, dtype, device), count in zip(shapes, counts, strict=True)
        ]
        self._mask_buffer = first_mask.new_zeros((self.rows, capacity))
        row = 0
        for layers, mask in parts:
            count, width = mask.shape
            start = self.width - width
            for (group, index), (keys, values) in zip(self._slots, layers, strict=True):
                target = self._buffers[group][index, :, row : row + count]  # [2, rows, heads, C, D]
                target[0, :, :, start : self.width] = keys
                target[1, :, :, start : self.width] = values
                if start:
                    target[:, :, :, :start].zero_()  # masked out, but must be finite for attention
            self._mask_buffer[row : row + count, start : self.width] = mask
            row += count
        self._layers = [
            _InPlaceLayer(self, self._buffers[group], index, self.width) for group, index in self._slots
        ]
        self.cache = Cache(layers=list(self._layers))

    def reserve(self, width: int) -> None:
        """Make room for ``width`` columns in every layer and the mask (one copy, ``HEADROOM`` spare)."""
        capacity = self._mask_buffer.shape[1]
        if width <= capacity:
            return
        capacity = width + HEADROOM
        filled = [layer.keys.shape[-2] for layer in self._layers]
        columns = max([self.width, *filled])  # layers a forward already extended keep their column
        grown = []
        for buffer in self._buffers:
            bigger = buffer.new_empty((*buffer.shape[:4], capacity, buffer.shape[5]))
            bigger[..., :columns, :] = buffer[..., :columns, :]
            grown.append(bigger)
        self._buffers = grown  # the old ones are freed as the layers re-point
        for layer, (group, _), layer_columns in zip(self._layers, self._slots, filled, strict=True):
            layer.point(self._buffers[group], layer_columns)
        mask = self._mask_buffer.new_zeros((self.rows, capacity))
        mask[:, : self.width] = self._mask_buffer[:, : self.width]
        self._mask_buffer = mask

    def next_mask(self) -> torch.Tensor:
        """The mask of the next one-token step (every row reads its new token); advances the width."""
        self.reserve(self.width + 1)
        self._mask_buffer[:, self.width] = 1
        self.width += 1
        return self.mask()

    def mask(self) -> torch.Tensor:
        return self._mask_buffer[:, : self.width]

    def layers(self) -> Layers:
        """Per layer, views of the filled columns: ``[rows, kv_heads, width, head_dim]``."""
        return [(layer.keys, layer.values) for layer in self._layers]

    def buffer_bytes(self) -> int:
        """Bytes the buffers hold, headroom included."""
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers)
