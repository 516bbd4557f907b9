"""Records for a terminal: a probe, a sweep's summary and a layer localisation as the lines the CLI
prints. Pure: a record in, text out."""
from __future__ import annotations

from typing import Any

from ..core.types import FLOOR_MULTIPLE, MIN_REL, Localisation, Run


def format_probe(run: Run) -> str:
    """The probe as lines for a terminal."""
    if run.status == "error":
        return f"probe {run.id}: ERROR: {run.error}"
    p = run.probes
    if p is None:
        return f"probe {run.id}: {run.status}"
    lines = [f"probe {run.id}: {'DETERMINISTIC' if run.status == 'ok' else 'NOT DETERMINISTIC'}  "
             f"model={run.model.name}  dtype={run.config.get('dtype')}  n={p.n}  batch={p.batch}"]
    for label, entry in p.sides.items():
        for s, what in ((entry.alone, "alone"), (entry.batched, "in a batch"), (entry.alone_vs_batched,
                                                                                "alone vs batched")):
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
        fd = "identical" if p["first_divergence"] is None and p["status"] == "ok" else \
            (f"diverges at {p['first_divergence']}" if p["first_divergence"] is not None else p["status"])
        extra = f" ({p['verdict']})" if p["verdict"] and p["verdict"] != "identical" else ""
        err = f": {p['error'][:100]}" if p["error"] else ""
        lines.append(f"  {s:50s} {fd}{extra}{err}   run {p['run_id']}")
    for e in summary["effects"]:
        by = ", ".join(f"{v} -> {['-' if x is None else x for x in fds]}" for v, fds in
                       e["first_divergence_by_value"].items())
        lines.append(f"  {e['key']}: {'MOVES' if e['moves_divergence'] else 'does not move'} the divergence ({by})")
    return "\n".join(lines)


def format_localisation(loc: Localisation) -> str:
    """The figures as text: one row per layer and block at the examined position."""
    if loc.error:
        return f"localisation {loc.id}: error: {loc.error}"
    lines = [f"localisation {loc.id} of run {loc.run_id}, prompt {loc.prompt_index}: {loc.b} against {loc.a} at "
             f"generated token {loc.position} (id index {loc.token_positions[0]}; also {loc.token_positions[1:]})",
             loc.summary, *(f"note: {n}" for n in loc.notes),
             f"noise floor: {loc.noise_floor.get('method', '')}",
             f"{'layer':>5}  {'block':8} {'rel L2':>10} {'floor':>10} {'cosine':>10}"]
    for f in loc.per_layer:
        mark = "*" if f["rel_l2"][0] > max(FLOOR_MULTIPLE * f["floor"][0], MIN_REL) else " "
        layer = "-" if f["layer"] is None else str(f["layer"])
        lines.append(f"{layer:>5}  {f['block']:8} {f['rel_l2'][0]:10.3e} {f['floor'][0]:10.3e} {f['cosine'][0]:10.6f} {mark}")
    lines.append(f"(* = over {FLOOR_MULTIPLE:g}x the floor; {loc.seconds:.1f} s)")
    return "\n".join(lines)
