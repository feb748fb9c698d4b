"""The results file: identified before it is touched, every resumed line validated, failures redone."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from conftest import run

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.errors import ConfigError, EngineError, UserPathError
from agentboost.rollout.results import ResultStore, drop_results, read_header, read_results
from agentboost.rollout.runner import RunConfig, in_process, iter_jobs, plan_jobs, plan_keys, run_jobs
from agentboost.tokens.trajectory import TerminationReason

IDENTITY = {
    "environment": "arithmetic",
    "model": "m",
    "sampling": {"temperature": 0.7, "top_p": 1.0},
    "limits": {"max_turns": 4},
    "tasks": 3,
    "samples": 2,
}


def fill(path, qwen_tokenizer, say, *, identity=IDENTITY, engine=None, n=3, samples=2, **store_options):
    environment = ArithmeticEnvironment()
    config = RunConfig(samples=samples, progress=False, retries=0)
    tasks = environment.tasks(n)
    engine = engine or ScriptedEngine([say("Answer: 7")], cycle=True)
    with ResultStore(
        path, identity=identity, plan=plan_keys(environment, tasks, config), **store_options
    ) as store:
        summary = run(
            run_jobs(
                plan_jobs(environment, tasks, config),
                in_process(environment, engine, qwen_tokenizer),
                store,
                config,
            )
        )
    return summary


def test_a_new_file_starts_with_a_header_that_names_the_run(qwen_tokenizer, say, tmp_path):
    path = tmp_path / "r.jsonl"
    fill(path, qwen_tokenizer, say)
    header = json.loads(path.read_text().splitlines()[0])
    assert header["format"] == "agentboost.results" and header["version"] == 1
    assert header["run"] == IDENTITY and read_header(path) == header
    assert len(list(read_results(path))) == 6  # the header is not a result


def test_a_resume_with_other_settings_is_refused_listing_them_or_allowed_when_asked(
    qwen_tokenizer, say, tmp_path
):
    path = tmp_path / "r.jsonl"
    fill(path, qwen_tokenizer, say)
    before = path.read_bytes()
    changed = {**IDENTITY, "model": "other", "sampling": {"temperature": 0.9, "top_p": 1.0}, "samples": 4}
    with pytest.raises(ConfigError) as refused:
        ResultStore(path, identity=changed)
    message = str(refused.value)
    assert 'model: "m" -> "other"' in message and "sampling.temperature: 0.7 -> 0.9" in message
    assert "samples" not in message  # more samples is a legitimate way to extend a run
    assert path.read_bytes() == before
    with ResultStore(path, identity=changed, allow_different=True) as store:
        assert len(store.done) == 6 and any("model" in d for d in store.differences)


@pytest.mark.parametrize(
    "content",
    [
        b"my notes\nsecond line without newline",
        b"\x00\x01binary\xff\n" * 1000,
        b'{"some": "json"}\n',
        b"x" * (2 << 20),  # no newline in the first MiB
    ],
    ids=["text", "binary", "other-json", "huge-line"],
)
def test_a_file_that_is_not_a_results_file_is_refused_untouched(tmp_path, content):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    for resume in (True, False):  # --fresh must not destroy it either
        with pytest.raises(ConfigError, match="not an agentboost results file, so it was left untouched"):
            ResultStore(path, identity=IDENTITY, resume=resume)
        assert path.read_bytes() == content


def test_devices_and_directories_are_refused_without_reading_them(tmp_path):
    with pytest.raises(ConfigError, match="not a regular file"):
        ResultStore("/dev/full")
    with pytest.raises(ConfigError, match="is a directory"):
        ResultStore(tmp_path)


def test_every_resumed_line_is_validated(qwen_tokenizer, say, tmp_path):
    path = tmp_path / "r.jsonl"
    fill(path, qwen_tokenizer, say)
    header, *lines = path.read_text().splitlines()
    environment = ArithmeticEnvironment()
    plan = plan_keys(environment, environment.tasks(3), RunConfig(samples=2))

    def store_with(*body: str):
        path.write_text("\n".join([header, *body]) + "\n")
        return ResultStore(path, identity=IDENTITY, plan=plan, environment_name="arithmetic")

    with pytest.raises(ConfigError, match=r"r.jsonl:3 repeats task 'arith-d1-s0-0' sample 0.*line 2"):
        store_with(lines[0], lines[0])
    without = json.loads(lines[0])
    del without["trajectory"]
    with pytest.raises(ConfigError, match=r"r.jsonl:2 is not a rollout result"):
        store_with(json.dumps(without))
    foreign = json.loads(lines[0])
    foreign["trajectory"]["info"]["environment"] = "chess"
    with pytest.raises(ConfigError, match="environment 'chess', not 'arithmetic'"):
        store_with(json.dumps(foreign))
    stranger = json.loads(lines[0])
    stranger["task_id"] = stranger["trajectory"]["task_id"] = "someone-else-0"
    with pytest.raises(ConfigError, match="task 'someone-else-0' is not one of this run's tasks"):
        store_with(json.dumps(stranger))
    with pytest.raises(ConfigError, match="second header"):
        store_with(lines[0], header)
    with pytest.raises(ConfigError, match=r"r.jsonl:3 is not valid JSON"):
        store_with(lines[0], "{oops", lines[1])
    with store_with(*lines) as store:
        assert len(store.done) == 6


def test_failed_rollouts_are_kept_and_run_again_on_resume(qwen_tokenizer, say, tmp_path):
    def broken(prompt, index):
        raise EngineError("the server is down")

    path = tmp_path / "r.jsonl"
    first = fill(path, qwen_tokenizer, say, engine=ScriptedEngine(broken))
    assert (
        first.failed == 6
        and "engine_error: " in first.first_failure
        and "the server is down" in first.first_failure
    )
    second = fill(path, qwen_tokenizer, say)
    assert second.skipped == 0 and second.completed == 6 and second.failed == 0
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + 6 + 6  # the failed attempts stay in the file for inspection
    results = list(read_results(path))  # ... but a reader sees each pair once: its last line
    assert len(results) == 6 and all(r.termination is TerminationReason.COMPLETED for r in results)
    third = fill(path, qwen_tokenizer, say)
    assert third.skipped == 6 and third.completed == 0


def test_failed_rollouts_count_as_done_when_asked(qwen_tokenizer, say, tmp_path):
    def broken(prompt, index):
        raise EngineError("down")

    path = tmp_path / "r.jsonl"
    fill(path, qwen_tokenizer, say, engine=ScriptedEngine(broken))
    again = fill(path, qwen_tokenizer, say, redo_failed=False)
    assert again.skipped == 6 and again.completed == 0


def test_a_full_disk_ends_the_run_with_one_error_naming_the_file(qwen_tokenizer, say, tmp_path):
    import resource
    import signal

    path = tmp_path / "r.jsonl"
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    ResultStore(path, identity=IDENTITY).close()
    resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 100, limits[1]))
    try:
        with pytest.raises(UserPathError, match=f"cannot write results to {path}: File too large"):
            fill(path, qwen_tokenizer, say)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert list(read_results(path)) == []  # the torn line is skipped; the header is intact


def test_the_runner_holds_at_most_concurrency_jobs_and_writes_off_the_event_loop(
    qwen_tokenizer, say, tmp_path
):
    environment = ArithmeticEnvironment()
    config = RunConfig(samples=5, concurrency=3, progress=False)
    tasks = environment.tasks(20)
    taken = {"jobs": 0, "most_in_hand": 0}
    written_on: set[str] = set()

    class Recording(ResultStore):
        def write(self, result):
            written_on.add(threading.current_thread().name)
            super().write(result)
            taken["written"] = taken.get("written", 0) + 1

    def lazily():
        for job in iter_jobs(environment, tasks, config):
            taken["jobs"] += 1
            in_hand = taken["jobs"] - taken.get("written", 0)
            taken["most_in_hand"] = max(taken["most_in_hand"], in_hand)
            yield job

    execute = in_process(environment, ScriptedEngine([say("Answer: 7")], cycle=True), qwen_tokenizer)

    async def main():
        loop_thread = threading.current_thread().name
        with Recording(tmp_path / "r.jsonl") as store:
            summary = await run_jobs(lazily(), execute, store, config, total=100)
        return summary, loop_thread

    summary, loop_thread = asyncio.run(main())
    assert summary.completed == 100 and taken["jobs"] == 100
    assert taken["most_in_hand"] <= config.concurrency
    assert written_on and loop_thread not in written_on


def test_run_config_rejects_counts_that_would_hang_or_do_nothing():
    for bad in ({"concurrency": 0}, {"concurrency": -1}, {"samples": 0}, {"retries": -1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            RunConfig(**bad)


def test_an_unreadable_results_file_is_one_error(tmp_path):
    with pytest.raises(UserPathError, match=r"cannot read .*missing.jsonl: No such file"):
        list(read_results(tmp_path / "missing.jsonl"))


def test_dropping_results_rewrites_the_file_without_them_and_resumes_the_rest(qwen_tokenizer, say, tmp_path):
    path = tmp_path / "r.jsonl"
    fill(path, qwen_tokenizer, say)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines) + b'{"task_id": "torn')  # a killed writer's last line
    assert drop_results(path, lambda result: result.sample == 1) == 3
    kept = path.read_bytes().splitlines(keepends=True)
    assert kept == [lines[0], *(line for line in lines[1:] if b'"sample": 0' in line)]  # bytes as they were
    assert drop_results(path, lambda result: False) == 0 and path.read_bytes() == b"".join(kept)
    engine = ScriptedEngine([say("Answer: 7")], cycle=True)
    fill(path, qwen_tokenizer, say, engine=engine)  # the dropped ones are run again, the rest resumed
    assert engine.calls == 3 and sorted((r.task_id, r.sample) for r in read_results(path)) == sorted(
        (task.id, sample) for task in ArithmeticEnvironment().tasks(3) for sample in (0, 1)
    )
    notes = tmp_path / "notes.txt"
    notes.write_text("not results\n")
    with pytest.raises(ConfigError, match="not an agentboost results file"):
        drop_results(notes, lambda result: True)
    assert notes.read_text() == "not results\n"
