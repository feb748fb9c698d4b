"""Where a training command's memory peaks: its RSS sampled every 10 ms, per phase, with glibc's heap.

Runs an ``agentboost`` command in this process (``train`` or ``sft``, any arguments), labels what it is
doing (the trainers' ``evaluate``, ``collect``, ``update``, ``train_step``, ``save_model``; anything
else is ``other``) and prints, for each phase, the highest RSS seen in it and, at that moment, the
embedded engines' KV bytes and glibc's ``mallinfo2``: bytes the heap spans, bytes mapped on their own,
bytes in use (heap and mapped) and bytes free inside the heap. Free heap bytes at a peak are memory
the process holds but does not use (fragmentation); docs/training.md reads them.

    cd a-run-directory
    python benchmarks/probe_memory_phases.py train examples/math/train.yaml steps=3 eval.every=100

Linux with glibc only. The 10 ms sampling can miss a short spike: the VmHWM printed last cannot.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
import time
from typing import Any

from agentboost.engines.embedded import engine as local
from agentboost.memory import peak_resident_bytes, resident_bytes

GIB = 2**30


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost",
        )
    ]  # fmt: skip


def heap() -> dict[str, float]:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return {
        "heap": info.arena / GIB,
        "mapped": info.hblkhd / GIB,
        "in_use": (info.uordblks + info.hblkhd) / GIB,
        "free_in_heap": info.fordblks / GIB,
    }


class Probe:
    def __init__(self) -> None:
        self.phase = "other"
        self.peaks: dict[str, tuple[float, float, dict[str, float]]] = {}
        self.engines: list[Any] = []

    def sample_forever(self) -> None:
        while True:
            rss = resident_bytes() / GIB
            phase = self.phase
            if rss > self.peaks.get(phase, (0.0,))[0]:
                kv = sum(engine.kv_bytes() for engine in self.engines if not engine._closed) / GIB
                self.peaks[phase] = (rss, kv, heap())
            time.sleep(0.01)

    def label(self, cls: type, name: str) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        def labelled(instance: Any, *args: Any, **kwargs: Any) -> Any:
            outer, self.phase = self.phase, name
            try:
                return original(instance, *args, **kwargs)
            finally:
                self.phase = outer

        setattr(cls, name, labelled)

    def watch_engines(self) -> None:
        original = local.LocalEngine.__init__

        @functools.wraps(original)
        def init(engine: Any, *args: Any, **kwargs: Any) -> None:
            original(engine, *args, **kwargs)
            self.engines.append(engine)

        local.LocalEngine.__init__ = init  # type: ignore[method-assign]

    def report(self) -> None:
        columns = ("peak RSS", 9), ("KV", 6), ("heap", 6), ("mapped", 7), ("in use", 7), ("free in heap", 13)
        print(f"{'phase':<12} " + " ".join(f"{name:>{width}}" for name, width in columns))
        for phase, (rss, kv, info) in sorted(self.peaks.items(), key=lambda item: -item[1][0]):
            print(
                f"{phase:<12} {rss:>9.2f} {kv:>6.2f} {info['heap']:>6.2f} {info['mapped']:>7.2f} "
                f"{info['in_use']:>7.2f} {info['free_in_heap']:>13.2f}"
            )
        print(f"VmHWM {peak_resident_bytes() / GIB:.2f} GiB (all figures GiB)")


def main() -> None:
    from agentboost.cli import run
    from agentboost.train.sft import SFTTrainer
    from agentboost.train.trainer import Trainer

    probe = Probe()
    for name in ("train_step", "evaluate", "save_model"):
        probe.label(SFTTrainer, name)
    for name in ("evaluate", "collect", "update", "save_model"):
        probe.label(Trainer, name)
    probe.watch_engines()
    threading.Thread(target=probe.sample_forever, daemon=True).start()
    sys.argv = ["agentboost", *sys.argv[1:]]
    try:
        run()
    except SystemExit as done:
        time.sleep(0.05)
        probe.report()
        raise SystemExit(done.code) from None


if __name__ == "__main__":
    main()
