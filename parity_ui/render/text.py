"""Records for a terminal: a probe, a sweep's summary, a layer localisation and a workload's one
screen as the lines the CLI prints. Pure: a record in, text out."""

from __future__ import annotations

from typing import Any

from ..analysis.verdict_basis import deciding
from ..core.cluster import describe_record
from ..core.figures import BAND_KEYS, FIGURE_ROWS, FIGURES, LEGEND, count
from ..core.pooled import EXCEEDS, TOO_FEW, FloorVerdict, factor_text
from ..core.types import FLOOR_MULTIPLE, MIN_REL, Localisation, Run
from ..core.workload_record import WorkloadReport, _pct
from .sections import SECTIONS


def format_probe(run: Run) -> str:
    """The probe as lines for a terminal."""
    if run.status == "error":
        return f"probe {run.id}: ERROR: {run.error}"
    p = run.probes
    if p is None:
        return f"probe {run.id}: {run.status}"
    lines = [
        f"probe {run.id}: {'DETERMINISTIC' if run.status == 'ok' else 'NOT DETERMINISTIC'}  "
        f"model={run.model.name}  dtype={run.config.get('dtype')}  n={p.n}  batch={p.batch}"
    ]
    for label, entry in p.sides.items():
        for s, what in (
            (entry.alone, "alone"),
            (entry.batched, "in a batch"),
            (entry.alone_vs_batched, "alone vs batched"),
        ):
            fork = "" if s.first_fork is None else f", first fork at token {s.first_fork}"
            lines.append(f"  {label:24s} {what:17s}: {s.distinct} distinct of {s.runs}{fork}")
    if not p.batch_invariant.supported:
        lines.append(f"  batch-invariant mode: {p.batch_invariant.detail}")
    return "\n".join(lines)


def format_sweep(summary: dict[str, Any]) -> str:
    """The sweep summary as lines for a terminal."""
    lines = [f"sweep {summary['group_id']}: {len(summary['points'])} points"]
    for p in summary["points"]:
        s = "  ".join(f"{k}={v}" for k, v in p["settings"].items())
        fd = (
            "identical"
            if p["first_divergence"] is None and p["status"] == "ok"
            else (f"diverges at {p['first_divergence']}" if p["first_divergence"] is not None else p["status"])
        )
        extra = f" ({p['verdict']})" if p["verdict"] and p["verdict"] != "identical" else ""
        err = f": {p['error'][:100]}" if p["error"] else ""
        lines.append(f"  {s:50s} {fd}{extra}{err}   run {p['run_id']}")
    for e in summary["effects"]:
        by = ", ".join(
            f"{v} -> {['-' if x is None else x for x in fds]}" for v, fds in e["first_divergence_by_value"].items()
        )
        lines.append(f"  {e['key']}: {'MOVES' if e['moves_divergence'] else 'does not move'} the divergence ({by})")
    return "\n".join(lines)


def format_localisation(loc: Localisation) -> str:
    """The figures as text: one row per layer and block at the examined position."""
    if loc.error:
        return f"localisation {loc.id}: error: {loc.error}"
    lines = [
        f"localisation {loc.id} of run {loc.run_id}, prompt {loc.prompt_index}: {loc.b} against {loc.a} at "
        f"generated token {loc.position} (id index {loc.token_positions[0]}; also {loc.token_positions[1:]})",
        loc.summary,
        *(f"note: {n}" for n in loc.notes),
        f"noise floor: {loc.noise_floor.get('method', '')}",
        f"{'layer':>5}  {'block':8} {'rel L2':>10} {'floor':>10} {'cosine':>10}",
    ]
    for f in loc.per_layer:
        mark = "*" if f["rel_l2"][0] > max(FLOOR_MULTIPLE * f["floor"][0], MIN_REL) else " "
        layer = "-" if f["layer"] is None else str(f["layer"])
        lines.append(
            f"{layer:>5}  {f['block']:8} {f['rel_l2'][0]:10.3e} {f['floor'][0]:10.3e} {f['cosine'][0]:10.6f} {mark}"
        )
    lines.append(f"(* = over {FLOOR_MULTIPLE:g}x the floor; {loc.seconds:.1f} s)")
    return "\n".join(lines)


