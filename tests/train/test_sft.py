"""Supervised fine-tuning: the mask is exactly the assistant's tokens, the loss goes down, resume is exact."""

from __future__ import annotations

import asyncio
import copy
import json
import sys

import pytest
import torch
from conftest import tiny_qwen3

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.envs.calculator import calculator
from agentboost.errors import ConfigError
from agentboost.tokens.templates import tool_specs_to_openai
from agentboost.train.sft import SFTDataConfig, SFTTrainer, load_examples, load_sft_config, render_chat

END = "<|im_end|>"
TOOL_TURN = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>' + END


def rollout(tokenizer, turns: list[str], task_index: int = 0):
    """A real arithmetic rollout whose model turns are ``turns`` (scripted token ids)."""
    environment = ArithmeticEnvironment()
    task = environment.tasks(task_index + 1)[task_index]
    engine = ScriptedEngine([tokenizer.encode(turn, add_special_tokens=False) for turn in turns])
    return asyncio.run(environment.run_episode(task, engine, tokenizer, template="qwen3"))


def masked_runs(tokenizer, ids: list[int], mask: list[int]) -> list[str]:
    runs, current = [], []
    for token, flag in zip(ids, mask, strict=True):
        if flag:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current)), current.clear()
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_chat_rendering_of_a_rollout_gives_its_exact_tokens_and_mask(qwen_tokenizer):
    result = rollout(qwen_tokenizer, [TOOL_TURN, "12 * 34 = 408.\nAnswer: 408" + END])
    trajectory = result.trajectory
    tools = tool_specs_to_openai([calculator.tool_spec])

    ids, mask = render_chat(qwen_tokenizer, trajectory.messages, tools, template="qwen3")

    assert ids == trajectory.token_ids  # the chat export trains on what a rollout would have produced
    assert mask == trajectory.loss_mask
    # the trained tokens are exactly the two assistant turns (tool call included), end-of-turn included
    assert masked_runs(qwen_tokenizer, ids, mask) == [TOOL_TURN, "12 * 34 = 408.\nAnswer: 408" + END]


def test_chat_mask_covers_only_assistant_turns_of_a_hand_written_conversation(qwen_tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Multiply 123 by 45."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "python", "arguments": {"code": "print(123*45)"}}}
            ],
        },
        {"role": "tool", "content": "5535"},
        {"role": "user", "content": "And the answer line?"},
        {"role": "assistant", "content": "Answer: 5535"},
    ]
    ids, mask = render_chat(qwen_tokenizer, messages, None, template="qwen3")

    runs = masked_runs(qwen_tokenizer, ids, mask)
    assert len(runs) == 2
    assert '"name": "python"' in runs[0] and runs[0].endswith(END) and "5535" not in runs[0]
    assert runs[1] == "Answer: 5535" + END
    context = qwen_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    for text in ("Be brief.", "Multiply 123 by 45.", "5535", "And the answer line?"):
        assert text in context


def test_an_assistant_turn_ends_at_the_first_end_of_turn_token_whatever_the_eos_token(qwen_tokenizer):
    """SmolLM2's tokenizer calls <|im_start|> its EOS: the turn must still end at <|im_end|>, once."""
    messages = [
        {"role": "user", "content": "Multiply 12 by 34."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "calc", "arguments": {"e": "12*34"}}}],
        },
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "Answer: 408"},
    ]
    expected = render_chat(qwen_tokenizer, messages, None, template="chatml")
    odd = copy.deepcopy(qwen_tokenizer)
    odd.eos_token = "<|im_start|>"
    ids, mask = render_chat(odd, messages, None, template="chatml")
    assert (ids, mask) == expected
    assert "<|im_end|>\n<|im_end|>" not in qwen_tokenizer.decode(ids)
    assert all(run.endswith(END) and run.count(END) == 1 for run in masked_runs(qwen_tokenizer, ids, mask))


def test_results_rows_train_on_their_stored_mask_and_are_filtered_by_reward(qwen_tokenizer, tmp_path):
    question = ArithmeticEnvironment().tasks(1)[0]
    right = rollout(qwen_tokenizer, [f"Answer: {question.ground_truth}{END}"])
    wrong = rollout(qwen_tokenizer, ["Answer: -1" + END])
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in (right, wrong)))

    examples, report = load_examples(SFTDataConfig(paths=[str(path)], min_reward=1.0), qwen_tokenizer)
    assert (report.kept, report.low_reward) == (1, 1)
    assert examples[0].token_ids == right.trajectory.token_ids
    assert examples[0].loss_mask == right.trajectory.loss_mask

    _, report = load_examples(SFTDataConfig(paths=[str(path)]), qwen_tokenizer)
    assert report.kept == 2


