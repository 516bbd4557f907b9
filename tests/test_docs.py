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
