"""Sides: the named engine setups a run compares. The first side is the reference; every other side
is compared with it.

A side comes from `--side NAME=KIND[,key=value...]`, from the config's `sides:` list, or from a
section named after it (`vllm: {enforce_eager: true}`, `--set b.enforce_eager=false`). Its options
are validated by its kind; `model=` and `python=` are understood by every kind that runs in a
worker.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import ConfigError, SideError
from .kinds import KINDS, SideOptions, get_kind
from .validation import build, non_default

# Keys a side has besides its kind's options.
SIDE_KEYS = ("name", "kind", "model", "python")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
MAX_SIDES = 8

# Today's pair, so that a user who asks for nothing gets what v1 did: HF, the reference
# implementation, against vLLM.
DEFAULT_SIDES: tuple[dict[str, Any], ...] = ({"name": "hf", "kind": "hf"}, {"name": "vllm", "kind": "vllm"})


@dataclass
class SideSpec:
    name: str
    kind: str
    options: SideOptions = field(default_factory=SideOptions)
    model: str | None = None  # another model folder for this side (same tokenizer ids, checked)
    python: str | None = None  # another environment's interpreter for this side's worker

    def to_dict(self) -> dict[str, Any]:
        """As a user writes it: name, kind, then only what differs from the defaults."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        out.update(non_default(self.options))
        if self.model:
            out["model"] = self.model
        if self.python:
            out["python"] = self.python
        return out

    def all_options(self) -> dict[str, Any]:
        return dataclasses.asdict(self.options)

    def replace(self, **options: Any) -> SideSpec:
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **options))

    def batch_size(self, run_batch_size: int) -> int:
        """Prompts per generate call for this side: its own batch_size, else the run's."""
        return self.all_options().get("batch_size") or run_batch_size  # a kind without the option: the run's

    def describe(self) -> str:
        """`name (kind, key=value, ...)` for messages."""
        extra = ", ".join(f"{k}={v}" for k, v in self.to_dict().items() if k not in ("name", "kind"))
        return f"{self.name} ({self.kind}{', ' + extra if extra else ''})"


def parse_side_arg(text: str) -> dict[str, Any]:
    """`b=vllm,enforce_eager=false,model=/x` -> {"name": "b", "kind": "vllm", ...}. Values are YAML
    scalars (true, 0.5, null). Raises ConfigError naming the problem."""
    head, _, rest = text.partition(",")
    if "=" not in head:
        raise ConfigError(
            f"--side {text}",
            "is not of the form NAME=KIND[,key=value...]",
            "e.g. --side ref=hf,dtype=float32 --side b=vllm,enforce_eager=false",
        )
    name, kind = (s.strip() for s in head.split("=", 1))
    out: dict[str, Any] = {"name": name, "kind": kind}
    pieces: list[str] = []
    for piece in filter(None, (s.strip() for s in rest.split(","))):
        if "=" not in piece and pieces and _continues(pieces[-1]):
            pieces[-1] += "," + piece  # device=cuda:0,1: the comma is part of the value
        else:
            pieces.append(piece)
    for item in pieces:
        if "=" not in item:
            raise ConfigError(
                f"--side {text}",
                f"option {item!r} is not of the form key=value",
                "e.g. --side b=vllm,enforce_eager=false",
            )
        key, raw = (s.strip() for s in item.split("=", 1))
        try:
            value = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            value = raw
        out[key] = value
    return out


def side_arg(side: SideSpec) -> str:
    """The `--side` argument that gives `side` back (parse_side_arg's inverse): NAME=KIND, then what
    differs from the defaults, values written as YAML scalars (true, 0.5)."""
    parts = [f"{side.name}={side.kind}"]
    for key, value in side.to_dict().items():
        if key in ("name", "kind"):
            continue
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
        parts.append(f"{key}={text.removesuffix('...').strip()}")
    return ",".join(parts)


def _continues(item: str) -> bool:
    """A value that a bare `,N` continues: a GPU list such as device=cuda:0,1."""
    key, _, value = item.partition("=")
    return key.strip() == "device" and value.strip().startswith("cuda:")


def _check_name(name: Any, where: str, reserved: set[str]) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            where,
            f"side name {name!r} is not usable",
            "start with a letter; letters, digits, '-' and '_' only; at most 32 characters",
        )
    if name in reserved:
        raise ConfigError(
            where,
            f"side name {name!r} is also a config key",
            "pick another name, e.g. 'ref', 'a', 'b', 'eager', 'graphs'",
        )
    return name


