"""The running batch's KV buffer (agentboost/engines/embedded/batch_kv.py): built from parts, grown, freed."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from agentboost.engines.embedded.batch_kv import HEADROOM, BatchKV, layout_of


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


def test_rows_left_for_a_prefill_get_their_columns_written_in_place_and_only_their_padding_zeroed():
    running = part(2, 5, seed=1)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])  # [pad | cached | pad | new]
    kv = BatchKV([running, (None, mask)], max_width=100, layout=layout_of(running[0]))
    assert (kv.rows, kv.width) == (4, 7) and kv.part_start(1) == (2, 0)
    assert torch.equal(kv.mask()[2:], mask) and torch.equal(kv.mask()[:2, 2:], running[1])
    cached = torch.randn(3, 2, 2, 2, 4)  # [layers, 2, heads, tokens, head dim]: a prefix-cache entry
    kv.write_prefix(2, 1, cached)
    cache = kv.prefill_cache(1, filled=3)  # three columns already written: the cached prefix
    new = [torch.randn(2, 2, 4, 4) for _ in range(3)]
    for layer, keys_in in zip(cache.layers, new, strict=True):
        keys, values = layer.update(keys_in, -keys_in)
        assert keys.shape == (2, 2, 7, 4) and torch.equal(keys[:, :, 3:], keys_in)
    for index, (keys, values) in enumerate(kv.layers()):
        assert torch.equal(keys[2, :, 1:3], cached[index, 0, :, :2])
        assert torch.equal(keys[2:, :, 3:], new[index]) and torch.equal(values[2:, :, 3:], -new[index])
        assert not keys[2, :, 0].any() and not values[2, :, 0].any()  # padding: zeros, never garbage
        assert torch.equal(keys[:2, :, 2:], running[0][index][0])  # the running rows, copied once
    # a row's KV for the prefix cache: its attended columns in order, across the hole, after a skip
    held = kv.row_kv(2, skip=1)
    assert kv.row_tokens(2) == 5 and held.shape == (3, 2, 2, 4, 4) and held.is_contiguous()
    for index, (keys, values) in enumerate(kv.layers()):
        assert torch.equal(held[index, 0], keys[2, :, [2, 4, 5, 6]])
        assert torch.equal(held[index, 1], values[2, :, [2, 4, 5, 6]])
    with pytest.raises(RuntimeError, match="past its batch's columns"):
        cache.layers[0].update(torch.zeros(2, 2, 200, 4), torch.zeros(2, 2, 200, 4))


def test_a_batch_of_prefill_rows_alone_needs_the_layout():
    with pytest.raises(ValueError, match="layout"):
        BatchKV([(None, torch.ones(1, 3, dtype=torch.long))], max_width=10)
