"""Typed, range-checked dataclasses from plain data: the canonical config and each side kind's options.

A field declares what it accepts in its metadata (`option(default, doc, allowed)`); `build` checks
types (coercing only losslessly, int -> float), rejects unknown keys and checks ranges, raising
`ConfigError` that names the key, what is allowed and how to fix it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import field
from typing import Any, get_args, get_type_hints

from .errors import ConfigError

Allowed = tuple[Callable[[Any], bool], str]  # (test, human description)


NO_FLIP = object()  # an option a bisect against another kind of engine cannot flip


def option(
    default: Any = None,
    doc: str = "",
    allowed: Allowed | None = None,
    *,
    factory: Any = None,
    flip_to: Any = NO_FLIP,
    flip_why: str = "",
) -> Any:
    """A dataclass field with its documentation and allowed values. `flip_to`, for an option only its
    kind has: the value a bisect against another kind of engine sets it to (the one that changes
    nothing in this engine's numerics, or that brings it nearest the other), `flip_why` that value in
    a few words (see parity_ui.core.bisect_factors)."""
    meta = {"doc": doc, "allowed": allowed, "flip_to": flip_to, "flip_why": flip_why}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def one_of(*values: Any) -> Allowed:
    return (lambda v: v is None or v in values, "one of " + ", ".join(str(v) for v in values))


def number_in(lo: float, hi: float, what: str = "a number") -> Allowed:
    return (lambda v: v is None or lo <= v <= hi, f"{what} from {lo:g} to {hi:g}")


def check_type(key: str, value: Any, hint: Any) -> Any:
    """Return `value` coerced to `hint` where that is lossless (int -> float), else raise."""
    args = get_args(hint)
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(key, "must not be null", f"give a value or remove '{key}' to use the default")
    if args and type(None) in args:  # Optional[X]
        inner = [a for a in args if a is not type(None)][0]
        return check_type(key, value, inner)
    origin = getattr(hint, "__origin__", None)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"must be true or false, got {value!r}", f"set {key}: true or {key}: false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(key, f"must be an integer, got {value!r}", f"write {key} as a whole number")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise ConfigError(key, f"must be a number, got {value!r}", f"write {key} as a number")
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # `device: 0` or `gpus: 0` in YAML: the user meant the text
        raise ConfigError(key, f"must be a string, got {value!r}", f"quote the value of {key}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(key, f"must be a list, got {value!r}", f"write {key} as [1, 2]")
        (item,) = get_args(hint)
        return [check_type(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a mapping, got {value!r}", f"write {key} as {{name: value}}")
        return dict(value)
    raise ConfigError(key, f"has an unsupported type {hint}")  # pragma: no cover - a coding error


def fields_of(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def build(
    cls: type, data: dict[str, Any], prefix: str = "", *, skip: tuple[str, ...] = (), unknown_fix: str = ""
) -> Any:
    """An instance of dataclass `cls` from `data`: types checked, unknown keys rejected, ranges
    checked. `prefix` is prepended to key names in errors ("b." for side b's options)."""
    if not isinstance(data, dict):
        raise ConfigError(prefix.rstrip(".") or "config", f"must be a mapping, got {data!r}")
    hints = get_type_hints(cls)
    known = fields_of(cls)
    unknown = sorted(k for k in set(data) - set(known) if k not in skip)
    if unknown:
        names = ", ".join(sorted(n for n in known if n not in skip))
        raise ConfigError(prefix + str(unknown[0]), "is not a known key", unknown_fix or f"known keys here: {names}")
    kwargs = {name: check_type(prefix + name, value, hints[name]) for name, value in data.items() if name in known}
    obj = cls(**kwargs)
    check_ranges(obj, prefix)
    return obj


def check_ranges(obj: Any, prefix: str = "") -> None:
    for f in dataclasses.fields(obj):
        allowed = f.metadata.get("allowed")
        if not allowed:
            continue
        ok, what = allowed
        value = getattr(obj, f.name)
        if not ok(value):
            key = prefix + f.name
            raise ConfigError(key, f"is {value!r}, must be {what}", f"set {key} to {what}")


def doc_of(cls: type, name: str) -> str:
    return fields_of(cls)[name].metadata.get("doc", "")


def non_default(obj: Any) -> dict[str, Any]:
    """The fields of `obj` that differ from their defaults (what a user actually set)."""
    out = {}
    for f in dataclasses.fields(obj):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        value = getattr(obj, f.name)
        if value != default:
            out[f.name] = value
    return out
