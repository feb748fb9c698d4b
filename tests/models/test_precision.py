"""The precision policy: what ``auto`` picks where, what is refused, the one warning, float32 logits."""

from __future__ import annotations

import warnings

import pytest
import torch

from agentboost.errors import ConfigError
from agentboost.models import precision


@pytest.fixture
def fresh_warning(monkeypatch):
    """The once-per-process warning, as if nothing had warned yet."""
    monkeypatch.setattr(precision, "_warned_pure_bfloat16", False)


@pytest.fixture
def bfloat16_gpu(monkeypatch):
    """A CUDA GPU with bfloat16, as far as the policy asks (no GPU here: the decision is what is tested)."""
    monkeypatch.setattr(precision, "bfloat16_compute_available", lambda device: device.type == "cuda")


def test_auto_is_float32_on_cpu_whether_trained_or_served():
    for trains in (True, False):
        chosen = precision.resolve_precision("auto", "auto", "cpu", trains=trains)
        assert (chosen.weights, chosen.compute, chosen.exact, chosen.autocasts) == (
            torch.float32,
            torch.float32,
            True,
            False,
        )


def test_auto_on_a_gpu_trains_float32_master_weights_with_bfloat16_autocast(bfloat16_gpu, fresh_warning):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto never warns
        trained = precision.resolve_precision("auto", "auto", "cuda", trains=True)
        served = precision.resolve_precision("auto", "auto", "cuda", trains=False)
        lora = precision.resolve_precision("auto", "auto", "cuda", trains=True, lora=True)
    assert (trained.weights, trained.compute, trained.autocasts) == (torch.float32, torch.bfloat16, True)
    assert trained.describe() == "float32 weights, bfloat16 autocast compute (cuda)"
    assert trained.as_dict() == {"weights": "float32", "compute": "bfloat16", "device": "cuda"}
    assert trained.as_metrics() == {"precision/bf16_weights": 0.0, "precision/bf16_compute": 1.0}
    # nothing is updated in a served model or a LoRA base: bfloat16 weights cost nothing in learning
    assert (served.weights, served.compute, served.autocasts) == (torch.bfloat16, torch.bfloat16, False)
    assert (lora.weights, lora.compute) == (torch.bfloat16, torch.bfloat16)


def test_bfloat16_compute_over_float32_weights_on_request_on_cpu():
    chosen = precision.resolve_precision("float32", "bfloat16", "cpu")
    assert chosen.autocasts and not chosen.exact
    with chosen.autocast():
        assert torch.is_autocast_enabled("cpu")
        product = torch.nn.functional.linear(torch.ones(2, 4), torch.ones(3, 4))
    assert product.dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


def test_pure_bfloat16_weights_warn_once_naming_the_rounding_risk(fresh_warning):
    with pytest.warns(UserWarning, match="rounds away") as caught:
        first = precision.resolve_precision("bfloat16", "auto", "cpu", trains=True)
    assert len(caught) == 1 and "model.compute_dtype=bfloat16" in str(caught[0].message)
    assert (first.weights, first.compute) == (torch.bfloat16, torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision.resolve_precision("bfloat16", "auto", "cpu", trains=True)  # the second time: silent


def test_bfloat16_weights_that_do_not_train_do_not_warn(fresh_warning):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision.resolve_precision("bfloat16", "auto", "cpu", trains=False)
        precision.resolve_precision("bfloat16", "auto", "cpu", trains=True, lora=True)


@pytest.mark.parametrize(
    ("weights", "compute", "message"),
    [
        ("bfloat16", "float32", "compute_dtype=float32 needs float32 weights"),
        ("float16", "auto", "model.dtype must be one of auto, float32, bfloat16"),
        ("auto", "fp8", "model.compute_dtype must be one of"),
    ],
)
def test_impossible_combinations_are_config_errors(weights, compute, message):
    with pytest.raises(ConfigError, match=message):
        precision.resolve_precision(weights, compute, "cpu", trains=False)


def test_head_logits_are_float32_from_bfloat16_weights_and_inside_autocast():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False).to(torch.bfloat16)
    hidden = torch.randn(3, 16).to(torch.bfloat16)
    expected = hidden.double() @ head.weight.double().T
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = precision.head_logits(head, hidden)
    assert logits.dtype == torch.float32
    assert torch.allclose(logits.double(), expected, atol=1e-5)
    rounded = head(hidden).double()  # what a bfloat16 head gives: off by up to half a bfloat16 spacing
    assert (rounded - expected).abs().max() > 100 * (logits.double() - expected).abs().max()


def test_lora_adapters_stay_float32_over_a_bfloat16_base():
    base = torch.nn.Linear(4, 4).to(torch.bfloat16).requires_grad_(False)
    adapter = torch.nn.Linear(4, 2).to(torch.bfloat16)
    model = torch.nn.Sequential(base, adapter)
    precision.keep_adapters_float32(model)
    assert base.weight.dtype == torch.bfloat16 and adapter.weight.dtype == torch.float32
