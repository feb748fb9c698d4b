"""Coding dataset preparation: every row shape becomes a task that grades right, bad rows are reported."""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from agentboost.envs.coding import grading
from agentboost.envs.coding.data import (
    decode_private_tests,
    docstring_examples,
    normalize_row,
    prepare_tasks,
    read_tasks,
    write_tasks,
)
from agentboost.envs.coding.task import CodingTask
from agentboost.errors import ConfigError
from agentboost.sandbox import SandboxLimits, SandboxPool

FIXTURES = Path(__file__).parents[1] / "data" / "coding"
SHAPES = [
    "deepcoder_taco.jsonl",
    "deepcoder_primeintellect.jsonl",
    "deepcoder_lcb.jsonl",
    "primeintellect_verification_info.jsonl",
    "livecodebench_lite.jsonl",
]
GOOD = {
    "stdio": "a, b = map(int, input().split())\nprint(a + b)\n",
    "function": "class Solution:\n    def add(self, a, b):\n        return a + b\n\n"
    "def add(a, b):\n    return a + b\n",
}
BAD = {
    "stdio": "a, b = map(int, input().split())\nprint(a - b)\n",
    "function": "class Solution:\n    def add(self, a, b):\n        return a - b\n\n"
    "def add(a, b):\n    return a - b\n",
}
LIMITS = SandboxLimits(timeout_s=10, memory_mb=512)


def grade_all(tasks: list[CodingTask], programs: dict[str, str], hidden: bool = True) -> list[grading.Grade]:
    async def main() -> list[grading.Grade]:
        async with SandboxPool(size=2, limits=LIMITS) as pool:
            run = grading.run_hidden_tests if hidden else grading.run_public_tests
            return list(await asyncio.gather(*(run(pool, t, programs[t.test_type], LIMITS) for t in tasks)))

    return asyncio.run(main())


@pytest.mark.parametrize("shape", SHAPES)
def test_each_row_shape_round_trips_and_grades_good_and_bad_programs(shape, tmp_path):
    report = prepare_tasks([str(FIXTURES / shape)])
    assert report.malformed == [] and report.tasks
    path = write_tasks(report.tasks, tmp_path / "tasks.jsonl")
    tasks = read_tasks(path)
    assert [t.to_dict() for t in tasks] == [t.to_dict() for t in report.tasks]
    for task in tasks:
        assert len(task.hidden_tests) == 3 and task.public_tests == task.hidden_tests[:1]
        assert task.public_tests[0]["input"] in ("1 2\n", "1\n2")
    good = grade_all(tasks, GOOD)
    assert [(g.status, g.passed, g.total) for g in good] == [("passed", 3, 3)] * len(tasks)
    bad = grade_all(tasks, BAD)
    assert all(g.status == "wrong_output" and not g.all_passed for g in bad)
    public = grade_all(tasks, GOOD, hidden=False)
    assert [(g.status, g.total) for g in public] == [("passed", 1)] * len(tasks)


def test_shapes_keep_their_test_type_and_limits():
    report = prepare_tasks([str(FIXTURES / shape) for shape in SHAPES])
    kinds = {task.source + ":" + task.test_type for task in report.tasks}
    assert "deepcoder_taco:function" in kinds and "livecodebench/leetcode:function" in kinds
    taco = next(t for t in report.tasks if t.source == "deepcoder_taco" and t.test_type == "stdio")
    assert (taco.time_limit_s, taco.memory_mb) == (2.0, 256)
    # TACO wraps a call's return value in a one-element list: unwrapped
    taco_call = next(t for t in report.tasks if t.source == "deepcoder_taco" and t.test_type == "function")
    assert taco_call.hidden_tests[1] == {"input": "7777777\n1", "output": "7777778"}
    lcb = next(t for t in report.tasks if t.id == "lcb-functional-1")
    assert lcb.starter_code.startswith("class Solution") and lcb.fn_name == "add"


def test_malformed_rows_are_counted_with_index_and_reason_and_never_unpickle_classes(tmp_path):
    marker = Path("/tmp/agentboost-pwned")
    marker.unlink(missing_ok=True)
    report = prepare_tasks([str(FIXTURES / "malformed.jsonl")])
    assert len(report.tasks) == 1 and report.duplicates == 1
    reasons = {bad.index: bad.reason for bad in report.malformed}
    assert sorted(reasons) == [1, 2, 3, 4, 5, 7]
    assert "unknown row shape" in reasons[1]
    assert "not valid JSON" in reasons[2]
    assert "mix" in reasons[3]
    assert "no problem text" in reasons[4]
    assert "system" in reasons[5] and "only plain data" in reasons[5]
    assert "not JSON" in reasons[7]
    assert not marker.exists()
    assert "6 malformed rows" in report.summary()


