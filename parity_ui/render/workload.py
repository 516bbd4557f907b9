"""A workload run for people: its card (status, headline, each side's verdict against the floor),
the figures table (each side next to the floor), the sortable prompt table, and, for the static
report, the survival curve and the |dlogp| histograms as inline SVG. Pure functions over a stored
run's header (its WorkloadReport) and its pair rows (store.pair_rows): no logprob is read here.
Shared by the app (parity_ui.ui.workload_view) and the static report (parity_ui.render.report).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..core.cluster import describe_record
from ..core.figures import BAND_KEYS, CHECK_OF_ROW, FIGURE_ROWS, FIGURES, LEGEND, count
from ..core.pooled import EXCEEDS, NOT_IDENTICAL, TOO_FEW, WITHIN, FigureCheck, FloorVerdict, factor_text
from ..core.types import Run
from ..core.workload_record import DlogpHistogram, SideFigures, WorkloadReport
from .cards import error_html, esc, finish_card, split_fix
from .charts import figure_sets, label, side_colors, svg_frame
from .sections import SECTIONS

# Sort keys of a prompt's first divergence that is not a position: identical ones sort after every
# fork (ascending: the earliest forks first), a fork at an unknown position just before them.
IDENTICAL_KEY, UNKNOWN_KEY = 1e12, 1e11
EXCERPT_CHARS = 90
# Rows the prompt table holds at most: ~0.4 kB of HTML each, sorted in the page. A larger workload
# lists its first ones (the CLI opens any prompt: parity runs show RUN --prompt N).
MAX_TABLE_ROWS = 10_000
# Rows the app's prompt table lays out at once (#33 item 6): the rest wait in a <template> (parsed, not
# laid out) and the page's script moves them in 200 at a time as the table is scrolled near its end; a
# sort orders them all and keeps laid out only as many as were. 1,000 rows laid out in one go took the
# page 0.35-0.6 s on 2 busy cores before the view could be used (and after each sort).
EAGER_TABLE_ROWS = 100

# The figures table's rows (FIGURE_ROWS) and the floor check that judges each (CHECK_OF_ROW) are
# core.figures', shared with the CLI screen.


def _g(x: float | None, fmt: str = ".3g") -> str:
    return "–" if x is None else format(x + 0.0, fmt)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def resumable(run: Run) -> bool:
    """A stopped, failed or interrupted workload with prompts left to do."""
    w = run.workload
    return (
        w is not None
        and run.status in ("cancelled", "error", "interrupted")
        and w.done + len(w.skipped_too_long) < w.n_prompts
    )


# -- the card ---------------------------------------------------------------------------------------


def badge_html(run: Run) -> str:
    """The run's state in a word: against the floor when it finished, else how it ended."""
    cls, text = {
        "running": ("cancel", "RUNNING"),
        "cancelled": ("cancel", "STOPPED"),
        "interrupted": ("cancel", "INTERRUPTED"),
        "error": ("err", "ERROR"),
    }.get(run.status, ("", ""))
    if not text:
        w = run.workload
        within = w.within_noise if w is not None else None
        if w is not None and w.too_few_to_tell:
            cls, text = "cancel", "TOO FEW PROMPTS TO TELL"
        elif within is True:  # a replay forces the same tokens on every side: never "identical"
            # (within is True only with a report: w is not None here)
            cls, text = "ok", "WITHIN NOISE" if not run.identical or (w is not None and w.replay) else "IDENTICAL"
        elif within is False:
            cls, text = "div", "EXCEEDS NOISE"
        elif w is not None and w.replay:
            cls, text = "", "REPLAYED, NO FLOOR"
        else:
            cls, text = ("ok", "IDENTICAL") if run.identical else ("div", "DIVERGED")
    return f'<span class="pc-badge {cls}">{text}</span>'