def test_bad_rows_are_typed_errors_naming_the_line(qwen_tokenizer, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1"):
        load_examples(SFTDataConfig(paths=[str(path)]), qwen_tokenizer)
    path.write_text("not json\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1 is not JSON"):
        load_examples(SFTDataConfig(paths=[str(path)]), qwen_tokenizer)


# --- training on a tiny model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(qwen_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-qwen3-sft")
    tiny_qwen3(seed=0, hidden=64).save_pretrained(directory)
    qwen_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory):
    rows = []
    for a in range(2, 18):
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": f"What is {a} * 7?"},
                    {"role": "assistant", "content": f"Answer: {a * 7}"},
                ]
            }
        )
    path = tmp_path_factory.mktemp("sft-data") / "chat.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft_config(model_dir, data, output_dir, *overrides):
    return load_sft_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"data.paths=[{data}]",
            "data.template=qwen3",
            "optimizer.lr=1e-2",
            "batch_size=4",
            "logging.progress=false",
            "checkpoint.save_final_model=false",
            f"output_dir={output_dir}",
            *overrides,
        ],
    )


def test_sft_lowers_the_loss_of_the_assistant_tokens(tiny_model_dir, chat_file, tmp_path):
    trainer = SFTTrainer(sft_config(tiny_model_dir, chat_file, tmp_path / "run", "steps=12"))
    before = trainer.loss_on(trainer.examples)
    summary = trainer.train()
    after = trainer.loss_on(trainer.examples)
    assert after < 0.5 * before, f"assistant-token loss went {before:.3f} -> {after:.3f}"
    assert summary.steps == 12
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(12))


class SimulatedKill(BaseException):
    pass


def test_a_resumed_run_is_bit_identical_to_an_uninterrupted_one(tiny_model_dir, chat_file, tmp_path):
    settings = ("steps=6", "checkpoint.every=2", "optimizer.schedule=cosine", "optimizer.warmup_steps=1")
    straight = SFTTrainer(sft_config(tiny_model_dir, chat_file, tmp_path / "straight", *settings))
    straight_summary = straight.train()

    killed = SFTTrainer(sft_config(tiny_model_dir, chat_file, tmp_path / "resumed", *settings))
    real_step = killed.train_step

    def dies_in_step_3(step: int, **options):
        if step == 3:
            raise SimulatedKill()  # after the step-2 checkpoint, in the middle of a checkpoint interval
        return real_step(step, **options)

    killed.train_step = dies_in_step_3
    with pytest.raises(SimulatedKill):
        killed.train()
    del killed

    resumed = SFTTrainer(sft_config(tiny_model_dir, chat_file, tmp_path / "resumed", *settings))
    summary = resumed.train()
    assert summary.resumed_from == 2
    assert summary.losses == straight_summary.losses
    for (name, a), (_, b) in zip(
        straight.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_overrides_are_checked_like_the_trainer(tmp_path):
    with pytest.raises(ConfigError, match="did you mean"):
        load_sft_config(None, ["data.paths=[x.jsonl]", "batch_sise=4"])
    with pytest.raises(ConfigError, match=r"data\.paths is empty"):
        load_sft_config(None, [])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("lora.rank=0", r"lora\.rank must be >= 1"),
        ("optimizer.warmup_steps=-1", r"optimizer\.warmup_steps must be >= 0"),
        ("optimizer.min_lr_ratio=1.5", r"optimizer\.min_lr_ratio must be in \[0, 1\]"),
        ("checkpoint.keep=0", r"checkpoint\.keep must be >= 1"),
    ],
)
def test_sections_shared_with_the_trainer_check_themselves_the_same_way(override, message):
    """SFT and GRPO read the same sections, so the same bad value gets the same error in both."""
    from agentboost.train.config import load_config

    with pytest.raises(ConfigError, match=message):
        load_sft_config(None, ["data.paths=[x.jsonl]", override])
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_the_held_out_evaluation_counts_its_rollouts_in_a_terminal(tiny_model_dir, chat_file, tmp_path):
    """examples/math/train.sh sat at `sft: 0/3` through its step-0 evaluation: the bar now counts it."""
    from pty_support import run_in_terminal

    command = [
        sys.executable,
        "-c",
        "from agentboost.cli import run; run()",
        "sft",
        f"model.name_or_path={tiny_model_dir}",
        f"data.paths=[{chat_file}]",
        "data.template=qwen3",
        "steps=1",
        "batch_size=4",
        "eval.every=1",
        "eval.environment=arithmetic",
        "eval.tasks=2",
        "eval.max_new_tokens=4",
        "checkpoint.save_final_model=false",
        f"output_dir={tmp_path / 'run'}",
    ]
    drawn = run_in_terminal(command).replace("\r", "\n").splitlines()
    for step in (0, 1):  # before the first step and after the last
        counts = [line for line in drawn if f"eval @{step} " in line]
        assert any(f"eval @{step} 1/2" in line for line in counts), drawn
        assert any(f"eval @{step} 2/2" in line for line in counts), drawn
