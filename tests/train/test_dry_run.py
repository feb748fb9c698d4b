"""`agentboost train --dry-run` / `sft --dry-run`: the settings, environment, data, model and engine
checked without loading a model or training."""

from __future__ import annotations

from agentboost.cli import main


def test_a_dry_run_checks_the_environment_and_model_and_trains_nothing(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # found, never loaded
    out = tmp_path / "run"
    common = [f"model.name_or_path={model}", f"output_dir={out}", "environment.name=arithmetic"]
    assert main(["train", *common, "environment.train_tasks=8", "eval.tasks=3", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "environment arithmetic: 8 train tasks, 3 held-out tasks" in printed
    assert f"model {model}: {model}" in printed and "engine: embedded" in printed
    assert "dry run: nothing trained" in printed and not out.exists()
    # what a real run would refuse at its start, the dry run refuses too
    assert main(["train", *common, "environment.train_tasks=2", "rollout.tasks_per_step=4", "--dry-run"]) == 2
    assert "gave 2 training tasks but rollout.tasks_per_step is 4" in capsys.readouterr().err
    missing = ["train", f"model.name_or_path={tmp_path / 'nowhere'}", f"output_dir={out}", "--dry-run"]
    assert main(missing) == 2
    assert "no model directory" in capsys.readouterr().err


def test_an_sft_dry_run_checks_its_data_files(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    args = ["sft", f"data.paths=[{data}]", f"output_dir={tmp_path / 'run'}"]
    assert main([*args, "--dry-run"]) == 2
    assert f"data.paths: {data} is not a file" in capsys.readouterr().err
    data.write_text("")
    model = tmp_path / "model"
    model.mkdir()
    assert main([*args, f"model.name_or_path={model}", "--dry-run"]) == 0
    assert f"data {data}: found" in capsys.readouterr().out