def test_private_test_decoding_admits_only_plain_data():
    tests = [{"input": "1", "output": "2", "testtype": "stdin"}]
    blob = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()
    assert decode_private_tests(blob) == tests
    assert decode_private_tests(json.dumps(tests)) == tests
    for value in [(1, 2), b"bytes", {1, 2}]:
        blob = base64.b64encode(zlib.compress(pickle.dumps(value))).decode()
        with pytest.raises(ConfigError, match=r"only plain data|pickle"):
            decode_private_tests(blob)
    with pytest.raises(ConfigError):
        decode_private_tests("!!! neither json nor base64 !!!")


def test_a_row_without_hidden_tests_is_refused_with_a_reason():
    with pytest.raises(ConfigError, match="no test cases"):
        normalize_row({"problem": "p", "tests": json.dumps({"inputs": [], "outputs": []})}, 0)


def test_hidden_tests_cap_keeps_the_public_tests_and_a_seeded_sample_in_order():
    tests = [{"input": "x" * n, "output": ""} for n in (3, 9, 1, 7, 5)]
    task = CodingTask(id="t", problem="p", test_type="stdio", public_tests=tests[:1], hidden_tests=tests)
    picked = grading.capped_tests(task, 3)
    assert picked[0] == tests[0] and len(picked) == 3 and len({t["input"] for t in picked}) == 3
    others = [tests.index(t) for t in picked[1:]]
    assert others == sorted(others)  # the sample keeps the dataset's order
    assert grading.capped_tests(task, None) == tests and grading.capped_tests(task, 5) == tests


def test_a_row_whose_hidden_tests_are_its_public_ones_is_refused(tmp_path):
    public = json.dumps([{"input": "1", "output": "2", "testtype": "stdin"}])
    row = {"question_content": "double it", "public_test_cases": public, "private_test_cases": "[]"}
    with pytest.raises(ConfigError, match="hidden tests are the public tests"):
        normalize_row(row, 0)
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(row) + "\n")
    report = prepare_tasks([str(path)])
    assert not report.tasks and "hidden tests are the public tests" in report.malformed[0].reason


def test_humaneval_docstring_examples():
    prompt = 'def f(x):\n    """Double.\n    >>> f(2)\n    4\n    >>> f(3) == 6\n    """\n'
    assert docstring_examples(prompt, "f") == [
        {"input": "f(2)", "output": "4"},
        {"input": "f(3)", "output": "6"},
    ]
    arrows = 'def g(s):\n    """\n    g("a") ➞ True\n    g("bb") should return False.\n    """\n'
    assert docstring_examples(arrows, "g") == [
        {"input": 'g("a")', "output": "True"},
        {"input": 'g("bb")', "output": "False"},
    ]


def test_prepare_coding_command_writes_jsonl_and_reports(tmp_path):
    out = tmp_path / "tasks.jsonl"
    command = [sys.executable, "-m", "agentboost.cli", "data", "prepare-coding"]
    done = subprocess.run(
        [
            *command,
            str(FIXTURES / "malformed.jsonl"),
            str(FIXTURES / "deepcoder_taco.jsonl"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "3 coding tasks" in done.stdout
    assert "malformed malformed row 5" in done.stderr and "6 malformed rows" in done.stderr
    assert len(read_tasks(out)) == 3


def test_a_dataset_folder_loads_through_the_hub_loader(tmp_path):
    pytest.importorskip("datasets")
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [json.loads(line) for line in (FIXTURES / "livecodebench_lite.jsonl").read_text().splitlines()]
    (tmp_path / "lcb" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "lcb" / "data" / "test-00000-of-00001.parquet")
    report = prepare_tasks([str(tmp_path / "lcb")], split="test")
    assert report.malformed == [] and [t.id for t in report.tasks] == ["lcb-stdin-1", "lcb-functional-1"]
    assert [(g.status, g.total) for g in grade_all(report.tasks, GOOD)] == [("passed", 3), ("passed", 3)]