def check_rows(v: FloorVerdict) -> str:
    """The figures over the floor (or, too few prompts to tell, over it within sampling error), the
    largest factor first: figure, side, floor, factor with its 95% interval over the prompts."""
    over = sorted(
        (c for c in v.figures if c.exceeds or c.uncertain),
        key=lambda c: -(c.factor if c.factor is not None else math.inf),
    )
    rows = []
    for c in over:
        if c.name == NOT_IDENTICAL and (i := v.identical).side_ci and i.floor_ci:
            side = f"{_pct(i.side_share)} identical [{_pct(i.side_ci.low)}–{_pct(i.side_ci.high)}]"
            floor = f"{_pct(i.floor_share)} [{_pct(i.floor_ci.low)}–{_pct(i.floor_ci.high)}]"
            factor = "95% intervals apart"
        else:
            side, floor = _g(c.side), _g(c.floor)
            factor = factor_text(c) + ("" if c.exceeds else " (reaches the limit: too few prompts to tell)")
        f = FIGURES.get(c.name)
        name = f.name if f else c.name
        tip = f' title="{esc(f.meaning)}"' if f else ""
        rows.append(
            f"<tr><th{tip}>{esc(name)}</th><td>{esc(side)}</td><td>{esc(floor)}</td><td>{esc(factor)}</td></tr>"
        )
    if not rows:
        return ""
    return (
        '<table class="pc-setting-table wl-checks"><tr><th>figure over the floor</th><th>side</th><th>floor</th>'
        f"<th>factor (95% interval over the prompts)</th></tr>{''.join(rows)}</table>"
    )


def verdicts_html(report: WorkloadReport) -> str:
    """Per side: within the reference's noise or not, and the figures that exceed it with their factors."""
    out = []
    for name, f in report.sides.items():
        v = f.verdict
        if v is None:
            out.append(
                f'<div class="wl-verdict" data-side="{esc(name)}"><b>{esc(name)}</b>: no floor to judge '
                f"against ({_pct(f.stats.sequences.share_identical)} of prompts identical)</div>"
            )
            continue
        cls = {WITHIN: "ok", EXCEEDS: "div", TOO_FEW: "cancel"}.get(v.verdict, "")
        n = f" over {count(v.prompts, 'prompt')}" if v.prompts else ""
        word = {
            WITHIN: "within the reference's noise",
            EXCEEDS: "EXCEEDS the reference's noise",
            TOO_FEW: f"too few prompts to tell{n}: over the {v.tolerance:g}x limit, but within sampling error "
            "(run more prompts)",
        }.get(v.verdict, v.verdict)
        out.append(
            f'<div class="wl-verdict {cls}" data-side="{esc(name)}" data-verdict="{esc(v.verdict)}">'
            f"<b>{esc(name)}</b>: {esc(word)}"
            f"{'' if v.verdict in (EXCEEDS, TOO_FEW) else f' <span class=pc-muted>({esc(v.summary)})</span>'}"
            f"{check_rows(v)}</div>"
        )
    return "".join(out)


def workload_card_html(run: Run, reveal: bool = False) -> str:
    """The card a workload opens with: state, headline, how it ran, each side's verdict, the sides
    and settings, the findings and the run's link."""
    w = run.workload
    sides = " · ".join(esc(s.name) + (" (ref)" if s.reference else "") for s in run.sides)
    meta = (
        [f"model <b>{esc(run.model.name)}</b>", f"sides {sides}"]
        if run.sides
        else [f"model <b>{esc(run.model.name)}</b>"]
    )
    body = [f'<div class="pc-head">{badge_html(run)}<span class="pc-meta">{" · ".join(meta)}</span></div>']
    if run.status in ("error", "cancelled", "interrupted") and run.error:
        msg, fix = split_fix(run.error)
        title = {"error": "Run failed", "cancelled": "Run stopped", "interrupted": "Run interrupted"}[run.status]
        body.append(error_html(msg, fix, title))
    if w is not None:
        body.append(f'<div class="wl-headline">{esc(w.headline)}</div>')
        opts = w.options
        how = [f"mode {esc(opts.mode)}", f"floor: {esc(w.floor.description)}"]
        src = opts.source.get("description") or opts.source.get("path")
        if src:
            how.append(f"source: {esc(src)}")
        if w.rate:
            how.append(f"{w.rate:.2f} prompts/s")
        body.append(f'<div class="pc-muted">{"; ".join(how)}</div>')
        if w.cluster:  # where it ran, and why its batches are not an in-process run's
            body.append(
                f'<div class="pc-muted wl-cluster">On {esc(describe_record(w.cluster))}. '
                f"{esc(w.cluster.get('note', ''))}.</div>"
            )
        if w.skipped_too_long:
            shown = ", ".join(map(str, w.skipped_too_long[:10])) + (" …" if len(w.skipped_too_long) > 10 else "")
            body.append(
                f'<div class="pc-muted">{len(w.skipped_too_long)} prompt(s) skipped as longer than the '
                f"context: {esc(shown)}</div>"
            )
        body.append(verdicts_html(w))
        if resumable(run):
            body.append(
                f'<div class="wl-resume">{w.done} of {w.n_prompts} prompts are done and kept: Resume goes '
                f"on with the rest (CLI: <code>parity resume {esc(run.id)}</code>).</div>"
            )
    return finish_card(run, body, "workload run", "pc-workload", reveal)


