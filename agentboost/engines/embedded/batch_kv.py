"""The running batch's KV cache in preallocated buffers, written in place by each decode step.

transformers' ``DynamicCache`` appends a step's keys and values with ``torch.cat``: every decode step
re-allocates and copies the whole cache of every layer (31% of a step at batch 1 in the profile of
docs/engines.md, and it grows with the cache). Here the keys and values of every layer live in one
buffer ``[layers, 2, rows, kv_heads, capacity, head_dim]`` (one per group of layers of the same shape:
one for the usual model); a step writes its column at the current width and the model attends over a
view of the first ``width`` columns. The buffer grows by :data:`HEADROOM` columns when full, so a copy
happens once every ``HEADROOM`` steps instead of every step. The attention mask lives in a buffer of
the same capacity.

A prefill writes its rows' keys and values straight into the buffer of the batch they join: the batch
is built first, from the rows already running (copied once) and the new rows (left for the prefill,
their cached prefix copied in from the prefix cache), and :meth:`BatchKV.prefill_cache` gives the
model a cache over just the new rows. Before, the prefill's keys and values were concatenated layer by
layer in a ``DynamicCache`` and then copied into the batch: two copies of every prefilled column.

One buffer rather than one per layer keeps the batch's KV out of the C heap: glibc maps an allocation
of that size (tens to hundreds of MiB) on its own and gives it back when it is freed, where 60
per-layer tensors of a few MiB each are carved from the heap and leave holes it cannot return (the
math demonstration's rollouts held 1.3 GiB free inside the heap at their peak; docs/training.md). A
batch is built straight from its parts (the rows already running, the rows just prefilled, the rows
that stay after some leave), each copied once into place: no concatenated or re-indexed intermediate.

Imported lazily by :mod:`agentboost.engines.embedded.engine` (it imports transformers).
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

Layout = list[tuple[int, int, int, torch.dtype, torch.device]]
"""Per layer, what its keys and values are: ``(kv_heads, key_dim, value_dim, dtype, device)``."""

_ALL = slice(None)


class _InPlaceLayer(DynamicLayer):
    """One layer's keys and values, views of its group's buffer; ``keys``/``values`` the filled columns.

    A decode step's layer (``owner`` set) views every row from column 0 and grows the batch's buffers
    when a step needs a column past them. A prefill's layer views only the rows it fills, from the
    column where they start, and never grows anything: the batch was built wide enough for it.
    """

    def __init__(
        self,
        owner: BatchKV | None,
        buffer: torch.Tensor,
        index: int,
        width: int,
        rows: slice = _ALL,
        start: int = 0,
    ) -> None:
        super().__init__()
        # a weak reference: a cycle would keep the batch's buffer alive until the cyclic collector ran
        self._owner = weakref.ref(owner) if owner is not None else None
        self._index, self._rows, self._start = index, rows, start
        self.dtype, self.device = buffer.dtype, buffer.device
        self.is_initialized = True
        self.point(buffer, width)

    def point(self, buffer: torch.Tensor, width: int) -> None:
        """Use the group's ``buffer`` (a new one after a growth) and view ``width`` filled columns."""
        self._key_buffer = buffer[self._index, 0, self._rows, :, self._start :]
        self._value_buffer = buffer[self._index, 1, self._rows, :, self._start :]
        self.keys, self.values = self._key_buffer[..., :width, :], self._value_buffer[..., :width, :]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            owner = self._owner() if self._owner is not None else None
            if owner is None:
                raise RuntimeError("a BatchKV layer was written past its batch's columns")
            owner.reserve(end)  # grows every layer's buffer at once
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.keys, self.values = self._key_buffer[..., :end, :], self._value_buffer[..., :end, :]
        return self.keys, self.values


def layout_of(layers: Layers) -> Layout:
    """The layout of ``layers`` (per layer: kv heads, key and value sizes, dtype, device)."""
    return [
        (keys.shape[1], keys.shape[3], values.shape[3], keys.dtype, keys.device) for keys, values in layers
    ]


