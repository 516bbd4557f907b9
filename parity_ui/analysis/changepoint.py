"""Where a figure jumps over a run's steps: one change-point in the mean, found by the split that leaves
the least spread within the two parts (the least squares split of binary segmentation), and judged by
its size against the spread of the steps themselves.

For a series x_1..x_n (steps in order; steps without the figure left out) every split k with at least
MIN_BEFORE steps before it is tried; the best k minimises SSE(x_<k) + SSE(x_>=k). The jump is named
when |mean after − mean before| is at least Z spreads, the spread being the pooled standard deviation
of the two parts, floored so that tiny series do not make noise look sure:
- figures spanning decades (KL, |Δlogprob| quantiles: positive, their noise multiplicative) are split
  on log10 of their values (below LOG_ZERO: zero), with a floor of LOG_FLOOR decades (a factor ~1.4);
- shares (ρ bands, the clip's share, routes differing) on their values, with a floor of SHARE_FLOOR and
  REL_FLOOR of the level;
- the rest (ratios ρ) on their values with REL_FLOOR of the level.
The size and the means are reported in the figure's own units ("from 2.1e-12 over the steps before to
7.3e-03"), and the score in spreads. A slow drift has no single jump: its best split scores low.

Pure: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..core.trend import ChangePoint, trend_figure

MIN_BEFORE = 2  # steps a baseline needs before a jump can be named
Z = 4.0  # spreads a jump must span
LOG_FLOOR = 0.15  # decades
LOG_ZERO = 1e-12  # a log-scale figure below this is zero (float32 rounding of a logprob is ~1e-7)
SHARE_FLOOR = 0.002  # 0.2 percentage points
REL_FLOOR = 0.05  # of the level
TINY = 1e-300


def _scale(figure: str) -> str:
    f = trend_figure(figure)
    if f.kind == "share":
        return "share"
    if f.unit == "nats" or figure == "k3":
        return "log"
    return "linear"


def _sse(xs: Sequence[float]) -> float:
    if not xs:
        return 0.0
    m = math.fsum(xs) / len(xs)
    return math.fsum((x - m) ** 2 for x in xs)


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def find_change(
    figure: str, steps: Sequence[int], values: Sequence[float | None], *, min_before: int = MIN_BEFORE, z: float = Z
) -> ChangePoint | None:
    """The step where `figure` jumps, or None (too few steps, or no split spans Z spreads)."""
    pts = [
        (s, float(v)) for s, v in zip(steps, values) if v is not None and not (isinstance(v, float) and math.isnan(v))
    ]
    if len(pts) < min_before + 1:
        return None
    scale = _scale(figure)
    raw = [v for _, v in pts]
    xs = [math.log10(max(v, LOG_ZERO)) for v in raw] if scale == "log" and min(raw) >= 0 else raw
    if scale == "log" and min(raw) < 0:
        scale = "linear"
    n = len(xs)
    best_k, best_sse = None, math.inf
    for k in range(min_before, n):
        sse = _sse(xs[:k]) + _sse(xs[k:])
        if sse < best_sse:  # the earliest of equal splits
            best_k, best_sse = k, sse
    if best_k is None:
        return None
    a, b = xs[:best_k], xs[best_k:]
    ma, mb = _mean(a), _mean(b)
    pooled = math.sqrt(best_sse / (n - 2)) if n > 2 else 0.0
    if scale == "log":
        floor = LOG_FLOOR
    elif scale == "share":
        floor = max(SHARE_FLOOR, REL_FLOOR * max(abs(ma), abs(mb)))
    else:
        floor = REL_FLOOR * max(abs(ma), abs(mb), TINY)
    spread = max(pooled, floor)
    score = abs(mb - ma) / spread
    if score < z:
        return None
    before, after = _mean(raw[:best_k]), _mean(raw[best_k:])
    return ChangePoint(
        figure=figure,
        step=pts[best_k][0],
        before=before,
        after=after,
        size=after - before,
        ratio=after / before if before != 0 else None,
        score=score,
    )


def find_changes(
    series: dict[str, tuple[Sequence[int], Sequence[float | None]]], figures: Sequence[str]
) -> list[ChangePoint]:
    """Each watched figure's change-point, earliest step first (ties: the order of `figures`)."""
    out = []
    for f in figures:
        if f in series:
            cp = find_change(f, *series[f])
            if cp is not None:
                out.append(cp)
    order = {f: i for i, f in enumerate(figures)}
    return sorted(out, key=lambda c: (c.step, order[c.figure]))
