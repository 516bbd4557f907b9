"""The replay-pairs measure's section (a run of kind "replay": parity_ui.commands.replay): the
attribution as one table of pairs (each pair's RL figures, the floor last, each pair by its one name,
core.replay_record) and the worst tokens first, each a row that opens its row's token view with the
recorded and the replayed logprobs, on the CLI screen and in the app and the report. Pure functions
over the stored run's header (its WorkloadReport and its ReplayRecord): no logprob is read here.
"""

from __future__ import annotations

from ...analysis.verdict_basis import deciding, verdict_basis
from ...core.figures import BAND_KEYS, FIGURES, display_name
from ...core.measures import REPLAY_PAIRS
from ...core.replay_record import FLOOR_PAIR, ReplayPair, ReplayRecord, ReplayRow, WorstToken
from ...core.workload_record import SideFigures, WorkloadReport
from ...core.workload_record import _pct as _pct_text
from ..markup import esc
from .base import Section

# The pairs table's columns: the frameworks' RL figures, in their order (the CLI screen's too).
COLUMNS = ("outside_0.8_1.2", "outside_0.9_1.1", "outside_0.99_1.01", "k3", "extreme_share", "abs_dlogp_max")
WORST_SHOWN = 20


class ReplayPairsSection(Section):
    key = REPLAY_PAIRS.key
    title = REPLAY_PAIRS.title

    def workload_lines(self, report: WorkloadReport) -> list[str]:
        return format_replay(report).splitlines() if report.replay is not None else []

    def workload_html(self, report: WorkloadReport, pick: str | None = None) -> str:
        return replay_html(report, pick)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}%"


def _num(x: float | None) -> str:
    return "–" if x is None else format(x + 0.0, ".4g")


def pair_figures(report: WorkloadReport, p: ReplayPair) -> SideFigures | None:
    """A pair's figures: the floor's for the floor pair, else the pair's by its name."""
    return report.floor_figures if p.kind == FLOOR_PAIR else report.sides.get(p.name)


def _cells(f: SideFigures, text: bool = False) -> list[str]:
    """A pair's RL figures (COLUMNS): in the app and the report the bands and shares as percentages to
    two places; on the CLI screen as every figure prints there."""
    band = {b: i for i, b in enumerate(BAND_KEYS)}
    t = f.stats.tokens
    cells = []
    for k in COLUMNS:
        v = getattr(t, k, None)
        if k in band:
            i = band[k]
            x = t.outside[i].outside if i < len(t.outside) else None
            cells.append((_pct_text(x) if text else _pct(x)) if i < len(t.outside) else ("-" if text else "–"))
        elif text:
            cells.append(FIGURES[k].format(v, "-"))
        else:  # a share (|Δlogprob| > ln 2) as a percentage, like the bands and the CLI screen
            cells.append(_pct(v) if FIGURES[k].kind == "share" else _num(v))
    return cells


def pairs_html(report: WorkloadReport) -> str:
    """The attribution: each pair (b against a) a row of the RL figures and its verdict against the
    floor; each pair's meaning on hover and under the table."""
    r = report.replay
    head = "".join(f'<th title="{esc(FIGURES[k].meaning)}">{esc(FIGURES[k].name)}</th>' for k in COLUMNS)
    rows = []
    for p in r.pairs if r is not None else []:
        f = pair_figures(report, p)
        if f is None:
            continue
        is_floor = p.kind == FLOOR_PAIR
        verdict = "the floor" if is_floor else (f.verdict.verdict if f.verdict else "–")
        why = "" if is_floor or f.verdict is None else verdict_basis(f.verdict)
        decided = [] if is_floor or f.verdict is None else deciding(f.verdict)
        if decided:  # the figure that decided it (issue 46 item 2), all of it on hover
            verdict += f" ({display_name(decided[0].name)})"
        cls = ' class="div"' if not is_floor and f.verdict is not None and f.verdict.verdict != "within noise" else ""
        cls += f' title="{esc(why)}"' if why else ""
        rows.append(
            f'<tr data-pair="{esc(p.name)}" title="{esc(p.meaning)}"><td>{esc(p.name)}</td>'
            f"<td>{f.stats.tokens.pairs:,}</td>"
            + "".join(f"<td>{c}</td>" for c in _cells(f))
            + f"<td{cls}>{esc(verdict)}</td></tr>"
        )
    meanings = "".join(f"<li><b>{esc(p.name)}</b>: {esc(p.meaning)}</li>" for p in (r.pairs if r else []))
    return (
        f'<div class="rp-pairs"><table class="wl-table rp-pairs-table"><thead><tr><th>pair</th><th>tokens</th>'
        f"{head}<th>verdict</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f'<ul class="pc-muted">{meanings}</ul></div>'
    )


