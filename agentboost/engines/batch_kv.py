"""The running batch's KV cache in preallocated buffers, written in place by each decode step.

transformers' ``DynamicCache`` appends a step's keys and values with ``torch.cat``: every decode step
re-allocates and copies the whole cache of every layer (31% of a step at batch 1 in the profile of
docs/engines.md, and it grows with the cache). Here each layer owns ``[rows, kv_heads, capacity,
head_dim]`` buffers; a step writes its column at the current width and the model attends over a view
of the first ``width`` columns. The buffers grow by :data:`HEADROOM` columns when full, so a copy
happens once every ``HEADROOM`` steps instead of every step. The attention mask lives in a buffer of
the same capacity.

Imported lazily by :mod:`agentboost.engines.local` (it imports transformers).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

HEADROOM = 64
"""Columns allocated past the current width: one growth (a copy of the cache) every 64 decode steps."""


class _InPlaceLayer(DynamicLayer):
    """One layer's keys and values in buffers; ``keys``/``values`` are views of the filled columns."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._allocate(keys, values, capacity)

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        width = keys.shape[-2]
        self._key_buffer = keys.new_empty((*keys.shape[:-2], capacity, keys.shape[-1]))
        self._value_buffer = values.new_empty((*values.shape[:-2], capacity, values.shape[-1]))
        self._key_buffer[..., :width, :] = keys
        self._value_buffer[..., :width, :] = values
        self.keys, self.values = self._key_buffer[..., :width, :], self._value_buffer[..., :width, :]

    @property
    def capacity(self) -> int:
        return self._key_buffer.shape[-2]

    def buffer_bytes(self) -> int:
        return 2 * self._key_buffer.numel() * self._key_buffer.element_size()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.capacity:
            self._allocate(self.keys, self.values, end + HEADROOM)
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.keys, self.values = self._key_buffer[..., :end, :], self._value_buffer[..., :end, :]
        return self.keys, self.values


class BatchKV:
    """The KV and attention mask of a running batch, extended one column per decode step without copies.

    Built from the batch's per-layer ``[rows, kv_heads, width, head_dim]`` tensors and its ``[rows,
    width]`` mask (copied once into buffers of ``width + HEADROOM`` columns, or fewer when the batch
    will never need them: ``max_width`` is the widest the caller reserved memory for). Pass
    :attr:`cache` to the model with the mask from :meth:`next_mask`; the model's forward writes the
    new keys and values in place.
    """

    def __init__(
        self, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor, max_width: int
    ) -> None:
        self.width = mask.shape[1]
        capacity = max(self.width + 1, min(self.width + HEADROOM, max_width))
        self._layers = [_InPlaceLayer(keys, values, capacity) for keys, values in layers]
        self.cache = Cache(layers=list(self._layers))
        self._mask_buffer = mask.new_zeros((mask.shape[0], capacity))
        self._mask_buffer[:, : self.width] = mask

    def next_mask(self) -> torch.Tensor:
        """The mask of the next one-token step (every row reads its new token); advances the width."""
        if self.width == self._mask_buffer.shape[1]:
            grown = self._mask_buffer.new_zeros((self._mask_buffer.shape[0], self.width + 1 + HEADROOM))
            grown[:, : self.width] = self._mask_buffer
            self._mask_buffer = grown
        self._mask_buffer[:, self.width] = 1
        self.width += 1
        return self.mask()

    def mask(self) -> torch.Tensor:
        return self._mask_buffer[:, : self.width]

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, views of the filled columns: ``[rows, kv_heads, width, head_dim]``."""
        return [(layer.keys, layer.values) for layer in self._layers]

    def buffer_bytes(self) -> int:
        """Bytes the buffers hold, headroom included."""
        return sum(layer.buffer_bytes() for layer in self._layers)