# -- the figures table ------------------------------------------------------------------------------


def figures_table_html(report: WorkloadReport) -> str:
    """The rows `parity` prints for a workload, each side next to the floor; a side's figure over
    the floor is marked, its factor on hover."""
    sets = figure_sets(report)
    if not sets:
        return ""
    checks: dict[str, dict[str, FigureCheck]] = {
        f.side: {c.name: c for c in f.verdict.figures} for f in report.sides.values() if f.verdict
    }
    head = "".join(f"<th>{esc(label(report, f.side))}</th>" for f in sets)

    def row(name: str, cells: list[str], check: str | None = None, key: str | None = None) -> str:
        tds = []
        for f, cell in zip(sets, cells):
            c = checks.get(f.side, {}).get(check) if check else None
            if c is not None and (c.exceeds or c.uncertain):
                how = factor_text(c) + (" the floor's" if c.exceeds else ": too few prompts to tell")
                cls = "pc-over" if c.exceeds else "pc-unsure"
                tds.append(f'<td class="{cls}" title="{esc(how)}">{esc(cell)}</td>')
            else:
                tds.append(f"<td>{esc(cell)}</td>")
        fig = FIGURES.get(key or "")
        tip = f' title="{esc(fig.meaning)}"' if fig else ""
        return f"<tr><th{tip}>{esc(name)}</th>{''.join(tds)}</tr>"

    def ident(f: SideFigures) -> str:
        s = f.stats.sequences
        ci = f" [{_pct(s.identical_ci.low)}–{_pct(s.identical_ci.high)}]" if s.identical_ci else ""
        return _pct(s.share_identical) + ci

    median = FIGURES["median_first_divergence"]
    rows = [
        row("prompts", [str(f.stats.sequences.n) for f in sets]),
        row("identical (95% interval)", [ident(f) for f in sets], NOT_IDENTICAL, "share_identical"),
        row(
            median.name,
            [median.format(f.stats.sequences.median_first_divergence) for f in sets],
            key="median_first_divergence",
        ),
    ]
    rows += [
        row(name, [FIGURES[key].format(getattr(f.stats.tokens, key)) for f in sets], CHECK_OF_ROW.get(key), key)
        for name, key in FIGURE_ROWS
    ]
    for i, key in enumerate(BAND_KEYS):
        rows.append(
            row(
                FIGURES[key].name,
                [_pct(f.stats.tokens.outside[i].outside) if i < len(f.stats.tokens.outside) else "–" for f in sets],
                key,
                key,
            )
        )
    for s in SECTIONS:  # each measure's family, where the run recorded it
        rows += s.html_rows(sets, row)
    legend = "".join(f"<li>{esc(x)}</li>" for x in LEGEND)
    notes = "".join(
        f'<li data-side="{esc(f.side)}">{esc(label(report, f.side))}: {esc(v)}</li>'
        for f in report.sides.values()
        for s in SECTIONS
        if s.html_verdicts() and (v := f.verdicts.get(s.key))
    )
    return (
        f'<table class="pc-setting-table wl-figures"><tr><th>figure</th>{head}</tr>{"".join(rows)}</table>'
        + (f'<ul class="wl-family-verdicts">{notes}</ul>' if notes else "")
        + "".join(s.html_extra(report) for s in SECTIONS)
        + f'<ul class="pc-muted wl-legend">{legend}</ul>'
    )


# -- the prompt table -------------------------------------------------------------------------------


@dataclass
class PairCell:
    identical: bool
    first_divergence: int | None
    max_abs_dlogp: float | None
    verdict: str | None


@dataclass
class PromptRow:
    index: int
    excerpt: str
    pairs: dict[str, PairCell] = field(default_factory=dict)  # side -> its comparison with the reference


