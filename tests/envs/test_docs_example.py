"""The complete environment example in docs/environments.md runs as documented (scripted model)."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

from conftest import run

from agentboost.engines.scripted import ScriptedEngine
from agentboost.tokens.trajectory import TerminationReason

DOC = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def load_example() -> types.ModuleType:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)[1]
    module = types.ModuleType("bank_example")
    exec(compile(code, str(DOC), "exec"), module.__dict__)
    return module


def test_the_documented_bank_environment_runs_a_multi_turn_rollout(qwen_tokenizer, say):
    bank = load_example()
    environment = bank.Bank()
    environment.template = "qwen3"
    task = environment.tasks()[1]  # the customer does not say which account to take it from
    arguments = {"source": "bob", "target": "alice", "amount": 5}
    call = f'<tool_call>\n{{"name": "transfer", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
    engine = ScriptedEngine([say("Which account should I take it from?"), say(call), say("Done.")])
    result = run(environment.run_episode(task, engine, qwen_tokenizer))

    trajectory = result.trajectory
    assert (
        trajectory.termination is TerminationReason.USER_ENDED
        and trajectory.termination_detail == "satisfied"
    )
    assert result.reward == 1.0 and result.reward_breakdown == {"db_match": 1.0}
    assert result.reward_info == {"final_db": {"alice": 105, "bob": 15}}
    assert bank.ACCOUNTS == {"alice": 100, "bob": 20}  # the rollout worked on its own copy
    assert [m["role"] for m in trajectory.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    tool_message = trajectory.messages[5]
    assert tool_message["metadata"] == {"status": "ok"} and "alice has 105" in tool_message["content"]
    assert trajectory.info["tool_calls_seen"] == 1
    user = next(s for s in trajectory.segments if s.role == "user")
    assert "From bob." in qwen_tokenizer.decode(trajectory.token_ids[user.start : user.end])
    assert not any(trajectory.loss_mask[user.start : user.end])
