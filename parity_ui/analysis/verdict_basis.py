"""What a verdict against the noise floor rests on, in words: the figure that decided it, its value,
the floor's, and the factor's interval.

A verdict is "exceeds noise" when ANY figure exceeds the floor, so a headline that shows one figure
beside a verdict another figure decided reads as if the shown one were over the floor (issue 46
item 2: "ρ outside [0.8, 1.2] 0.9% (exceeds noise)" while that share sat at the floor's 0.87%, the
mean log-ratio k1 deciding). Every one-line verdict names the deciding figure through here.
Pure: reads a FloorVerdict (parity_ui.core.pooled).
"""

from __future__ import annotations

import math

from ..core.figures import display_name
from ..core.pooled import EXCEEDS, NOT_IDENTICAL, TOO_FEW, FigureCheck, FloorVerdict, factor_text


def _size(c: FigureCheck) -> float:
    """How far over the floor a check is, to pick the one to name first (an infinite factor, over a
    zero floor, first)."""
    if c.factor is None:
        return -math.inf
    return c.factor / c.limit


def deciding(v: FloorVerdict) -> list[FigureCheck]:
    """The checks that decided the verdict, the furthest over its limit first: those that exceed
    ("exceeds noise"), else those over the limit within sampling error ("too few prompts to tell");
    none for "within noise" or "not comparable"."""
    if v.verdict == EXCEEDS:
        picked = [c for c in v.figures if c.exceeds]
    elif v.verdict == TOO_FEW:
        picked = [c for c in v.figures if c.uncertain]
    else:
        return []
    return sorted(picked, key=_size, reverse=True)


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def figure_text(v: FloorVerdict, c: FigureCheck) -> str:
    """One check: "|mean log-ratio (k1)| 0.00172 vs the floor's 5e-05 (34.4x, 95% interval 12x–80x)"."""
    if c.name == NOT_IDENTICAL and v.identical.side_share is not None and v.identical.floor_share is not None:
        i = v.identical
        ci = (
            f" [{i.side_ci.low:.3g}, {i.side_ci.high:.3g}] vs [{i.floor_ci.low:.3g}, {i.floor_ci.high:.3g}], 95% Wilson"
            if i.side_ci and i.floor_ci
            else ""
        )
        return f"share identical {i.side_share:.3g} vs the floor's {i.floor_share:.3g}{ci}"
    return f"{display_name(c.name)} {_num(c.side)} vs the floor's {_num(c.floor)} ({factor_text(c)})"


def verdict_basis(v: FloorVerdict | None) -> str:
    """The verdict and what decided it, for a one-line headline:
    "exceeds noise on |mean log-ratio (k1)| 0.00172 vs the floor's 5e-05 (34.4x, ...) and 2 more",
    "too few prompts to tell on ...", "within noise"; "" without a verdict."""
    if v is None:
        return ""
    picked = deciding(v)
    if not picked:
        return v.verdict
    more = f" and {len(picked) - 1} more figure{'s' if len(picked) > 2 else ''}" if len(picked) > 1 else ""
    return f"{v.verdict} on {figure_text(v, picked[0])}{more}"
