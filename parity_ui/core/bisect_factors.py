"""A bisect's factors: the settings in which a diverging side differs from the reference, as the user
asked for them, and whether a flipped one showed in a trial side's resolved settings.

A factor is what the user can set: an option both sides' kinds have (a side's own value, else the
run's), the model folder (`model=`) and the interpreter (`python=`, its installed versions as a
whole). When the kinds differ, an option only the side's kind has is a factor too where its kind names
the value to flip it to (`flip_to` in parity_ui.core.kinds: vLLM's eager mode, no prefix caching, the
Transformers model code, values that change nothing in its numerics or bring it nearest the other
engine), marked `engine_only`. What cannot be flipped (the engine itself, with the other options only
one kind has) is one fixed factor. Whether a flip took effect is read in the settings vocabulary of
parity_ui.core.settings (OPTION_ROWS, `reported`), the one the engines report in. Pure: no engine, no store.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .bisect_record import APPLIED, NO_VISIBLE_DIFFERENCE, NOT_APPLIED, NOT_SHOWN, OTHER, Factor, FlipCheck, show_value
from .config import ParityConfig
from .kinds import get_kind
from .mapping import option, side_dtype, side_generation_config
from .settings import option_row, reported
from .sides import SideSpec
from .types import ModelInfo, SideInfo
from .validation import NO_FLIP

__all__ = ["differences", "check_flip", "effective"]


def effective(cfg: ParityConfig, spec: SideSpec, name: str, model: ModelInfo, on_gpu: bool) -> Any:
    """An option's value in effect for a side: its own, else the run's ('auto' dtype resolved)."""
    if name == "dtype":
        return side_dtype(cfg, spec, model)
    if name == "batch_size":
        return spec.batch_size(cfg.batch_size)
    if name == "generation_config":
        return side_generation_config(cfg, spec)
    if name in ("image_min_pixels", "image_max_pixels"):
        return option(spec, name) or getattr(cfg, name)
    value = spec.all_options()[name]
    if name == "enforce_eager" and value is None:
        return not on_gpu  # vLLM's default here: eager on the CPU, graphs on a GPU
    return value


def differences(
    cfg: ParityConfig, ref: SideSpec, side: SideSpec, model: ModelInfo, on_gpu: bool
) -> tuple[list[Factor], list[Factor]]:
    """(flippable, fixed): the settings in which `side` differs from `ref`, as asked. Options both kinds
    have, the model folder and the interpreter are flippable; the engine (when the kinds differ) is one
    fixed factor, whose note names the options only one of the kinds has (set away from their defaults)."""
    rk, sk = get_kind(ref.kind), get_kind(side.kind)
    ref_fields = {f.name for f in dataclasses.fields(rk.options)}
    out: list[Factor] = []
    for f in dataclasses.fields(sk.options):
        sv = effective(cfg, side, f.name, model, on_gpu)
        if f.name in ref_fields:
            rv = effective(cfg, ref, f.name, model, on_gpu)
            if rv != sv:
                out.append(Factor(key=f.name, reference=rv, side=sv, resolved_key=option_row(f.name)))
        elif _flip_to(f) is not NO_FLIP and sv != _flip_to(f):
            out.append(
                Factor(
                    key=f.name,
                    reference=_flip_to(f),
                    side=sv,
                    resolved_key=option_row(f.name),
                    engine_only=True,
                    note=f"only {sk.name} has it ({rk.name} does not): flipped to "
                    f"{show_value(_flip_to(f))}, {f.metadata.get('flip_why') or 'its plain value'}",
                )
            )
    models = [s.model or model.path for s in (ref, side)]
    if models[0] != models[1]:
        out.append(Factor(key="model", reference=models[0], side=models[1], resolved_key="model"))
    if ref.python != side.python:
        out.append(
            Factor(
                key="python",
                reference=ref.python or "this environment",
                side=side.python or "this environment",
                resolved_key="environment",
                note="the interpreter as a whole: its installed vLLM, transformers and torch",
            )
        )
    fixed: list[Factor] = []
    if rk.name != sk.name:
        only = [f"{side.name}: {k}={v}" for k, v in _kind_only(side, ref_fields).items()]
        side_fields = {f.name for f in dataclasses.fields(sk.options)}
        only += [f"{ref.name}: {k}={v}" for k, v in _kind_only(ref, side_fields, flippable=True).items()]
        fixed.append(
            Factor(
                key="engine",
                reference=f"{rk.name} ({rk.label})",
                side=f"{sk.name} ({sk.label})",
                flippable=False,
                resolved_key="engine",
                note="another kind of engine cannot be flipped"
                + (f"; with it the options only one kind has: {', '.join(only)}" if only else ""),
            )
        )
    return out, fixed


def _flip_to(f: dataclasses.Field) -> Any:
    return f.metadata.get("flip_to", NO_FLIP)


def _kind_only(spec: SideSpec, other_fields: set[str], flippable: bool = False) -> dict[str, Any]:
    """A side's options that the other kind lacks, where set away from their defaults (those a bisect
    flips, with a flip_to, left out unless `flippable`: they are factors of their own)."""
    mine, defaults = spec.all_options(), dataclasses.asdict(type(spec.options)())
    return {
        f.name: mine[f.name]
        for f in dataclasses.fields(spec.options)
        if f.name not in other_fields and mine[f.name] != defaults[f.name] and (flippable or _flip_to(f) is NO_FLIP)
    }


def check_flip(f: Factor, trial: SideInfo | None, ref: SideInfo | None, side: SideInfo | None) -> FlipCheck:
    """Whether flipping `f` showed in the trial side's resolved settings: APPLIED (now the reference's
    value, or not reported on either), NOT_APPLIED (still the side's own), NOT_SHOWN (its engine does
    not report it), NO_VISIBLE_DIFFERENCE (the stored sides resolved it alike already), OTHER."""
    key = f.resolved_key
    got, want, was = reported(trial, key), reported(ref, key), reported(side, key)
    label = f"{f.key} (resolved as {key!r})" if key and key != f.key else f.key
    asked, own = show_value(f.reference), show_value(f.side)
    if got is None and want is None and was is not None:
        return FlipCheck(f.key, APPLIED, f.reference, None, f"{label}: not reported, as on the reference")
    if got is None:
        return FlipCheck(
            f.key,
            NOT_SHOWN,
            f.reference,
            None,
            f"{label} was flipped to {asked}, but the engine's resolved settings do not show it: "
            "whether it took effect cannot be checked",
        )
    if want is not None and was is not None and want == was:
        return FlipCheck(
            f.key,
            NO_VISIBLE_DIFFERENCE,
            f.reference,
            got,
            f"{label}: the stored run's sides resolved it alike ({want!r}) although they asked "
            f"{asked} and {own}: the side's own setting did not take effect (or means the same here), "
            "so flipping it changes nothing visible",
        )
    if want is not None and got == want:
        return FlipCheck(f.key, APPLIED, f.reference, got, f"{label}: now {got!r}, as on the reference")
    if was is not None and got == was:
        return FlipCheck(
            f.key,
            NOT_APPLIED,
            f.reference,
            got,
            f"{label} was flipped to {asked}, but the trial side still resolved its own "
            f"{got!r} (the reference: {want!r}): the flip did not take effect",
        )
    if want is None:  # another kind's reference does not report it: the side's value moved, as asked
        return FlipCheck(f.key, APPLIED, f.reference, got, f"{label}: now {got!r} (was {was!r})")
    return FlipCheck(
        f.key,
        OTHER,
        f.reference,
        got,
        f"{label} was flipped to {asked}; the trial side resolved {got!r}, the reference {want!r}",
    )
