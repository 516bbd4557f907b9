"""A workload run's report: what was asked (mode, floor, source), how far it got, and the pooled
figures of each side against the reference next to the reference's own noise floor.

Stored as the run's `workload_json` (and its one-line `headline` for the history list). The figures
are computed from the stored pair samples (`pooled`), never from what a process held in memory, so
a stopped, failed or resumed run reports exactly what is in the database.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlite_utils import Database

from ..crossscore import MASKED_LOGPROB
from ..store import pair_samples
from .stats import Accumulator, FloorVerdict, WorkloadStats, compare_to_floor

MODES = ("free", "scored")
FLOORS = ("auto", "batch", "order", "kernel", "none")


@dataclass
class WorkloadOptions:
    """How the workload runs; stored with it, so `parity resume` goes on the same way."""

    mode: str = "free"  # "free": every side generates; "scored": the reference teacher-forces the others
    floor: str = "auto"  # the change the reference's own noise is measured under (FLOORS; auto: see run.py)
    floor_batch_size: int = 8  # floor "batch": the reference again at this batch size
    too_long: str = "skip"  # a prompt longer than the context: "skip" (counted) or "stop"
    chunk: int = 64  # prompts generated, compared and stored together (Stop keeps finished chunks)
    source: dict[str, Any] = field(default_factory=dict)  # the file: path, field, rows, sample, content hash


@dataclass
class FloorSpec:
    change: str  # FLOORS
    side: str | None  # the floor's side in run.sides (the reference under the change); None: no floor
    description: str  # for people: "the reference again at batch 8, its prompts in reverse order"


# The |dlogp| histogram's bins, in log10 nats: 1e-7 (float32 rounding of a log-softmax is ~1e-6) to
# 1e2, a quarter decade each. Fixed, so every side's and the floor's bars line up in one chart.
HIST_LOW, HIST_HIGH, HIST_WIDTH = -7.0, 2.0, 0.25


@dataclass
class DlogpHistogram:
    """A side's |dlogp| = |logp_side - logp_ref| over the same scorable pairs as its token figures,
    binned by log10: counts[i] holds low + i*width <= log10|dlogp| < low + (i+1)*width. Exact zeros
    have no logarithm (`zero`); `below` and `above` count what falls outside the bins. Computed once
    when the figures are pooled, so a view draws it without reading any logprob."""
    low: float = HIST_LOW
    width: float = HIST_WIDTH
    counts: list[int] = field(default_factory=lambda: [0] * round((HIST_HIGH - HIST_LOW) / HIST_WIDTH))
    zero: int = 0
    below: int = 0
    above: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts) + self.zero + self.below + self.above

    def edges(self) -> list[float]:
        """The bins' log10 edges (one more than counts)."""
        return [self.low + i * self.width for i in range(len(self.counts) + 1)]

    def add(self, logp_side: Sequence[float | None], logp_ref: Sequence[float | None]) -> None:
        """Count one sample's pairs; a pair with a missing, non-finite or masked logprob is skipped,
        as the token figures skip it."""
        n, low, width, counts = len(self.counts), self.low, self.width, self.counts
        for a, b in zip(logp_side, logp_ref):
            if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) \
                    or a <= MASKED_LOGPROB or b <= MASKED_LOGPROB:
                continue
            d = abs(a - b)
            if d == 0.0:
                self.zero += 1
                continue
            i = math.floor((math.log10(d) - low) / width)
            if i < 0:
                self.below += 1
            elif i >= n:
                self.above += 1
            else:
                counts[i] += 1

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> DlogpHistogram | None:
        return None if not d else cls(low=d["low"], width=d["width"], counts=list(d["counts"]), zero=d["zero"],
                                      below=d["below"], above=d["above"])


@dataclass
class SideFigures:
    side: str
    stats: WorkloadStats
    verdict: FloorVerdict | None = None  # against the floor; None for the floor itself, or without one
    hist: DlogpHistogram | None = None  # None in a report stored before histograms were pooled