def build_side(raw: Any, where: str, reserved: set[str]) -> SideSpec:
    """One side from its dict form; errors name the side and the key."""
    if not isinstance(raw, dict):
        raise ConfigError(
            where,
            f"must be a mapping with name and kind, got {raw!r}",
            "e.g. {name: b, kind: vllm, enforce_eager: false}",
        )
    name = _check_name(raw.get("name"), f"{where}.name", reserved)
    if "kind" not in raw:
        raise SideError(name, "kind", "has no kind", f"give its kind: one of {', '.join(KINDS)}, e.g. {name}=vllm")
    if str(raw["kind"]) not in KINDS:
        raise SideError(
            name, "kind", f"unknown kind {raw['kind']!r}; available: {', '.join(KINDS)}", f"e.g. --side {name}=vllm"
        )
    kind = get_kind(raw["kind"])
    opts = {k: v for k, v in raw.items() if k not in SIDE_KEYS}
    known = ", ".join(sorted([*(f.name for f in dataclasses.fields(kind.options)), "model", "python"]))
    unknown = sorted(set(opts) - {f.name for f in dataclasses.fields(kind.options)})
    if unknown:
        key = unknown[0]
        # Another kind's option (HF's deterministic on a vLLM side): say whose it is, and this kind's own
        # way to the same end where it has one.
        owners = [k.name for k in KINDS.values() if any(f.name == key for f in dataclasses.fields(k.options))]
        whose = f" (it is an option of kind {', '.join(owners)})" if owners else ""
        advice = dict(kind.instead).get(key)
        raise SideError(
            name,
            key,
            f"{key!r} is not an option of kind {kind.name}{whose}",
            (f"{advice}; " if advice else "") + f"options of kind {kind.name}: {known}",
        )
    try:
        options = build(kind.options, opts, "")
    except SideError:
        raise
    except ConfigError as e:
        raise SideError(
            name,
            e.key,
            f"option {e.message.removeprefix('config key ')}",
            e.fix.replace(f"set {e.key} ", f"set {name}.{e.key} "),
        ) from None
    side = SideSpec(name=name, kind=kind.name, options=options)
    for key in ("model", "python"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise SideError(
                name,
                key,
                f"{key} must be a path, got {value!r}",
                f"give {key}=/path/to/{'folder' if key == 'model' else 'bin/python'}",
            )
        if value and not kind.in_worker:
            raise SideError(name, key, f"kind {kind.name} does not run in a worker here", f"remove {key}")
        setattr(side, key, value.strip() if value else None)
    return side


def build_sides(
    raw: list[Any] | None, sections: dict[str, dict[str, Any]], reserved: set[str], min_sides: int = 2
) -> list[SideSpec]:
    """The run's sides: `raw` (the sides list, None = the defaults) with each side's section (by name)
    merged over it. Raises ConfigError for a duplicate or unknown name, fewer than `min_sides` (a
    comparison needs two; an invariance audit audits one setup alone), too many."""
    if raw is not None and not isinstance(raw, list):
        raise ConfigError(
            "sides",
            f"must be a list of sides, got {raw!r}",
            "e.g. sides: [{name: ref, kind: hf}, {name: b, kind: vllm}]",
        )
    for i, item in enumerate(raw or []):
        if not isinstance(item, dict):
            raise ConfigError(
                f"sides[{i}]",
                f"must be a mapping with name and kind, got {item!r}",
                "e.g. {name: b, kind: vllm} (on the command line: --side b=vllm)",
            )
    items = [dict(s) for s in (DEFAULT_SIDES if raw is None else raw)]
    names = [item.get("name") for item in items]
    for name, section in sections.items():
        if name not in names:
            raise ConfigError(
                f"{name}",
                f"no side is named {name!r} (sides: {', '.join(map(str, names))})",
                "name an existing side, or add it with --side NAME=KIND",
            )
        items[names.index(name)].update(section)
    sides = [build_side(item, f"sides[{i}]", reserved) for i, item in enumerate(items)]
    seen: set[str] = set()
    for s in sides:
        if s.name in seen:
            raise SideError(s.name, "", "two sides have this name", "give every side its own name")
        seen.add(s.name)
    if len(sides) < min_sides:
        raise ConfigError(
            "sides",
            f"has {len(sides)} side; a comparison needs two or more" if min_sides == 2 else f"has {len(sides)} sides",
            "add another, e.g. --side ref=hf --side b=vllm",
        )
    if len(sides) > MAX_SIDES:
        raise ConfigError("sides", f"has {len(sides)} sides, over the limit of {MAX_SIDES}", "drop some sides")
    return sides