def prompt_rows(pair_rows: list[dict[str, Any]], excerpts: dict[int, str]) -> list[PromptRow]:
    """store.pair_rows (one per prompt and side) as one row per prompt, in prompt order."""
    rows: dict[int, PromptRow] = {}
    for r in pair_rows:
        i = r["prompt_idx"]
        row = rows.get(i)
        if row is None:
            row = rows[i] = PromptRow(i, excerpts.get(i, ""))
        row.pairs[r["side"]] = PairCell(bool(r["identical"]), r["first_divergence"], r["max_abs_dlogp"], r["verdict"])
    return [rows[i] for i in sorted(rows)]


def _fork(cell: PairCell | None) -> tuple[str, str]:
    """(shown, sort key) of a first divergence."""
    if cell is None:
        return "", str(IDENTICAL_KEY * 10)
    if cell.identical:
        return "identical", f"{IDENTICAL_KEY:g}"
    if cell.first_divergence is None:
        return "diverged", f"{UNKNOWN_KEY:g}"
    return str(cell.first_divergence), str(cell.first_divergence)


def prompt_table_html(
    rows: list[PromptRow],
    sides: list[str],
    pick: str | None = None,
    floor: str | None = None,
    limit: int = MAX_TABLE_ROWS,
    eager: int | None = None,
    labels: dict[str, str] | None = None,
    forced: bool = False,
) -> str:
    """Every prompt, a row: its index, the start of its text, and per side (then the floor) where it
    first left the reference, its largest |dlogp| and the explanation's verdict. The page's script
    sorts it by any column in the page (each cell's sort value in data-v), and with `pick` (the
    view's prefix) a click on a row opens that prompt's token view. At most `limit` rows (the first);
    with `eager`, only that many are in the table body and the rest in a <template> the page's script
    moves in as the table is scrolled (a sort orders both). `labels`: a column group's heading per
    name (a replay's pairs: "recorded vs hf", where the keys alone read alike); `forced`: a replay,
    whose forced tokens never fork, so each pair shows only its largest gap."""
    names = [*sides, *([floor] if floor else [])]
    total, rows = len(rows), rows[:limit]
    head = ['<th data-sort="num" title="prompt index">#</th>', '<th data-sort="text">prompt</th>']
    for name in names:
        who = (labels or {}).get(name) or ("floor" if name == floor else name)
        gap_head = (
            f'<th data-sort="num" data-col="gap:{esc(name)}" title="{esc(who)}: largest |logprob gap| of the '
            f'compared tokens">{esc(who)} max |Δlp|</th>'
        )
        if forced:
            head.append(gap_head)
            continue
        head += [
            f'<th data-sort="num" data-col="fork:{esc(name)}" title="{esc(who)}: first divergence from the '
            f'reference (identical ones last)">{esc(who)} fork</th>',
            gap_head,
            f'<th data-sort="text" data-col="verdict:{esc(name)}">{esc(who)} verdict</th>',
        ]
    body = []
    for r in rows:
        text = " ".join(r.excerpt.split())
        text = text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"
        cells = [f"<td>{r.index}</td>", f"<td>{esc(text)}</td>"]
        for name in names:
            c = r.pairs.get(name)
            shown, key = _fork(c)
            cls = ' class="div"' if c is not None and not c.identical else ""
            gap = c.max_abs_dlogp if c is not None else None
            gap_cell = f'<td data-v="{-1 if gap is None else repr(gap)}">{_g(gap)}</td>'
            if forced:
                cells.append(gap_cell)
                continue
            cells += [
                f'<td data-v="{key}"{cls}>{shown}</td>',
                gap_cell,
                f"<td>{esc((c.verdict if c and not c.identical else '') or '')}</td>",
            ]
        body.append(f'<tr data-i="{r.index}">{"".join(cells)}</tr>')
    attrs = f' data-pick="{esc(pick)}"' if pick else ""
    hint = "click a column to sort" + ("; a row to open its tokens below" if pick else "")
    count = (
        f"{total:,} prompts"
        if total == len(rows)
        else f"the first {len(rows):,} of {total:,} prompts (open any other with parity runs show RUN --prompt N)"
    )
    now, later = (body, []) if eager is None else (body[:eager], body[eager:])
    rest = f'<template class="wl-rest">{"".join(later)}</template>' if later else ""
    return (
        f'<div class="wl-prompts"><div class="pc-muted">{esc(count)} ({hint})</div>'
        f'<div class="wl-scroll"><table class="wl-table" data-rows="{len(rows)}"{attrs}><thead><tr>'
        f"{''.join(head)}</tr></thead><tbody>{''.join(now)}</tbody></table>{rest}</div></div>"
    )


