"""An invariance audit (parity_ui.core.audit_record) as the app's view, a terminal screen, and the
self-contained certificate page.

The view's heart is a grid: one row per (side, axis), one column per prompt, each cell that prompt's
verdict on that axis; in the app a broken cell (and an axis's first break) opens the axis's pair run in
the token view at its break (the page's script writes `side|axis|prompt` into the view's off-screen
box, parity_ui.render.assets). Pure: a record in, HTML or text out.
"""

from __future__ import annotations

import json
from typing import Any

from ..core.audit_record import (
    BROKEN,
    CELL_BROKEN,
    CELL_IDENTICAL,
    CELL_SKIPPED,
    CELL_VACUOUS,
    ERROR,
    IDENTICAL,
    NOT_APPLICABLE,
    NOT_RUN,
    VACUOUS,
    AuditReport,
    AxisResult,
    axis_label,
)
from .markup import esc

_STATUS_CLASS = {
    IDENTICAL: "identical",
    BROKEN: "broken",
    VACUOUS: "vacuous",
    NOT_APPLICABLE: "na",
    NOT_RUN: "na",
    ERROR: "err",
}
_CELL = {CELL_IDENTICAL: "=", CELL_BROKEN: "✗", CELL_VACUOUS: "∅", CELL_SKIPPED: "·"}


def _card_class(report: AuditReport) -> str:
    if report.void:
        return "void"
    if report.certified:
        return "ok"
    return "bad" if report.broken else "other"


def _controls_html(report: AuditReport) -> str:
    if not report.controls:
        return "<div><b>control:</b> none ran: the audit is VOID</div>"
    out = []
    for c in report.controls:
        state = (
            "detected, as it must be"
            if c.detected
            else ("could not run: " + esc(c.error or "") if c.detected is None else "<b>NOT detected</b>")
        )
        where = f" (seen at {esc(c.brk.describe())})" if c.brk is not None and c.detected else ""
        out.append(f"<div><b>control ({esc(c.kind)}):</b> {esc(c.description)}: {state}{where}</div>")
    return "".join(out)


def verdict_card_html(report: AuditReport, run_id: str = "") -> str:
    rate = f" at {report.tokens_per_s:,.0f} tokens/s" if report.tokens_per_s else ""
    lengths = [p.tokens for p in report.prompts]
    span = f"{min(lengths):,}-{max(lengths):,} tokens" if lengths else "no prompt"
    void = (
        "<div><b>VOID:</b> the control was not detected, so this audit could not have seen a break; nothing here is certified.</div>"
        if report.void
        else ""
    )
    return (
        f'<div class="au-card {_card_class(report)}" id="au-verdict"><div class="au-verdict">{esc(report.verdict)}'
        f"{' - audit ' + esc(run_id) if run_id else ''}</div>"
        f"<div>{esc(report.headline())}</div>"
        f'<div class="au-muted">{len(report.prompts)} prompts ({esc(span)}) x {report.max_new_tokens} new tokens; '
        f"full batch {report.batch_size}; {esc(report.source)}; tolerance 0 (token ids and logprob bits); "
        f"{report.tokens_checked:,} tokens compared in {report.seconds:.1f} s{rate}; engines loaded in {report.load_s:.1f} s</div>"
        f"{void}{_controls_html(report)}</div>"
    )


def _size(b: Any) -> str:
    """A break's size in a few characters: ulps where they read as a count, else the difference."""
    if b.kind == "token":
        return f"token {b.a_token} vs {b.b_token}"
    if b.ulps is not None and b.ulps < 10**6:
        return f"{b.ulps:,} ulp"
    return f"|d| {b.abs_diff:.3g}" if b.abs_diff is not None else b.kind


def _cell(r: AxisResult, i: int, pick: bool) -> str:
    cell = next((c for c in r.cells if c.prompt == i), None)
    if cell is None:
        return '<td class="c na"></td>'
    title = f"prompt {i}: {cell.status}"
    if cell.brk is not None:
        title = cell.brk.describe()
    if cell.slot:
        title += f"; {cell.slot}"
    if cell.cached is not None:
        title += f"; {cell.cached} cached tokens"
    if cell.note:
        title += f"; {cell.note}"
    text = _CELL.get(cell.status, "?")
    if cell.brk is not None:
        text = f"✗{cell.brk.token}"
    k = f' data-k="{esc(r.side)}|{esc(r.axis)}|{i}"' if pick and r.pair_run and cell.status == CELL_BROKEN else ""
    return f'<td class="c {cell.status}" title="{esc(title)}"{k}>{esc(text)}</td>'


