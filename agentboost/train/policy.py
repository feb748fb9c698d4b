"""The policy being trained: device, precision, loading (with optional LoRA), optimizer, and its logprobs.

Shared by the RL trainer (:mod:`agentboost.train.trainer`) and supervised fine-tuning
(:mod:`agentboost.train.sft`), so both load, adapt and optimise a model the same way.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from agentboost.errors import ConfigError
from agentboost.models import precision as precision_module
from agentboost.models.precision import Precision
from agentboost.tokens.tokenizer import Tokenizer
from agentboost.train import algorithms
from agentboost.train.batching import TokenBatch
from agentboost.train.config import LoraConfig, ModelConfig, OptimizerConfig

LOGIT_CHUNK_ROWS = 512
"""Positions whose vocabulary-wide logits exist at once in :meth:`PolicyModel.logprobs` (96 MiB in fp32
for a 49k vocabulary)."""


def resolve_device(model: ModelConfig) -> torch.device:
    """``auto`` is cuda when available, else cpu."""
    if model.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(model.device)
    except RuntimeError as error:
        raise ConfigError(
            f"model.device {model.device!r} is not a device ({error}); use auto, cpu or cuda"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"model.device={model.device} but this machine's torch sees no CUDA GPU; "
            "use model.device=auto or cpu"
        )
    return device


def resolve_precision(model: ModelConfig, lora: LoraConfig, device: torch.device) -> Precision:
    """The run's precision policy (:mod:`agentboost.models.precision`): ``model.dtype`` for the weights
    (``auto``: float32 master weights), ``model.compute_dtype`` for the passes (``auto``: bfloat16 autocast
    on CUDA, float32 on CPU). Warns once when full fine-tuning is asked to update bfloat16 weights."""
    return precision_module.resolve_precision(
        model.dtype, model.compute_dtype, device, trains=True, lora=lora.enabled
    )


def seed_everything(seed: int) -> None:
    """Seed Python, torch and numpy (when installed)."""
    random.seed(seed)
    torch.manual_seed(seed)
    with contextlib.suppress(ImportError):
        import numpy

        numpy.random.seed(seed % 2**32)


def load_policy(
    model: ModelConfig, lora: LoraConfig, device: torch.device, precision: Precision | None = None
) -> tuple[Any, Any]:
    """The tokenizer and the causal LM to train (wrapped in LoRA adapters when ``lora.enabled``), its
    weights in ``precision.weights`` (default: :func:`resolve_precision`), LoRA adapters in float32."""
    from transformers import AutoModelForCausalLM

    from agentboost.models.tokenizers import load_tokenizer
    from agentboost.models.weights import quiet_loading, resolve_model

    precision = precision or resolve_precision(model, lora, device)
    tokenizer = load_tokenizer(model.name_or_path)
    quiet_loading()
    network = AutoModelForCausalLM.from_pretrained(
        resolve_model(model.name_or_path), dtype=precision.weights
    ).to(device)
    if model.gradient_checkpointing:
        network.gradient_checkpointing_enable()
        network.config.use_cache = False
    if lora.enabled:
        try:
            from peft import LoraConfig as PeftLoraConfig
            from peft import get_peft_model
        except ImportError as error:
            raise ConfigError("lora.enabled needs peft: pip install 'agentboost[train]'") from error
        if model.gradient_checkpointing:
            network.enable_input_require_grads()
        network = get_peft_model(
            network,
            PeftLoraConfig(
                r=lora.rank,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
                task_type="CAUSAL_LM",
            ),
        )
        precision_module.keep_adapters_float32(network)
    return tokenizer, network


def make_optimizer(
    parameters: Iterable[torch.nn.Parameter], config: OptimizerConfig
) -> torch.optim.Optimizer:
    """AdamW over the parameters that train, one parameter at a time.

    ``foreach=False``: PyTorch's default multi-tensor step builds its temporaries (``sqrt`` of the
    second moments, then the update) for every parameter at once, the model's size again at the step;
    the per-parameter loop needs one parameter's worth, computes the same values (bit for bit, tested)
    and costs a few milliseconds of Python a step.
    """
    return torch.optim.AdamW(
        list(parameters),
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        weight_decay=config.weight_decay,
        foreach=False,
    )


def pad_token_id(tokenizer: Tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


class PolicyModel:
    """The model as the trainer sees it: logprobs (and entropy) of target tokens, only where needed.

    The transformer body runs over every position, but the vocabulary projection only over positions
    whose target was generated: prompts and tool results need hidden states, not [V]-sized logits.
    """

    def __init__(self, model: Any, precision: Precision | None = None) -> None:
        self.model = model  # a transformers causal LM, or a peft model wrapping one
        # what the passes compute in (None: the weights' dtype, no autocast); logits always in float32
        self.precision = precision or precision_module.of_model(model)
        causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.decoder = causal_lm.get_decoder()
        self.head = causal_lm.get_output_embeddings()
        if self.decoder is causal_lm or self.head is None:
            raise ConfigError(
                f"{type(causal_lm).__name__} does not expose a decoder body and an output head "
                "(get_decoder / get_output_embeddings); the local trainer needs both"
            )

    def check_head(self, device: torch.device) -> None:
        """Refuse models whose logits are more than ``head(hidden)`` (soft-capping, scaling)."""
        ids = torch.arange(3, 11, device=device).unsqueeze(0)
        with torch.no_grad():
            reference = self.model(input_ids=ids, use_cache=False).logits.float()
            ours = self.head(self.decoder(input_ids=ids, use_cache=False).last_hidden_state).float()
        if not torch.allclose(reference, ours, atol=1e-3, rtol=1e-3):
            raise ConfigError(
                f"{type(self.model).__name__}'s logits are not its output head applied to its decoder's "
                "hidden states (logit soft-capping or scaling?); the local trainer does not support it yet"
            )

    def logprobs(
        self, batch: TokenBatch, temperature: float, *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B, T] logprobs of the target ids (0 where loss_mask is 0), and [B, T] entropy if asked.

        The [N, V] logits are taken ``LOGIT_CHUNK_ROWS`` positions at a time and, when gradients are
        on, recomputed in the backward pass instead of kept: the head's memory no longer grows with
        the number of generated tokens in a micro-batch (49k-vocabulary fp32 logits cost 192 KiB a
        position, three times over with the softmax and its gradient).
        """
        with self.precision.autocast():  # bfloat16 autocast over float32 weights, when the policy says so
            hidden = self.decoder(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
            ).last_hidden_state  # [B, T, H]
        rows, columns = batch.loss_mask.nonzero(as_tuple=True)  # [N], [N]
        picked, targets = hidden[rows, columns], batch.target_ids[rows, columns]  # [N, H], [N]
        pieces, entropies = [], []
        for start in range(0, picked.shape[0], LOGIT_CHUNK_ROWS):
            inputs = (picked[start : start + LOGIT_CHUNK_ROWS], targets[start : start + LOGIT_CHUNK_ROWS])
            if torch.is_grad_enabled() and picked.requires_grad:
                piece, chunk_entropy = checkpoint(
                    self._head, *inputs, temperature, with_entropy, use_reentrant=False
                )
            else:
                piece, chunk_entropy = self._head(*inputs, temperature, with_entropy)
            pieces.append(piece)
            entropies.append(chunk_entropy)
        empty = hidden.new_zeros((0,), dtype=torch.float32)
        token_logprobs = torch.cat(pieces) if pieces else empty
        shape = batch.loss_mask.shape
        logprobs = torch.zeros(shape, dtype=torch.float32, device=hidden.device).index_put(
            (rows, columns), token_logprobs
        )
        entropy = None
        if with_entropy:
            entropy = torch.zeros(shape, dtype=torch.float32, device=hidden.device)
            entropy[rows, columns] = torch.cat(entropies) if entropies else empty
        return logprobs, entropy

    def _head(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprobs of ``targets`` (and their entropy, when asked; else empty) from [n, H] hidden states."""
        if self.precision.exact:
            logits = self.head(hidden)  # [n, V]
        else:  # float32 logits from bfloat16 hidden states: a bfloat16 logit of 20 is 0.125 off at worst
            logits = precision_module.head_logits(self.head, hidden)  # [n, V] float32
        logprobs = algorithms.token_logprobs(logits, targets, temperature)
        if not with_entropy:
            return logprobs, logprobs.new_zeros((0,))
        return logprobs, algorithms.entropy_from_logits(logits.detach(), temperature)
