"""YAML read with its line numbers, and ${VAR} taken from the environment.

A gate spec's errors must name the LINE of the bad value, so the document is composed (PyYAML keeps
each node's mark) and turned into plain dicts and lists that remember where each value came from:
`Map.lines[key]` and `Seq.lines[i]` are 1-based line numbers.

`${NAME}` and `${NAME:-default}` in a scalar are replaced with the environment's value before the
scalar is typed, so `limit: ${GATE_LIMIT:-8}` is the integer 8 (inside a flow mapping, quote it:
`{limit: "${GATE_LIMIT:-8}"}`, still the integer 8): a CI job passes paths (the two environments'
interpreters, a cached model) without editing the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass
class YamlProblem:
    line: int | None  # 1-based; None: the whole file
    message: str


class YamlReadError(Exception):
    def __init__(self, problem: YamlProblem):
        super().__init__(problem.message)
        self.problem = problem


class Map(dict):
    """A mapping that knows the line of each key and of itself."""

    line: int = 0
    lines: dict[str, int]

    def __init__(self, *a: Any, line: int = 0, lines: dict[str, int] | None = None, **kw: Any):
        super().__init__(*a, **kw)
        self.line = line
        self.lines = dict(lines or {})

    def line_of(self, key: str) -> int:
        return self.lines.get(key, self.line)


class Seq(list):
    """A list that knows the line of each item and of itself."""

    line: int = 0
    lines: list[int]

    def __init__(self, *a: Any, line: int = 0, lines: list[int] | None = None):
        super().__init__(*a)
        self.line = line
        self.lines = list(lines or [])

    def line_of(self, i: int) -> int:
        return self.lines[i] if 0 <= i < len(self.lines) else self.line


def substitute(text: str, env: Mapping[str, str], line: int) -> str:
    """`${NAME}` / `${NAME:-default}` from `env`. Raises YamlReadError for an unset NAME without a
    default, or a value with a line break (it would move every later line number)."""

    def one(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        value = env.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                raise YamlReadError(YamlProblem(line, f"${{{name}}} is not set in the environment"))
            value = default
        if "\n" in value:
            raise YamlReadError(YamlProblem(line, f"${{{name}}} holds a line break"))
        return value

    return _VAR.sub(one, text)


def read_yaml(text: str, env: Mapping[str, str] | None = None) -> Any:
    """The document as Map/Seq/scalars with line numbers. Raises YamlReadError (with the line) on a
    syntax error, several documents, a non-string or duplicate key, or a bad ${VAR}."""
    env = os.environ if env is None else env
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            raise YamlReadError(
                YamlProblem(mark.line + 1 if mark else None, f"not valid YAML: {e.problem or e}")
            ) from None
        except yaml.YAMLError as e:
            raise YamlReadError(YamlProblem(None, f"not valid YAML: {e}")) from None
        if node is None:
            return None
        return _build(node, loader, env)
    finally:
        loader.dispose()


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _build(node: yaml.Node, loader: yaml.SafeLoader, env: Mapping[str, str]) -> Any:
    if isinstance(node, yaml.MappingNode):
        out = Map(line=_line(node))
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise YamlReadError(YamlProblem(_line(k), "a key must be a plain name"))
            key = loader.construct_object(k)
            if not isinstance(key, str):
                raise YamlReadError(YamlProblem(_line(k), f"key {key!r} is not a name (quote it if it is one)"))
            if key in out:
                raise YamlReadError(
                    YamlProblem(_line(k), f"key {key!r} is given twice (first on line {out.lines[key]})")
                )
            out[key] = _build(v, loader, env)
            out.lines[key] = _line(k)
        return out
    if isinstance(node, yaml.SequenceNode):
        return Seq([_build(v, loader, env) for v in node.value], line=_line(node), lines=[_line(v) for v in node.value])
    value = node.value
    if isinstance(value, str) and "${" in value:
        whole = _VAR.fullmatch(value) is not None
        value = substitute(value, env, _line(node))
        tag = node.tag
        # A plain scalar, or a quoted one that is nothing but ${...} (braces must be quoted inside a
        # flow mapping), is typed by what it says after substitution: "${LIMIT:-8}" is the integer 8.
        if node.style is None or whole:
            tag = loader.resolve(yaml.ScalarNode, value, (True, False))
        node = yaml.ScalarNode(tag, value, node.start_mark, node.end_mark, node.style)
    return loader.construct_object(node, deep=True)
