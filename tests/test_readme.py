"""The README's quick starts, followed in the order written, in an empty directory, by the real command.

The commands are read from README.md itself (so an edit there is what runs here), sized down (fewer
tasks, samples, turns and tokens), and run with the real default model (SmolLM2-135M-Instruct from
the local cache). Each example's quick start runs at its own smoke size, as written
(`SMOKE=1 bash examples/X/train.sh`: rollouts, a training step, evaluations, the final model written)
in the same directory, which holds a copy of `examples/` as a fresh clone does. Each must exit 0 and
produce what the README says; no two collide on a file. Skipped: the pip lines, the coding and tau2
rollouts (their own tests cover them), the full-size trainers and the vLLM server.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from verl_support import verl_python, with_verl_first_on_path

from agentboost.rollout.results import read_results

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SMALL = {"-n": "1", "--samples": "2"}
"""What each count is cut to."""
SHORT = ["--max-turns", "2", "--max-new-tokens", "24"]
"""Added to every rollout and eval: a few tokens per turn are enough to check the plumbing."""
EXAMPLES = ("math", "deepcoder", "tau2", "gateway", "mcp")
"""The examples whose quick start is a `SMOKE=1 bash examples/X/train.sh` line (5.6 minutes for the five on
2 idle cores: math 95 s, deepcoder 55 s, tau2 95 s, gateway 33 s, MCP 61 s; 2026-11-28, load 1.3-1.5)."""


def readme_commands() -> list[list[str]]:
    """Every indented command line that runs agentboost, the veRL dry run or an example's smoke size, in
    README order. A smoke line is kept whole (`python examples/X/prepare_data.py && SMOKE=1 bash ...`)."""
    commands = []
    for line in README.splitlines():
        if not line.startswith("    ") or line.startswith("     "):
            continue
        whole = shlex.split(line.strip(), comments=True)
        if "SMOKE=1" in whole:
            commands.append(whole)
            continue
        text = line.strip().split("&&")[-1].strip()  # `pip install ... && agentboost rollout -n 4`
        words = shlex.split(text, comments=True)
        if words[:1] == ["agentboost"] or words[:2] == ["DRY_RUN=1", "bash"]:
            commands.append(words)
    return commands


def is_smoke(words: list[str]) -> bool:
    return "SMOKE=1" in words


def sized_down(words: list[str]) -> list[str]:
    if is_smoke(words):  # the example's own smoke size, as written
        return words
    out = list(words)
    for index, word in enumerate(out[:-1]):
        if word in SMALL and not (word == "-n" and "Capitals" in " ".join(out)):
            out[index + 1] = SMALL[word]
    if out[1] in ("rollout", "eval") and "--compare" not in out:
        out += SHORT
    return out


def run(words: list[str], cwd: Path, home: Path, verl: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HOME": str(home)}
    # HOME is a fresh folder (to see what the commands write there); the caches stay where they are
    env["AGENTBOOST_HOME"] = os.environ.get("AGENTBOOST_HOME", str(Path.home() / ".cache" / "agentboost"))
    env["HF_HOME"] = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
    # the scripts' `agentboost` and `python` are this interpreter's
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    if is_smoke(words):  # the line as written, `&&` and all, in the clone-like working directory
        command = ["bash", "-c", shlex.join(words).replace("'&&'", "&&")]
    elif words[0] == "DRY_RUN=1":
        env.update(DRY_RUN="1", TRAIN_TASKS="8", VAL_TASKS="4")
        if verl:  # the README runs this line in veRL's own virtual environment (activated)
            env = with_verl_first_on_path(env, verl)
        command = ["bash", str(ROOT / words[2]), *words[3:]]
    else:
        command = [sys.executable, "-m", "agentboost.cli", *words[1:]]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_the_readme_lists_the_quick_starts_this_test_runs():
    commands = [" ".join(words) for words in readme_commands()]
    assert commands[0] == "agentboost rollout -n 4"
    for expected in (
        "agentboost rollout --env my_package.envs:Capitals",
        "agentboost eval --env arithmetic",
        "agentboost eval --compare runs/eval/base.json runs/eval/greedy.json",
        "agentboost stats runs/eval/base.jsonl",
        "agentboost view runs/eval/base.jsonl",
        "agentboost export runs/eval/base.jsonl",
        "DRY_RUN=1 bash examples/arithmetic/train_verl.sh",
    ):
        assert any(command.startswith(expected) for command in commands), expected
    outs = [words[words.index("--out") + 1] for words in readme_commands() if "--out" in words]
    assert len(outs) == len(set(outs)), f"two quick starts write the same file: {outs}"
    smokes = [" ".join(words) for words in readme_commands() if is_smoke(words)]
    for example in EXAMPLES:
        assert any(f"SMOKE=1 bash examples/{example}/train.sh" in command for command in smokes), example


def check_smoke(words: list[str], work: Path, before: set[Path]) -> None:
    """A smoke run trained and evaluated end to end: every training run it made under runs/smoke/ has its
    metrics, its evaluations and its final model."""
    smoke = work / "runs" / "smoke"
    trained = {config.parent for config in smoke.glob("*/config.json")} - before
    assert trained, f"{' '.join(words)} made no training run under runs/smoke/"
    for run_dir in trained:
        assert (run_dir / "metrics.jsonl").read_text().strip(), run_dir
        assert any((run_dir / "evals").iterdir()), f"{run_dir} has no evaluation"
        assert (run_dir / "final" / "config.json").exists(), f"{run_dir} wrote no final model"
    if "examples/math/train.sh" in words:  # its last stage: `agentboost eval` of the three models
        for name in ("base", "warmup", "final"):
            assert json.loads((smoke / "math-eval" / f"{name}.json").read_text())["rollouts"] == 2
    if "examples/mcp/train.sh" in words:  # the rollouts over stdio and over streamable HTTP
        assert read_results(smoke / "mcp-stdio.jsonl") and read_results(smoke / "mcp-http.jsonl")


def test_no_two_readme_commands_write_the_same_file():
    """A second command writing a file the first one wrote is refused (it asks for --force): every
    `-o` / `--out` in the README, in its command blocks and in its prose, names a file of its own."""
    inline = [shlex.split(" ".join(text.split())) for text in re.findall(r"`(agentboost [^`]+)`", README)]
    outs = []
    for words in [*readme_commands(), *inline]:
        for flag in ("-o", "--out"):
            if flag in words[:-1]:
                outs.append(words[words.index(flag) + 1])
    repeated = sorted({out for out in outs if outs.count(out) > 1})
    assert not repeated, f"README commands that write the same file: {repeated}"


@pytest.mark.slow
@pytest.mark.timeout(3600)  # ten model-loading commands and five smokes: 6.5 min at load 0.4-4 (2026-11-28)
def test_the_quick_starts_run_in_the_order_written(tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    home.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")  # what a clone holds beside the package
    code = re.search(r"```python\n(.*?)```", README, re.DOTALL).group(1)
    (work / "my_package").mkdir()
    (work / "my_package" / "__init__.py").write_text("")
    (work / "my_package" / "envs.py").write_text(code)
    # their own quick starts need more than a CPU minute or a separate server (tested elsewhere)
    skipped = ("--env coding", "--env tau2", "serve-vllm", "--engine vllm")
    verl = verl_python()  # veRL lives in its own virtual environment
    if verl is None:
        skipped += ("train_verl.sh",)
    for words in readme_commands():
        if any(part in " ".join(words) for part in skipped):
            continue
        command = sized_down(words)
        before = {config.parent for config in (work / "runs" / "smoke").glob("*/config.json")}
        started = time.monotonic()
        done = run(command, work, home, verl)
        print(f"{time.monotonic() - started:6.1f} s  {' '.join(command)}")
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        assert "Loading weights" not in done.stderr
        joined = " ".join(command)
        if is_smoke(command):
            check_smoke(command, work, before)
            continue
        if joined.startswith("agentboost rollout -n"):
            assert "mean reward" in done.stdout and (work / "runs" / "rollouts.jsonl").exists()
        if "Capitals" in joined:  # the first example users copy shows a reward that moves
            rewards = [result.reward for result in read_results(work / "runs" / "capitals.jsonl")]
            assert len(rewards) == 2 * 2 and max(rewards) == 1.0, rewards
        if "--compare" in joined:
            assert "base" in done.stdout and "greedy" in done.stdout
        if joined.startswith("agentboost export"):
            assert "left out by the filters" in done.stdout or re.search(r"^\d+ rollouts ->", done.stdout)
    for made in ("eval/base.json", "eval/greedy.json", "eval/base.stats.md"):
        assert (work / "runs" / made).exists(), made
    report = json.loads((work / "runs" / "eval" / "base.json").read_text())
    assert report["rollouts"] == 2
    assert (work / "runs" / "eval" / "base.html").stat().st_size > 0
    assert (work / "runs" / "eval" / "sft.jsonl").exists()
    assert list((work / "runs" / "eval" / "plots").glob("*.png"))
    assert not (home / "data").exists(), "the veRL dry run wrote its tasks into ~/data"
