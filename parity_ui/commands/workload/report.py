"""A workload run's report: what was asked (mode, floor, source), how far it got, and the pooled
figures of each side against the reference next to the reference's own noise floor.

Stored as the run's `workload_json` (and its one-line `headline` for the history list). The figures
are computed from the stored pair samples (`pooled`), never from what a process held in memory, so
a stopped, failed or resumed run reports exactly what is in the database.
"""
from __future__ import annotations

from sqlite_utils import Database

from ...store.runs import pair_samples
from ...core.figures import BAND_KEYS, FIGURE_ROWS, FIGURES, LEGEND, count
from ...core.pooled import EXCEEDS, TOO_FEW, Accumulator, FloorVerdict, compare_to_floor, factor_text
from ...core.workload_record import DlogpHistogram, SideFigures, WorkloadReport


def side_figures(db: Database, run_id: str, side: str) -> SideFigures:
    """A side's pooled figures and its |dlogp| histogram, in one read of its stored pair samples
    (one prompt at a time); no verdict."""
    acc, hist = Accumulator(), DlogpHistogram()
    for sample in pair_samples(db, run_id, side):
        acc.add(sample)
        hist.add(sample.logp_side, sample.logp_ref)
    return SideFigures(side, acc.result(), hist=hist)


def pooled(db: Database, run_id: str, report: WorkloadReport, sides: list[str]) -> WorkloadReport:
    """The report with every side's figures (and the floor's) computed from the store, each side
    judged against the floor, and the headline."""
    floor = report.floor.side
    report.floor_figures = side_figures(db, run_id, floor) if floor else None
    report.sides = {}
    for name in sides:
        figs = side_figures(db, run_id, name)
        figs.verdict = compare_to_floor(figs.stats, report.floor_figures.stats) if report.floor_figures else None
        report.sides[name] = figs
    report.headline = headline(report)
    return report


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def headline(report: WorkloadReport) -> str:
    """One line: how many prompts, and per side its share identical and its verdict against the floor."""
    mode = "scored" if report.options.mode == "scored" else "free-running"
    parts = []
    for name, f in report.sides.items():
        seq = f.stats.sequences
        verdict = f" ({f.verdict.verdict})" if f.verdict else ""
        parts.append(f"{name} {_pct(seq.share_identical)} identical{verdict}")
    done = f"{report.done}/{report.n_prompts}" if report.done < report.n_prompts else str(report.n_prompts)
    return f"{done} prompts, {mode}: " + ("; ".join(parts) if parts else "no figures yet")


def _g(x: float | None, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x + 0.0, fmt)  # + 0.0: no "-0"


def verdict_line(v: FloorVerdict, most: int = 4) -> str:
    """The verdict in a line: within noise, the figures over the floor (the largest factors first,
    each with its 95% interval over the prompts), or too few prompts to tell."""
    if v.verdict not in (EXCEEDS, TOO_FEW):
        return v.summary
    over = sorted((c for c in v.figures if (c.exceeds if v.verdict == EXCEEDS else c.uncertain)),
                  key=lambda c: -(c.factor if c.factor is not None else 0))
    shown = [f"{FIGURES[c.name].name} {_g(c.side)} vs {_g(c.floor)} ({factor_text(c)})" for c in over[:most]]
    more = f" and {len(over) - most} more" if len(over) > most else ""
    if v.verdict == TOO_FEW:
        n = f" over {count(v.prompts, 'prompt')}" if v.prompts else ""
        return (f"TOO FEW PROMPTS TO TELL{n}: {'; '.join(shown)}{more} — over the {v.tolerance:g}x limit, but the "
                f"interval reaches it (sampling error); run more prompts")
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
    if report.skipped_too_long:
        lines.append(f"  {len(report.skipped_too_long)} prompt(s) skipped as longer than the context: "
                     f"{', '.join(map(str, report.skipped_too_long[:10]))}{' ...' if len(report.skipped_too_long) > 10 else ''}")
    cols = names + (["floor"] if floor else [])
    stats = [report.sides[n].stats for n in names] + ([floor.stats] if floor else [])
    w = 18

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"  {label:28}" + "".join(f"{c:>{w}}" for c in cells))

    row("", [c[:w - 1] for c in cols])
    row("prompts", [str(s.sequences.n) for s in stats])
    row("identical", [_pct(s.sequences.share_identical) + (
        f" [{_pct(s.sequences.identical_ci.low)}-{_pct(s.sequences.identical_ci.high)}]"
        if s.sequences.identical_ci else "") for s in stats])
    median = FIGURES["median_first_divergence"]
    row(median.name, [median.format(s.sequences.median_first_divergence, "-") for s in stats])
    for label, key in FIGURE_ROWS:
        row(label, [FIGURES[key].format(getattr(s.tokens, key), "-") for s in stats])
    for i, key in enumerate(BAND_KEYS if stats else ()):
        row(FIGURES[key].name, [_pct(s.tokens.outside[i].outside) if i < len(s.tokens.outside) else "-"
                                for s in stats])
    lines += [f"  {x}" for x in LEGEND]
    for name in names:
        f = report.sides[name]
        if f.verdict is not None:
            lines.append(f"  {name}: {verdict_line(f.verdict)}")
        worst = f.stats.worst_by_divergence[:5]
        if worst:
            lines.append(f"  {name}: earliest forks: " + ", ".join(
                f"prompt {w.prompt_index} at {w.first_divergence}" for w in worst))
    if run_id and names:
        lines.append(f"  open one: parity runs show {run_id} --prompt N")
    return "\n".join(lines)
