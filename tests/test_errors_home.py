"""Every public exception class lives in agentboost/errors.py, and every one is an AgentBoostError.

Read from the source with ``ast`` (nothing is imported), so a class added anywhere in the package is
seen. An exception class is one whose bases are, transitively, a builtin exception, a class of
errors.py, or an outside class whose name ends in ``Error`` / ``Exception`` (e.g. ``httpx.HTTPError``).
Private classes (a name starting with ``_``) may live beside the code that raises and catches them:
they never reach a caller, so the catch-all does not concern them.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "agentboost"
ERRORS = PACKAGE / "errors.py"
BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _classes(path: Path) -> list[tuple[str, list[str], int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.name, [name for name in map(_base_name, node.bases) if name], node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]


def _exception_classes() -> dict[tuple[Path, str], tuple[list[str], int]]:
    """Every class of the package that is an exception, by (file, name): its bases and line."""
    classes = {
        (path, name): (bases, line) for path in PACKAGE.rglob("*.py") for name, bases, line in _classes(path)
    }
    exceptions: set[str] = set(BUILTIN_EXCEPTIONS)
    found: dict[tuple[Path, str], tuple[list[str], int]] = {}
    while True:  # to a fixed point: a class deriving from a class found in the last round is one too
        grown = {
            key: value
            for key, value in classes.items()
            if key not in found
            and any(base in exceptions or base.endswith(("Error", "Exception")) for base in value[0])
        }
        if not grown:
            return found
        found.update(grown)
        exceptions |= {name for _, name in grown}


def test_every_public_exception_class_is_defined_in_errors_py():
    outside = [
        f"{path.relative_to(PACKAGE.parent)}:{line} class {name}({', '.join(bases)})"
        for (path, name), (bases, line) in sorted(_exception_classes().items())
        if path != ERRORS and not name.startswith("_")
    ]
    assert not outside, (
        "exception classes outside agentboost/errors.py (move them there, draw them on its tree, and "
        "import them where they were):\n" + "\n".join(outside)
    )


def test_every_exception_in_errors_py_is_an_agentboost_error():
    defined = {name: bases for name, bases, _ in _classes(ERRORS)}
    roots = {name for name, bases in defined.items() if not bases} | {"AgentBoostError"}

    def reaches_root(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name == "AgentBoostError":
            return True
        return (
            name in defined
            and name not in seen
            and any(reaches_root(b, seen | {name}) for b in defined[name])
        )

    strays = [name for name in defined if name not in roots and not reaches_root(name)]
    assert not strays, (
        f"exceptions in errors.py that are not AgentBoostError (the documented catch-all): {strays}"
    )


def test_the_tree_in_errors_py_draws_every_public_exception():
    tree = ast.get_docstring(ast.parse(ERRORS.read_text())) or ""
    drawn = {word.strip("`,.():") for line in tree.splitlines() for word in line.split()}
    public = {name for name, bases, _ in _classes(ERRORS) if bases and not name.startswith("_")}
    assert public - drawn == set(), (
        f"exceptions missing from the tree in errors.py's docstring: {public - drawn}"
    )


def test_the_check_sees_an_exception_outside_errors_py(tmp_path, monkeypatch):
    """The check itself: a module with a stray exception (directly and through another) is caught."""
    package = tmp_path / "agentboost"
    package.mkdir()
    (package / "errors.py").write_text('"""AgentBoostError"""\nclass AgentBoostError(Exception): ...\n')
    (package / "stray.py").write_text(
        "import httpx\nfrom agentboost.errors import AgentBoostError\n"
        "class Stray(AgentBoostError): ...\nclass Child(Stray): ...\nclass Wrapped(httpx.HTTPError): ...\n"
        "class _Private(ValueError): ...\nclass Plain: ...\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    monkeypatch.setattr(__import__(__name__), "ERRORS", package / "errors.py")
    names = {name for _, name in _exception_classes()}
    assert names == {"AgentBoostError", "Stray", "Child", "Wrapped", "_Private"}
