"""A replay for people (a run of kind "replay": parity_ui.commands.replay): the attribution as one
table of pairs (each pair's RL figures, the floor last) and the worst tokens first, each a row that
opens its row's token view with the recorded and the replayed logprobs. Pure functions over the
stored run's header (its WorkloadReport and its `replay` record): no logprob is read here. Shared by
the app (parity_ui.ui.workload_view) and the static report (parity_ui.render.report).
"""

from __future__ import annotations

from typing import Any

from ..analysis.verdict_basis import deciding, verdict_basis
from ..core.figures import BAND_KEYS, FIGURES, display_name
from ..core.workload_record import WorkloadReport
from .cards import esc

# The pairs table's columns: the frameworks' RL figures, in their order (the CLI screen's too).
COLUMNS = ("outside_0.8_1.2", "outside_0.9_1.1", "outside_0.99_1.01", "k3", "extreme_share", "abs_dlogp_max")
WORST_SHOWN = 20


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}%"


def _num(x: float | None) -> str:
    return "–" if x is None else format(x + 0.0, ".4g")


def pairs_html(report: WorkloadReport) -> str:
    """The attribution: each pair (b against a) a row of the RL figures and its verdict against the
    floor; each pair's meaning on hover and under the table."""
    r = report.replay or {}
    band = {b: i for i, b in enumerate(BAND_KEYS)}
    head = "".join(f'<th title="{esc(FIGURES[k].meaning)}">{esc(FIGURES[k].name)}</th>' for k in COLUMNS)
    rows = []
    for p in r.get("pairs") or []:
        is_floor = p["key"] == report.floor.side
        f = report.floor_figures if is_floor else report.sides.get(p["key"])
        if f is None:
            continue
        t = f.stats.tokens
        cells = []
        for k in COLUMNS:
            if k in band:
                i = band[k]
                cells.append(_pct(t.outside[i].outside) if i < len(t.outside) else "–")
            else:  # a share (|Δlogprob| > ln 2) as a percentage, like the bands and the CLI screen
                v = getattr(t, k, None)
                cells.append(_pct(v) if FIGURES[k].kind == "share" else _num(v))
        verdict = "the floor" if is_floor else (f.verdict.verdict if f.verdict else "–")
        why = "" if is_floor or f.verdict is None else verdict_basis(f.verdict)
        decided = [] if is_floor or f.verdict is None else deciding(f.verdict)
        if decided:  # the figure that decided it (issue 46 item 2), all of it on hover
            verdict += f" ({display_name(decided[0].name)})"
        cls = ' class="div"' if not is_floor and f.verdict is not None and f.verdict.verdict != "within noise" else ""
        cls += f' title="{esc(why)}"' if why else ""
        rows.append(
            f'<tr data-pair="{esc(p["key"])}" title="{esc(p["meaning"])}"><td>{esc(p["b"])} vs '
            f"{esc(p['a'])}</td><td>{t.pairs:,}</td>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + f"<td{cls}>{esc(verdict)}</td></tr>"
        )
    meanings = "".join(
        f"<li><b>{esc(p['b'])} vs {esc(p['a'])}</b>: {esc(p['meaning'])}</li>" for p in r.get("pairs") or []
    )
    return (
        f'<div class="rp-pairs"><table class="wl-table rp-pairs-table"><thead><tr><th>pair</th><th>tokens</th>'
        f"{head}<th>verdict</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f'<ul class="pc-muted">{meanings}</ul></div>'
    )


def worst_tokens_html(report: WorkloadReport, pick: str | None = None) -> str:
    """The worst tokens first (largest |Δ| = |trainer − rollout| of the run's own pair), each row its
    dump row, position, token, the trainer's and the rollout's logprobs and each engine re-run's.
    With `pick` (the app's view prefix) a click opens that row's token view at that token (the
    page's script writes "row@position" into the view's box)."""
    r = report.replay or {}
    worst = (r.get("worst_tokens") or [])[:WORST_SHOWN]
    if not worst:
        return '<div class="pc-muted rp-worst">No token scored yet.</div>'
    engines = list(dict.fromkeys(k for w in worst for k in (w.get("engines") or {})))
    head = (
        "<th>#</th><th>row</th><th>token</th><th>text</th><th>Δ = trainer − rollout</th><th>trainer</th>"
        f"<th>{esc(worst[0].get('pair', 'rollout'))}</th>" + "".join(f"<th>{esc(e)}</th>" for e in engines)
    )
    body = []
    for n, w in enumerate(worst, 1):
        eng = "".join(f"<td>{_num((w.get('engines') or {}).get(e))}</td>" for e in engines)
        body.append(
            f'<tr data-i="{w["prompt_index"]}" data-at="{w["position"]}"><td>{n}</td><td>{esc(w["row"])}</td>'
            f"<td>{w['position']}</td><td><code>{esc(repr(w['text']))}</code></td>"
            f'<td class="div">{w["dlogp"]:+.4g}</td><td>{_num(w["trainer"])}</td><td>{_num(w["rollout"])}</td>'
            f"{eng}</tr>"
        )
    attrs = f' data-pick="{esc(pick)}"' if pick else ""
    hint = " (a row opens its tokens below, at that token)" if pick else ""
    return (
        f'<div class="rp-worst"><div class="pc-muted">The worst tokens first: the largest |Δ logprob| of '
        f"{esc(worst[0].get('pair', ''))} against the trainer, masked tokens left out{esc(hint)}</div>"
        f'<div class="wl-scroll"><table class="wl-table rp-worst-table"{attrs}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div></div>"
    )


def replay_html(report: WorkloadReport, pick: str | None = None) -> str:
    """A replay's own part of its view: what was replayed (the dump, rows, masked tokens, how each
    side forced the tokens, notes), the pairs table and the worst tokens."""
    r = report.replay or {}
    if not r:
        return ""
    facts = [
        f"{report.done:,} of {report.n_prompts:,} rows of {r.get('dump', '?')} ({r.get('format', '?')}), "
        f"{r.get('tokens', 0):,} response tokens, {r.get('masked', 0):,} masked by the loss mask (left out)"
    ]
    facts += list(r.get("notes") or [])
    facts += [f"{name} forced the tokens by {how}" for name, how in (r.get("forced") or {}).items()]
    if r.get("rows") and r.get("with_logprobs", 0) < r["rows"]:
        facts.append(
            f"{r['rows'] - r.get('with_logprobs', 0)} rows have no recorded logprobs: the recorded side is "
            "absent for them"
        )
    if r.get("skipped"):
        facts.append(f"{len(r['skipped'])} rows could not be read and were skipped: {', '.join(r['skipped'][:5])}")
    items = "".join(f"<li>{esc(f)}</li>" for f in facts)
    return (
        f'<div class="rp-view"><h3>Replay</h3><ul class="rp-facts">{items}</ul>{pairs_html(report)}'
        f"{worst_tokens_html(report, pick)}</div>"
    )


def token_note(run_id: str, index: int, at: int | None, worst: list[dict[str, Any]]) -> str:
    """The line above a replayed row's token view: which row, and the opened token's figures."""
    w = next((w for w in worst if w["prompt_index"] == index and w["position"] == at), None) if at is not None else None
    line = f"Row {index} of replay {run_id}: the trainer against the recorded rollout and each re-run."
    if w is not None:
        line += (
            f" Token {at} {w['text']!r}: trainer {w['trainer']:.4g}, {w['pair']} {w['rollout']:.4g}, "
            f"Δ {w['dlogp']:+.4g}."
        )
    elif at is not None:
        line += f" Token {at}."
    return line