# -- the charts, as inline SVG (the static report) --------------------------------------------------


def survival_points(f: SideFigures, max_k: int) -> list[tuple[float, float]] | None:
    """The survival curve as step points (k, share still identical after k tokens), 0..max_k."""
    s = f.stats.sequences.survival
    if s is None or not s.n:
        return None
    pts = [(0.0, 1.0)]
    for k, share in zip(s.at, s.share):
        if k > max_k:
            break
        pts += [(float(k), pts[-1][1]), (float(k), share)]
    pts.append((float(max_k), pts[-1][1]))
    return pts


def survival_max_k(run: Run) -> int:
    """The survival curve's x range: the tokens each side was asked for, else the last fork."""
    assert run.workload is not None  # the survival curve is a workload's (a run with a report)
    n = run.config.get("max_new_tokens") if isinstance(run.config, dict) else None
    forks = [k for f in figure_sets(run.workload) if f.stats.sequences.survival for k in f.stats.sequences.survival.at]
    return int(n) if isinstance(n, int) and n > 0 else max(forks, default=0) + 1


def histogram_shares(h: DlogpHistogram) -> tuple[list[float], list[float]]:
    """(bin left edges, share of all the side's pairs in each bin): sides with different numbers of
    pairs compare on one scale."""
    total = h.total or 1
    return h.edges()[:-1], [c / total for c in h.counts]


def survival_svg(run: Run, width: int = 560, height: int = 240) -> str:
    """Share of prompts still identical after k tokens, each side and the floor (dashed)."""
    report = run.workload
    assert report is not None  # the survival curve is a workload's (a run with a report)
    max_k = max(survival_max_k(run), 1)
    colors = side_colors(report)
    x0, x1, y0, y1 = 46.0, width - 12.0, 26.0, height - 36.0

    def xy(k: float, s: float) -> str:
        return f"{x0 + (x1 - x0) * k / max_k:.1f},{y1 - (y1 - y0) * s:.1f}"

    lines, legend = [], []
    for f in figure_sets(report):
        pts = survival_points(f, max_k)
        if pts is None:
            continue
        floor = f.side == (report.floor.side or "")
        dash = ' stroke-dasharray="5 4"' if floor else ""
        lines.append(
            f'<polyline fill="none" stroke="{colors[f.side]}" stroke-width="2"{dash} '
            f'points="{" ".join(xy(k, s) for k, s in pts)}" data-side="{esc(f.side)}"/>'
        )
        legend.append((label(report, f.side), colors[f.side], floor))
    if not lines:
        return ""
    xticks = [(x0 + (x1 - x0) * k / max_k, str(k)) for k in _nice_ticks(max_k)]
    yticks = [(y1 - (y1 - y0) * s, f"{100 * s:.0f}%") for s in (0, 0.25, 0.5, 0.75, 1.0)]
    return svg_frame(
        width,
        height,
        "Prompts still identical after k tokens",
        "generated tokens k",
        "share identical",
        "".join(lines),
        legend,
        xticks,
        yticks,
    )


