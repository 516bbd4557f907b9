"""A weight-sync check (issue 41) for people: the terminal screen and the app's HTML, differing
tensors first (core.weights.ordered keeps that order in the report itself)."""

from __future__ import annotations

import math
from typing import Any

from ..core.weights import DIFFERS, EQUAL, MISSING, ProbeComparison, TensorFigure, WeightReport, ordered
from .markup import esc

SHOWN_EQUAL = 12  # equal tensors listed after the differing ones (the rest counted)
# The view's own few rules (kept here, not in the page's CSS: this view is one self-contained piece)
STYLE = (
    "<style>.weights-check .w-ok{color:#1a7f37}.weights-check .w-bad{color:#cf222e}"
    ".weights-table{border-collapse:collapse;font-size:0.85em}.weights-table td,.weights-table th"
    "{border:1px solid #d0d7de;padding:2px 6px;text-align:left}.weights-table tr.w-differs td"
    "{background:#ffebe9}.weights-table tr.w-missing td{background:#fff8c5}.weights-check .w-note"
    "{color:#57606a;font-size:0.85em}</style>"
)


def check_choices(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The stored checks as (label, run id) for a picker: when, verdict, model, the headline's start."""
    out = []
    for r in rows:
        verdict = {0: "LANDED", 1: "NOT LANDED"}.get(int(r.get("exit_code", 2)), "ERROR")
        when = str(r.get("datetime_utc") or "")[:19].replace("T", " ")
        model = str(r.get("model") or "").rstrip("/").rsplit("/", 1)[-1]
        out.append((f"{when}  {verdict}  {model}  ({r.get('differing', 0)} differ)  {r['run_id']}", r["run_id"]))
    return out


def _g(x: float | None, fmt: str = ".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, fmt)


def _size(t: TensorFigure) -> str:
    if t.status == EQUAL:
        return "equal"
    bits = []
    if t.live_zero:
        bits.append("ALL ZERO")
    if t.nonfinite:
        bits.append(f"{t.nonfinite} NaN/inf")
    if t.n_differ is not None and t.numel:
        bits.append(f"{t.n_differ}/{t.numel} differ")
    if t.max_abs is not None:
        bits.append(f"max|d| {_g(t.max_abs)}")
    if t.rel_l2 is not None:
        bits.append(f"rel L2 {_g(t.rel_l2)}")
    if not bits and t.norm_live is not None and t.norm_ref is not None:
        bits.append(f"norms {_g(t.norm_live)} vs {_g(t.norm_ref)}")
    return ", ".join(bits) or t.status


def _probe_line(c: ProbeComparison) -> str:
    at = "at the floor" if c.at_floor else f"ABOVE the floor ({c.verdict})"
    first = f"; first token over it: #{c.first_token}" if c.first_token is not None and not c.at_floor else ""
    judged = "" if c.judged else " [shown, not judged]"
    return (
        f"{c.side} vs {c.against}: max|dlogp| {_g(c.abs_dlogp_max)} (floor {_g(c.floor_abs_dlogp_max)}: "
        f"{c.floor}), {at}{first}{judged}"
    )


def format_weights(r: WeightReport) -> str:
    """The terminal screen: verdict, what was pushed, the differing tensors by name, the probe."""
    out = [r.headline(), f"  model {r.model}" + (f", started from {r.start_from}" if r.start_from else "")]
    if r.run_id:
        out.append(f"  stored as run {r.run_id}")
    if r.error:
        return "\n".join(out + [f"  error: {r.error}"])
    u = r.update
    if u is not None:
        out.append(
            f"  update: {u.pushed} tensors through {u.path} in {u.seconds:.2f} s ({u.where})"
            + (f"; left out: {', '.join(u.skipped[:4])}" + (" ..." if len(u.skipped) > 4 else "") if u.skipped else "")
            + (f"; zeroed: {', '.join(u.zeroed[:4])}" if u.zeroed else "")
            + (f"; sleep level {u.sleep}" if u.sleep else "")
        )
    if not r.readable:
        out.append(f"  tensors: not readable: {r.not_readable}")
    else:
        differ = [t for t in ordered(r.tensors) if t.status != EQUAL]
        equal = [t for t in r.tensors if t.status == EQUAL]
        out.append(
            f"  tensors: {len(r.tensors)} units, {len(differ)} not equal ({r.timings.get('tensor_check_s', 0):.2f} s)"
        )
        for t in differ:
            sources = f" <- {', '.join(t.sources)}" if t.sources and t.part else ""
            out.append(f"    {t.status.upper():10} {t.key}{sources}: {_size(t)}" + (f" ({t.note})" if t.note else ""))
        for t in equal[:SHOWN_EQUAL]:
            out.append(f"    equal      {t.key}  {t.live_digest[:12] if t.live_digest else ''}")
        if len(equal) > SHOWN_EQUAL:
            out.append(f"    ... {len(equal) - SHOWN_EQUAL} more equal")
        for rank in r.ranks:
            if rank.get("rank"):
                same = "equal" if rank["equal"] else "DIFFER"
                out.append(
                    f"  rank {rank['rank']}: digests {same} ({str(rank['live'])[:12]} / {str(rank['ref'])[:12]})"
                )
    if r.unknown:
        out.append(f"  tensors unknown to the engine: {', '.join(r.unknown[:8])}")
    p = r.probe
    if p is not None:
        out.append(f"  probe: {p.tokens} forced tokens in {p.sequences} sequences ({p.seconds:.2f} s)")
        out += [f"    {_probe_line(c)}" for c in p.comparisons]
        if p.coverage:
            out.append(f"    {p.coverage}")
        if p.note:
            out.append(f"    {p.note}")
    out += [f"  note: {n}" for n in r.notes]
    return "\n".join(out)


def _row(t: TensorFigure) -> str:
    cls = {DIFFERS: "w-differs", MISSING: "w-missing"}.get(t.status, "w-equal" if t.status == EQUAL else "w-other")
    src = "<br>".join(esc(s) for s in t.sources)
    return (
        f'<tr class="{cls}" data-status="{esc(t.status)}"><td>{esc(t.status)}</td><td><code>{esc(t.name)}</code>'
        + (f" <b>[{esc(t.part)}]</b>" if t.part else "")
        + f"</td><td>{src}</td><td>{esc(t.rank)}</td><td>{esc('x'.join(map(str, t.shape)))} {esc(t.dtype)}</td>"
        f"<td>{esc(_size(t))}</td><td><code>{esc((t.live_digest or '-')[:12])}</code> / "
        f"<code>{esc((t.ref_digest or '-')[:12])}</code></td><td>{esc(t.note)}</td></tr>"
    )


def weights_html(r: WeightReport) -> str:
    """The app's view of one check: verdict, update, probe, then the tensors table, differing first."""
    ok = r.exit_code == 0
    parts = [
        STYLE,
        f'<div class="weights-check" data-verdict="{esc(r.verdict)}">',
        f'<h3 class="{"w-ok" if ok else "w-bad"}">{esc(r.headline())}</h3>',
        f"<p>model <code>{esc(r.model)}</code>"
        + (f", started from <code>{esc(r.start_from)}</code>" if r.start_from else "")
        + (f" &middot; run <code>{esc(r.run_id)}</code>" if r.run_id else "")
        + "</p>",
    ]
    if r.error:
        parts.append(f'<p class="w-bad">{esc(r.error)}</p></div>')
        return "".join(parts)
    u = r.update
    if u is not None:
        parts.append(
            f"<p>update: {u.pushed} tensors through <code>{esc(u.path)}</code> in {u.seconds:.2f} s"
            + (f"; left out: {esc(', '.join(u.skipped))}" if u.skipped else "")
            + (f"; zeroed: {esc(', '.join(u.zeroed))}" if u.zeroed else "")
            + (f"; sleep level {u.sleep}" if u.sleep else "")
            + "</p>"
        )
    p = r.probe
    if p is not None:
        items = "".join(f"<li>{esc(_probe_line(c))}</li>" for c in p.comparisons)
        extra = "".join(f"<li>{esc(x)}</li>" for x in (p.coverage, p.note) if x)
        parts.append(f"<p>probe: {p.tokens} forced tokens in {p.sequences} sequences</p><ul>{items}{extra}</ul>")
    if not r.readable:
        parts.append(f'<p class="w-bad">tensors not readable: {esc(r.not_readable)}</p>')
    else:
        head = "<tr><th>status</th><th>engine tensor [slice]</th><th>checkpoint source</th><th>rank</th>"
        head += "<th>shape</th><th>difference</th><th>digest live / fresh</th><th>note</th></tr>"
        rows = "".join(_row(t) for t in ordered(r.tensors))
        parts.append(f'<table class="weights-table"><thead>{head}</thead><tbody>{rows}</tbody></table>')
    parts += [f'<p class="w-note">{esc(n)}</p>' for n in r.notes]
    parts.append("</div>")
    return "".join(parts)
