"""Every example's prepare step writes disjoint train and test sets (by id and by problem text) and
refuses overlapping ones loudly unless asked (tau2's is tested in test_tau2_examples.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentboost.envs.splits import SplitOverlapError, check_disjoint, normalized_text

ROOT = Path(__file__).resolve().parents[2]


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _text(row: dict) -> str:
    return normalized_text(
        row["problem"] + ("\n" + row.get("starter_code", "") if row["test_type"] == "humaneval" else "")
    )


def test_check_disjoint_finds_shared_ids_and_texts():
    assert check_disjoint([("a", "Add two numbers.")], [("b", "Print the sum.")]) is None
    with pytest.raises(
        SplitOverlapError, match=r"1 test problems are also training problems \(0 by id, 1 by"
    ):
        check_disjoint([("a", "Add  two\nnumbers.")], [("b", "add two numbers.")])
    warning = check_disjoint([("a", "x")], [("a", "y")], allow=True)
    assert warning and "--allow-overlap" in warning


def test_deepcoder_default_data_is_a_disjoint_humaneval_split(tmp_path):
    script = [sys.executable, "examples/deepcoder/prepare_data.py", "--out-dir", str(tmp_path)]
    done = subprocess.run(script, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    train, test = _read(tmp_path / "train.jsonl"), _read(tmp_path / "test.jsonl")
    assert (len(train), len(test)) == (113, 51)
    assert {r["id"] for r in train}.isdisjoint(r["id"] for r in test)
    assert {_text(r) for r in train}.isdisjoint(_text(r) for r in test)


def test_deepcoder_refuses_the_same_problems_for_train_and_test_unless_asked(tmp_path):
    script = [
        sys.executable,
        "examples/deepcoder/prepare_data.py",
        "--train",
        "humaneval",
        "--test",
        "humaneval",
    ]
    refused = subprocess.run(
        [*script, "--out-dir", str(tmp_path / "a")], cwd=ROOT, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "would not be held out" in refused.stderr
    assert not (tmp_path / "a").exists()
    allowed = subprocess.run(
        [*script, "--out-dir", str(tmp_path / "b"), "--allow-overlap"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert allowed.returncode == 0 and "164 test problems are also training problems" in allowed.stderr
    assert len(_read(tmp_path / "b" / "train.jsonl")) == 164


def test_math_demonstrations_and_the_held_out_set_are_disjoint_by_id_and_text():
    from agentboost.envs.math_problems import MathEnvironment

    environment = MathEnvironment("products", {"min_digits": 3, "max_digits": 3}, tool="calculator")
    train, test = environment.tasks(4096, split="train"), environment.tasks(256, split="test")
    assert check_disjoint([(t.id, t.prompt) for t in train], [(t.id, t.prompt) for t in test]) is None
