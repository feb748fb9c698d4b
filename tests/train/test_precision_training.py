"""Training in bfloat16 compute learns: float32 master weights take updates bfloat16 weights would lose.

The real failure (issue 43): SmolLM2-135M, full fine-tuning of bfloat16 weights with AdamW at lr 2e-5..5e-5,
learned nothing on a GPU. On CPU torch runs the same bfloat16 arithmetic, so the policy is tested here
with the tiny models of the other trainer tests at the example's learning rates.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import tiny_qwen3
from train_toy_env import FirstToken, save_toy_model

from agentboost.models import precision
from agentboost.rollout.results import read_header
from agentboost.train.config import config_from_dict
from agentboost.train.logging import read_metrics
from agentboost.train.sft import SFTTrainer, load_sft_config
from agentboost.train.trainer import Trainer

MISMATCH_KEYS = {
    "mismatch/logprob_abs_diff",
    "mismatch/logprob_abs_diff_max",
    "mismatch/kl",
    "mismatch/ratio_min",
    "mismatch/ratio_p01",
    "mismatch/ratio_p50",
    "mismatch/ratio_p99",
    "mismatch/ratio_max",
    "mismatch/weight_mean",
    "mismatch/masked_fraction",
    "mismatch/truncated_fraction",
}


@pytest.fixture(scope="module")
def tiny_model_dir(qwen_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-qwen3-precision")
    tiny_qwen3(seed=0, hidden=64).save_pretrained(directory)
    qwen_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def toy_model_dir(qwen_tokenizer, tmp_path_factory):
    return save_toy_model(tmp_path_factory.mktemp("toy-precision"), qwen_tokenizer)


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory):
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"What is {a} * 7?"},
                {"role": "assistant", "content": f"Answer: {a * 7}"},
            ]
        }
        for a in range(2, 18)
    ]
    path = tmp_path_factory.mktemp("sft-precision") / "chat.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft(model_dir, data, output_dir, *overrides) -> SFTTrainer:
    """The math example's SFT settings (lr 5e-5, batch 8) on the tiny model."""
    return SFTTrainer(
        load_sft_config(
            None,
            [
                f"model.name_or_path={model_dir}",
                f"data.paths=[{data}]",
                "data.template=qwen3",
                "optimizer.lr=5e-5",
                "batch_size=8",
                "steps=3",
                "logging.progress=false",
                "checkpoint.save_final_model=false",
                f"output_dir={output_dir}",
                *overrides,
            ],
        )
    )


def check_master_weights_hold_updates_bfloat16_would_lose(trainer: SFTTrainer, before: dict) -> None:
    """After one step at lr 5e-5: float32 weights and AdamW state, moved by updates that a bfloat16 copy
    of the weights would not even show (about a third of them on the tiny model)."""
    changed = lost_in_bfloat16 = 0
    for name, parameter in trainer.model.named_parameters():
        assert parameter.dtype == torch.float32, name
        moved = parameter.detach() != before[name]
        changed += int(moved.sum())
        lost_in_bfloat16 += int((moved & (parameter.detach().bfloat16() == before[name].bfloat16())).sum())
    assert changed > 10_000
    assert lost_in_bfloat16 > 0.2 * changed
    states = [t for state in trainer.optimizer.state.values() for t in state.values() if t.dim()]
    assert states and all(t.dtype == torch.float32 for t in states)


def test_an_sft_step_in_bfloat16_compute_updates_float32_master_weights(tiny_model_dir, chat_file, tmp_path):
    trainer = sft(tiny_model_dir, chat_file, tmp_path / "run", "model.compute_dtype=bfloat16")
    assert trainer.precision.autocasts and trainer.precision.weights == torch.float32
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train_step(0)
    check_master_weights_hold_updates_bfloat16_would_lose(trainer, before)


