"""The verifiers side of ``--env verifiers:...``: run by the Python of a virtual environment that has
``verifiers`` installed, never imported by agentboost (verifiers pins ``mcp<2``; agentboost needs 2.x).

    python verifiers_bridge.py tasks ENVIRONMENT ENV_ARGS_JSON SPLIT      # one JSON row per line
    python verifiers_bridge.py rollout ENVIRONMENT ENV_ARGS_JSON          # one rollout, scored

ENVIRONMENT is an importable module or a ``.py`` file defining ``load_environment(**env_args)``. A
rollout reads its row from ``AGENTBOOST_TASK`` (the task's ``metadata.verifiers_row``) and talks to
``OPENAI_BASE_URL`` with ``OPENAI_API_KEY`` (agentboost's gateway session); its last stdout line is
``{"reward", "metrics", "is_truncated", "stop_condition"}``. Only the standard library and verifiers
are used here.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import sys

MODEL = "policy"
"""The model name sent to the gateway (it serves one policy, whatever the name)."""


def load(reference: str, env_args: dict) -> object:
    if reference.endswith(".py"):
        spec = importlib.util.spec_from_file_location("verifiers_environment", reference)
        if spec is None or spec.loader is None:
            raise SystemExit(f"cannot load {reference}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(reference)
    if not hasattr(module, "load_environment"):
        raise SystemExit(f"{reference} defines no load_environment(**env_args)")
    return module.load_environment(**env_args)


def tasks(environment, split: str) -> None:
    dataset = environment.get_eval_dataset() if split == "test" else environment.get_dataset()
    for index, row in enumerate(dataset):
        record = {key: row[key] for key in ("prompt", "answer", "info", "task") if key in row}
        record["example_id"] = row.get("example_id", index)
        print(json.dumps(record, default=str))


async def rollout(environment) -> None:
    from verifiers.types import ClientConfig

    row = json.loads(os.environ["AGENTBOOST_TASK"])["metadata"]["verifiers_row"]
    client = ClientConfig(
        client_type="openai_chat_completions",
        api_key_var="OPENAI_API_KEY",
        api_base_url=os.environ["OPENAI_BASE_URL"],
        max_retries=0,  # agentboost's engine retries; a refused request is an answer, not a blip
    )
    output = await environment.run_rollout(row, client, MODEL, {})
    if output.get("error"):
        raise SystemExit(f"the verifiers rollout failed: {output['error']}")
    result = {
        "reward": output.get("reward"),
        "metrics": output.get("metrics") or {},
        "is_truncated": bool(output.get("is_truncated")),
        "stop_condition": output.get("stop_condition"),
    }
    print(json.dumps(result, default=str))


def main() -> None:
    command, reference, env_args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    environment = load(reference, env_args)
    if command == "tasks":
        tasks(environment, sys.argv[4])
    else:
        asyncio.run(rollout(environment))


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # this folder is agentboost's, not the verifiers environment's
    sys.path.insert(0, os.getcwd())  # as `python -m` does: an environment module in the working directory
    main()
