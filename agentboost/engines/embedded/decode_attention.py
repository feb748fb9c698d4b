"""Grouped-query attention for one-token decode steps, without copying the cache per query head.

transformers' ``sdpa`` attention calls ``torch.nn.functional.scaled_dot_product_attention`` with the
keys and values repeated once per query head of a group (``repeat_kv``) whenever an attention mask is
passed, which the embedded engine always does (its rows are left-padded): every decode step copies the
whole cache of every layer ``num_key_value_groups`` times over and then attends over the copy.
SmolLM2-135M has 9 query heads on 3 key/value heads; at 16 rows and ~430 cached positions that was
about 0.9 ms of a layer's attention, 27 ms of a 93 ms step (docs/engines.md).

A one-token step needs no copy: the ``g`` query heads that share a key/value head can be laid out as
``g`` query rows against that head, ``[B, kv_heads, g, head_dim]``, and attended in one
``scaled_dot_product_attention`` call, unmasked in the causal sense (they sit at the same position)
and masked by the row's padding mask, which broadcasts over them. Same arithmetic on the same values;
the outputs agree with the repeated path to float rounding (tested at 2.4e-7 on SmolLM2's shapes).
Four to five times faster on the attention alone at those shapes.

It is registered with transformers' published :class:`~transformers.AttentionInterface` under
:data:`NAME` (and the ``sdpa`` mask builder under the same name), and a model whose attention is
``sdpa`` is switched to it by the engine (:func:`use_for`). Everything that is not a one-token,
gradient-free, dropout-free step with grouped heads (training, prefill, teacher-forced passes) goes to
transformers' own ``sdpa_attention_forward`` unchanged, so the trainer computes exactly what it did.

:data:`NATIVE_NAME`, the engine's default, runs every gradient-free, dropout-free pass (decode steps
and prefills) in agentboost's C kernel where it applies (:mod:`agentboost.engines.embedded.native_attention`:
about twice as fast again on a decode step, 3.4x on a prefill's attention, on SmolLM2's shapes), and is
:data:`NAME` elsewhere. Passes with gradients (the trainer's) are still transformers' ``sdpa``.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "agentboost_sdpa"
"""The attention implementation's name in transformers' registry."""
NATIVE_NAME = "agentboost_native"
"""The same, with one-token steps in the native kernel where it is available."""

_registered = False


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, length, head_dim = query.shape
    if (
        length != 1
        or groups <= 1
        or dropout
        or torch.is_grad_enabled()
        or kwargs.get("output_attentions")
        or key.shape[1] * groups != heads
        or (attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1:3] != (1, 1)))
    ):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    grouped = query.reshape(batch, key.shape[1], groups, head_dim)  # head h reads key/value head h // groups
    output = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=attention_mask, scale=scaling, is_causal=False
    )
    # [B, kv_heads, groups, D] -> [B, heads, 1, D] -> the [B, 1, heads, D] transformers expects
    return output.reshape(batch, heads, 1, head_dim).transpose(1, 2).contiguous(), None


def _native_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if not dropout and not torch.is_grad_enabled() and not kwargs.get("output_attentions"):
        from agentboost.engines.embedded import native_attention

        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        if query.shape[2] == 1:
            output = native_attention.attend(query, key, value, attention_mask, scale)
        else:  # causal without a mask exactly where transformers' sdpa_attention_forward makes it so
            causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
            causal = bool(causal) and attention_mask is None
            output = native_attention.prefill(query, key, value, attention_mask, scale, is_causal=causal)
        if output is not None:
            return output, None
    return _attention(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )


def register() -> None:
    """Add :data:`NAME` and :data:`NATIVE_NAME` to transformers' attention and mask registries (once)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    AttentionInterface.register(NATIVE_NAME, _native_attention)
    AttentionMaskInterface.register(NATIVE_NAME, sdpa_mask)
    _registered = True


def use_for(model: Any, *, native: bool = False) -> bool:
    """Switch ``model`` from ``sdpa`` attention to :data:`NAME` (``native``: :data:`NATIVE_NAME`).

    True when it runs on one of them now. Only a model on transformers' ``sdpa`` (or already on one of
    these) is switched: eager, flash or custom attention are left as they are. The switch is the
    config's attention name, which ``save_pretrained`` does not write; the model's last engine sets it.
    """
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", NAME, NATIVE_NAME):
        return False
    register()
    config._attn_implementation = NATIVE_NAME if native else NAME
    return True