def audit_grid_html(report: AuditReport, pick: str | None = None) -> str:
    """Axes x prompts. `pick`: the app view's prefix (cells open their tokens); None in the static page."""
    n = len(report.prompts)
    head = "".join(f'<th title="{p.tokens} tokens: {esc(p.excerpt)}">p{p.index}</th>' for p in report.prompts)
    rows = []
    for r in report.results:
        cls = _STATUS_CLASS.get(r.status, "")
        first = ""
        if r.first is not None:
            k = f' data-k="{esc(r.side)}|{esc(r.axis)}|{r.first.prompt}"' if pick and r.pair_run else ""
            first = f'<td class="broken" title="{esc(r.first.describe())}"{k}>p{r.first.prompt} t{r.first.token}'
            first += f" ({_size(r.first)})</td>"
        else:
            first = "<td></td>"
        count = f"{r.broken}/{r.prompts}" if r.status in (BROKEN, IDENTICAL, VACUOUS) else ""
        extra = ""
        if r.status == VACUOUS or (r.axis == "prefix" and r.cached_tokens is not None):
            extra = f" ({r.cached_tokens or 0:,} cached)"
        why = esc(r.reason) if r.status in (NOT_APPLICABLE, NOT_RUN, ERROR, VACUOUS) else ""
        cells = (
            "".join(_cell(r, i, pick is not None) for i in range(n))
            if r.cells
            else f'<td class="why" colspan="{max(n, 1)}">{why}</td>'
        )
        rows.append(
            f'<tr><td>{esc(r.side)}</td><td title="{esc(r.a)} | {esc(r.b)}">{esc(axis_label(r.axis))}</td>'
            f'<td class="{cls}">{esc(r.status)}{esc(extra)}</td><td>{count}</td>{first}'
            f"<td>{r.seconds:.1f}s</td>{cells}</tr>"
        )
    attrs = f' data-pick="{esc(pick)}"' if pick else ""
    hint = "; click a broken cell to open its tokens below" if pick else ""
    return (
        f'<div class="au-muted">= identical (ids and logprob bits), ✗N broken at token N, ∅ vacuous (no cache hit), '
        f"· not compared on this axis{hint}</div>"
        f'<div class="au-scroll"><table class="au-grid"{attrs}><thead><tr><th>side</th><th>axis</th><th>verdict</th>'
        f"<th>broke</th><th>first break</th><th>time</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def axes_detail_html(report: AuditReport) -> str:
    """Per axis that ran: what its two streams were, the settings its engines differed in, the first
    break and what to run next."""
    out = []
    for r in report.results:
        if r.status in (NOT_APPLICABLE, NOT_RUN):
            continue
        lines = [f"<b>{esc(r.side)} / {esc(axis_label(r.axis))}: {esc(r.status)}</b>"]
        if r.a or r.b:
            lines.append(f"a: {esc(r.a)}<br>b: {esc(r.b)}")
        if r.settings:
            lines.append(
                "settings the two engines reported differently: "
                + "; ".join(f"{esc(k)}: {esc(v[0])} vs {esc(v[1])}" for k, v in r.settings.items())
            )
        if r.reason:
            lines.append(esc(r.reason))
        if r.hint:
            lines.append(esc(r.hint))
        if r.cached_tokens is not None:
            lines.append(f"cached tokens over the warm requests: {r.cached_tokens:,}")
        if r.pair_run:
            lines.append(f"the two streams: run <code>{esc(r.pair_run)}</code>")
        for c in r.commands:
            lines.append(f"<code>{esc(c)}</code>")
        if r.status == BROKEN and r.commands and len(r.commands) == 1:
            lines.append(
                '<span class="au-muted">Both streams come from one setup: parity layers teacher-forces each alone, '
                "so expect every layer within the floor; the break is in how the requests were served.</span>"
            )
        lines.append(
            f'<span class="au-muted">digests a {esc(r.digests.get("a", "")[:16])} b {esc(r.digests.get("b", "")[:16])}</span>'
        )
        out.append('<div class="au-axis">' + "<br>".join(lines) + "</div>")
    return "".join(out)


def evidence_html(report: AuditReport) -> str:
    ev = report.evidence or {}
    if not ev:
        return ""
    rows = []
    for folder, w in (ev.get("weights") or {}).items():
        files = "<br>".join(f"{esc(name)} {esc(h)}" for name, h in (w.get("files") or {}).items())
        rows.append(f"<tr><td>weights</td><td>{esc(folder)}<br>{files}</td></tr>")
    for name, s in (ev.get("sides") or {}).items():
        versions = ", ".join(f"{k} {v}" for k, v in (s.get("versions") or {}).items())
        rows.append(
            f"<tr><td>side {esc(name)}</td><td>{esc(s.get('kind'))}: {esc(versions)}; {esc(s.get('device'))}</td></tr>"
        )
        resolved = "; ".join(f"{k}={v}" for k, v in (s.get("resolved") or {}).items())
        rows.append(f"<tr><td></td><td class=au-muted>{esc(resolved)}</td></tr>")
    for key, v in (ev.get("second_engines") or {}).items():
        rows.append(f"<tr><td>{esc(key)}</td><td>{esc(v.get('changed'))}</td></tr>")
    rows.append(f"<tr><td>tolerance</td><td>{esc(ev.get('tolerance'))}: {esc(ev.get('compared'))}</td></tr>")
    rows.append(f"<tr><td>audit run</td><td>{esc(ev.get('audit_run'))}</td></tr>")
    return f'<h3>Evidence</h3><table class="au-ev">{"".join(rows)}</table>'


def audit_view_html(report: AuditReport, run_id: str = "", pick: str | None = None) -> str:
    """The app's view: the verdict, the grid, each axis's detail."""
    return (
        verdict_card_html(report, run_id)
        + audit_grid_html(report, pick)
        + f"<details><summary>Each axis: its two streams, what differs, what to run next</summary>{axes_detail_html(report)}</details>"
    )


def certificate_json(report: AuditReport, run_id: str) -> dict[str, Any]:
    """The certificate as one JSON object: the verdict up front, then the whole record."""
    data = report.to_json()
    return {
        "schema": 1,
        "kind": "parity-ui invariance audit",
        "run_id": run_id,
        "certified": report.certified,
        "verdict": report.verdict,
        "tolerance": 0.0,
        "axes_x_prompts_x_tokens": {
            f"{r.side}/{r.axis}": {"status": r.status, "prompts": r.prompts, "tokens": r.tokens} for r in report.results
        },
        "audit": data,
    }


def audit_page_html(report: AuditReport, run_id: str) -> str:
    """One self-contained page (no network): the view, the evidence, and the certificate's JSON inside."""
    from .assets import CSS

    payload = json.dumps(certificate_json(report, run_id), default=str).replace("</", "<\\/")
    title = f"parity-ui audit {run_id}: {report.verdict}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
        f"<style>body{{font-family:system-ui,sans-serif;margin:24px;}}{CSS}</style></head><body>"
        f"<h2>{esc(title)}</h2>{verdict_card_html(report, run_id)}{audit_grid_html(report)}"
        f"<h3>Axes</h3>{axes_detail_html(report)}{evidence_html(report)}"
        f'<script type="application/json" id="parity-audit">{payload}</script></body></html>'
    )


