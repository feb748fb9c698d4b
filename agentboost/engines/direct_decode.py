"""A decode step that calls the model's weights and functions directly, without its module machinery.

A one-token decode step of SmolLM2-135M does little arithmetic per call: at batch 1 its 211 linears
read the weights at near memory speed in about 15 ms, and the rest of a 25 ms step was work outside any
operator (docs/engines.md): about 400 ``nn.Module`` calls, transformers' per-layer keyword handling,
its attention-interface dispatch and cache bookkeeping, and a 4-D mask built every step. For the
decoder families whose layers are plain (Llama, Mistral, Qwen2, Qwen3), :class:`DirectDecode` runs the
same computation as transformers' ``forward`` in one function: the same weights, the same norm modules'
``forward`` and the same ``apply_rotary_pos_emb`` of the model's own modeling module, the engine's
linears (oneDNN packs, or ``F.linear``), the batch's KV buffer written in place, and the attention
kernel of :mod:`agentboost.engines.native_attention` (or the grouped path of
:mod:`agentboost.engines.decode_attention` where it declines). Nothing of the model is modified.

Which models: a ``*ForCausalLM`` of those four families, fp32 on CPU, every layer full attention (no
sliding window). And before its first use on an engine, a check: one small batch (two rows, one
left-padded) is prefilled, then stepped once through transformers' forward and once through this one,
from copies of the same cache; the step is used only if the two give the same log-probabilities within
1e-5 (they were identical on SmolLM2 and the tests' Qwen3). Otherwise the engine keeps transformers'
forward and the difference is logged.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from agentboost.engines import decode_attention, native_attention, packed_linear

logger = logging.getLogger(__name__)

FAMILIES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
CALLED_AS_MODULES = 2
"""The first entries of ``DirectDecode._modules()`` (the embedding, the rotary embedding) are called as
modules, hooks and all; the step computes the others itself."""
TOLERANCE = 1e-5
"""Largest log-probability difference the first-use check accepts."""


def unsupported_reason(model: Any) -> str | None:
    """Why ``model`` cannot take a direct decode step, or None when it can (before the numeric check)."""
    name = type(model).__name__
    if name not in FAMILIES:
        return f"{name} is not one of {', '.join(FAMILIES)}"
    config = model.config
    parameter = next(model.parameters())
    if parameter.dtype != torch.float32 or parameter.device.type != "cpu":
        return f"weights are {parameter.dtype} on {parameter.device.type} (fp32 on CPU only)"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "sliding-window layers"
    if name == "MistralForCausalLM" and getattr(config, "sliding_window", None) is not None:
        return "a sliding window"
    if (getattr(config, "pretraining_tp", 1) or 1) > 1:
        return "pretraining_tp > 1"
    return None


class DirectDecode:
    """One decode step of ``model`` for the engine's running batch (see the module's text)."""

    def __init__(self, model: Any, *, native: bool = True) -> None:
        self.model = model
        self.native = native  # the attention kernel (else the grouped sdpa path, as the engine chose)
        self.inner = model.model
        modeling = sys.modules[type(self.inner.layers[0].self_attn).__module__]
        self._rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]] = modeling.apply_rotary_pos_emb
        self.checked: bool | None = None  # None until the first-use check ran
        self.difference: float | None = None
        self._classes = [type(module) for module in self._modules()]

    def _modules(self) -> list[Any]:
        """Every module the step reads, in order (looked up afresh: a replaced module is seen)."""
        inner = self.inner
        modules = [
            inner.embed_tokens,
            inner.rotary_emb,
            inner.norm,
            self.model.lm_head,
        ]  # see CALLED_AS_MODULES
        for layer in inner.layers:
            attention, mlp = layer.self_attn, layer.mlp
            modules += [layer, layer.input_layernorm, layer.post_attention_layernorm, attention, mlp]
            modules += [attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj]
            modules += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
            modules += [getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)]
        return modules

    def unchanged(self) -> bool:
        """True while the model is what was checked: the same classes in the same places (a module
        replaced, by an adapter for instance, is not), and no forward hooks on the modules this step
        does not call (all but the embedding and the rotary embedding, which it calls as modules, so
        their hooks run: the one transformers' gradient checkpointing puts on the embedding, for one).
        About 0.1 ms a step on SmolLM2; run before anything of a step is written."""
        if getattr(torch.nn.modules.module, "_global_forward_hooks", None) or getattr(
            torch.nn.modules.module, "_global_forward_pre_hooks", None
        ):
            return False
        modules = self._modules()
        if len(modules) != len(self._classes):
            return False
        for position, (module, cls) in enumerate(zip(modules, self._classes, strict=True)):
            if type(module) is not cls:
                return False
            bypassed = position >= CALLED_AS_MODULES and module is not None
            if bypassed and (module._forward_hooks or module._forward_pre_hooks):
                return False
        return True

    def step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        linear: Callable[[torch.Tensor, torch.nn.Linear], torch.Tensor],
    ) -> torch.Tensor:
        """Logits ``[rows, vocabulary]`` of one token per row.

        ``input_ids`` and ``positions`` are ``[rows, 1]``; ``mask`` the ``[rows, width]`` 0/1 mask of the
        cache including this step's column; ``cache`` the batch's ``Cache`` (layers written in place);
        ``linear(x, module)`` computes one of the model's linears.
        """
        rows = input_ids.shape[0]
        attend_mask = mask.bool()[:, None, None, :]  # what transformers' sdpa mask is for one token
        hidden = self.inner.embed_tokens(input_ids)
        cos, sin = self.inner.rotary_emb(hidden, positions)
        for index, layer in enumerate(self.inner.layers):
            attention = layer.self_attn
            head_dim = attention.head_dim
            x = layer.input_layernorm.forward(hidden)
            query = linear(x, attention.q_proj).view(rows, 1, -1, head_dim)
            key = linear(x, attention.k_proj).view(rows, 1, -1, head_dim)
            value = linear(x, attention.v_proj).view(rows, 1, -1, head_dim).transpose(1, 2)
            if hasattr(attention, "q_norm"):  # Qwen3
                query, key = attention.q_norm.forward(query), attention.k_norm.forward(key)
            query, key = self._rotary(query.transpose(1, 2), key.transpose(1, 2), cos, sin)
            keys, values = cache.layers[index].update(key, value)
            out = (
                native_attention.attend(query, keys, values, attend_mask, attention.scaling)
                if self.native
                else None
            )
            if out is None:
                out, _ = decode_attention._attention(
                    attention, query, keys, values, attend_mask, scaling=attention.scaling
                )
            hidden = hidden + linear(out.reshape(rows, 1, -1), attention.o_proj)
            x = layer.post_attention_layernorm.forward(hidden)
            mlp = layer.mlp
            x = mlp.act_fn(linear(x, mlp.gate_proj)) * linear(x, mlp.up_proj)
            hidden = hidden + linear(x, mlp.down_proj)
        hidden = self.inner.norm.forward(hidden)
        return linear(hidden[:, -1], self.model.lm_head)

    def check(
        self,
        forward: Callable[..., Any],
        cache_argument: str,
        linear: Callable[[torch.Tensor, torch.nn.Linear], torch.Tensor],
    ) -> bool:
        """Compare one step with transformers' (through the engine's ``forward``); True when they agree."""
        from transformers import DynamicCache

        from agentboost.engines.batch_kv import BatchKV

        mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
        ids = torch.tensor([[11, 12, 13, 14, 15], [0, 0, 21, 22, 23]])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            cache = DynamicCache()  # passed in under the name this transformers takes, as the engine does
            forward(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{cache_argument: cache},
            )
            layers = [(layer.keys, layer.values) for layer in cache.layers]
            theirs_kv, ours_kv = BatchKV([(layers, mask)], 8), BatchKV([(layers, mask)], 8)
            step_ids, step_positions = torch.tensor([[7], [8]]), torch.tensor([[5], [3]])
            theirs = forward(
                input_ids=step_ids,
                attention_mask=theirs_kv.next_mask(),
                position_ids=step_positions,
                use_cache=True,
                **{cache_argument: theirs_kv.cache},
            ).logits[:, -1]
            ours = self.step(step_ids, step_positions, ours_kv.next_mask(), ours_kv.cache, linear)
            difference = (theirs.float().log_softmax(-1) - ours.float().log_softmax(-1)).abs().max().item()
        self.difference = difference
        self.checked = difference <= TOLERANCE
        if not self.checked:
            logger.warning(
                "decode steps keep transformers' forward: the direct step differed by %.2e in logprobs",
                difference,
            )
        return self.checked


def linear_function(
    linears: packed_linear.PackedLinears | None,
) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """``linear(x, module)`` on the engine's oneDNN route (its packs when held), else ``F.linear``."""
    if linears is None:
        return lambda x, module: F.linear(x, module.weight, module.bias)
    return linears.compute
