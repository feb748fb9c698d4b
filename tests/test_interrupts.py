"""Ctrl-C while an event loop is being built ends the command cleanly (agentboost.interrupts)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Ctrl-C lands inside the loop's constructor, before its self-pipe exists: the moment a trainer's
# collection, an evaluation or `agentboost rollout` starts its loop (it failed a CI run once).
PROBE = textwrap.dedent(
    """
    import asyncio, gc, os, signal, sys
    from asyncio import selector_events

    from agentboost import interrupts

    interrupts.install()
    original = selector_events.BaseSelectorEventLoop._make_self_pipe

    def pressed(self):
        os.kill(os.getpid(), signal.SIGINT)
        original(self)

    selector_events.BaseSelectorEventLoop._make_self_pipe = pressed

    async def work():
        return 1

    try:
        if sys.argv[1] == "run_coroutine":
            interrupts.run_coroutine(work())
        elif sys.argv[1] == "trainer_runner":
            with asyncio.Runner(loop_factory=interrupts.new_event_loop) as runner:
                runner.run(work())
        else:
            with asyncio.Runner() as runner:
                runner.run(work())
    except KeyboardInterrupt:
        print("interrupted")
    else:
        print("not interrupted")
    gc.collect()
    """
)


def probe(how: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, how], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("how", ["run_coroutine", "trainer_runner"])
def test_ctrl_c_while_the_loop_is_built_interrupts_without_a_finaliser_traceback(how):
    done = probe(how)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted"
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_probe_sees_the_traceback_of_a_plain_loop():
    """The probe is a real one: asyncio's own loop, interrupted the same way, prints the traceback."""
    done = probe("plain")
    assert done.stdout.strip() == "interrupted"
    assert "Exception ignored" in done.stderr and "_ssock" in done.stderr


def test_held_raises_the_ctrl_c_after_the_block_and_lets_the_block_finish():
    script = textwrap.dedent(
        """
        import os, signal
        from agentboost import interrupts

        finished = False
        try:
            with interrupts.held():
                os.kill(os.getpid(), signal.SIGINT)
                finished = True
        except KeyboardInterrupt:
            print("raised after", finished)
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["raised after True", "True"]
