"""examples/math: the demonstration's stages agree on one task and one held-out set, and its data is real."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentboost.train.config import load_config
from agentboost.train.sft import SFTDataConfig, load_examples, load_sft_config

pytest.importorskip("reasoning_gym")

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "math"


def prepare_data_env_kwargs() -> dict:
    """ENV_KWARGS of examples/math/prepare_data.py, read without importing the script as a module."""
    text = (EXAMPLE / "prepare_data.py").read_text()
    return json.loads(re.search(r"^ENV_KWARGS = (.*)$", text, re.MULTILINE).group(1))


ENV_KWARGS = prepare_data_env_kwargs()


def train_sh_settings(script: str = "train.sh") -> tuple[dict, dict[str, str]]:
    """ENV_KWARGS and the options of the `agentboost eval` line in one of the example's scripts."""
    text = (EXAMPLE / script).read_text()
    env_kwargs = json.loads(re.search(r"^ENV_KWARGS='(.*)'$", text, re.MULTILINE).group(1))
    command = re.search(r"agentboost eval --env math (.*?)--model", text, re.DOTALL).group(1)
    options = dict(re.findall(r"(--?[a-z-]+) ([^\s\\-][^\s\\]*)", command))
    # a shell variable takes the value of the full run: the first assignment of it in the script (the
    # SMOKE=1 branch assigns it again later)
    for option, value in options.items():
        variable = re.fullmatch(r'"?\$(\w+)"?', value)
        if variable is not None:
            options[option] = re.search(rf"\b{variable.group(1)}=(\S+)", text).group(1)
    return env_kwargs, options


def test_every_stage_uses_the_same_task_and_held_out_evaluation():
    sft = load_sft_config(EXAMPLE / "sft.yaml")
    rl = load_config(EXAMPLE / "train.yaml")
    env_kwargs, options = train_sh_settings()

    assert ENV_KWARGS == sft.eval.kwargs == rl.environment.kwargs == env_kwargs
    assert sft.eval.environment == rl.environment.name == "math"
    assert rl.model.name_or_path == f"{sft.output_dir}/final"  # RL starts from the warm-up
    # the trainer's held-out evaluations and `agentboost eval` score the same problems the same way
    assert int(options["-n"]) == sft.eval.tasks == rl.eval.tasks >= 64
    assert float(options["--temperature"]) == sft.eval.temperature == rl.eval.temperature == 0.0
    assert int(options["--max-turns"]) == sft.eval.max_turns == rl.rollout.max_turns
    assert int(options["--max-new-tokens"]) == sft.eval.max_new_tokens == rl.rollout.max_new_tokens
    assert options["--split"] == "test"


def test_the_vllm_demonstration_scores_its_model_as_train_sh_does():
    assert train_sh_settings("train_vllm.sh") == train_sh_settings("train.sh")
    text = (EXAMPLE / "train_vllm.sh").read_text()
    assert "agentboost train examples/math/train.yaml rollout.vllm_url=" in text  # the same GRPO stage
    assert "agentboost sft examples/math/sft.yaml" in text


def test_prepared_demonstrations_come_from_the_train_split_and_train_only_the_agent(tmp_path, qwen_tokenizer):
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "prepare_data.py"), "--out", str(tmp_path), "--demonstrations", "6"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "demonstrations.jsonl").read_text().splitlines()]
    assert len(rows) == 6

    from agentboost.envs.math_problems import MathEnvironment

    held_out = {task.prompt for task in MathEnvironment(**ENV_KWARGS).tasks(256, seed=0, split="test")}
    for row in rows:
        user = next(m["content"] for m in row["messages"] if m["role"] == "user")
        assert user not in held_out
        tool_result = next(m["content"] for m in row["messages"] if m["role"] == "tool")
        left, right = re.search(r"(\d+) \* (\d+)", user).groups()
        assert tool_result == str(int(left) * int(right))  # the calculator's real output
        assert row["messages"][-1]["content"] == f"Answer: {tool_result}"

    examples, report = load_examples(
        SFTDataConfig(paths=[str(tmp_path / "demonstrations.jsonl")]), qwen_tokenizer
    )
    assert report.kept == 6
    trained = qwen_tokenizer.decode(
        [t for t, m in zip(examples[0].token_ids, examples[0].loss_mask, strict=True) if m]
    )
    assert "calculator" in trained and trained.rstrip().endswith("<|im_end|>")
    assert rows[0]["messages"][-1]["content"] in trained
    assert "multiplication" not in trained and "math problems" not in trained  # prompts: context only


