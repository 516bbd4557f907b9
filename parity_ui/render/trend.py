"""A run's trend over its steps for people (core.trend.TrendReport): the terminal table and the
follow mode's line per step (the CLI), and the HTML section the app's History and the static report
show: one small chart per plotted figure over the steps (inline SVG, log scale for the figures that
span decades), the jump marked, every point and every row of the steps table a link that opens that
step's replay (`?run=ID`). Pure functions of the record: nothing is read here.
"""

from __future__ import annotations

import json
import math

from ..core.trend import PLOTTED, TREND_FIGURES, TrendReport, TrendStep, trend_figure
from ..core.types import Run
from .cards import esc

# The CLI table's figure columns (the rest are in --json and the app's table).
TABLE: tuple[str, ...] = (
    "k3",
    "outside_0.8_1.2",
    "outside_0.99_1.01",
    "rho_clipped_share",
    "rho_low_share",
    "abs_dlogp_p99",
    "abs_dlogp_max",
)
SHORT = {
    "k3": "KL k3",
    "outside_0.8_1.2": "ρ∉[.8,1.2]",
    "outside_0.99_1.01": "ρ∉[.99,1.01]",
    "rho_clipped_share": "ρ>2 clip",
    "rho_low_share": "ρ<0.5",
    "abs_dlogp_p99": "|Δ| p99",
    "abs_dlogp_max": "|Δ| max",
}


def _fmt(key: str, x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    f = trend_figure(key)
    if f.kind == "share":
        return f"{100 * x:.2f}%"
    return format(x + 0.0, ".3g")


def _versions(step: TrendStep) -> str:
    if len(step.versions) < 2:
        return ""
    return " versions " + ", ".join(
        f"{v}: {s.rows} rows k3 {_fmt('k3', s.figures.get('k3'))}" for v, s in step.versions.items()
    )


def step_line(step: TrendStep) -> str:
    """The follow mode's line for one step as it lands (and the table's row, unpadded)."""
    if step.status in ("skipped", "error"):
        return f"step {step.step}: {step.status}: {step.note or ''}".rstrip(": ")
    figs = step.figures.figures
    cells = " ".join(f"{SHORT[k]} {_fmt(k, figs.get(k))}" for k in TABLE)
    landed = f", {step.landed_s:.1f}s after it landed" if step.landed_s is not None else ""
    note = f" ({step.note})" if step.note else ""
    return (
        f"step {step.step}: {step.figures.rows} rows, {step.figures.tokens:,} tokens: {cells}"
        f" [run {step.run_id}{landed}]{note}{_versions(step)}"
    )


def step_json(step: TrendStep, report: TrendReport) -> str:
    """The follow mode's JSON line for one step (what a training script reads): the step, its status,
    figures and run, and the gate's breach when this step failed it."""
    breach = report.breach if report.breach and report.breach.get("step") == step.step else None
    return json.dumps(
        {
            "step": step.step,
            "status": step.status,
            "run_id": step.run_id,
            "rows": step.figures.rows,
            "tokens": step.figures.tokens,
            "figures": step.figures.figures,
            "note": step.note,
            "landed_s": step.landed_s,
            "breach": breach,
        },
        allow_nan=False,
        default=str,
    )


def breach_line(report: TrendReport) -> str:
    """The line a training script greps for: the gate failed, at which step, on what."""
    b = report.breach or {}
    value = b.get("value")
    said = (
        f"{b.get('figure')} not measured at this step: a gate that cannot measure fails"
        if value is None or value != value  # None, or NaN
        else f"{b.get('figure')} = {_fmt(b.get('figure', 'k3'), value)}"
    )
    return f"PARITY GATE FAILED at step {b.get('step')}: {b.get('rule')} ({said})"


def trend_text(report: TrendReport, run_id: str | None = None) -> str:
    """The CLI's screen: one row per step, the jumps named, what was left out, the gate."""
    head = ["step", "rows", "tokens", *(SHORT[k] for k in TABLE), "run"]
    rows = []
    for s in report.steps:
        if s.status in ("skipped", "error"):
            rows.append([str(s.step), "", "", *([""] * len(TABLE)), f"{s.status}: {s.note or ''}"])
            continue
        figs = s.figures.figures
        mark = " *" if any(c.step == s.step for c in report.changes) else ""
        rows.append(
            [
                str(s.step) + mark,
                str(s.figures.rows),
                f"{s.figures.tokens:,}",
                *(_fmt(k, figs.get(k)) for k in TABLE),
                (s.run_id or "") + (f" ({s.status})" if s.status != "ok" else ""),
            ]
        )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(r, widths)) + "  " + r[-1]

    out = [
        f"Trend of {report.root} ({report.format}; {report.pair or 'no pair yet'}; "
        + ("recorded only, no engine" if report.mode == "recorded" else "replayed with engines")
        + (f"; trend run {run_id}" if run_id else "")
        + ")",
        "",
        line(head),
        *(line(r) for r in rows),
        "",
    ]
    if report.changes:
        out.append("Where it jumps (* in the table):")
        out += [f"  {c.sentence()}" for c in report.changes]
    else:
        out.append("No jump: no figure moves by more than the steps' own spread.")
    for s in report.steps:
        v = _versions(s)
        if v:
            out.append(f"  step {s.step}:{v}")
    if report.findings:
        out.append("Findings:")
        out += [f"  {f}" for f in report.findings]
    if report.gate:
        rules = ", ".join(r.text() for r in report.gate)
        out.append(breach_line(report) if report.breach else f"Gate passed: {rules}")
    out.append(
        "Open a step's replay: parity runs show RUN (its worst tokens: parity report RUN), or in the app's History."
    )
    return "\n".join(out)