def worst_tokens_html(report: WorkloadReport, pick: str | None = None) -> str:
    """The worst tokens first (largest |Δ| = |trainer − rollout| of the run's own pair), each row its
    dump row (by its name), position, token, the trainer's and the rollout's logprobs and each engine
    re-run's. With `pick` (the app's view prefix) a click opens that row's token view at that token
    (the page's script writes "row@position" into the view's box)."""
    worst = (report.replay.worst_tokens if report.replay else [])[:WORST_SHOWN]
    if not worst:
        return '<div class="pc-muted rp-worst">No token scored yet.</div>'
    engines = list(dict.fromkeys(k for w in worst for k in w.engines))
    head = (
        "<th>#</th><th>row</th><th>token</th><th>text</th><th>Δ = trainer − rollout</th><th>trainer</th>"
        f"<th>{esc(worst[0].side or 'rollout')}</th>" + "".join(f"<th>{esc(e)}</th>" for e in engines)
    )
    body = []
    for n, w in enumerate(worst, 1):
        eng = "".join(f"<td>{_num(w.engines.get(e))}</td>" for e in engines)
        body.append(
            f'<tr data-i="{w.prompt_index}" data-at="{w.position}"><td>{n}</td><td>{esc(w.row)}</td>'
            f"<td>{w.position}</td><td><code>{esc(repr(w.text))}</code></td>"
            f'<td class="div">{w.dlogp:+.4g}</td><td>{_num(w.trainer)}</td><td>{_num(w.rollout)}</td>'
            f"{eng}</tr>"
        )
    attrs = f' data-pick="{esc(pick)}"' if pick else ""
    hint = " (a row opens its tokens below, at that token)" if pick else ""
    return (
        f'<div class="rp-worst"><div class="pc-muted">The worst tokens first: the largest |Δ logprob| of '
        f"{esc(worst[0].pair)}, masked tokens left out{esc(hint)}</div>"
        f'<div class="wl-scroll"><table class="wl-table rp-worst-table"{attrs}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div></div>"
    )


def facts(report: WorkloadReport, r: ReplayRecord) -> list[str]:
    """What was replayed: the dump, rows, masked tokens, notes, how each side forced the tokens."""
    out = [
        f"{report.done:,} of {report.n_prompts:,} rows of {r.dump or '?'} ({r.format or '?'}), "
        f"{r.tokens:,} response tokens, {r.masked:,} masked by the loss mask (left out)"
    ]
    out += list(r.notes)
    out += [f"{name} forced the tokens by {how}" for name, how in r.forced.items()]
    if r.rows and r.with_logprobs < r.rows:
        out.append(f"{r.rows - r.with_logprobs} rows have no recorded logprobs: the recorded side is absent for them")
    if r.skipped:
        out.append(f"{len(r.skipped)} rows could not be read and were skipped: {', '.join(r.skipped[:5])}")
    return out


def replay_html(report: WorkloadReport, pick: str | None = None) -> str:
    """A replay's own part of its view: what was replayed, the pairs table and the worst tokens."""
    r = report.replay
    if r is None:
        return ""
    items = "".join(f"<li>{esc(f)}</li>" for f in facts(report, r))
    return (
        f'<div class="rp-view"><h3>Replay</h3><ul class="rp-facts">{items}</ul>{pairs_html(report)}'
        f"{worst_tokens_html(report, pick)}</div>"
    )


def format_replay(report: WorkloadReport) -> str:
    """A replay's attribution for a terminal (its pairs as rows of one table, the floor last), the masked
    tokens and the worst tokens first."""
    r = report.replay
    if r is None:
        return ""
    lines = [
        f"replay of {r.dump} ({r.format}): {report.done} of {report.n_prompts} rows, "
        f"{r.tokens:,} response tokens, {r.masked:,} masked by the loss mask (left out)"
    ]
    lines += [f"  note: {n}" for n in r.notes]
    lines += [f"  {name} forced the tokens by {how}" for name, how in r.forced.items()]
    if r.rows and r.with_logprobs < r.rows:
        lines.append(
            f"  {r.rows - r.with_logprobs} rows have no recorded logprobs: the recorded side is absent for them"
        )
    head = (
        f"  {'pair (b against a)':34}"
        + "".join(f"{FIGURES[k].name[:15]:>16}" for k in COLUMNS)
        + f"{'seq. geo-mean ρ':>20}  verdict"
    )
    lines.append(head)
    for p in r.pairs:
        f = pair_figures(report, p)
        if f is None:
            continue
        sr = f.stats.sequences.seq_ratio
        geo = "-" if sr.min is None else f"{sr.min:.3g}..{sr.max:.3g}"
        verdict = "floor" if p.kind == FLOOR_PAIR else (f.verdict.verdict if f.verdict else "-")
        lines.append(
            f"  {p.name[:33]:34}" + "".join(f"{c:>16}" for c in _cells(f, text=True)) + f"{geo:>20}  {verdict}"
        )
    for p in r.pairs:
        lines.append(f"    {p.name}: {p.meaning}")
    if r.worst_tokens:
        lines.append("  worst tokens (Δ = trainer − rollout):")
        for w in r.worst_tokens[:10]:
            eng = "  ".join(f"{k} {v:.4g}" for k, v in w.engines.items() if v is not None)
            lines.append(
                f"    {w.row} (prompt {w.prompt_index}) token {w.position} {w.text!r}: "
                f"Δ {w.dlogp:+.4g}  trainer {w.trainer:.4g}  {w.side} {w.rollout:.4g}" + (f"  {eng}" if eng else "")
            )
    return "\n".join(lines)


def token_note(run_id: str, row: ReplayRow, at: int | None, worst: list[WorstToken]) -> str:
    """The line above a replayed row's token view: the row by its name, and the opened token's figures."""
    w = next((w for w in worst if w.prompt_index == row.index and w.position == at), None) if at is not None else None
    line = f"{row.describe(run_id)}: the trainer against the recorded rollout and each re-run."
    if w is not None:
        line += f" Token {at} {w.text!r}: trainer {w.trainer:.4g}, {w.side} {w.rollout:.4g}, Δ {w.dlogp:+.4g}."
    elif at is not None:
        line += f" Token {at}."
    return line
