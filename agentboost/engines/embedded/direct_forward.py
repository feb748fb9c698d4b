"""Prefills and decode steps that call the model's weights and functions directly, without its modules.

A one-token decode step of SmolLM2-135M does little arithmetic per call: at batch 1 its 211 linears
read the weights at near memory speed in about 15 ms, and the rest of a 25 ms step was work outside any
operator (docs/engines.md): about 400 ``nn.Module`` calls, transformers' per-layer keyword handling,
its attention-interface dispatch and cache bookkeeping, and a 4-D mask built every step. A prefill is
the opposite, big products, but around them transformers makes and frees a tensor for every
elementwise operation (the norms, the rotary embedding, the MLP's activation and product, the residual
additions), each a pass over tens of MB. For the decoder families whose layers are plain (Llama,
Mistral, Qwen2, Qwen3), :class:`DirectForward` runs the same computation as transformers' ``forward``
in one function, from the same weights: the RMSNorms and the rotary embedding in one pass each
(``native/layers.c``; without the native kernels, the norm modules' own ``forward`` and the model's
``apply_rotary_pos_emb``), the engine's linears (oneDNN packs, or ``F.linear``) with the MLP's
activation and product and the residual additions done in place on their outputs
(:class:`~agentboost.engines.embedded.packed_linear.Linears`), the batch's KV buffer written in place, and the
attention kernel of :mod:`agentboost.engines.embedded.native_attention` (or PyTorch's where it declines). A
prefill computes the last layer's attention output and MLP for the last position only, the one whose
logits are read. Nothing of the model is modified.

Which models: a ``*ForCausalLM`` of those four families, fp32 on CPU, every layer full attention (no
sliding window). And before its first use on an engine, a check: one small batch (two rows, one
left-padded) is prefilled and then stepped once, through transformers' forward and through this one;
both are used only if every logit agrees within 1e-4 of the largest (:data:`TOLERANCE`). Otherwise
the engine keeps transformers' forward and the difference is logged.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from agentboost.engines.embedded import decode_attention, native_attention, packed_linear

logger = logging.getLogger(__name__)

FAMILIES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
CALLED_AS_MODULES = 2
"""The first entries of ``DirectForward._walk()`` (the embedding, the rotary embedding) are called as
modules, hooks and all; the forward computes the others itself."""
TOLERANCE = 1e-4
"""Largest logit difference the first-use check accepts, relative to the largest logit. Two fp32
computations of the same model that sum in different orders (oneDNN's products or MKL's, this module's
norm or PyTorch's) differ by about 1e-6 of it on SmolLM2-135M, whose logits reach 31 (their
logprobs by up to 8e-5: docs/engines.md); a model computed differently differs by far more (a forward
hook adding 0.5 to one MLP's output in the tests: 1.4)."""
SILU = ("SiLU", "SiLUActivation")
"""Activation modules that compute ``silu(x)`` (torch's, transformers'): applied in place."""
MLP_BLOCK_BYTES = 16 << 20
"""The most a block of rows' gate and up outputs take together in :meth:`DirectForward._mlp`."""
NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
"""The RMSNorm classes the native kernel computes (``weight * (x * rsqrt(mean(x**2) + eps))``)."""


def unsupported_reason(model: Any) -> str | None:
    """Why ``model`` cannot run a direct forward, or None when it can (before the numeric check)."""
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


class _Top(NamedTuple):
    embed: Any
    rotary: Any
    norm: Any
    lm_head: Any


class _Layer(NamedTuple):
    layer: Any
    input_norm: Any
    post_norm: Any
    attention: Any
    mlp: Any
    q: Any
    k: Any
    v: Any
    o: Any
    gate: Any
    up: Any
    down: Any
    act: Any
    q_norm: Any
    k_norm: Any


def _flat(walked: tuple[_Top, list[_Layer]]) -> list[Any]:
    top, layers = walked
    return [*top, *(module for layer in layers for module in layer)]


class DirectForward:
    """Prefills and decode steps of ``model`` for the engine's batch buffer (see the module's text)."""

    def __init__(self, model: Any, *, native: bool = True) -> None:
        self.model = model
        self.native = native  # the attention kernel (else the grouped sdpa path, as the engine chose)
        inner = model.model
        modeling = sys.modules[type(inner.layers[0].self_attn).__module__]
        self._rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]] = modeling.apply_rotary_pos_emb
        self.checked: bool | None = None  # None until the first-use check ran
        self.difference: float | None = None  # the check's largest logit difference, relative
        self.logprob_difference: float | None = None  # and its largest log-probability difference
        self._walked = self._walk()  # the modules as the last look found them
        self._classes = [type(module) for module in _flat(self._walked)]

    def groups(self) -> list[tuple[Any, ...]]:
        """The linears each layer runs on one input: its query, key and value; its MLP's gate and up."""
        return [
            group
            for layer in self._walked[1]
            for group in ((layer.q, layer.k, layer.v), (layer.gate, layer.up))
        ]

    def _walk(self) -> tuple[_Top, list[_Layer]]:
        """Every module the forward reads, looked up afresh (a replaced module is seen), through the
        modules' own dictionaries: a fifth of the time of attribute lookups, which go through
        ``nn.Module.__getattr__`` (420 modules on SmolLM2, before every pass)."""
        top = self.model._modules
        inner = top["model"]._modules
        layers = []
        for layer in inner["layers"]._modules.values():
            members = layer._modules
            attention, mlp = members["self_attn"], members["mlp"]
            a, m = attention._modules, mlp._modules
            act = m.get("act_fn") or mlp.act_fn
            layers.append(
                _Layer(
                    layer,
                    members["input_layernorm"],
                    members["post_attention_layernorm"],
                    attention,
                    mlp,
                    a["q_proj"],
                    a["k_proj"],
                    a["v_proj"],
                    a["o_proj"],
                    m["gate_proj"],
                    m["up_proj"],
                    m["down_proj"],
                    act,
                    a.get("q_norm"),
                    a.get("k_norm"),
                )
            )
        return _Top(inner["embed_tokens"], inner["rotary_emb"], inner["norm"], top["lm_head"]), layers

    def unchanged(self) -> bool:
        """True while the model is what was checked: the same classes in the same places (a module
        replaced, by an adapter for instance, is not), and no forward hooks on the modules this forward
        does not call (all but the embedding and the rotary embedding, which it calls as modules, so
        their hooks run: the one transformers' gradient checkpointing puts on the embedding, for one).
        About 0.1 ms on SmolLM2; run before anything of a pass is written. The forward then reads the
        modules this look found."""
        if getattr(torch.nn.modules.module, "_global_forward_hooks", None) or getattr(
            torch.nn.modules.module, "_global_forward_pre_hooks", None
        ):
            return False
        try:
            walked = self._walk()
        except (KeyError, AttributeError):  # a module removed
            return False
        modules = _flat(walked)
        if len(modules) != len(self._classes):
            return False
        for position, (module, cls) in enumerate(zip(modules, self._classes, strict=True)):
            if type(module) is not cls:
                return False
            bypassed = position >= CALLED_AS_MODULES and isinstance(module, torch.nn.Module)
            if bypassed and (module._forward_hooks or module._forward_pre_hooks):
                return False
        self._walked = walked
        return True

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        linears: packed_linear.Linears,
    ) -> torch.Tensor:
        """Logits ``[rows, vocabulary]`` of the last position of every row.

        ``input_ids`` and ``positions`` are ``[rows, S]`` (``S`` is 1 for a decode step); ``mask`` the
        ``[rows, width]`` 0/1 mask of the cache including these ``S`` columns, which are its last;
        ``cache`` a ``Cache`` whose layers write in place (the batch buffer's, or a prefill's view of it).
        """
        rows, length = input_ids.shape
        padding = mask.bool()
        if length == 1:
            attend_mask = padding[:, None, None, :]  # what transformers' sdpa mask is for one token
        else:  # causal: query i (column width - S + i) reads the attended columns up to its own
            width = padding.shape[1]
            causal = torch.ones((length, width), dtype=torch.bool, device=mask.device).tril(width - length)
            attend_mask = (padding[:, None, :] & causal)[:, None]  # [rows, 1, S, width]
        last_mask = padding[:, None, None, :]  # the last position's row of it
        top, layers = self._walked
        hidden = top.embed(input_ids)
        cos, sin = top.rotary(hidden, positions)
        for index, layer in enumerate(layers):
            attention = layer.attention
            head_dim = attention.head_dim
            x = self._norm(layer.input_norm, hidden)
            query, key, value = linears.project(x, (layer.q, layer.k, layer.v))
            query = query.view(rows, length, -1, head_dim)
            key = key.view(rows, length, -1, head_dim)
            value = value.view(rows, length, -1, head_dim).transpose(1, 2)
            if layer.q_norm is not None:  # Qwen3
                query, key = self._norm(layer.q_norm, query), self._norm(layer.k_norm, key)
            if self.native and native_attention.rotary(query, key, cos, sin):
                query, key = query.transpose(1, 2), key.transpose(1, 2)
            else:
                query, key = self._rotary(query.transpose(1, 2), key.transpose(1, 2), cos, sin)
            keys, values = cache.layers[index].update(key, value)
            step_mask = attend_mask
            if length > 1 and index == len(layers) - 1:  # only the last position's output is read
                query, hidden, step_mask = query[:, :, -1:], hidden[:, -1:], last_mask
            out = self._attend(attention, query, keys, values, step_mask)
            hidden = linears.add(out.reshape(*hidden.shape[:2], -1), layer.o, hidden)
            self._mlp(layer, self._norm(layer.post_norm, hidden), hidden, linears)
        hidden = self._norm(top.norm, hidden[:, -1])
        return linears(hidden, top.lm_head)

    @staticmethod
    def _mlp(layer: _Layer, x: torch.Tensor, hidden: torch.Tensor, linears: packed_linear.Linears) -> None:
        """``hidden += mlp(x)``, a block of rows at a time: a prefill's gate and up outputs are tens of
        MB a layer, which a thread's heap cannot keep for reuse (glibc maps each afresh and faults its
        pages in: a 16 x 400 prefill took 1.1x as long, docs/engines.md); blocks of
        :data:`MLP_BLOCK_BYTES` are reused from the heap and stay in the cache."""
        silu = type(layer.act).__name__ in SILU
        rows, outputs = x.reshape(-1, x.shape[-1]), hidden.view(-1, hidden.shape[-1])
        block = max(1, MLP_BLOCK_BYTES // ((layer.gate.out_features + layer.up.out_features) * 4))
        for start in range(0, rows.shape[0], block):
            gate, up = linears.project(rows[start : start + block], (layer.gate, layer.up))
            gate = F.silu(gate) if silu else layer.act(gate)
            outputs[start : start + block] += linears(gate.mul_(up), layer.down)

    def _norm(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        """``module(x)``: in the native kernel for the RMSNorm classes it knows, else the module's own."""
        if self.native and type(module).__name__ in NORMS:
            out = native_attention.rms_norm(x, module.weight, module.variance_epsilon)
            if out is not None:
                return out
        return module.forward(x)

    def _attend(
        self,
        attention: Any,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """``[rows, S, heads, head_dim]``: the kernel where it applies, else PyTorch's attention."""
        function = decode_attention._native_attention if self.native else decode_attention._attention
        out, _ = function(attention, query, keys, values, mask, scaling=attention.scaling)
        return out

    def check(self, forward: Callable[..., Any], cache_argument: str, linears: packed_linear.Linears) -> bool:
        """Compare a prefill and one step with transformers' (through the engine's ``forward``); True
        when every logit agrees within :data:`TOLERANCE` of the largest."""
        from transformers import DynamicCache

        from agentboost.engines.embedded.batch_kv import BatchKV, layout_of

        self._walked = self._walk()  # what is checked is the model as it is now
        self._classes = [type(module) for module in _flat(self._walked)]
        mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
        ids = torch.tensor([[11, 12, 13, 14, 15], [0, 0, 21, 22, 23]])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        step_ids, step_positions = torch.tensor([[7], [8]]), torch.tensor([[5], [3]])
        with torch.inference_mode():
            cache = DynamicCache()  # passed in under the name this transformers takes, as the engine does
            arguments = dict(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
            theirs_prefill = forward(**arguments, **{cache_argument: cache}).logits[:, -1]
            layers = [(layer.keys, layer.values) for layer in cache.layers]
            theirs_kv = BatchKV([(layers, mask)], 8)
            theirs_step = forward(
                input_ids=step_ids,
                attention_mask=theirs_kv.next_mask(),
                position_ids=step_positions,
                use_cache=True,
                **{cache_argument: theirs_kv.cache},
            ).logits[:, -1]
            ours_kv = BatchKV([(None, mask)], 8, layout=layout_of(layers))
            ours_prefill = self.forward(ids, positions, mask, ours_kv.prefill_cache(0, 0), linears)
            ours_step = self.forward(step_ids, step_positions, ours_kv.next_mask(), ours_kv.cache, linears)
            difference = max(
                ((theirs.float() - ours.float()).abs().max() / theirs.float().abs().max()).item()
                for theirs, ours in ((theirs_prefill, ours_prefill), (theirs_step, ours_step))
            )
            self.logprob_difference = max(
                (theirs.float().log_softmax(-1) - ours.float().log_softmax(-1)).abs().max().item()
                for theirs, ours in ((theirs_prefill, ours_prefill), (theirs_step, ours_step))
            )
        self.difference = difference
        self.checked = difference <= TOLERANCE
        if not self.checked:
            logger.warning(
                "the engine keeps transformers' forward: the direct forward's logits differed by %.2e of "
                "the largest",
                difference,
            )
        return self.checked
