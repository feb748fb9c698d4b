"""``--env math``: verifiable math problems from reasoning-gym (or AIME-style rows), with a computation tool.

Tasks come from `reasoning-gym <https://pypi.org/project/reasoning-gym/>`_ generators, offline and
deterministic for a seed: one generator (``generators="products"``) or a weighted mix
(``generators={"products": 3, "gcd": 1}``), each with its own difficulty settings (``config``, the
generator's config fields, e.g. ``{"products": {"min_digits": 3, "max_digits": 3}}``). Rows of a file
with ``problem`` and ``answer`` (AIME format, JSONL/JSON/parquet) can be used instead (``data_file``;
``test_file`` for the held-out split, which otherwise reads the same file).

The model ends its reply with a line ``Answer: <answer>``; :func:`extract_answer` takes what follows
the last such marker (or the last ``\\boxed{}`` when there is no marker) and nothing else: no "last
number in the text" fallback, which would pay answers that ignore the format. The reward is the
generator's own ``score_answer`` on that text, thresholded to 0/1 (``threshold=1.0``, the default)
because several scorers give partial credit (0.01) to any wrong but well-formed answer; set
``threshold=None`` for the raw score. File rows are scored by exact match (as integers when both
parse, else as normalised text).

The reward is total over model output: whatever the model writes scores a number in [0, 1], never
an error. Some reasoning-gym scorers raise on malformed answers (``prime_factorization`` runs
``int()`` on each factor, so ``Answer: 7 or 5`` raises ValueError); such an answer scores 0, as does a
scorer result that is not a finite number. A rollout the policy cannot get unscored is the point:
an unscored rollout would be excluded from the averages and pay a policy for writing garbage.

Tools (``tool``): ``python`` runs model-written code in :mod:`agentboost.sandbox` (one
:class:`~agentboost.sandbox.pool.SandboxPool` per process and event loop, created lazily and closed
when that loop ends); ``calculator`` is the safe expression evaluator (no processes at all, the
cheapest on a laptop); ``none`` gives no tool.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from strands import tool

from agentboost.agent.limits import RolloutLimits
from agentboost.envs.arithmetic import answer_verdict
from agentboost.envs.base import Environment, Episode, Reward, Task
from agentboost.envs.calculator import CalculatorError, evaluate, format_number
from agentboost.errors import ConfigError
from agentboost.tokens.trajectory import Trajectory

SUPPORTED_GENERATORS = (
    "products",
    "basic_arithmetic",
    "chain_sum",
    "gcd",
    "lcm",
    "decimal_arithmetic",
    "fraction_simplification",
    "prime_factorization",
    "power_function",
    "leg_counting",
)
"""Generators whose scorer is tested against their gold answers (other reasoning-gym names also work)."""

TOOL_HINTS = {
    "python": "Use the python tool for every calculation: it runs a program and shows what it prints.",
    "calculator": "Use the calculator tool for every calculation.",
    "none": "",
}

SYSTEM_PROMPT = "You solve math problems. {hint}Finish with a last line of the form\nAnswer: <answer>"

_SPLIT_OFFSETS = {"train": 0, "test": 1_000_003, "validation": 2_000_006}
_OVERLAP_GUARD = 4096
"""Held-out problems whose question is among the first this many training problems are skipped."""


# --- answers -------------------------------------------------------------------------------------

_ANSWER_LINE = re.compile(r"\banswer(?:\*\*)?\s*:(?P<rest>[^\n]*)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{(?P<inside>(?:[^{}]|\{[^{}]*\})*)\}")


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``: what follows the last ``Answer:`` on its line, else the last
    ``\\boxed{...}``; None when there is neither or it is empty.

    Bold markers, a ``\\boxed{}`` around the value, ``$`` delimiters and a final full stop are removed.
    """
    markers = list(_ANSWER_LINE.finditer(text))
    if markers:
        candidate = markers[-1]["rest"]
    else:
        boxes = list(_BOXED.finditer(text))
        if not boxes:
            return None
        candidate = boxes[-1]["inside"]
    candidate = candidate.strip().strip("*").strip()
    boxed = _BOXED.fullmatch(candidate)
    if boxed:
        candidate = boxed["inside"].strip()
    if candidate.endswith(".") and not candidate[:-1].rstrip().endswith("."):
        candidate = candidate[:-1].rstrip()
    if len(candidate) >= 2 and candidate.startswith("$") and candidate.endswith("$"):
        inner = candidate.strip("$").strip()
        candidate = inner if "$" not in inner else candidate
    return candidate or None


