"""The precision policy: what the weights are stored in and what the forward passes compute in.

Decided here, once, for the trainer, SFT, the embedded engine and ``eval``. Two settings:

- **weights** (``model.dtype``): the dtype of the parameters, i.e. of what AdamW updates (its moments
  follow it). ``auto`` is float32 when the weights are trained (full fine-tuning keeps float32 master
  weights on every device: an update of ``lr * m / sqrt(v)`` ~ 2e-5 is below bfloat16's spacing near
  most weights, 2^-8 relative, and rounds away) and bfloat16 on CUDA when they are only served
  (evaluation, rollouts). ``bfloat16`` with full fine-tuning is honoured, with a warning (once).
  LoRA adapters are float32 whatever the base weights are.
- **compute** (``model.compute_dtype``): the dtype of the matrix products. ``auto`` is bfloat16 autocast
  on CUDA (where bfloat16 is supported) and float32 on CPU. Over float32 weights bfloat16 compute is
  ``torch.autocast``: the weights are cast per forward pass, gradients land on the float32 weights.

Whatever the compute dtype, the output head (the logits) runs in float32 (:func:`head_logits`): a
bfloat16 logit of 20 is 0.125 off at worst, which would be the logprob's error.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch

logger = logging.getLogger(__name__)

DtypeSetting = Literal["auto", "float32", "bfloat16"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}

PURE_BFLOAT16_WARNING = (
    "model.dtype=bfloat16 with full fine-tuning: the weights and AdamW's state are bfloat16, and an update "
    "smaller than a weight's bfloat16 spacing (2^-8 of its size) rounds away; at learning rates of "
    "1e-5..1e-4 most do, and the model may not learn at all. Use model.dtype=auto (float32 weights) with "
    "model.compute_dtype=bfloat16 for bfloat16 speed with float32 updates"
)
_warned_pure_bfloat16 = False


@dataclass(frozen=True)
class Precision:
    """A resolved policy: ``weights`` and ``compute`` dtypes on ``device_type`` (``cpu``, ``cuda``)."""

    weights: torch.dtype
    compute: torch.dtype
    device_type: str

    @property
    def autocasts(self) -> bool:
        """Whether forward passes run under ``torch.autocast`` (bfloat16 compute over float32 weights)."""
        return self.compute != self.weights

    @property
    def exact(self) -> bool:
        """float32 through and through: engine and trainer logprobs agree to float rounding (~1e-6)."""
        return self.weights == torch.float32 and self.compute == torch.float32

    def autocast(self, *, cache: bool = True) -> contextlib.AbstractContextManager[Any]:
        """The context of a forward pass: autocast to ``compute`` when it differs from the weights.

        Enter it per forward pass, not once for a thread's life: autocast keeps its casts of the weights
        until the outermost context exits, and an optimizer step in between would make them stale.
        ``cache=False`` keeps no casts at all (a pass captured as a CUDA graph).
        """
        if not self.autocasts:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.compute, cache_enabled=cache)

    def describe(self) -> str:
        """One line for logs: ``float32 weights, bfloat16 autocast compute (cuda)``."""
        compute = f"{NAMES[self.compute]} autocast" if self.autocasts else NAMES[self.compute]
        return f"{NAMES[self.weights]} weights, {compute} compute ({self.device_type})"

    def as_dict(self) -> dict[str, str]:
        """For results headers and run records: ``{"weights", "compute", "device"}``."""
        return {"weights": NAMES[self.weights], "compute": NAMES[self.compute], "device": self.device_type}

    def as_metrics(self) -> dict[str, float]:
        """Numbers for metrics.jsonl / TensorBoard: 1.0 where bfloat16 is used."""
        return {
            "precision/bf16_weights": float(self.weights == torch.bfloat16),
            "precision/bf16_compute": float(self.compute == torch.bfloat16),
        }


def setting(dtype: torch.dtype | str | None) -> str:
    """A dtype argument as a setting: None is ``auto``; ``torch.bfloat16`` is ``bfloat16``."""
    if dtype is None:
        return "auto"
    if isinstance(dtype, torch.dtype):
        if dtype not in NAMES:
            from agentboost.errors import ConfigError

            raise ConfigError(f"dtype {dtype} is not supported; use float32 or bfloat16")
        return NAMES[dtype]
    return str(dtype).removeprefix("torch.")


def default_device() -> str:
    """Where a model goes when nobody says: ``cuda`` when torch sees a GPU, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def bfloat16_compute_available(device: torch.device) -> bool:
    """bfloat16 autocast is worth it on CUDA GPUs that support it (Ampere and later)."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def resolve_precision(
    weights: str = "auto",
    compute: str = "auto",
    device: torch.device | str = "cpu",
    *,
    trains: bool = True,
    lora: bool = False,
) -> Precision:
    """The policy for a model on ``device``: ``trains`` (an optimizer updates it) and ``lora`` (only
    float32 adapters train) decide ``auto`` weights and whether bfloat16 weights warn."""
    from agentboost.errors import ConfigError

    device = torch.device(device)
    for key, value in (("model.dtype", weights), ("model.compute_dtype", compute)):
        if value != "auto" and value not in DTYPES:
            raise ConfigError(f"{key} must be one of auto, float32, bfloat16; got {value!r}")
    updates_base = trains and not lora
    if weights == "auto":
        weights_dtype = (
            torch.bfloat16 if not updates_base and bfloat16_compute_available(device) else torch.float32
        )
    else:
        weights_dtype = DTYPES[weights]
    if compute == "auto":
        compute_dtype = (
            torch.bfloat16
            if weights_dtype == torch.bfloat16 or bfloat16_compute_available(device)
            else torch.float32
        )
    else:
        compute_dtype = DTYPES[compute]
    if weights_dtype == torch.bfloat16 and compute_dtype == torch.float32:
        raise ConfigError(
            "model.compute_dtype=float32 needs float32 weights (model.dtype=float32 or auto); "
            "bfloat16 weights compute in bfloat16"
        )
    if weights_dtype == torch.bfloat16 and updates_base:
        warn_pure_bfloat16()
    return Precision(weights=weights_dtype, compute=compute_dtype, device_type=device.type)


def warn_pure_bfloat16() -> None:
    """Warn, once per process, that training bfloat16 weights may not learn (see PURE_BFLOAT16_WARNING)."""
    global _warned_pure_bfloat16
    if _warned_pure_bfloat16:
        return
    _warned_pure_bfloat16 = True
    warnings.warn(PURE_BFLOAT16_WARNING, UserWarning, stacklevel=3)


def of_model(model: Any) -> Precision:
    """The policy a loaded model already follows (its parameters' dtype, computed in it): for code that
    gets a model without a policy (an engine over a caller's model)."""
    parameter = next(model.parameters())
    dtype = parameter.dtype if parameter.dtype in NAMES else torch.float32
    return Precision(weights=dtype, compute=dtype, device_type=parameter.device.type)


def keep_adapters_float32(model: Any) -> None:
    """LoRA adapters (the parameters that train over a frozen base) in float32, whatever the base is."""
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()


def head_logits(head: Any, hidden: torch.Tensor) -> torch.Tensor:
    """``head(hidden)`` in float32, outside autocast: [..., H] -> [..., V] float32.

    A plain ``nn.Linear`` head (the usual output embedding) is applied with its weight in float32; any
    other head module runs as it is and its output is converted.
    """
    with torch.autocast(hidden.device.type, enabled=False):
        if type(head) is torch.nn.Linear:
            weight = head.weight if head.weight.dtype == torch.float32 else head.weight.float()
            bias = None if head.bias is None else head.bias.float()
            return torch.nn.functional.linear(hidden.float(), weight, bias)
        return head(hidden).float()