def format_audit(report: AuditReport, run_id: str = "") -> str:
    """The terminal screen."""
    lengths = [p.tokens for p in report.prompts]
    span = f"{min(lengths):,}-{max(lengths):,} tokens" if lengths else "no prompt"
    lines = [
        f"audit {run_id}: {report.verdict}",
        f"  {len(report.prompts)} prompts ({span}) x {report.max_new_tokens} new tokens, full batch {report.batch_size}; "
        f"{report.tokens_checked:,} tokens compared in {report.seconds:.1f} s"
        + (f" ({report.tokens_per_s:,.0f}/s)" if report.tokens_per_s else "")
        + "; tolerance 0 (token ids and logprob bits)",
    ]
    if report.void:
        lines.append("  VOID: the control was not detected; this audit could not have seen a break")
    for c in report.controls:
        state = (
            "detected"
            if c.detected
            else ("could not run: " + (c.error or "") if c.detected is None else "NOT DETECTED")
        )
        lines.append(f"  control ({c.kind}): {state}: {c.description}")
    side = None
    for r in report.results:
        if r.side != side:
            side = r.side
            lines.append(f"side {side}:")
        label = f"{axis_label(r.axis):22}"
        if r.status in (IDENTICAL, BROKEN, VACUOUS):
            head = f"    {label} {r.status.upper() if r.status != IDENTICAL else r.status:10} {r.broken}/{r.prompts} prompts broke, {r.tokens:,} tokens, {r.seconds:.1f} s"
            if r.cached_tokens is not None:
                head += f", {r.cached_tokens:,} cached tokens"
            lines.append(head)
            if r.reason:
                lines.append(f"        {r.reason}")
            if r.hint:
                lines.append(f"        {r.hint}")
            if r.pair_run:
                lines.append(f"        the two streams: run {r.pair_run}")
            lines.extend(f"        {c}" for c in r.commands)
        else:
            lines.append(f"    {label} {r.status}: {r.reason}")
    return "\n".join(lines)