def histogram_svg(report: WorkloadReport, width: int = 560, height: int = 240) -> str:
    """Each side's |dlogp| distribution against the floor's (dashed): the share of its pairs per
    quarter decade of |dlogp|; exact zeros are counted in the legend (no logarithm)."""
    sets = [(f, f.hist) for f in figure_sets(report) if f.hist is not None and f.hist.total]
    if not sets:
        return ""
    colors = side_colors(report)
    h0 = sets[0][1]
    lo, hi = h0.low, h0.low + h0.width * len(h0.counts)
    top = max(max(histogram_shares(h)[1]) for _, h in sets) or 1.0
    x0, x1, y0, y1 = 46.0, width - 12.0, 26.0, height - 36.0

    def xy(x: float, s: float) -> str:
        return f"{x0 + (x1 - x0) * (x - lo) / (hi - lo):.1f},{y1 - (y1 - y0) * s / top:.1f}"

    lines, legend = [], []
    for f, h in sets:
        edges, shares = histogram_shares(h)
        pts = [xy(lo, 0.0)]
        for e, s in zip(edges, shares):
            pts += [xy(e, s), xy(e + h.width, s)]
        pts.append(xy(hi, 0.0))
        floor = f.side == (report.floor.side or "")
        dash = ' stroke-dasharray="5 4"' if floor else ""
        lines.append(
            f'<polyline fill="none" stroke="{colors[f.side]}" stroke-width="1.6"{dash} '
            f'points="{" ".join(pts)}" data-side="{esc(f.side)}"/>'
        )
        zeros = f" ({_pct(h.zero / h.total)} exactly 0)" if h.zero else ""
        legend.append((label(report, f.side) + zeros, colors[f.side], floor))
    xticks = [
        (x0 + (x1 - x0) * (e - lo) / (hi - lo), f"1e{e:+.0f}".replace("+", ""))
        for e in range(math.ceil(lo), math.floor(hi) + 1)
    ]
    yticks = [(y1 - (y1 - y0) * s / top, f"{100 * s:.1f}%") for s in (0, top / 2, top)]
    return svg_frame(
        width,
        height,
        "|Δlogprob| per token, each side against the floor",
        "|Δlogprob| (nats, log scale)",
        "share of tokens",
        "".join(lines),
        legend,
        xticks,
        yticks,
    )


def _nice_ticks(n: int) -> list[int]:
    step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10**4, 10**5, 10**6) if n / s <= 8)
    return list(range(0, n + 1, step))


# -- the static report's section --------------------------------------------------------------------


def workload_section_html(run: Run, rows: list[PromptRow] | None = None) -> str:
    """The workload as the static report shows it: the card, the two charts, the figures table and,
    given its rows, the sortable prompt table."""
    w = run.workload
    if w is None:
        return ""
    charts = survival_svg(run) + histogram_svg(w)
    parts = [
        workload_card_html(run),
        f'<div class="wl-charts">{charts}</div>' if charts else "",
        "<h3>Figures, each side next to the floor</h3>" + figures_table_html(w) if figure_sets(w) else "",
    ]
    if rows:
        floor = w.floor_figures.side if w.floor_figures else None
        parts.append(
            "<h3>Prompts</h3>"
            + prompt_table_html(rows, list(w.sides), pick=None, floor=floor, **replay_table_labels(w))
        )
    return f'<section class="wl-section">{"".join(parts)}</section>'


# -- while it runs ----------------------------------------------------------------------------------


def workload_progress_html(
    phase: str,
    done: int,
    n_prompts: int,
    eta: str,
    lines: list[str],
    elapsed: float,
    source: str = "",
    fraction: float | None = None,
    states: dict[str, str] | None = None,
) -> str:
    """The live card of a workload: the phase, prompts done of all with the rate and the time left
    (the runner's progress line; `fraction` the share of the work done, inside a chunk too), what
    each side is doing (`states`), the last status lines."""
    share = fraction if fraction is not None else (done / n_prompts if n_prompts else 0.0)
    pct = min(100.0, 100.0 * share)
    line = eta or f"{done:,}/{n_prompts:,} prompts stored"
    if states:
        src = (source + " · " if source else "") + " · ".join(f"{n}: {s}" for n, s in states.items())
        source = src
    log = "".join(f"<li>{esc(x)}</li>" for x in lines[-4:])
    src = f'<div class="pc-muted">{esc(source)}</div>' if source else ""
    return (
        f'<div class="pc-card pc-progress wl-progress" data-done="{done}" data-n="{n_prompts}">'
        f'<div class="pc-title">{esc(phase)} <span class="pp-time">{elapsed:.1f}s</span></div>{src}'
        f'<div class="pp-row"><span class="pp-bar"><span style="width:{pct:.0f}%"></span></span>'
        f'<span class="pp-n wl-eta">{esc(line)}</span></div>'
        f'<div class="pc-muted">Stop keeps every finished prompt and the figures so far; Resume goes on '
        f'from there.</div><ul class="pp-log">{log}</ul></div>'
    )


def replay_table_labels(w: Any) -> dict[str, Any]:
    """A replay's prompt-table options: each pair's column headed by its name (the floor's too: "floor
    vs hf"), and only its largest gap (forced tokens never fork)."""
    if not getattr(w, "replay", None):
        return {}
    labels = {p.stored: p.name for p in w.replay.pairs}
    return {"labels": labels, "forced": True}