def exact_match(answer: str, gold: Any) -> float:
    """1.0 when ``answer`` equals ``gold``: as integers when both parse (``1,000`` = 1000), else as text."""

    def as_int(value: str) -> str | None:  # canonical digits, not int(): no 4300-digit limit
        match = re.fullmatch(r"([-+]?)0*(\d+)", value.replace(",", "").strip(), re.ASCII)
        if match is None:
            return None
        sign = "-" if match[1] == "-" and match[2].strip("0") else ""
        return sign + (match[2].lstrip("0") or "0")

    left, right = as_int(answer), as_int(str(gold))
    if left is not None and right is not None:
        return float(left == right)
    return float(answer.strip().lower() == str(gold).strip().lower())


# --- tools ---------------------------------------------------------------------------------------


@tool(name="calculator")
def short_calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 123 * 456.

    Args:
        expression: The expression, e.g. (12 + 5) * 3.
    """
    try:
        return format_number(evaluate(expression))
    except CalculatorError as error:
        return f"error: {error}"


class _LoopPools:
    """One SandboxPool per event loop of this process, started on first use and closed with its loop."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._pools: dict[int, Any] = {}
        self._keepers: dict[int, Any] = {}

    async def get(self) -> Any:
        from agentboost.sandbox.pool import SandboxPool

        loop = asyncio.get_running_loop()
        key = id(loop)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = SandboxPool(size=self.size)
            keeper = self._keep(pool, key)
            await keeper.__anext__()  # asyncio.run() closes async generators before the loop: see _keep
            self._keepers[key] = keeper
        return pool

    async def _keep(self, pool: Any, key: int) -> AsyncIterator[None]:
        try:
            yield
        finally:
            self._pools.pop(key, None)
            self._keepers.pop(key, None)
            await pool.close()


def _python_tool(pools: _LoopPools) -> Any:
    from agentboost.sandbox.tool import format_report

    @tool(name="python")
    async def python(code: str) -> str:
        """Run a Python program and return what it prints.

        Args:
            code: The program, e.g. print(123 * 456).
        """
        pool = await pools.get()
        return format_report(await pool.run_python(code), 1000)

    return python


# --- the environment -----------------------------------------------------------------------------


