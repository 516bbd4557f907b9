"""Every CLI command is documented in the README, and the README's two commands are what CI runs."""
from __future__ import annotations

import argparse
from pathlib import Path

from parity_ui.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _commands(parser: argparse.ArgumentParser, prefix: str = "parity") -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _commands(sub, f"{prefix} {name}")
                out.extend(nested or [f"{prefix} {name}"])
    return out


def test_every_cli_command_is_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    commands = _commands(build_parser())
    assert "parity compare" in commands and "parity runs show" in commands
    missing = [c for c in commands if c not in readme]
    assert not missing, f"undocumented commands: {missing}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\nmake test\n" in readme and "make test" in ci


def test_bench_summary_reads_every_figure_file_it_names():
    """bench/summary.py's table comes from the committed figure files: each goal of issue 12 has rows,
    every row an after figure, and no cell breaks the Markdown table."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_summary", ROOT / "bench" / "summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    rows = summary.rows()
    assert {r[0].split()[0] for r in rows} == {"1", "2", "4", "5"}
    assert all(r[3] for r in rows) and not any("|" in cell for r in rows for cell in r)
    assert sum(r[0] == "4 16k view" for r in rows) == 4
