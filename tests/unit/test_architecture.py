"""The folders are a map, and the map is checked: each folder of parity_ui (and each module at its
root) says in its docstring what it may import ("May import: core, inputs."), and this test walks
every import in the package — at module level, inside functions, under TYPE_CHECKING — and fails on
one that the importer's own docstring does not allow. The rule lives where a reader looks for it;
this test keeps it true (the layers contract of import-linter, without the extra tool)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "parity_ui"
RULE = re.compile(r"^May import:\s*(.*?)\.?\s*$", re.M)


def _unit(package: Path, path: Path) -> str:
    """The architectural unit a file belongs to: its top folder under the package, or the root
    module's own name (cli, service)."""
    parts = path.relative_to(package).with_suffix("").parts
    return parts[0]


def _rules(package: Path) -> dict[str, set[str]]:
    """Each unit's allowed imports, read from its docstring (a folder's __init__.py, a root module)."""
    rules: dict[str, set[str]] = {}
    for entry in sorted(package.iterdir()):
        src = entry / "__init__.py" if entry.is_dir() else entry
        if entry.name.startswith("__") or src.suffix != ".py" or not src.exists():
            continue
        doc = ast.get_docstring(ast.parse(src.read_text())) or ""
        m = RULE.search(doc)
        name = entry.name if entry.is_dir() else entry.stem
        rules[name] = set() if m is None or m.group(1).strip().lower() == "nothing else of parity_ui" else \
            {w.strip() for w in m.group(1).split(",") if w.strip()}
        rules[name].add(name)
    return rules


def _imports(package: Path, path: Path) -> list[tuple[int, str]]:
    """(line, the imported unit) for every import of the package in `path`, at any depth."""
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    here = parts if parts[-1] == "__init__" else parts
    pkg = here[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == package.name:
                target = node.module.split(".")
            else:
                continue
            if len(target) == 1:  # `from parity_ui import __version__` (or `from .. import x` at the root)
                names = [a.name for a in node.names]
                out += [(node.lineno, n) for n in names if (package / n).is_dir() or (package / f"{n}.py").exists()]
                continue
            out.append((node.lineno, target[1]))
        elif isinstance(node, ast.Import):
            for a in node.names:
                t = a.name.split(".")
                if t[0] == package.name and len(t) > 1:
                    out.append((node.lineno, t[1]))
    return out


def violations(package: Path) -> list[str]:
    rules = _rules(package)
    found = []
    for path in sorted(package.rglob("*.py")):
        unit = _unit(package, path)
        if unit == "__init__":
            continue
        if unit not in rules:
            found.append(f"{path.relative_to(package.parent)}: its folder's docstring says nothing of what it may import")
            continue
        for line, target in _imports(package, path):
            if target not in rules[unit]:
                found.append(f"{path.relative_to(package.parent)}:{line} imports {target} "
                             f"({unit} may import {', '.join(sorted(rules[unit] - {unit})) or 'nothing else'})")
    return found


def test_every_import_follows_the_layer_rules():
    assert violations(PACKAGE) == []


def test_every_folder_says_what_it_may_import():
    rules = _rules(PACKAGE)
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(rules) and {"core", "run", "commands", "store", "ui", "cli", "service"} <= set(rules)
    assert rules["core"] == {"core"}  # the ground floor imports nothing else


def test_at_most_a_dozen_modules_at_the_package_root():
    assert len(list(PACKAGE.glob("*.py"))) <= 12


def test_a_forbidden_import_is_caught(tmp_path):
    """The checker itself can fail: a copy of the rules with core importing the store, and the store
    importing the ui inside a function."""
    pkg = tmp_path / "parity_ui"
    for name, rule in {"core": "nothing else of parity_ui", "store": "core", "ui": "core, store"}.items():
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text(f'"""{name}.\n\nMay import: {rule}.\n"""\n')
    (pkg / "__init__.py").write_text('"""pkg"""\n')
    (pkg / "core" / "types.py").write_text("from ..store.runs import get_run\n")
    (pkg / "store" / "runs.py").write_text("from ..core import types\n\ndef f():\n    from parity_ui.ui import app\n")
    (pkg / "ui" / "app.py").write_text("from ..store.runs import get_run\nfrom parity_ui.core.types import X\n")
    found = violations(pkg)
    assert len(found) == 2, found
    assert "core/types.py:1 imports store (core may import nothing else)" in found[0]
    assert "store/runs.py:4 imports ui (store may import core)" in found[1]


@pytest.mark.parametrize("unit", ["cli", "ui"])
def test_the_cli_and_the_app_reach_commands_only_through_the_service(unit):
    assert "commands" not in _rules(PACKAGE)[unit] and "service" in _rules(PACKAGE)[unit]


def test_the_architecture_page_names_every_module():
    """docs/architecture.md is the map: a module added without a line there fails here (a nested
    package, such as commands/gate/, may be named as a whole)."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py":
            continue
        nested = len(rel.parts) > 2 and f"{rel.parts[-2]}/" in page
        if path.name not in page and not nested:
            missing.append(rel.as_posix())
    assert missing == [], f"modules not on docs/architecture.md: {missing}"


def test_no_code_above_the_kinds_probes_the_config_or_a_sides_options_by_name():
    """`config.routes` is a typed field, read as one; a side's options are read by name only in
    core/mapping (option(), route_replay_mode()), and code elsewhere asks a kind what it can do."""
    import re

    probes = re.compile(r'getattr\(.*config.*"routes"|getattr\(.*options')
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).as_posix() != "core/mapping.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if probes.search(line)
    ]
    assert found == []
