"""A user's files are never damaged: the real `agentboost` command in a subprocess (docs/errors.md).

No output option writes over a file it did not create unless `--force`; an output that is also an
input is refused even then; devices are refused; a refused results file is left byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_qwen3
from results_support import scripted_results

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def agentboost(*args, cwd, timeout=300):
    pythonpath = os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "agentboost.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1"},
    )


def one_error(result, status=2) -> str:
    assert result.returncode == status, (result.returncode, result.stdout[-1000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, result.stderr
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def results(qwen_tokenizer, tmp_path_factory) -> Path:
    return scripted_results(qwen_tokenizer, tmp_path_factory.mktemp("results") / "r.jsonl")


@pytest.fixture
def workdir(results, tmp_path) -> Path:
    (tmp_path / "r.jsonl").write_bytes(results.read_bytes())
    (tmp_path / "notes.txt").write_text("my notes\n")
    return tmp_path


def test_export_into_its_own_input_is_refused_even_with_force(workdir):
    before = digest(workdir / "r.jsonl")
    for extra in ([], ["--force"]):
        error = one_error(agentboost("export", "r.jsonl", "-o", "r.jsonl", *extra, cwd=workdir))
        assert "-o r.jsonl is also an input of this command" in error
        assert digest(workdir / "r.jsonl") == before


OUTPUTS = {
    "view": ["view", "r.jsonl", "-o", "notes.txt"],
    "export": ["export", "r.jsonl", "-o", "notes.txt"],
    "export parquet": ["export", "r.jsonl", "-o", "notes.txt", "--format", "parquet"],
    "stats": ["stats", "r.jsonl", "-o", "notes"],
    "eval --report": ["eval", "--report", "notes.txt"],
    "data to-verl": ["data", "to-verl", "-n", "2", "--out", "notes.txt"],
    "data prepare-coding": ["data", "prepare-coding", "humaneval", "--limit", "1", "--out", "notes.txt"],
}


@pytest.mark.parametrize("name", OUTPUTS)
def test_no_output_option_replaces_a_file_it_did_not_create_without_force(workdir, name):
    command = OUTPUTS[name]
    target = workdir / ("notes.md" if name == "stats" else "notes.txt")
    target.write_text("my notes\n")
    error = one_error(agentboost(*command, cwd=workdir))
    assert "exists, so it was left untouched; pass --force to replace it" in error
    assert target.read_text() == "my notes\n"


@pytest.mark.parametrize("name", ["view", "export", "stats", "data to-verl", "data prepare-coding"])
def test_force_replaces_the_file(workdir, name):
    command = OUTPUTS[name]
    if name == "data to-verl":
        command = ["data", "to-verl", "-n", "2", "--out", "notes.parquet"]
        (workdir / "notes.parquet").write_text("my notes\n")
    target = workdir / ("notes.md" if name == "stats" else command[-1])
    target.write_text("my notes\n")
    done = agentboost(*command, "--force", cwd=workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert target.read_bytes() != b"my notes\n"


def test_devices_are_refused_as_outputs(workdir):
    for command in (["stats", "r.jsonl", "-o", "/dev/full"], ["view", "r.jsonl", "-o", "/dev/full"]):
        error = one_error(agentboost(*command, cwd=workdir))
        assert "/dev/full is not a regular file" in error
    assert not Path("/dev/full.md").exists() and not Path("/dev/full.json").exists()


def test_eval_replaces_the_report_it_wrote_for_the_same_results_but_no_other(workdir):
    """The report of an eval is its own file: a resumed eval rewrites it; another run's is refused."""
    from agentboost.eval.evaluate import REPORT_FORMAT

    (workdir / "base.json").write_text(json.dumps({"format": REPORT_FORMAT, "results": "other.jsonl"}))
    error = one_error(agentboost("eval", "--out", "base.jsonl", "-n", "1", cwd=workdir))
    assert "--report base.json exists" in error


