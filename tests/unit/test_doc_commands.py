"""Every `parity ...` command in the README and the docs names a subcommand that exists and flags that
subcommand takes (issue 46 item 17: docs/sampling.md showed `parity workload ...`, a command that does
not exist). Read from the fenced code blocks and the inline code spans, checked against the CLI's own
parser: the subcommand path (`parity runs show`), then each --flag (`--flag=value` too). Prose-shaped
mentions that leave out required arguments are fine: flags are checked, completeness is not."""
from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from parity_ui.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
# docs/reference/cli.md is the parser's own --help (tests/unit/test_docs.py keeps it current).
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "cli.md")]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
# A command: a shell line (or a piece of one between && and ;) that starts with `parity` or a path to it
# (`.venv/bin/parity`), after a prompt `$`, a CI step's `run:` or VAR=value assignments; an inline span
# that starts so. Not "parity-ui", not prose or a table that says "parity" mid-line.
COMMAND = re.compile(r"^\s*(?:\$\s+|-?\s*run:\s*|[A-Z_]+=\S*\s+)*(?:\S*/)?parity[ \t]+([a-z][\w-]*(?:[ \t].*)?)$")


def _found(line: str) -> list[str]:
    return [m.group(1) for piece in re.split(r"&&|;|\|\|", line) if (m := COMMAND.match(piece))]


def _commands(page: Path) -> list[tuple[str, str]]:
    """(where, the command's text after `parity`) for each command in a page's code."""
    text = page.read_text(encoding="utf-8")
    out = []
    for block in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)  # shell line continuations
        for line in joined.splitlines():
            out += [(f"{page.relative_to(ROOT)}: {line.strip()}", m) for m in _found(line)]
    prose = FENCE.sub("", text)
    for span in INLINE.findall(prose):
        out += [(f"{page.relative_to(ROOT)}: `{span}`", m) for m in _found(span)]
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def problem(command: str) -> str | None:
    """What is wrong with one command (the text after `parity`), or None."""
    try:
        tokens = shlex.split(command, comments=True)
    except ValueError as e:
        return f"does not split as a shell line: {e}"
    parser, path = build_parser(), ["parity"]
    while tokens and (subs := _subparsers(parser)):
        if tokens[0] not in subs:
            return f"'{' '.join(path)} {tokens[0]}' is not a command (there are: {', '.join(sorted(subs))})"
        path.append(tokens[0])
        parser = subs[tokens.pop(0)]
    flags = parser._option_string_actions
    for t in (t.strip("[]") for t in tokens):  # a synopsis' optional flags: [--prompt N]
        if t.startswith("-") and not re.fullmatch(r"-\d[\d.e-]*", t) and t not in ("-", "--"):
            if t.split("=", 1)[0] not in flags:
                return f"'{' '.join(path)}' takes no {t.split('=', 1)[0]}"
    return None


COMMANDS = [c for page in PAGES for c in _commands(page)]


def test_the_docs_hold_commands_to_check():
    assert len(COMMANDS) > 40  # the reader finds them (README's compare, replay, check, the docs' examples)
    assert any("parity compare" in w for w, _ in COMMANDS) and any("parity runs show" in w for w, _ in COMMANDS)


@pytest.mark.parametrize("where, command", COMMANDS, ids=[w[:90] for w, _ in COMMANDS])
def test_every_parity_command_in_the_docs_parses(where, command):
    assert problem(command) is None, f"{where}: {problem(command)}"


def test_a_command_or_flag_that_does_not_exist_is_caught():
    assert "'parity workload' is not a command" in problem("workload prompts.jsonl --model demo")
    assert "takes no --no-such-flag" in problem("compare --model demo --no-such-flag 3")
    assert problem("runs show RUN_ID --json") is None and problem("compare --set=max_new_tokens=8") is None
    assert "takes no --position" in problem("runs show RUN_ID [--position N]")  # a synopsis' flags too
