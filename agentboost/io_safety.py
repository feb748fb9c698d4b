"""Output files: no command writes over a file it did not create unless told to (``--force``).

Every option that names a file to write (``view -o``, ``export -o``, ``eval --report``, ``stats -o``,
``data to-verl --out``, ``data prepare-coding --out``) passes through :func:`claim_output` before
anything is read or computed, so a refusal costs nothing and leaves the file byte-identical:

- an output that is also one of the command's inputs is refused, even with ``--force``;
- a device, pipe or socket (``/dev/full``) is refused: outputs are regular files;
- a directory is refused where a file is expected (and an existing non-empty directory where a
  directory is expected, unless ``--force``);
- an existing regular file is refused unless ``--force``, or unless the command recognises it as its
  own earlier output (``ours``: e.g. the report ``eval`` wrote for the same results file).

The parent directories are created here, so an unusable path fails before the work, in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from agentboost.errors import ConfigError, UserPathError


def add_force_argument(parser: argparse.ArgumentParser, what: str = "the output file") -> None:
    """``--force``: replace an existing output (never an input of the same command)."""
    parser.add_argument(
        "--force", action="store_true", help=f"replace {what} if it exists (never one of the inputs)"
    )


def _same_file(path: Path, other: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(path, other)
    except OSError:
        return False


def refuse_special_file(path: str | os.PathLike[str], option: str) -> None:
    """ConfigError if ``path`` exists and is a device, pipe or socket (e.g. a ``stats -o`` prefix)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ConfigError(f"{option} {path} is not a regular file (a device, pipe or socket); name a file")


def claim_output(
    path: str | os.PathLike[str],
    *,
    option: str,
    force: bool,
    inputs: Iterable[str | os.PathLike[str]] = (),
    ours: Callable[[Path], bool] | None = None,
    directory: bool = False,
) -> Path:
    """Check that ``path`` may be written by this command (see the module docstring); create its parent.

    ``option`` names the flag in messages (``-o``, ``--report``...). ``directory`` is for outputs that
    are directories (``export --format hf``). Returns ``path`` as a :class:`Path`; raises
    :class:`ConfigError` (or :class:`UserPathError`) with one sentence saying what to do.
    """
    target = Path(path)
    for source in inputs:
        if _same_file(target, source):
            raise ConfigError(
                f"{option} {target} is also an input of this command; write to another file "
                "(the input is left untouched)"
            )
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    except OSError as error:
        raise UserPathError.from_os_error(target, error, "use") from error
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            if not directory:
                raise ConfigError(f"{option} {target} is a directory; name a file inside it")
            if not force and any(target.iterdir()):
                raise ConfigError(
                    f"{option} {target} is a directory that is not empty, so it was left untouched; "
                    "choose another path or pass --force to write into it"
                )
        elif not stat.S_ISREG(info.st_mode):
            refuse_special_file(target, option)
        elif directory:
            raise ConfigError(f"{option} {target} is a file; this output is a directory")
        elif not force and not (ours is not None and ours(target)):
            raise ConfigError(
                f"{option} {target} exists, so it was left untouched; pass --force to replace it, "
                "or choose another path"
            )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserPathError.from_os_error(target.parent, error, "create the directory") from error
    if not os.access(target.parent, os.W_OK):
        raise UserPathError.from_os_error(
            target.parent, PermissionError(13, "Permission denied"), "write into"
        )
    return target


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path next to ``path`` to write; renamed onto ``path`` only if the block succeeds.

    A command that fails half-way leaves neither a half-written output nor an empty file behind.
    """
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    try:
        yield partial
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
