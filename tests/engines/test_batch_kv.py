"""The running batch's KV buffer (agentboost/engines/batch_kv.py): built from parts, grown, freed."""

from __future__ import annotations

import gc
import weakref

import torch

from agentboost.engines.batch_kv import HEADROOM, BatchKV


def part(rows: int, width: int, layers: int = 3, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    shape = (rows, 2, width, 4)  # rows, kv heads, width, head dim
    kv = [tuple(torch.randn(shape, generator=generator) for _ in "kv") for _ in range(layers)]
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[0, :2] = 0  # a padded row inside the part
    return kv, mask


def test_parts_are_stacked_right_aligned_with_zero_padding_and_their_masks():
    old, new = part(2, 5, seed=1), part(3, 8, seed=2)
    kv = BatchKV([old, new], max_width=100)
    assert kv.width == 8 and kv.rows == 5
    for (keys, values), (old_k, old_v), (new_k, new_v) in zip(kv.layers(), old[0], new[0], strict=True):
        assert keys.shape == (5, 2, 8, 4)
        assert torch.equal(keys[:2, :, 3:], old_k) and torch.equal(values[:2, :, 3:], old_v)
        assert torch.equal(keys[2:], new_k) and torch.equal(values[2:], new_v)
        assert not keys[:2, :, :3].any() and not values[:2, :, :3].any()  # padding: zeros, never garbage
    assert torch.equal(kv.mask()[:2], torch.cat([torch.zeros(2, 3, dtype=torch.long), old[1]], dim=1))
    assert torch.equal(kv.mask()[2:], new[1])
    assert kv.buffer_bytes() == 3 * 2 * 5 * 2 * (8 + HEADROOM) * 4 * 4  # one buffer, headroom included


def test_a_step_writes_in_place_and_growth_keeps_every_column():
    kv = BatchKV([part(2, 4)], max_width=5)  # room for one step only
    before = [k.clone() for k, _ in kv.layers()]
    for step in range(3):  # the second step outgrows the buffer
        mask = kv.next_mask()
        assert mask.shape == (2, 5 + step) and bool(mask[:, -1].all())
        for index, layer in enumerate(kv.cache.layers):
            column = torch.full((2, 2, 1, 4), float(10 * step + index))
            keys, values = layer.update(column, -column)
            assert keys.shape == (2, 2, 5 + step, 4)
            assert torch.equal(keys[:, :, :4], before[index])  # earlier columns survive the growth
            assert torch.equal(keys[:, :, -1:], column) and torch.equal(values[:, :, -1:], -column)
    assert kv.buffer_bytes() >= 3 * 2 * 2 * 2 * 7 * 4 * 4


def test_a_replaced_batch_is_freed_at_once_without_the_cycle_collector():
    gc.disable()
    try:
        kv = BatchKV([part(2, 4)], max_width=50)
        kv.next_mask()
        gone = weakref.ref(kv)
        layers = kv.layers()  # views held by the engine between steps keep the data, not the object
        del kv
        assert gone() is None
        assert layers[0][0].shape == (2, 2, 4, 4)
    finally:
        gc.enable()