def _padding_runs(row: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of every run of zeros in a 0/1 mask row."""
    return _attended_runs([0 if value else 1 for value in row])


def _attended_runs(row: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of every run of nonzero values in a mask row."""
    runs: list[tuple[int, int]] = []
    for column, attended in enumerate(row):
        if not attended:
            continue
        if runs and runs[-1][1] == column:
            runs[-1] = (runs[-1][0], column + 1)
        else:
            runs.append((column, column + 1))
    return runs


class BatchKV:
    """The KV and attention mask of a running batch, extended one column per decode step without copies.

    Built from ``parts``: groups of rows, each its per-layer ``[rows, kv_heads, width, head_dim]`` keys
    and values (views are fine: each is copied once into place) and its ``[rows, width]`` mask, or
    ``None`` for the keys and values of rows a prefill is about to write (:meth:`prefill_cache`; their
    padding columns are zeroed here, the rest is theirs to fill). Rows are stacked in order,
    right-aligned to the widest part; the columns left of a narrower part are zeros with mask 0.
    Buffers have ``width + HEADROOM`` columns, or fewer when the batch will never need them
    (``max_width`` is the widest the caller reserved memory for). ``layout`` is required when no part
    has keys and values. Pass :attr:`cache` to the model with the mask from :meth:`next_mask`; the
    model's forward writes the new keys and values in place.

    ``pad_rows`` rows of zeros (mask 0) follow the parts, and ``zeroed`` makes every column past the
    width zero too: the batch of a graphed decode step, padded to its bucket and attended over its
    whole capacity (:mod:`agentboost.engines.embedded.cuda_graphs`). Both off: the eager engine's batch.
    """

    def __init__(
        self,
        parts: Sequence[tuple[Layers | None, torch.Tensor]],
        max_width: int,
        layout: Layout | None = None,
        *,
        pad_rows: int = 0,
        zeroed: bool = False,
    ) -> None:
        known = next((layers for layers, _ in parts if layers is not None), None)
        if known is not None:
            layout = layout_of(known)
        if layout is None:
            raise ValueError("a BatchKV of prefill rows only needs the layout of its layers")
        first_mask = parts[0][1]
        self.rows = sum(mask.shape[0] for _, mask in parts) + pad_rows
        self._zeroed = zeroed
        allocate = torch.zeros if zeroed else torch.empty
        self.width = max(mask.shape[1] for _, mask in parts)
        capacity = max(self.width + 1, min(self.width + HEADROOM, max_width))
        # layers whose keys and values share a shape (but the width) and dtype share a buffer
        self._slots: list[tuple[int, int]] = []  # per layer: (group, index in the group)
        shapes: list[tuple[tuple[int, ...], torch.dtype, torch.device]] = []
        counts: list[int] = []
        for kv_heads, key_dim, value_dim, dtype, device in layout:
            key = ((kv_heads, key_dim), dtype, device)
            if key_dim != value_dim:
                key = ((kv_heads, key_dim, len(shapes)), dtype, device)  # never shared
            if key not in shapes:
                shapes.append(key)
                counts.append(0)
            group = shapes.index(key)
            self._slots.append((group, counts[group]))
            counts[group] += 1
        self._buffers = [
            allocate((count, 2, self.rows, shape[0], capacity, shape[1]), dtype=dtype, device=device)
            for (shape, dtype, device), count in zip(shapes, counts, strict=True)
        ]
        self._mask_buffer = first_mask.new_zeros((self.rows, capacity))
        self._starts: list[int] = []  # per part: its first row's index and column
        row = 0
        for layers, mask in parts:
            count, width = mask.shape
            start = self.width - width
            self._starts.append(start)
            for buffer in self._buffers:
                if start:  # masked out, but must be finite for attention
                    buffer[:, :, row : row + count, :, :start].zero_()
            if layers is None:
                for offset, runs in enumerate(_padding_runs(r) for r in mask.tolist()):
                    for first, end in runs:
                        for buffer in self._buffers:
                            buffer[:, :, row + offset, :, start + first : start + end].zero_()
            else:
                for (group, index), (keys, values) in zip(self._slots, layers, strict=True):
                    target = self._buffers[group][index, :, row : row + count]  # [2, rows, heads, C, D]
                    target[0, :, :, start : self.width] = keys
                    target[1, :, :, start : self.width] = values
            self._mask_buffer[row : row + count, start : self.width] = mask
            row += count
        self._part_rows = [mask.shape[0] for _, mask in parts]
        self._layers = [
            _InPlaceLayer(self, self._buffers[group], index, self.width) for group, index in self._slots
        ]
        self.cache = Cache(layers=list(self._layers))

    def part_start(self, part: int) -> tuple[int, int]:
        """The first row and the first column of part ``part``."""
        return sum(self._part_rows[:part]), self._starts[part]

    def _part(self, part: int) -> tuple[slice, int]:
        """Rows and first column of part ``part``."""
        first, column = self.part_start(part)
        return slice(first, first + self._part_rows[part]), column

    def write_prefix(self, row: int, column: int, kv: torch.Tensor) -> None:
        """Copy ``kv`` (``[layers, 2, kv_heads, n, head_dim]``, a prefix cache entry) into ``row`` at
        columns ``column .. column + n``."""
        end = column + kv.shape[3]
        if len(self._buffers) == 1:
            self._buffers[0][:, :, row, :, column:end] = kv
            return
        for layer, (group, index) in enumerate(self._slots):
            self._buffers[group][index, :, row, :, column:end] = kv[layer]

    def prefill_cache(self, part: int, filled: int) -> Cache:
        """A cache over the rows of part ``part`` (made with ``None`` layers), ``filled`` columns of
        theirs already written (a cached prefix): a forward pass writes the next ones in place."""
        rows, start = self._part(part)
        return Cache(
            layers=[
                _InPlaceLayer(None, self._buffers[group], index, filled, rows=rows, start=start)
                for group, index in self._slots
            ]
        )

    def row_tokens(self, row: int) -> int:
        """How many columns of ``row`` are attended (its tokens held)."""
        return int(self._mask_buffer[row, : self.width].sum())

    def row_kv(self, row: int, skip: int = 0) -> torch.Tensor:
        """A new ``[layers, 2, kv_heads, tokens, head_dim]`` tensor: the keys and values of ``row``'s
        attended columns after its first ``skip``, in order, copied once (what the prefix cache holds)."""
        runs, seen = [], 0
        for first, end in _attended_runs(self._mask_buffer[row, : self.width].tolist()):
            if seen + (end - first) > skip:
                runs.append((max(first, first + skip - seen), end))
            seen += end - first
        count = sum(end - first for first, end in runs)
        layers = self.layers()
        if len(self._buffers) == 1:  # every layer alike: one copy per run
            keys = layers[0][0]
            out = keys.new_empty((len(layers), 2, keys.shape[1], count, keys.shape[3]))
            source, position = self._buffers[0][:, :, row], 0  # [layers, 2, heads, capacity, D]
            for first, end in runs:
                out[:, :, :, position : position + end - first] = source[:, :, :, first:end]
                position += end - first
            return out
        parts = [
            torch.stack(
                [
                    torch.cat([keys[row, :, a:b] for a, b in runs], dim=1),
                    torch.cat([values[row, :, a:b] for a, b in runs], dim=1),
                ]
            )
            for keys, values in layers
        ]
        return torch.stack(parts)

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
            shape = (*buffer.shape[:4], capacity, buffer.shape[5])
            bigger = buffer.new_zeros(shape) if self._zeroed else buffer.new_empty(shape)
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

    def full_mask(self) -> torch.Tensor:
        """The mask over the buffer's whole capacity, ``[rows, capacity]`` (0 past the width)."""
        return self._mask_buffer

    def layer_buffers(self) -> list[tuple[torch.Tensor, int]]:
        """Per layer, its group's buffer ``[layers, 2, rows, kv_heads, capacity, D]`` and its index."""
        return [(self._buffers[group], index) for group, index in self._slots]

    def advance(self) -> None:
        """After a step that wrote column ``width - 1`` without the layers (a graphed step): the layers'
        views take it in."""
        for layer, (group, _) in zip(self._layers, self._slots, strict=True):
            layer.point(self._buffers[group], self.width)

    def layers(self) -> Layers:
        """Per layer, views of the filled columns: ``[rows, kv_heads, width, head_dim]``."""
        return [(layer.keys, layer.values) for layer in self._layers]

    def buffer_bytes(self) -> int:
        """Bytes the buffers hold, headroom included."""
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers)