def test_a_refused_resume_leaves_the_file_byte_identical(workdir):
    """Results followed by junk with newlines: the resume is refused and nothing is cut."""
    path = workdir / "r.jsonl"
    path.write_bytes(path.read_bytes() + b"\x00\xff garbage\n\x13\x37 more" + bytes(range(256)))
    before = digest(path)
    error = one_error(
        agentboost(
            "rollout",
            "--env",
            "results_support:ToolEnvironment",
            "--out",
            "r.jsonl",
            "--allow-different-settings",
            cwd=workdir,
        )
    )
    assert "r.jsonl:" in error
    assert digest(path) == before


def test_sft_trains_on_a_results_file_with_its_header(workdir, qwen_tokenizer):
    """The rejection-sampling flow: `rollout` / `eval` results straight into `sft --data`."""
    model = workdir / "tiny"
    tiny_qwen3(seed=0, hidden=64).save_pretrained(model)
    qwen_tokenizer.save_pretrained(model)
    assert json.loads((workdir / "r.jsonl").read_text().splitlines()[0])["format"] == "agentboost.results"
    done = agentboost(
        "sft",
        "--data",
        "r.jsonl",
        f"model.name_or_path={model}",
        "data.min_reward=1.0",
        "steps=1",
        "batch_size=2",
        "logging.progress=false",
        "checkpoint.save_final_model=false",
        "output_dir=run",
        cwd=workdir,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_sft_on_binary_data_is_one_line(workdir):
    (workdir / "junk.jsonl").write_bytes(bytes(range(256)) * 4)
    error = one_error(agentboost("sft", "--data", "junk.jsonl", cwd=workdir))
    assert "junk.jsonl:1 is not JSON" in error


def _drop_to_nobody():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def _unprivileged():
    """How to run the command so that permissions bind (as root every check passes): as nobody
    (65534) when nobody can run this Python, else as root without the capabilities that bypass file
    permissions (setpriv); None where neither is possible."""
    if os.geteuid() != 0:
        return {}
    try:
        probe = subprocess.run([sys.executable, "-c", "pass"], preexec_fn=_drop_to_nobody, timeout=60)
        if probe.returncode == 0:
            return {"preexec_fn": _drop_to_nobody}
    except OSError:
        pass  # e.g. the interpreter lives under /root, which nobody cannot enter
    if shutil.which("setpriv"):
        drop = "-dac_override,-dac_read_search"
        return {"prefix": ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}"]}
    return None


@pytest.mark.parametrize(
    "command",
    [
        ["export", "r.jsonl", "--format", "parquet", "-o", "locked/out.parquet"],
        ["data", "to-verl", "-n", "2", "--out", "locked/out.parquet"],
    ],
    ids=["export", "to-verl"],
)
def test_parquet_into_a_read_only_directory_is_one_line_as_an_unprivileged_user(results, command):
    import tempfile

    how = _unprivileged()
    if how is None:
        pytest.skip("running as root with no way to drop privileges (no nobody-readable Python, no setpriv)")
    with tempfile.TemporaryDirectory() as directory:  # /tmp, not pytest's root-only folder
        workdir = Path(directory)
        workdir.chmod(0o755)
        (workdir / "r.jsonl").write_bytes(results.read_bytes())
        (workdir / "r.jsonl").chmod(0o644)
        (workdir / "locked").mkdir(mode=0o555)  # owned by root, writable by nobody
        pythonpath = os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])
        done = subprocess.run(
            [*how.get("prefix", []), sys.executable, "-m", "agentboost.cli", *command],
            capture_output=True,
            text=True,
            cwd=workdir,
            timeout=300,
            env={**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", "HOME": directory},
            preexec_fn=how.get("preexec_fn"),
        )
        assert "No module named" not in done.stderr, "the unprivileged child cannot import agentboost"
        line = one_error(done)
        assert "locked" in line and "Permission denied" in line, line
        assert list((workdir / "locked").iterdir()) == []
