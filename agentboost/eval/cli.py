"""``agentboost eval``, ``stats`` and ``view``: :func:`register_commands` adds them to the CLI."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from agentboost.cli_args import finite_float
from agentboost.interrupts import run_coroutine
from agentboost.io_safety import add_force_argument, claim_output, refuse_special_file
from agentboost.rollout.spec import RunSpec, add_run_options


def _default_out(spec: RunSpec) -> Path:
    model = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(spec.model.rstrip("/")).name or spec.model).strip("-")
    environment = re.sub(r"[^A-Za-z0-9._-]+", "-", spec.environment).strip("-")
    return Path("runs/eval") / f"{environment}-{model}-{spec.split}.jsonl"


def _is_report_of(path: Path, results: Path) -> bool:
    """Whether ``path`` is the report an earlier ``eval`` wrote for the same results file."""
    from agentboost.eval.evaluate import REPORT_FORMAT

    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(report, dict)
        and report.get("format") == REPORT_FORMAT
        and report.get("results") == str(results)
    )


async def _evaluate(args: argparse.Namespace) -> int:
    from agentboost.eval.evaluate import evaluate_run, summary_text, write_report
    from agentboost.rollout.run import prepare_run

    spec = RunSpec.from_args(args)
    run = await prepare_run(spec, say=lambda line: print(f"agentboost: {line}", file=sys.stderr))
    out = Path(args.out) if args.out else _default_out(spec)
    report_path = claim_output(
        Path(args.report) if args.report else out.with_suffix(".json"),
        option="--report",
        force=args.force,
        inputs=[out],
        ours=lambda existing: _is_report_of(existing, out),
    )
    report, summary = await evaluate_run(
        run,
        out,
        threshold=args.threshold,
        fresh=args.fresh,
        allow_different=args.allow_different_settings,
        progress=not args.quiet,
    )
    write_report(report, report_path)
    print(summary_text(report))
    print(f"({summary.skipped} rollouts resumed from {out}) report -> {report_path}")
    if summary.hint:
        print(summary.hint)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    if args.compare:
        from agentboost.eval.evaluate import compare_text, load_report

        first, second = (load_report(path) for path in args.compare)
        print(compare_text(first, second, (Path(args.compare[0]).stem, Path(args.compare[1]).stem)))
        return 0
    return run_coroutine(_evaluate(args))


def _cmd_stats(args: argparse.Namespace) -> int:
    from agentboost.eval.stats import tool_usage_stats
    from agentboost.rollout.results import read_results

    prefix = Path(args.out) if args.out else Path(args.results[0]).with_suffix(".stats")
    refuse_special_file(prefix, "-o")
    markdown_path, json_path = (
        claim_output(f"{prefix}{suffix}", option="-o", force=args.force, inputs=args.results)
        for suffix in (".md", ".json")
    )
    groups = []
    for position, path in enumerate(args.results):
        groups.append((path, list(read_results(path)), position))
    stats = tool_usage_stats(
        (result for _, results, _ in groups for result in results),
        threshold=args.threshold,
        test_tool=args.test_tool,
    )
    markdown = stats.to_markdown()
    markdown_path.write_text(markdown, encoding="utf-8")
    json_path.write_text(stats.to_json() + "\n", encoding="utf-8")
    print(markdown)
    print(f"-> {prefix}.md, {prefix}.json", file=sys.stderr)
    if args.plot:
        from agentboost.eval.plots import plot_results, step_of

        pngs = plot_results(
            [(step_of(path, position), results) for path, results, position in groups], args.plot
        )
        print("plots -> " + ", ".join(str(png) for png in pngs), file=sys.stderr)
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    from agentboost.view.html import write_report

    out = claim_output(
        args.out or Path(args.results[0]).with_suffix(".html"),
        option="-o",
        force=args.force,
        inputs=args.results,
    )
    count = write_report(
        args.results, out, tokenizer=args.tokenizer, threshold=args.threshold, title=args.title
    )
    print(f"{count} rollouts -> {out}")
    return 0


def _add_eval(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="evaluate a model on an environment: pass@k, pass^k, rewards, tools, tokens, latency",
        description=(
            "Runs tasks x samples rollouts through the resumable runner (RESULTS.jsonl), then writes a "
            "JSON report and prints a summary. --compare A.json B.json prints the difference per metric."
        ),
    )
    evaluate.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="compare two reports")
    add_run_options(evaluate, RunSpec(split="test"))
    evaluate.add_argument(
        "--out", default=None, help="results JSONL, resumed (default: runs/eval/ENV-MODEL-SPLIT.jsonl)"
    )
    evaluate.add_argument("--report", default=None, help="report JSON (default: --out with .json)")
    evaluate.add_argument(
        "--threshold", type=finite_float, default=1.0, help="success = reward >= this (default 1)"
    )
    evaluate.add_argument("--quiet", action="store_true", help="no progress bar")
    add_force_argument(evaluate, "the --report file")
    evaluate.set_defaults(func=_cmd_eval)


def _add_stats(commands: argparse._SubParsersAction) -> None:
    stats = commands.add_parser(
        "stats",
        help="tool-usage statistics of results files (Markdown + JSON tables; --plot for PNGs)",
        description=(
            "Tables: terminations, tool calls and statuses, calls per rollout, parse errors, and for "
            "coding environments submissions/testing, test-tool statuses and first failures. Several "
            "files (e.g. a training run's rollouts/step_*.jsonl) are pooled; --plot draws reward by step."
        ),
    )
    stats.add_argument("results", nargs="+", help="results JSONL file(s)")
    stats.add_argument("-o", "--out", default=None, help="output prefix: writes PREFIX.md and PREFIX.json")
    stats.add_argument(
        "--threshold", type=finite_float, default=1.0, help="success = reward >= this (default 1)"
    )
    stats.add_argument(
        "--test-tool", default=None, help="coding: the test tool (default: tools recording a status)"
    )
    stats.add_argument("--plot", default=None, metavar="DIR", help="also write PNG plots into DIR")
    add_force_argument(stats, "PREFIX.md and PREFIX.json")
    stats.set_defaults(func=_cmd_stats)


def _add_view(commands: argparse._SubParsersAction) -> None:
    view = commands.add_parser(
        "view",
        help="write a self-contained HTML report of results: list, conversations, tokens, statistics",
    )
    view.add_argument("results", nargs="+", help="results JSONL file(s)")
    view.add_argument("-o", "--out", default=None, help="HTML file (default: RESULTS.html)")
    view.add_argument(
        "--tokenizer",
        default=None,
        help="model id or directory whose tokenizer shows token text (default: the results' model, else ids)",
    )
    view.add_argument(
        "--threshold", type=finite_float, default=1.0, help="success = reward >= this (default 1)"
    )
    view.add_argument("--title", default=None, help="page title")
    add_force_argument(view)
    view.set_defaults(func=_cmd_view)


def register_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``eval``, ``stats`` and ``view`` to the ``agentboost`` command's subparsers."""
    _add_eval(commands)
    _add_stats(commands)
    _add_view(commands)
