"""The distribution measure's section (full_distribution=true): a comparison's whole-distribution line,
each side's per-position columns in `--json`, a workload's distribution family (figures table rows,
its verdict) and the KL(ref‖side) chart."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.distribution import DISTRIBUTION_COLUMNS, KL_DECADES
from ...core.figures import DISTRIBUTION_ROWS, FIGURES
from ...core.measures import DISTRIBUTION, FULL_ROWS
from ...core.pooled import WorkloadStats
from ...core.types import Comparison, SideResult, step_column
from ...core.workload_record import SideFigures, WorkloadReport
from ..charts import figure_sets, label, side_colors, svg_frame
from ..markup import esc
from .base import Row, Section, family_rows, family_text_rows


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


class DistributionSection(Section):
    key = FULL_ROWS.key
    title = FULL_ROWS.title

    def comparison_lines(self, c: Comparison) -> list[str]:
        return [f"    {distribution_line(c)}"] if DISTRIBUTION.of(c) else []

    def stream_json(self, res: SideResult) -> dict[str, Any]:
        # The whole distribution against the reference per position; absent when not recorded.
        if any(x is not None for x in step_column(res.steps, "kl")):
            return {"distribution": {name: step_column(res.steps, name) for name in DISTRIBUTION_COLUMNS}}
        return {}

    def text_rows(self, stats: Sequence[WorkloadStats]) -> list[tuple[str, list[str]]]:
        return family_text_rows(stats, self.key, DISTRIBUTION_ROWS, "positions", "positions, full rows met")

    def html_rows(self, sets: Sequence[SideFigures], row: Row) -> list[str]:
        return family_rows(sets, row, self.key, DISTRIBUTION_ROWS, self.title, "positions", "positions compared")

    def html_extra(self, report: WorkloadReport) -> str:
        return kl_svg_html(report)


def distribution_line(c: Comparison) -> str:
    """One line for the CLI summary: a comparison's whole-distribution figures (full_distribution), by
    display name."""
    d = DISTRIBUTION.of(c)
    assert d is not None
    keys = ("kl_mean", "kl_max", "kl_rev_mean", "tv_mean", "tv_max", "top1_agree", "topk_contained")
    figs = ", ".join(f"{FIGURES[k].name} {FIGURES[k].format(d.get(k))}" for k in keys)
    return f"full distribution ({d.generator}'s tokens, rows met by {d.scorer}, {d.positions} positions): {figs}"


def kl_svg_html(report: WorkloadReport, width: int = 560, height: int = 220) -> str:
    """The KL(ref‖side) distribution (full_distribution): each side's and the floor's (dashed) share of
    positions per decade of KL, exact zeros in the legend; "" when no side recorded it."""
    sets = [f for f in figure_sets(report) if (f.stats.family("distribution") or {}).get("kl_decades")]
    if not sets:
        return ""
    colors = side_colors(report)
    lo, hi = KL_DECADES
    shares = {}
    for f in sets:
        d = f.stats.family("distribution") or {}
        n = sum(d["kl_decades"].values()) or 1
        shares[f.side] = (
            [d["kl_decades"].get(str(e), 0) / n for e in range(lo, hi + 1)],
            d["kl_decades"].get("0", 0) / n,
        )
    top = max(max(s) for s, _ in shares.values()) or 1.0
    x0, x1, y0, y1 = 46.0, width - 12.0, 26.0, height - 36.0

    def xy(x: float, s: float) -> str:
        return f"{x0 + (x1 - x0) * (x - lo) / (hi + 1 - lo):.1f},{y1 - (y1 - y0) * s / top:.1f}"

    lines, legend = [], []
    for f in sets:
        per, zero = shares[f.side]
        pts = [xy(lo, 0.0)]
        for e, s in zip(range(lo, hi + 1), per):
            pts += [xy(e, s), xy(e + 1, s)]
        pts.append(xy(hi + 1, 0.0))
        floor = f.side == (report.floor.side or "")
        dash = ' stroke-dasharray="5 4"' if floor else ""
        lines.append(
            f'<polyline fill="none" stroke="{colors[f.side]}" stroke-width="1.6"{dash} '
            f'points="{" ".join(pts)}" data-side="{esc(f.side)}"/>'
        )
        legend.append((label(report, f.side) + (f" ({_pct(zero)} exactly 0)" if zero else ""), colors[f.side], floor))
    xticks = [(x0 + (x1 - x0) * (e - lo) / (hi + 1 - lo), f"1e{e}") for e in range(lo, hi + 1, 2)]
    yticks = [(y1 - (y1 - y0) * s / top, f"{100 * s:.1f}%") for s in (0, top / 2, top)]
    return svg_frame(
        width,
        height,
        "KL(ref‖side) per position, each side against the floor",
        "KL(ref‖side) (nats, per decade)",
        "share of positions",
        "".join(lines),
        legend,
        xticks,
        yticks,
    )