@dataclass
class WorkloadReport:
    options: WorkloadOptions
    floor: FloorSpec
    n_prompts: int  # as given
    done: int = 0  # prompts every side has finished (stored)
    skipped_too_long: list[int] = field(default_factory=list)  # prompt indices left out (too_long=skip)
    sides: dict[str, SideFigures] = field(default_factory=dict)  # each compared side (not the floor)
    floor_figures: SideFigures | None = None
    headline: str = ""
    rate: float | None = None  # prompts per second while generating (progress, ETA)

    @property
    def identical(self) -> bool | None:
        """Every side token-identical on every finished prompt; None before any figure."""
        if not self.sides:
            return None
        return all(f.stats.sequences.n and f.stats.sequences.identical == f.stats.sequences.n
                   for f in self.sides.values())

    @property
    def first_divergence(self) -> int | None:
        firsts = [f.stats.worst_by_divergence[0].first_divergence for f in self.sides.values()
                  if f.stats.worst_by_divergence]
        firsts = [x for x in firsts if x is not None]
        return min(firsts) if firsts else None

    @property
    def within_noise(self) -> bool | None:
        """Every side within the floor (None without a floor or figures)."""
        verdicts = [f.verdict for f in self.sides.values()]
        if not verdicts or any(v is None for v in verdicts):
            return None
        return all(v.verdict == "within noise" for v in verdicts)

    def to_json(self) -> dict[str, Any]:
        def figures(f: SideFigures | None) -> dict[str, Any] | None:
            if f is None:
                return None
            return {"side": f.side, "stats": f.stats.to_dict(), "verdict": f.verdict.to_dict() if f.verdict else None,
                    "hist": dataclasses.asdict(f.hist) if f.hist else None}

        return {"options": dataclasses.asdict(self.options), "floor": dataclasses.asdict(self.floor),
                "n_prompts": self.n_prompts, "done": self.done, "skipped_too_long": list(self.skipped_too_long),
                "sides": {k: figures(v) for k, v in self.sides.items()}, "floor_figures": figures(self.floor_figures),
                "headline": self.headline, "rate": self.rate}


def report_from_json(d: dict[str, Any]) -> WorkloadReport:
    def figures(f: dict[str, Any] | None) -> SideFigures | None:
        if not f:
            return None
        return SideFigures(side=f["side"], stats=WorkloadStats.from_dict(f["stats"]),
                           verdict=FloorVerdict.from_dict(f["verdict"]) if f.get("verdict") else None,
                           hist=DlogpHistogram.from_dict(f.get("hist")))

    opts = {k: v for k, v in (d.get("options") or {}).items() if k in {f.name for f in dataclasses.fields(WorkloadOptions)}}
    return WorkloadReport(options=WorkloadOptions(**opts), floor=FloorSpec(**d["floor"]), n_prompts=d["n_prompts"],
                          done=d.get("done", 0), skipped_too_long=list(d.get("skipped_too_long") or []),
                          sides={k: f for k, v in (d.get("sides") or {}).items() if (f := figures(v)) is not None},
                          floor_figures=figures(d.get("floor_figures")), headline=d.get("headline", ""),
                          rate=d.get("rate"))


def side_stats(db: Database, run_id: str, side: str) -> WorkloadStats:
    """A side's pooled figures, read from its stored pair samples one prompt at a time."""
    return side_figures(db, run_id, side).stats


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


FIGURE_ROWS: tuple[tuple[str, str], ...] = (
    ("|dlogp| mean", "abs_dlogp_mean"), ("|dlogp| p50", "abs_dlogp_p50"), ("|dlogp| p95", "abs_dlogp_p95"),
    ("|dlogp| p99", "abs_dlogp_p99"), ("|dlogp| max", "abs_dlogp_max"), ("|dprob| mean", "abs_dprob_mean"),
    ("|dprob| max", "abs_dprob_max"), ("KL (kl)", "kl"), ("k3", "k3"), ("Pearson r (p)", "pearson"),
    ("token_mult_prob_error", "token_mult_prob_error"), ("rho min", "rho_min"), ("rho mean", "rho_mean"),
    ("rho max", "rho_max"),
)


def verdict_line(v: FloorVerdict, most: int = 4) -> str:
    """The verdict in a line: within noise, or the figures over the floor, the largest factors first."""
    if v.verdict != "exceeds noise":
        return v.summary
    over = sorted((c for c in v.figures if c.exceeds), key=lambda c: -(c.factor if c.factor is not None else 0))
    shown = [f"{c.name} {_g(c.side)} vs {_g(c.floor)} (" + ("floor zero" if c.floor_is_zero else f"{c.factor:.3g}x") + ")"
             for c in over[:most]]
    more = f" and {len(over) - most} more" if len(over) > most else ""
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
        lines.append(f"  {label:24}" + "".join(f"{c:>{w}}" for c in cells))

    row("", [c[:w - 1] for c in cols])
    row("prompts", [str(s.sequences.n) for s in stats])
    row("identical", [_pct(s.sequences.share_identical) + (
        f" [{_pct(s.sequences.identical_ci.low)}-{_pct(s.sequences.identical_ci.high)}]"
        if s.sequences.identical_ci else "") for s in stats])
    row("median first divergence", [_g(s.sequences.median_first_divergence) for s in stats])
    for label, key in FIGURE_ROWS:
        row(label, [_g(getattr(s.tokens, key)) for s in stats])
    for i, band in enumerate(stats[0].tokens.outside if stats else []):
        row(f"outside [{band.low:g}, {band.high:g}]", [_pct(s.tokens.outside[i].outside) for s in stats])
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