def _g(x: float | None, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x + 0.0, fmt)  # + 0.0: no "-0"


def verdict_line(v: FloorVerdict, most: int = 4) -> str:
    """The verdict in a line: within noise, the figures over the floor (the largest factors first,
    each with its 95% interval over the prompts), or too few prompts to tell."""
    if v.verdict not in (EXCEEDS, TOO_FEW):
        return v.summary
    over = deciding(v)
    shown = [f"{FIGURES[c.name].name} {_g(c.side)} vs {_g(c.floor)} ({factor_text(c)})" for c in over[:most]]
    more = f" and {len(over) - most} more" if len(over) > most else ""
    if v.verdict == TOO_FEW:
        n = f" over {count(v.prompts, 'prompt')}" if v.prompts else ""
        return (
            f"TOO FEW PROMPTS TO TELL{n}: {'; '.join(shown)}{more} — over the {v.tolerance:g}x limit, but the "
            f"interval reaches it (sampling error); run more prompts"
        )
    return f"EXCEEDS the reference's noise: {'; '.join(shown)}{more}"


def format_workload(report: WorkloadReport, run_id: str = "", status: str = "") -> str:
    """The workload as one screen for a terminal: the headline, each side's figures next to the
    floor's, the verdict, and the worst prompts (open one with `parity runs show RUN --prompt N`)."""
    floor = report.floor_figures
    names = list(report.sides)
    lines = [f"workload {run_id}: {report.headline}" + (f"  [{status}]" if status else "")]
    opts = report.options
    src = opts.source.get("path") or opts.source.get("source") or ""
    lines.append(f"  mode {opts.mode}; floor: {report.floor.description}" + (f"; source {src}" if src else ""))
    if report.cluster:  # where it ran, and why its batches are not an in-process run's
        lines.append(f"  on {describe_record(report.cluster)}; {report.cluster.get('note', '')}")
    if report.skipped_too_long:
        lines.append(
            f"  {len(report.skipped_too_long)} prompt(s) skipped as longer than the context: "
            f"{', '.join(map(str, report.skipped_too_long[:10]))}{' ...' if len(report.skipped_too_long) > 10 else ''}"
        )
    cols = names + (["floor"] if floor else [])
    stats = [report.sides[n].stats for n in names] + ([floor.stats] if floor else [])
    w = 18

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"  {label:28}" + "".join(f"{c:>{w}}" for c in cells))

    row("", [c[: w - 1] for c in cols])
    row("prompts", [str(s.sequences.n) for s in stats])
    row(
        "identical",
        [
            _pct(s.sequences.share_identical)
            + (
                f" [{_pct(s.sequences.identical_ci.low)}-{_pct(s.sequences.identical_ci.high)}]"
                if s.sequences.identical_ci
                else ""
            )
            for s in stats
        ],
    )
    median = FIGURES["median_first_divergence"]
    row(median.name, [median.format(s.sequences.median_first_divergence, "-") for s in stats])
    for label, key in FIGURE_ROWS:
        row(label, [FIGURES[key].format(getattr(s.tokens, key), "-") for s in stats])
    for i, key in enumerate(BAND_KEYS if stats else ()):
        row(FIGURES[key].name, [_pct(s.tokens.outside[i].outside) if i < len(s.tokens.outside) else "-" for s in stats])
    for s in SECTIONS:  # each measure's family, where the run recorded it (routes, full rows, draws)
        for label, cells in s.text_rows(stats):
            row(label, cells)
    lines += [f"  {x}" for x in LEGEND]
    for name in names:
        f = report.sides[name]
        lines += [f"  {name}: {v}" for s in SECTIONS if (v := f.verdicts.get(s.key))]
        if f.verdict is not None:
            lines.append(f"  {name}: {verdict_line(f.verdict)}")
        worst = f.stats.worst_by_divergence[:5]
        if worst:
            lines.append(
                f"  {name}: earliest forks: "
                + ", ".join(f"prompt {w.prompt_index} at {w.first_divergence}" for w in worst)
            )
    if run_id and names:
        lines.append(f"  open one: parity runs show {run_id} --prompt N")
    for sec in SECTIONS:  # each measure's own part (a replay's pairs table and worst tokens)
        lines += sec.workload_lines(report)
    return "\n".join(lines)
