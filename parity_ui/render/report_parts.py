"""Sections of the static report beyond the summary and the panes: probes, a bisect's trials and
what later features store with a run. Pure functions."""

from __future__ import annotations

import math

from ..core.types import Localisation, Run
from .cards import esc


def probes_html(run: Run) -> str:
    p = run.probes
    if p is None or not p.sides:
        return ""
    rows = []
    for label, entry in p.sides.items():
        cells = []
        for s in (entry.alone, entry.batched, entry.alone_vs_batched):
            fork = "" if s.first_fork is None else f", fork at {s.first_fork}"
            cells.append(f"<td>{s.distinct} distinct of {s.runs}{fork}</td>")
        rows.append(f"<tr><th>{esc(label)}</th>{''.join(cells)}</tr>")
    return (
        f"<h3>Determinism probe (n={esc(p.n)}, batch={esc(p.batch)})</h3>"
        '<table class="pc-setting-table"><tr><th>setup</th><th>alone</th><th>in a batch</th>'
        f"<th>alone vs batched</th></tr>{''.join(rows)}</table>"
    )


def extra_sections(run: Run, localisations: list[Localisation] | None = None) -> list[str]:
    locs = [localisation_html(loc) for loc in localisations or []]
    return [s for s in (probes_html(run), bisect_html(run), *locs) if s]


def bisect_html(run: Run) -> str:
    """A bisect's record (parity_ui.commands.setting_bisect): the settings that differ, the oracle, the table of trials
    (what each flipped, its outcome and figures, whether its flips showed in the resolved settings) and
    the answer."""
    from ..core.bisect_record import show_value, trial_rows

    b = run.bisect
    if b is None:
        return ""
    factors = "".join(
        f"<tr><th>{esc(f.key)}</th><td>{esc(show_value(f.reference))}</td>"
        f"<td>{esc(show_value(f.side))}</td>"
        f"<td>{'yes' if f.flippable else 'no'}{' (runtime only)' if f.runtime_only else ''}</td>"
        f"<td>{esc(f.note)}</td></tr>"
        for f in b.factors + b.fixed
    )
    trials = "".join(
        f"<tr class=pc-bisect-{esc(r['outcome'].replace(' ', '-'))}><td>{esc(r['trial'])}</td>"
        f"<td>{esc(r['flipped'])}</td>"
        f"<td><b>{esc(r['outcome'])}</b></td><td>{esc(r['oracle'])}</td><td>{esc(r['figures'])}</td>"
        f"<td>{esc(r['seconds'])}</td><td>{esc(r['warm'])}</td><td>{esc(r['notes'])}</td>"
        f"<td><code>{esc(r['run'])}</code></td></tr>"
        for r in trial_rows(b)
    )
    doubts = "".join(f"<li>{esc(c.message)}</li>" for c in b.unconfirmed())
    answer = esc(b.summary or run.error or "")
    est = f"<p class=pc-muted>Estimate: {esc(b.estimate.line())}</p>" if b.estimate else ""
    return (
        f'<div class="pc-card pc-bisect"><b>Which setting is it? {esc(b.side)} against {esc(b.reference)}</b> '
        f"<span class=pc-muted>bisect of run {esc(b.run_id)}, {len(b.trials)} trial(s), "
        f"group {esc(b.group_id)}</span>"
        f"<p class=pc-bisect-answer><b>{esc(b.outcome or run.status)}</b>: {answer}</p>"
        f"<p class=pc-muted>Oracle: {esc(b.oracle)}</p>{est}"
        '<table class="pc-setting-table"><tr><th>setting</th><th>reference</th><th>side</th><th>flippable</th>'
        f"<th>note</th></tr>{factors}</table>"
        + (f"<p>Flips the resolved settings did not confirm:</p><ul>{doubts}</ul>" if doubts else "")
        + '<table class="pc-setting-table"><tr><th>#</th><th>flipped to the reference</th><th>outcome</th>'
        "<th>oracle</th><th>figures</th><th>s</th><th>warm</th><th>not confirmed</th><th>run</th></tr>"
        f"{trials}</table></div>"
    )