# -- HTML ---------------------------------------------------------------------------------------------


def _chart(report: TrendReport, key: str, width: int = 300, height: int = 150) -> str:
    steps, values = report.series(key)
    pts = [
        (s, float(v), report.step(s))
        for s, v in zip(steps, values)
        if v is not None and not (isinstance(v, float) and math.isnan(v))
    ]
    f = trend_figure(key)
    if not pts:
        return ""
    log = (f.unit == "nats" or key == "k3") and all(v >= 0 for _, v, _ in pts)

    def y_of(v: float) -> float:
        return math.log10(max(v, 1e-12)) if log else v

    ys = [y_of(v) for _, v, _ in pts]
    lo, hi = min(ys), max(ys)
    if hi - lo < 1e-12:  # a flat series: a band around it (never below 0 for a figure that is not)
        pad = 0.5 if log else max(abs(hi) * 0.1, 1e-9)
        lo, hi = (lo - pad if log or lo - pad >= 0 or lo < 0 else 0.0), hi + pad
    s_lo, s_hi = min(s for s, _, _ in pts), max(s for s, _, _ in pts)
    x0, x1, y0, y1 = 64.0, width - 10.0, 22.0, height - 26.0

    def xy(s: int, v: float) -> tuple[float, float]:
        x = x0 + (x1 - x0) * ((s - s_lo) / (s_hi - s_lo) if s_hi > s_lo else 0.5)
        return x, y1 - (y1 - y0) * (y_of(v) - lo) / (hi - lo)

    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(s, v) for s, v, _ in pts))
    dots = []
    for s, v, step in pts:
        x, y = xy(s, v)
        tip = f"step {s}: {f.name} {_fmt(key, v)}"
        dot = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#3b6fb6"><title>{esc(tip)}</title></circle>'
        if step is not None and step.run_id:
            dot = f'<a href="?run={esc(step.run_id)}" class="tr-step" data-run="{esc(step.run_id)}">{dot}</a>'
        dots.append(dot)
    marks = ""
    change = next((c for c in report.changes if c.figure == key), None)
    if change is not None:
        x, _ = xy(change.step, pts[0][1])
        marks = (
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0}" y2="{y1}" stroke="#c0392b" stroke-dasharray="4 3"/>'
            f'<text x="{x + 3:.1f}" y="{y0 + 9:.1f}" font-size="10" fill="#c0392b">jump</text>'
        )
    ticks = "".join(
        f'<text x="{xy(s, pts[0][1])[0]:.1f}" y="{height - 10}" font-size="10" text-anchor="middle">{s}</text>'
        for s in sorted({s for s, _, _ in pts})[:: max(1, len(pts) // 8)]
    )
    ylab = f'<text x="{x0 - 4}" y="{y0 + 4:.1f}" font-size="10" text-anchor="end">{esc(_tick(hi, log, key))}</text>'
    ylab += f'<text x="{x0 - 4}" y="{y1:.1f}" font-size="10" text-anchor="end">{esc(_tick(lo, log, key))}</text>'
    title = f"{f.name} over the steps" + (" (log scale)" if log else "")
    return (
        f'<svg class="wl-svg tr-chart" data-figure="{esc(key)}" width="{width}" height="{height}" role="img" '
        f'aria-label="{esc(title)}"><title>{esc(title)}</title>'
        f'<text x="{x0}" y="12" font-size="11">{esc(f.name)}{" (log)" if log else ""}</text>{ylab}{ticks}'
        f'<polyline fill="none" stroke="#3b6fb6" stroke-width="1.5" points="{line}"/>{marks}{"".join(dots)}</svg>'
    )


def _tick(y: float, log: bool, key: str) -> str:
    return _fmt(key, 10**y) if log else _fmt(key, y)


def trend_html(report: TrendReport, run_id: str | None = None, figures: tuple[str, ...] = PLOTTED) -> str:
    """The trend's section: what was read, the jumps, the charts, the steps table (each step opens its
    replay), what was left out and the gate."""
    facts = [
        f"{len(report.steps)} steps of {report.root} ({report.format}); the pair: {report.pair or 'none yet'}; "
        + ("recorded only: no engine loaded" if report.mode == "recorded" else "each step replayed with engines")
    ]
    if report.follow:
        facts.append("followed as the steps landed")
    jumps = "".join(f"<li><b>{esc(c.sentence())}</b></li>" for c in report.changes) or (
        "<li>No jump: no figure moves by more than the steps' own spread.</li>"
    )
    charts = "".join(_chart(report, k) for k in figures)
    head = "".join(
        f"<th title='{esc(trend_figure(k).meaning)}'>{esc(trend_figure(k).name)}</th>" for k in TREND_FIGURES
    )
    body = []
    for s in report.steps:
        link = f'<a href="?run={esc(s.run_id)}" data-run="{esc(s.run_id)}">{esc(s.run_id)}</a>' if s.run_id else ""
        cells = "".join(f"<td>{esc(_fmt(k, s.figures.figures.get(k)))}</td>" for k in TREND_FIGURES)
        cls = " class='div'" if any(c.step == s.step for c in report.changes) else ""
        body.append(
            f"<tr{cls} data-step='{s.step}'><td>{s.step}</td><td>{esc(s.status)}</td><td>{s.figures.rows}</td>"
            f"<td>{s.figures.tokens:,}</td>{cells}<td>{link}</td><td>{esc(s.note or '')}</td></tr>"
        )
    findings = "".join(f"<li>{esc(f)}</li>" for f in report.findings)
    gate = ""
    if report.gate:
        gate = (
            f"<p class='div'><b>{esc(breach_line(report))}</b></p>"
            if report.breach
            else f"<p>Gate passed: {esc(', '.join(r.text() for r in report.gate))}</p>"
        )
    return (
        f'<div class="tr-view" data-run="{esc(run_id or "")}"><h3>Trend over the steps</h3>'
        f'<ul class="rp-facts">{"".join(f"<li>{esc(x)}</li>" for x in facts)}</ul>'
        f'<ul class="tr-jumps">{jumps}</ul>{gate}<div class="tr-charts">{charts}</div>'
        f"<p class=\"pc-muted\">A point or a step's run opens that step's replay.</p>"
        f'<div class="wl-scroll"><table class="wl-table tr-steps"><thead><tr><th>step</th><th>status</th>'
        f"<th>rows</th><th>tokens</th>{head}<th>replay</th><th>note</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
        + (f'<h4>Findings</h4><ul class="pc-muted">{findings}</ul>' if findings else "")
        + "</div>"
    )


def trend_page(report: TrendReport, run: Run) -> str:
    """The static report of a trend run: one self-contained page."""
    import html

    from .assets import CSS, JS

    title = f"parity-ui trend {run.id}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>body{{font-family:system-ui,sans-serif;margin:24px;}}{CSS}</style>{JS}</head><body>"
        f"<h2>{html.escape(title)}</h2>{trend_html(report, run.id)}</body></html>"
    )
