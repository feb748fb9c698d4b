"""Ctrl-C ends a command promptly and cleanly, whatever it is doing and however loaded the machine.

Python runs a signal handler only in the main thread, between bytecodes: while the main thread is in
one long native call (a backward pass, a decode step on an overloaded CPU) a Ctrl-C waits for it, and
a second Ctrl-C that lands while the command is already unwinding raises KeyboardInterrupt inside a
finaliser ("Exception ignored in ... __del__") or tears down a C++ thread (``terminate called``,
exit 134). :func:`install` makes it:

- the first Ctrl-C raises KeyboardInterrupt as usual: the command unwinds, says ``agentboost:
  interrupted`` and exits with 130 (results lines are fsynced and checkpoints renamed into place as
  they are written, so nothing is lost);
- a second Ctrl-C exits with 130 at once, from wherever the main thread is;
- a watchdog thread, woken by the C-level handler through a wakeup descriptor (so a busy main thread
  does not delay it), exits with 130 if the command is still alive ``grace_s`` after the first Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

MESSAGE = "agentboost: interrupted"
GRACE_S = 10.0
"""How long the first Ctrl-C lets a command unwind before the watchdog ends it."""

_pressed = threading.Event()


def exit_now() -> None:
    """Say so and end the process with 130, without running finalisers or joining threads."""
    try:
        sys.stderr.write(f"\n{MESSAGE}\n")
        sys.stderr.flush()
        sys.stdout.flush()
    except Exception:  # a closed or full stream must not keep the process alive
        pass
    os._exit(130)


def _on_sigint(signum: int, frame: Any) -> None:
    if _pressed.is_set():
        exit_now()
    _pressed.set()
    raise KeyboardInterrupt


def _next_sigint(reader: socket.socket) -> bool:
    """Wait for the next SIGINT written to the wakeup descriptor (other signals write there too);
    False when the wait timed out."""
    try:
        while True:
            number = reader.recv(1)
            if not number:
                return False
            if number[0] == signal.SIGINT:
                return True
    except TimeoutError:
        return False


def _watch(reader: socket.socket, grace_s: float) -> None:
    if not _next_sigint(reader):
        return
    reader.settimeout(grace_s)
    _next_sigint(reader)  # the grace period, or a second Ctrl-C, whichever comes first
    exit_now()


def install(grace_s: float = GRACE_S) -> None:
    """Take over SIGINT for this process (main thread only; a no-op elsewhere or when already done)."""
    if threading.current_thread() is not threading.main_thread() or getattr(install, "keep", None):
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.signal(signal.SIGINT, _on_sigint)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(reader, grace_s), name="agentboost-interrupts", daemon=True).start()
    install.keep = (reader, writer)  # type: ignore[attr-defined]  (the sockets live as long as the process)


def uninstall() -> None:
    """Give SIGINT back to Python's default (KeyboardInterrupt, no watchdog): for a command that
    handles Ctrl-C itself, such as a server that stops and writes its state however long that takes."""
    kept = getattr(install, "keep", None)
    if kept is None or threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    kept[1].close()  # the watchdog reads the end of its stream and returns
    install.keep = None  # type: ignore[attr-defined]


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold a Ctrl-C that lands inside this block until the block ends, then raise it.

    For steps that a KeyboardInterrupt half-way leaves broken: an event loop interrupted in its
    constructor has no self-pipe, and its finaliser then prints a traceback ("Exception ignored in
    BaseEventLoop.__del__") as the command unwinds. A second Ctrl-C while one is held still exits at
    once when :func:`install` took Ctrl-C over. Outside the main thread (no signal arrives there) it
    does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = signal.getsignal(signal.SIGINT)

    def hold(signum: int, frame: Any) -> None:
        if previous is _on_sigint and _pressed.is_set():
            exit_now()  # the second Ctrl-C
        pending.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending and previous is not signal.SIG_IGN:  # an ignored Ctrl-C stays ignored
        if callable(previous):
            previous(signal.SIGINT, None)  # ours or Python's: raises KeyboardInterrupt
        raise KeyboardInterrupt


def new_event_loop() -> asyncio.AbstractEventLoop:
    """``asyncio.new_event_loop()``, whole even when Ctrl-C is pressed while it is built."""
    with held():
        return asyncio.new_event_loop()


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coroutine)`` on a loop from :func:`new_event_loop`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coroutine)