def _svg_curve(loc: Localisation, width: int = 420, height: int = 110) -> str:
    """log10 relative error of the residual stream per layer (solid) and 10x its floor (dashed), at
    the examined position: an inline SVG, so the static report needs no script or network."""
    stream = [f for f in loc.per_layer if f["block"] == "residual"]
    if len(stream) < 2:
        return ""
    ys = [math.log10(max(f["rel_l2"][0], 1e-12)) for f in stream]
    fl = [math.log10(max(10 * f["floor"][0], 1e-12)) for f in stream]
    lo, hi = min(ys + fl), max(ys + fl)
    span = (hi - lo) or 1.0

    def pts(vals: list[float]) -> str:
        n = len(vals) - 1
        return " ".join(
            f"{8 + i * (width - 16) / n:.1f},{8 + (hi - v) * (height - 16) / span:.1f}" for i, v in enumerate(vals)
        )

    return (
        f'<svg class="pc-layer-svg" width="{width}" height="{height}" role="img" aria-label="error per layer">'
        f'<polyline fill="none" stroke="#94a3b8" stroke-dasharray="4 3" points="{pts(fl)}"/>'
        f'<polyline fill="none" stroke="#dc2626" stroke-width="2" points="{pts(ys)}"/>'
        f'<text x="8" y="{height - 2}" font-size="10">layer 0</text>'
        f'<text x="{width - 60}" y="{height - 2}" font-size="10">layer {stream[-1]["layer"]}</text></svg>'
    )


def localisation_html(loc: Localisation, heatmaps: bool = True) -> str:
    """One layer localisation: the verdict, how the floor was measured, a curve and every figure; with an
    op map, its section (without its static heatmaps where the page draws the map itself: the app)."""
    when = esc(loc.created_utc or "")
    if loc.error:
        return (
            f'<div class="pc-card pc-layers pc-layers-error"><b>Layer localisation failed</b> {when}'
            f"<p>{esc(loc.error)}</p></div>"
        )
    where = (
        "none (within the noise floor)"
        if loc.first_divergent_block is None
        else f"layer {loc.first_divergent_layer}, {loc.first_divergent_block}"
        if loc.first_divergent_layer is not None
        else loc.first_divergent_block
    )
    rows = "".join(
        f"<tr{' class=pc-over' if f['rel_l2'][0] > 10 * f['floor'][0] and f['rel_l2'][0] > 1e-6 else ''}>"
        f"<td>{'-' if f['layer'] is None else f['layer']}</td><td>{esc(f['block'])}</td>"
        f"<td>{f['rel_l2'][0]:.3e}</td><td>{f['floor'][0]:.3e}</td><td>{f['cosine'][0]:.6f}</td></tr>"
        for f in loc.per_layer
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in loc.notes)
    if loc.op_map:
        from .op_map import op_map_html

        extra = op_map_html(loc, heatmaps)
    else:
        extra = ""
    return (
        f'<div class="pc-card pc-layers"><b>Where inside the model: {esc(loc.b)} vs {esc(loc.a)}</b> '
        f"<span class=pc-muted>prompt {loc.prompt_index}, generated token {loc.position}, {when}</span>"
        f"<p class=pc-layers-verdict>First layer over the noise floor: <b>{esc(where)}</b></p>"
        f"<p>{esc(loc.summary)}</p>{f'<ul>{notes}</ul>' if notes else ''}"
        f"{_svg_curve(loc)}<p class=pc-muted>Noise floor: {esc(loc.noise_floor.get('method', ''))}</p>"
        f"<details><summary>every layer and block ({len(loc.per_layer)})</summary>"
        '<table class="pc-setting-table"><tr><th>layer</th><th>block</th><th>rel L2</th><th>floor</th>'
        f"<th>cosine</th></tr>{rows}</table></details>{extra}</div>"
    )


def bisect_progress_html(phase: str, trials: int, estimate: str, lines: list[str], elapsed: float) -> str:
    """A bisect in progress (the app's live view): the trial under way, how many are done against the
    estimate, the last status lines."""
    done = f"{trials} trial(s) done" + (f"; {estimate}" if estimate else "")
    log = "".join(f"<li>{esc(x)}</li>" for x in lines[-5:])
    return (
        f'<div class="pc-card pc-progress pc-bisect-progress"><div class="pc-title">{esc(phase)} '
        f'<span class="pp-time">{elapsed:.1f}s</span></div><div class=pc-muted>{esc(done)}</div>'
        f'<ul class="pp-log">{log}</ul></div>'
    )
