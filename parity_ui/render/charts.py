"""What every chart of a workload's view shares: a color per side (the floor gray), the figure sets
in column order, a side's legend label, and the SVG frame (axes, ticks, legend). Pure: a report in,
strings out; used by render.workload and the measures' sections (render.sections)."""

from __future__ import annotations

from ..core.workload_record import SideFigures, WorkloadReport
from .markup import esc

FLOOR_COLOR = "#64748b"
SIDE_COLORS = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#be123c")


def side_colors(report: WorkloadReport) -> dict[str, str]:
    """A color per compared side, the floor gray: the same in every chart of the view."""
    out = {name: SIDE_COLORS[i % len(SIDE_COLORS)] for i, name in enumerate(report.sides)}
    if report.floor_figures is not None:
        out[report.floor_figures.side] = FLOOR_COLOR
    return out


def figure_sets(report: WorkloadReport) -> list[SideFigures]:
    """Every side's figures, then the floor's (when there is one)."""
    return [*report.sides.values(), *([report.floor_figures] if report.floor_figures else [])]


def label(report: WorkloadReport, name: str) -> str:
    """A side's name in a legend: the floor is called what it is."""
    return "floor (reference vs itself)" if report.floor_figures and name == report.floor_figures.side else name


def svg_frame(
    width: int,
    height: int,
    title: str,
    xlabel: str,
    ylabel: str,
    body: str,
    legend: list[tuple[str, str, bool]],
    xticks: list[tuple[float, str]],
    yticks: list[tuple[float, str]],
) -> str:
    ticks = "".join(
        f'<text x="{x:.1f}" y="{height - 22}" font-size="10" text-anchor="middle">{esc(t)}</text>' for x, t in xticks
    )
    ticks += "".join(
        f'<text x="40" y="{y + 3:.1f}" font-size="10" text-anchor="end">{esc(t)}</text>'
        f'<line x1="44" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
        for y, t in yticks
    )
    dash = ' stroke-dasharray="4 3"'
    keys = "".join(
        f'<g transform="translate({60 + 170 * i},14)"><line x1="0" x2="18" y1="-4" y2="-4" stroke="{c}" '
        f'stroke-width="2"{dash if dashed else ""}/><text x="22" y="0" '
        f'font-size="11">{esc(n)}</text></g>'
        for i, (n, c, dashed) in enumerate(legend)
    )
    return (
        f'<svg class="wl-svg" width="{width}" height="{height}" role="img" aria-label="{esc(title)}">'
        f"<title>{esc(title)}</title>{ticks}{keys}{body}"
        f'<text x="{width / 2:.0f}" y="{height - 6}" font-size="11" text-anchor="middle">{esc(xlabel)}</text>'
        f'<text x="10" y="{height / 2:.0f}" font-size="11" transform="rotate(-90 10 {height / 2:.0f})" '
        f'text-anchor="middle">{esc(ylabel)}</text></svg>'
    )