@pytest.mark.slow  # three SFT runs of the tiny model: about 25 s on an idle 2-core machine
def test_sft_in_bfloat16_compute_makes_float32_progress_where_bfloat16_weights_do_not(
    tiny_model_dir, chat_file, tmp_path, monkeypatch
):
    """Three SFT steps at lr 5e-5 (the math example's): the assistant-token loss falls as far with
    bfloat16 compute as in float32 (within 10%); with pure bfloat16 weights it falls much less (the
    issue's failure, in small).

    The proxy compares how far the loss falls, not its level: the tiny random model's loss stays near
    log(151k) whatever it learns in three steps, so a 10% band on the level could never fail.
    """
    monkeypatch.setattr(precision, "_warned_pure_bfloat16", False)
    drops = {}
    for name, override in (
        ("float32", "model.compute_dtype=float32"),
        ("bfloat16 compute", "model.compute_dtype=bfloat16"),
        ("bfloat16 weights", "model.dtype=bfloat16"),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = sft(tiny_model_dir, chat_file, tmp_path / name.replace(" ", "-"), override)
        rounding = [w for w in caught if "rounds away" in str(w.message)]
        assert len(rounding) == (name == "bfloat16 weights"), name
        measure = SFTTrainer.loss_on  # in float32 for all three, so only the weights differ
        trainer.policy.precision = precision.of_model(trainer.model)
        start = measure(trainer, trainer.examples)
        trainer.policy.precision = trainer.precision
        for step in range(3):
            trainer.train_step(step)
        trainer.policy.precision = precision.of_model(trainer.model)
        drops[name] = start - measure(trainer, trainer.examples)
    assert drops["float32"] > 0.05, drops
    assert abs(drops["bfloat16 compute"] - drops["float32"]) < 0.1 * drops["float32"], drops
    assert drops["bfloat16 weights"] < 0.9 * drops["float32"], drops


def test_a_grpo_step_in_bfloat16_compute_learns_corrects_and_logs_the_mismatch(
    qwen_tokenizer, toy_model_dir, tmp_path
):
    model_dir = toy_model_dir
    (line_break,) = qwen_tokenizer.encode("\n", add_special_tokens=False)
    config = config_from_dict(
        {
            "model": {"name_or_path": str(model_dir), "compute_dtype": "bfloat16"},
            "environment": {"train_tasks": 16},
            "rollout": {"tasks_per_step": 4, "group_size": 8},
            "algorithm": {"off_policy": {"correction": "icepop", "low": 0.5, "high": 2.0}},
            "optimizer": {"lr": 2e-5},  # the math example's GRPO learning rate
            "eval": {"every": 0},
            "checkpoint": {"every": 0, "save_final_model": False},
            "logging": {"progress": False},
            "steps": 2,
            "output_dir": str(tmp_path / "run"),
        }
    )
    trainer = Trainer(config, environment=FirstToken(line_break))
    assert trainer.engine.precision == trainer.precision  # the engine samples with the trainer's numerics
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()

    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    (chosen,) = [r for r in records if r["kind"] == "precision"]
    assert chosen["precision/bf16_compute"] == 1.0 and chosen["precision/bf16_weights"] == 0.0
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2 and sum(r["optim/updates"] for r in train) >= 1
    for record in train:
        assert record.keys() >= MISMATCH_KEYS, MISMATCH_KEYS - record.keys()
        # bfloat16 on both sides, different kernels: a gap, small on this model, and measured
        assert 0 < record["mismatch/logprob_abs_diff"] < 0.05
        assert record["mismatch/ratio_min"] <= record["mismatch/ratio_p50"] <= record["mismatch/ratio_max"]
        assert 0 <= record["mismatch/masked_fraction"] <= 1
    moved = sum(int((p.detach() != before[n]).any()) for n, p in trainer.model.named_parameters())
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert moved == len(before)
    # every step's rollouts file says what the engine sampled in: the trainer's policy, not the policy an
    # `agentboost rollout` would serve in (float32 compute on this CPU)
    for step in (0, 1):
        header = read_header(tmp_path / "run" / "rollouts" / f"step_{step:06d}.jsonl")
        assert header["run"]["precision"] == {"weights": "float32", "compute": "bfloat16", "device": "cpu"}


def test_the_off_policy_correction_is_none_in_float32_and_icepop_in_bfloat16_unless_chosen():
    from agentboost.errors import ConfigError
    from agentboost.train.config import load_config

    default = load_config(None, []).algorithm
    assert default.correction(exact=True).correction == "none"
    assert default.correction(exact=False).correction == "icepop"
    older = load_config(None, ["algorithm.tis_cap=3"]).algorithm  # the older spelling of TIS
    resolved = older.correction(exact=True)
    assert (resolved.correction, resolved.cap) == ("tis", 3.0)
    chosen = load_config(None, ["algorithm.off_policy.correction=mis", "algorithm.off_policy.high=1.5"])
    assert chosen.algorithm.correction(exact=False).correction == "mis"
    with pytest.raises(ConfigError, match="tis_cap is the older spelling"):
        load_config(None, ["algorithm.tis_cap=2", "algorithm.off_policy.correction=icepop"])
    with pytest.raises(ConfigError, match="0 <= low < 1 < high"):
        load_config(None, ["algorithm.off_policy.low=1.2"])


def test_graphed_decode_steps_are_asked_for_in_the_rollout_section_and_refused_without_a_gpu(
    qwen_tokenizer, toy_model_dir, tmp_path
):
    """`rollout.cuda_graphs` reaches the trainer's engine: off by default, a config error on this CPU."""
    from agentboost.errors import ConfigError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the switch is allowed")
    model_dir = toy_model_dir
    (line_break,) = qwen_tokenizer.encode("\n", add_special_tokens=False)
    settings = {
        "model": {"name_or_path": str(model_dir)},
        "rollout": {"tasks_per_step": 1, "group_size": 2},
        "eval": {"every": 0},
        "logging": {"progress": False},
        "steps": 1,
        "output_dir": str(tmp_path / "run"),
    }
    assert config_from_dict(settings).rollout.cuda_graphs is False
    settings["rollout"]["cuda_graphs"] = True
    with pytest.raises(ConfigError, match="cuda_graphs needs a model on a CUDA GPU"):
        Trainer(config_from_dict(settings), environment=FirstToken(line_break))
