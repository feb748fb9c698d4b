"""No import circles: each part of the package imports only from the layers below it.

Read from the source with ``ast`` (nothing is imported), counting every ``import`` statement: at the
top of a module, inside a function (lazy) and under ``if TYPE_CHECKING:`` (type-only) alike, since a
type-only import is still a dependency a reader must follow. The rule and the order are drawn in
docs/architecture.md ("Layers").
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "agentboost"

LAYERS: list[set[str]] = [
    {"errors"},
    {"cli_args", "interrupts", "io_safety", "lazy_names", "memory"},  # small utilities
    {"tokens", "sandbox"},
    {"models"},
    {"engines"},
    {"agent"},
    {"outcomes"},
    {"tables"},
    {"envs"},
    {"rollout", "gateway"},
    {"eval", "export"},
    {"view"},
    {"train", "integrations"},
    {"cli"},  # agentboost/cli.py and every command module its command table names
    {"agentboost"},  # the package's face (agentboost/__init__.py): type-only imports of everything
]
"""Bottom first. A module may import from its own part and from any lower layer; two parts of one
layer never import each other."""

ROOT_NAMES_ALLOWED = {"__version__"}
"""What any module may import from the package root: its version (the root runs no other import)."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def command_modules() -> set[str]:
    """The modules named in agentboost/cli.py's command table (``"agentboost.x.y:register_..."``)."""
    tree = ast.parse((PACKAGE / "cli.py").read_text())
    return {
        node.value.partition(":")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("agentboost.")
        and ":register_" in node.value
    }


def part_of(module: str, commands: set[str]) -> str:
    """The layer part a module belongs to: its top-level package, ``cli`` for command modules."""
    if module in commands or module == "agentboost.cli":
        return "cli"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "agentboost"


def _imports(path: Path) -> list[tuple[str, int, list[str]]]:
    """(imported module, line, names) for every import statement of the file, relative ones resolved."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [alias.name for alias in node.names]
            if base == "agentboost":  # `from agentboost import x`: x may be a submodule or a name
                submodules = [
                    name for name in names if (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").exists()
                ]
                found += [(f"agentboost.{name}", node.lineno, []) for name in submodules]
                names = [name for name in names if name not in submodules]
                if names:
                    found.append((base, node.lineno, names))
            else:
                found.append((base, node.lineno, names))
    return [(name, line, names) for name, line, names in found if name.split(".")[0] == "agentboost"]


def upward_imports(package: Path = PACKAGE) -> list[str]:
    rank = {part: index for index, layer in enumerate(LAYERS) for part in layer}
    commands = command_modules()
    wrong = []
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path)
        source = part_of(module, commands)
        for imported, line, names in _imports(path):
            target = part_of(imported, commands)
            where = f"{path.relative_to(package.parent)}:{line} imports {imported}"
            if source not in rank or target not in rank:
                wrong.append(f"{where}: add {source if source not in rank else target!r} to LAYERS")
            elif target == "agentboost" and set(names) <= ROOT_NAMES_ALLOWED and names:
                continue
            elif source != target and rank[target] >= rank[source]:
                side = "the same layer as" if rank[target] == rank[source] else "a layer above"
                wrong.append(f"{where}: {target} is {side} {source}")
    return wrong


def test_no_module_imports_upward_even_lazily_or_for_types_only():
    wrong = upward_imports()
    assert not wrong, "imports against the layer order (docs/architecture.md, Layers):\n" + "\n".join(wrong)


def test_every_part_of_the_package_has_a_layer():
    parts = {
        path.stem if path.suffix == ".py" else path.name
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }
    assert parts <= {part for layer in LAYERS for part in layer}, parts - {
        p for layer in LAYERS for p in layer
    }


def test_the_check_sees_an_upward_import_in_a_function_and_under_type_checking(tmp_path, monkeypatch):
    """The check itself: an environment that names the evaluator's types, or the runner lazily, fails."""
    package = tmp_path / "agentboost"
    (package / "envs").mkdir(parents=True)
    (package / "eval").mkdir()
    (package / "rollout").mkdir()
    for part in ("envs", "eval", "rollout"):
        (package / part / "__init__.py").write_text("")
    (package / "cli.py").write_text('COMMANDS = ("agentboost.eval.cli:register_commands",)\n')
    (package / "eval" / "cli.py").write_text("from agentboost.rollout import runner\n")  # a command: fine
    (package / "envs" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agentboost.eval.stats import Table\n"
        "def run():\n    from ..rollout import runner\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    assert upward_imports(package) == [
        "agentboost/envs/base.py:3 imports agentboost.eval.stats: eval is a layer above envs",
        "agentboost/envs/base.py:5 imports agentboost.rollout: rollout is a layer above envs",
    ]
