"""How big and how fast the HTML viewer is for thousands of rollouts.

Runs the arithmetic environment with a scripted engine (one calculator call, then the answer; Qwen3
tokenizer and template) for N rollouts, writes the page with `agentboost view`, and opens it in
Debian's Chromium (Playwright) to time the first render of the list and opening one rollout.

    python benchmarks/bench_view.py [--rollouts 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.models.tokenizers import load_qwen3_tokenizer
from agentboost.rollout.results import ResultStore
from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs
from agentboost.view.html import write_report

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=3000)
    args = parser.parse_args()
    tokenizer = load_qwen3_tokenizer()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3 * 4"}}\n</tool_call>',
        "The calculator says 14.\nAnswer: 14",
    ]
    engine = ScriptedEngine(
        [[*tokenizer.encode(t, add_special_tokens=False), end] for t in turns], cycle=True
    )
    environment = ArithmeticEnvironment()
    config = RunConfig(samples=1, concurrency=32, progress=False)
    with tempfile.TemporaryDirectory() as directory:
        results = Path(directory) / "results.jsonl"
        jobs = plan_jobs(environment, environment.tasks(args.rollouts), config)
        with ResultStore(results, fsync=False) as store:
            asyncio.run(run_jobs(jobs, in_process(environment, engine, tokenizer), store, config))
        page = Path(directory) / "report.html"
        started = time.perf_counter()
        write_report([results], page, tokenizer=tokenizer)
        build_s = time.perf_counter() - started
        results_mb = results.stat().st_size / 2**20
        page_mb = page.stat().st_size / 2**20
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            tab = browser.new_page()
            started = time.perf_counter()
            tab.goto(page.as_uri())
            tab.wait_for_selector("#rows tbody tr")
            load_s = time.perf_counter() - started
            started = time.perf_counter()
            tab.click("#rows tbody tr[data-index='0']")
            tab.click("#tabs button[data-tab='tokens']")
            tab.wait_for_selector("#token-stream .tok")
            open_s = time.perf_counter() - started
            started = time.perf_counter()
            tab.fill("#f-task", "-1")
            tab.wait_for_function("document.getElementById('count').textContent.includes('filtered')")
            filter_s = time.perf_counter() - started
            browser.close()
    print(f"rollouts: {args.rollouts}")
    print(f"results JSONL: {results_mb:.1f} MiB; page: {page_mb:.1f} MiB; page written in {build_s:.1f} s")
    print(f"Chromium: list shown {load_s:.2f} s after navigation; a rollout opened in {open_s:.3f} s; ")
    print(f"a task-id filter over every rollout applied in {filter_s:.3f} s")


if __name__ == "__main__":
    main()
