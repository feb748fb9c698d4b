"""Writes the coding row-shape fixtures next to this file: ``python tests/data/coding/make_fixtures.py``.

Every shape holds a stdin/stdout problem (print the sum of two integers) and, where the shape has them,
a function-call problem (return the sum of two integers). The first test of each is public-looking
(``1 2``); the others carry distinctive numbers (``7777777``...) that tests search for in model-visible
text, to prove hidden tests never reach the model.
"""

import base64
import json
import pickle
import zlib
from pathlib import Path

HERE = Path(__file__).parent
STDIO = [("1 2\n", "3\n"), ("7777777 1\n", "7777778\n"), ("-5 8888888\n", "8888883\n")]
CALLS = [([1, 2], 3), ([7777777, 1], 7777778), ([-5, 8888888], 8888883)]
SUM_TEXT = "Read two integers a and b from one line and print a + b."
ADD_TEXT = "Write add(a, b) returning the sum of the integers a and b."


def lcb_blob(value: object) -> str:
    """LiveCodeBench's private-test encoding: JSON text, pickled, zlib-compressed, base64."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(value)))).decode()


def write(name: str, rows: list[dict]) -> None:
    with (HERE / name).open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")


write(
    "deepcoder_taco.jsonl",
    [
        {
            "problem": SUM_TEXT + " (TACO)",
            "tests": json.dumps({"inputs": [i for i, _ in STDIO], "outputs": [o for _, o in STDIO]}),
            "metadata": json.dumps({"time_limit": "2 seconds", "memory_limit": "256 megabytes"}),
        },
        {
            "problem": ADD_TEXT + " (TACO)",
            "tests": json.dumps(
                {"fn_name": "add", "inputs": [a for a, _ in CALLS], "outputs": [[r] for _, r in CALLS]}
            ),
            "metadata": "{}",
        },
    ],
)
write(
    "deepcoder_primeintellect.jsonl",
    [
        {
            "problem": SUM_TEXT + " (PrimeIntellect)",
            "tests": json.dumps([{"type": "stdin_stdout", "input": i, "output": o} for i, o in STDIO]),
            "metadata": "{}",
        },
        {
            "problem": ADD_TEXT + " (PrimeIntellect)",
            "tests": json.dumps(
                [{"type": "function_call", "fn_name": "add", "input": a, "output": r} for a, r in CALLS]
            ),
            "metadata": "{}",
        },
    ],
)
write(
    "deepcoder_lcb.jsonl",
    [
        {
            "problem": SUM_TEXT + " (LiveCodeBench in DeepCoder)",
            "tests": json.dumps([{"input": i, "output": o, "testtype": "stdin"} for i, o in STDIO]),
            "metadata": "{}",
        },
        {
            "problem": ADD_TEXT + " (LiveCodeBench in DeepCoder)",
            "starter_code": "class Solution:\n    def add(self, a: int, b: int) -> int:\n        ",
            "tests": json.dumps(
                [
                    {
                        "input": "\n".join(json.dumps(x) for x in a),
                        "output": json.dumps(r),
                        "testtype": "functional",
                    }
                    for a, r in CALLS
                ]
            ),
            "metadata": json.dumps({"func_name": "add"}),
        },
    ],
)
write(
    "primeintellect_verification_info.jsonl",
    [
        {
            "problem_id": "pi-1",
            "prompt": SUM_TEXT + " (PrimeIntellect verification_info)",
            "verification_info": json.dumps(
                {"test_cases": [{"type": "stdin_stdout", "input": i, "output": o} for i, o in STDIO]}
            ),
        }
    ],
)
write(
    "livecodebench_lite.jsonl",
    [
        {
            "question_id": "lcb-stdin-1",
            "question_title": "Sum",
            "question_content": SUM_TEXT + " (LiveCodeBench lite)",
            "platform": "atcoder",
            "difficulty": "easy",
            "starter_code": "",
            "public_test_cases": json.dumps(
                [{"input": STDIO[0][0], "output": STDIO[0][1], "testtype": "stdin"}]
            ),
            "private_test_cases": json.dumps(
                [{"input": i, "output": o, "testtype": "stdin"} for i, o in STDIO[1:]]
            ),
            "metadata": "{}",
        },
        {
            "question_id": "lcb-functional-1",
            "question_title": "Add",
            "question_content": ADD_TEXT + " (LiveCodeBench lite, encoded private tests)",
            "platform": "leetcode",
            "difficulty": "easy",
            "starter_code": "class Solution:\n    def add(self, a: int, b: int) -> int:\n        ",
            "public_test_cases": json.dumps([{"input": "1\n2", "output": "3", "testtype": "functional"}]),
            "private_test_cases": lcb_blob(
                [
                    {
                        "input": "\n".join(json.dumps(x) for x in a),
                        "output": json.dumps(r),
                        "testtype": "functional",
                    }
                    for a, r in CALLS[1:]
                ]
            ),
            "metadata": json.dumps({"func_name": "add"}),
        },
    ],
)


class Evil:  # a pickle that would run os.system on a plain pickle.loads
    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/agentboost-pwned",))


write(
    "malformed.jsonl",
    [
        {
            "problem": SUM_TEXT + " (good row among bad ones)",
            "tests": json.dumps([{"input": "1 2\n", "output": "3\n"}, {"input": "2 2\n", "output": "4\n"}]),
        },
        {"problem": "no tests at all"},
        {"problem": "tests are not JSON", "tests": "{not json"},
        {
            "problem": "mixed",
            "tests": json.dumps(
                [
                    {"input": "1", "output": "1", "testtype": "stdin"},
                    {"input": "1", "output": "1", "testtype": "functional"},
                ]
            ),
            "metadata": json.dumps({"func_name": "f"}),
        },
        {"problem": "", "tests": json.dumps([{"input": "1", "output": "1"}])},
        {
            "question_id": "evil",
            "question_content": "a pickle with a class in it",
            "public_test_cases": "[]",
            "private_test_cases": base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode(),
            "metadata": "{}",
        },
        {
            "problem": SUM_TEXT + " (good row among bad ones)",
            "tests": json.dumps([{"input": "1 2\n", "output": "3\n"}, {"input": "2 2\n", "output": "4\n"}]),
        },
    ],
)
(HERE / "malformed.jsonl").open("a").write("this line is not JSON\n")