@pytest.mark.slow
def test_the_demonstration_runs_end_to_end_on_a_tiny_model(tmp_path, qwen_tokenizer):
    """train.sh's stages on a tiny random Qwen3 (the real configs, shortened): prepare, warm-up,
    GRPO from the warm-up's final model, the two-stage curve, and `agentboost eval` of the result."""
    from conftest import tiny_qwen3

    from agentboost.cli import main
    from agentboost.eval.evaluate import load_report
    from agentboost.train.logging import read_metrics

    model = tmp_path / "tiny"
    tiny_qwen3(hidden=32).save_pretrained(model)
    qwen_tokenizer.save_pretrained(model)
    data = tmp_path / "data"
    prepare = [sys.executable, str(EXAMPLE / "prepare_data.py"), "--out", str(data), "--demonstrations", "8"]
    assert subprocess.run(prepare, cwd=ROOT, capture_output=True).returncode == 0
    short = ["eval.tasks=2", "threads=1"]

    sft_run = tmp_path / "sft"
    sft = [f"model.name_or_path={model}", f"data.paths=[{data / 'demonstrations.jsonl'}]", "steps=2"]
    sft += ["batch_size=4", "eval.every=2", f"output_dir={sft_run}", *short]
    assert main(["sft", str(EXAMPLE / "sft.yaml"), *sft]) == 0
    evals = [r for r in read_metrics(sft_run / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2]
    assert all(0.0 <= r["eval/tool_use_rate"] <= 1.0 for r in evals)

    rl_run = tmp_path / "grpo"
    rl = [f"model.name_or_path={sft_run / 'final'}", "steps=1", "rollout.tasks_per_step=2"]
    rl += ["rollout.group_size=2", "eval.every=1", f"output_dir={rl_run}", "time_limit_minutes=null", *short]
    assert main(["train", str(EXAMPLE / "train.yaml"), *rl]) == 0
    records = read_metrics(rl_run / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 1]
    assert "rollout/tool_use_rate" in next(r for r in records if r["kind"] == "train")

    curve = tmp_path / "curve.png"
    plot = [sys.executable, str(EXAMPLE / "plot_stages.py"), str(sft_run), str(rl_run), "--out", str(curve)]
    plotted = subprocess.run(plot, cwd=ROOT, capture_output=True, text=True)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert "RL gain" in plotted.stdout and curve.stat().st_size > 10_000

    env_kwargs, options = train_sh_settings()
    out = tmp_path / "final.jsonl"
    evaluate = ["eval", "--env", "math", "--env-kwargs", json.dumps(env_kwargs), "--split", "test", "-n", "2"]
    evaluate += ["--temperature", "0", "--max-turns", options["--max-turns"], "--max-new-tokens"]
    evaluate += [options["--max-new-tokens"], "--model", str(rl_run / "final"), "--out", str(out), "--quiet"]
    assert main(evaluate) == 0
    report = load_report(out.with_suffix(".json"))
    assert report["rollouts"] == 2 and report["tool_use_rate"] is not None
    # the trainer's last held-out evaluation and `agentboost eval` score the same model and problems
    last = [r for r in records if r["kind"] == "eval"][-1]
    assert report["mean_reward"] == pytest.approx(last["eval/reward_mean"])
