"""The docs: every CLI command is in the generated CLI reference and the page is current, the README's
test command is what CI runs, the README stays short, and the mkdocs site builds in strict mode."""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from parity_ui.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"


def _commands(parser: argparse.ArgumentParser, prefix: str = "parity") -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _commands(sub, f"{prefix} {name}")
                out.extend(nested or [f"{prefix} {name}"])
    return out


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_cli_command_is_in_the_cli_reference():
    page = CLI_PAGE.read_text()
    commands = _commands(build_parser())
    assert "parity compare" in commands and "parity runs show" in commands
    missing = [c for c in commands if f"\n## {c}\n" not in page and f"\n### {c}\n" not in page]
    assert not missing, f"undocumented commands: {missing}"


def test_the_cli_reference_is_what_the_parser_gives(monkeypatch):
    """docs/reference/cli.md is generated; when the parser changes, regenerate it with
    `.venv/bin/python scripts/cli_reference.py`. The terminal's width does not change the page."""
    monkeypatch.setenv("COLUMNS", "37")
    assert _cli_reference().render() == CLI_PAGE.read_text(), \
        "docs/reference/cli.md is stale: run .venv/bin/python scripts/cli_reference.py"


def test_the_cli_reference_check_fails_on_a_stale_page(tmp_path, monkeypatch, capsys):
    module = _cli_reference()
    assert module.main(["--check"]) == 0
    stale = tmp_path / "cli.md"
    stale.write_text(CLI_PAGE.read_text().replace("## parity compare", "## parity compare-old"))
    monkeypatch.setattr(module, "PAGE", stale)
    assert module.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\nmake test\n" in readme and "make test" in ci


def test_the_readme_is_short_and_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md") if p.name != "index.md")
    missing = [p for p in pages if f"]({p})" not in readme]
    assert not missing, f"the README does not link: {missing}"


def test_the_docs_home_page_starts_every_page():
    """Issue 46 item 18: docs/index.md's "Start here" missed the rollouts, sampling, cluster and MoE pages."""
    index = (ROOT / "docs" / "index.md").read_text()
    start = index[index.index("## Start here"):]
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md") if p.name != "index.md")
    missing = [p for p in pages if f"]({p})" not in start]
    assert not missing, f"docs/index.md's Start here does not link: {missing}"


def test_every_test_path_the_docs_name_exists():
    """Issue 46 item 18: docs/architecture.md named tests/test_architecture.py (it is under tests/unit/)."""
    import re

    named = {(p.name, m) for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
             for m in re.findall(r"`(tests/[\w/.-]+\.py)`", p.read_text())}
    assert named
    missing = sorted(f"{page}: {path}" for page, path in named if not (ROOT / path).is_file())
    assert not missing, missing


def test_the_docs_build_in_strict_mode(tmp_path):
    """`mkdocs build --strict` (mkdocs.yml sets strict and validates links and anchors between pages)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_bench_summary_reads_every_figure_file_it_names():
    """bench/summary.py's table comes from the committed figure files: each goal of issue 12 has rows,
    every row an after figure, and no cell breaks the Markdown table."""
    spec = importlib.util.spec_from_file_location("bench_summary", ROOT / "bench" / "summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    rows = summary.rows()
    assert {r[0].split()[0] for r in rows} == {"1", "2", "4", "5"}
    assert all(r[3] for r in rows) and not any("|" in cell for r in rows for cell in r)
    assert sum(r[0] == "4 16k view" for r in rows) == 4