class MathEnvironment(Environment):
    """reasoning-gym problems (or AIME-style file rows), a computation tool, the generator's own scorer."""

    name = "math"
    limits = RolloutLimits(max_turns=4, max_new_tokens=256)

    def __init__(
        self,
        generators: str | Mapping[str, float] = "products",
        config: Mapping[str, Any] | None = None,
        *,
        data_file: str | None = None,
        test_file: str | None = None,
        tool: str = "python",
        threshold: float | None = 1.0,
        sandbox_workers: int = 2,
    ) -> None:
        if tool not in TOOL_HINTS:
            raise ConfigError(f"tool must be one of {', '.join(TOOL_HINTS)}; got {tool!r}")
        if isinstance(generators, str):
            weights = {name.strip(): 1.0 for name in generators.split(",") if name.strip()}
        else:
            weights = {str(name): float(weight) for name, weight in generators.items()}
        if data_file is None and (not weights or any(w <= 0 for w in weights.values())):
            raise ConfigError("generators must name at least one reasoning-gym generator with weight > 0")
        self.weights = weights
        self.configs = _per_generator_config(config or {}, list(weights))
        self.data_file = data_file
        self.tool = tool
        self.threshold = threshold
        self.test_file = test_file
        self._rows: dict[str | None, list[dict[str, Any]]] = {}
        self._pools = _LoopPools(sandbox_workers)
        self.system_prompt = SYSTEM_PROMPT.format(hint=TOOL_HINTS[tool] + " " if TOOL_HINTS[tool] else "")
        if data_file is None:
            for name in weights:
                _dataset(name, self.configs.get(name, {}), seed=0, size=1)  # fail now on a bad name/config

    # --- tasks -----------------------------------------------------------------------------------

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        if split not in _SPLIT_OFFSETS:
            raise ConfigError(f"unknown split {split!r}; use train, test or validation")
        count = 64 if n is None else n
        if self.data_file is not None:
            return self._file_tasks(count, seed=seed, split=split)
        tasks = self._generate(count, seed=seed + _SPLIT_OFFSETS[split], split=split)
        if split != "train":
            seen = {task.prompt for task in self._generate(_OVERLAP_GUARD, seed=seed, split="train")}
            tasks = [task for task in tasks if task.prompt not in seen]
            extra = 1
            while len(tasks) < count:  # replace the overlapping ones, deterministically
                more = self._generate(count + extra, seed=seed + _SPLIT_OFFSETS[split], split=split)[-1]
                if more.prompt not in seen:
                    tasks.append(more)
                extra += 1
        return tasks

    def _generate(self, count: int, *, seed: int, split: str) -> list[Task]:
        rng = random.Random(f"math:{seed}")
        names = list(self.weights)
        picks = rng.choices(names, weights=[self.weights[n] for n in names], k=count)
        entries: dict[str, list[dict[str, Any]]] = {}
        for name in names:
            needed = picks.count(name)
            if needed:
                dataset = _dataset(name, self.configs.get(name, {}), seed=seed, size=needed)
                entries[name] = [dataset[i] for i in range(needed)]
        tasks, used = [], dict.fromkeys(names, 0)
        for index, name in enumerate(picks):
            entry = entries[name][used[name]]
            used[name] += 1
            tasks.append(
                Task(
                    id=f"math-{name}-{split}-s{seed}-{index}",
                    prompt=entry["question"],
                    ground_truth=str(entry["answer"]),
                    metadata={"generator": name, "entry": json.loads(json.dumps(entry, default=list))},
                )
            )
        return tasks

    def _file_tasks(self, count: int, *, seed: int, split: str) -> list[Task]:
        path = self.test_file if split != "train" and self.test_file is not None else self.data_file
        if path not in self._rows:
            self._rows[path] = load_problem_rows(Path(str(path)))
        rows = self._rows[path]
        order = list(range(len(rows)))
        random.Random(f"math-file:{seed}").shuffle(order)
        return [
            Task(
                id=str(rows[i].get("id", f"row-{i}")),
                prompt=str(rows[i]["problem"]),
                ground_truth=str(rows[i]["answer"]),
            )
            for i in order[:count]
        ]

    def tools(self, episode: Episode) -> list[Any]:
        if self.tool == "python":
            return [_python_tool(self._pools)]
        if self.tool == "calculator":
            return [short_calculator]
        return []

    # --- reward ----------------------------------------------------------------------------------

    def score_answer(self, answer: str | None, task: Task) -> float:
        """The raw score of an extracted answer: the generator's scorer, or exact match for file rows."""
        if answer is None:
            return 0.0
        entry = task.metadata.get("entry")
        if entry is None:
            return exact_match(answer, task.ground_truth)
        import reasoning_gym

        scorer = reasoning_gym.get_score_answer_fn(task.metadata["generator"])
        try:
            value = float(scorer(answer, entry))
        except Exception:  # a scorer that raises on a malformed answer: the answer is wrong (see above)
            return 0.0
        return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0

    def answer_reward(self, answer: str | None, task: Task) -> float:
        """The reward of an extracted answer: its raw score, thresholded unless ``threshold`` is None."""
        raw = self.score_answer(answer, task)
        if self.threshold is None:
            return raw
        return 1.0 if raw >= self.threshold else 0.0

    def reward(self, trajectory: Trajectory, episode: Episode) -> Reward:
        found = extract_answer(trajectory.final_text)
        return answer_verdict(self.answer_reward(found, episode.task), found, episode.task.ground_truth)


def _per_generator_config(config: Mapping[str, Any], names: list[str]) -> dict[str, dict[str, Any]]:
    """``{"products": {...}}`` as given, or one flat dict applied to a single generator."""
    if (
        config
        and all(key in names for key in config)
        and all(isinstance(v, Mapping) for v in config.values())
    ):
        return {name: dict(value) for name, value in config.items()}
    if len(names) != 1:
        raise ConfigError(
            "with several generators, config must map generator names to their settings, "
            'e.g. {"products": {"min_digits": 3}}'
        )
    return {names[0]: dict(config)}


def _dataset(name: str, config: Mapping[str, Any], *, seed: int, size: int) -> Any:
    try:
        import reasoning_gym
    except ImportError as error:
        raise ConfigError(
            "the math environment needs reasoning-gym: pip install 'agentboost[math]'"
        ) from error
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **dict(config))
    except (ValueError, TypeError, AssertionError) as error:
        raise ConfigError(
            f"reasoning-gym generator {name!r} with settings {dict(config)}: {error}"
        ) from error


def load_problem_rows(path: Path) -> list[dict[str, Any]]:
    """Rows with ``problem`` and ``answer`` from JSONL, a JSON list, or parquet (AIME format)."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as parquet

            rows = parquet.read_table(path).to_pylist()
        elif path.suffix == ".json":
            rows = json.loads(path.read_text(encoding="utf-8"))
        else:
            rows = [
                json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
            ]
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read problems from {path}: {error}") from error
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{path} holds no problem rows")
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict) or "problem" not in row or "answer" not in row:
            raise ConfigError(f"{path} row {number} needs 'problem' and 'answer' (AIME format)")
    return rows
