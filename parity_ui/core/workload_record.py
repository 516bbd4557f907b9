"""A workload run's record: what was asked (mode, floor, source), how far it got, and each side's
pooled figures next to the floor's. Plain data (its JSON is the run's `workload_json`); computing the
figures from the store and printing them is parity_ui.commands.workload.report's and parity_ui.render.text's.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import sub, truediv
from typing import Any

from .pooled import EXCEEDS, TOO_FEW, WITHIN, FloorVerdict, WorkloadStats, all_scorable, scorable
from .replay_record import ReplayRecord, replay_record_from_json

MODES = ("free", "scored", "replay")  # replay: a dump's tokens forced (parity_ui.commands.replay)
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
    # On a Ray cluster (parity_ui.core.cluster): "local", an address, or None (in process); and the
    # replicas of each side ({side or "*": count}). Stored, so `parity resume` goes on the same way.
    cluster: str | None = None
    replicas: dict[str, int] = field(default_factory=dict)


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
        if all_scorable(logp_side) and all_scorable(logp_ref):  # the usual case: at C speed
            gaps = list(map(abs, map(sub, logp_side, logp_ref)))
        else:
            gaps = [abs(a - b) for a, b in zip(logp_side, logp_ref) if scorable(a) and scorable(b)]
        self.zero += gaps.count(0.0)  # exact zeros have no logarithm
        # Each nonzero gap's bin as the one-pair-at-a-time loop computed it, floor((log10 d - low) / width),
        # the same float operations mapped over the sample (~1.5x faster than a Python loop per pair).
        n, counts = len(self.counts), self.counts
        for i, k in Counter(
            map(
                math.floor,
                map(truediv, map(sub, map(math.log10, filter(None, gaps)), repeat(self.low)), repeat(self.width)),
            )
        ).items():
            if i < 0:
                self.below += k
            elif i >= n:
                self.above += k
            else:
                counts[i] += k

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> DlogpHistogram | None:
        return (
            None
            if not d
            else cls(
                low=d["low"],
                width=d["width"],
                counts=list(d["counts"]),
                zero=d["zero"],
                below=d["below"],
                above=d["above"],
            )
        )


@dataclass
class SideFigures:
    side: str
    stats: WorkloadStats
    verdict: FloorVerdict | None = (
        None  # the token figures against the floor; None for the floor itself, or without one
    )
    hist: DlogpHistogram | None = None  # None in a report stored before histograms were pooled
    # Each pooled measure's family against the floor's, one sentence, by the measure's key (core.measures
    # POOLED: "routing", "distribution", "sampling"); absent: not recorded, or no floor to judge against.
    verdicts: dict[str, str] = field(default_factory=dict)


# `--json` (schema 3) and stored reports before it: each family's verdict as its own key (an alias of
# SideFigures.verdicts, kept for one schema version; read back from older reports).
VERDICT_ALIASES = {"routing": "routing_verdict", "distribution": "distribution_verdict", "sampling": "sampling_verdict"}


def put_family(
    report: WorkloadReport,
    key: str,
    figures: Callable[[str], dict[str, Any] | None],
    judge: Callable[[dict[str, Any] | None, dict[str, Any] | None], str | None],
) -> None:
    """A pooled measure's family onto a report: `figures(side)` for each pair (from the side it pools
    from: WorkloadReport.side_of) and the floor (None: not recorded), and each pair's verdict against
    the floor's (`judge(side, floor)`)."""
    floor = report.floor_figures
    if floor is not None:
        _set_family(floor, key, figures(floor.side))
    fl = floor.stats.family(key) if floor is not None else None
    for name, figs in report.sides.items():
        side = report.side_of(name)
        _set_family(figs, key, figures(side) if side is not None else None)
        verdict = judge(figs.stats.family(key), fl)
        if verdict:
            figs.verdicts[key] = verdict
        else:
            figs.verdicts.pop(key, None)


def _set_family(f: SideFigures, key: str, figures: dict[str, Any] | None) -> None:
    if figures is None:
        f.stats.families.pop(key, None)
    else:
        f.stats.families[key] = figures


@dataclass
class WorkloadReport:
    options: WorkloadOptions
    floor: FloorSpec
    n_prompts: int  # as given
    done: int = 0  # prompts every side has finished (stored)
    skipped_too_long: list[int] = field(default_factory=list)  # prompt indices left out (too_long=skip)
    # Each compared pair's figures (not the floor's), by the pair's name: in a workload a pair is a side
    # against the reference, named by the side (and a scored route replay "b+ref routes"); in a replay its
    # ReplayPairs ("recorded vs hf", ...: core.replay_record). `figures_of` also takes a replay pair's
    # key from before schema 3.
    sides: dict[str, SideFigures] = field(default_factory=dict)
    floor_figures: SideFigures | None = None
    headline: str = ""
    rate: float | None = None  # prompts per second while generating (progress, ETA)
    # A replay's own record (core.replay_record.ReplayRecord): the dump, its pairs, the masked tokens,
    # the worst tokens. None for other workloads.
    replay: ReplayRecord | None = None
    # The cluster it ran on (parity_ui.core.cluster.ClusterRecord as a dict); None in process.
    cluster: dict[str, Any] | None = None

    def figures_of(self, name: str) -> SideFigures | None:
        """A pair's figures by its name (a replay's: or its key before schema 3)."""
        got = self.sides.get(name)
        if got is None and self.replay is not None:
            p = self.replay.pair(name)
            got = self.sides.get(p.name) if p is not None else None
        return got

    def side_of(self, name: str) -> str | None:
        """The side whose stored comparisons and steps a pair's measures pool from (routes, full rows): a
        workload's pair is its side; a replay's the side it compares with the trainer, where it is one."""
        if self.replay is None:
            return name
        p = self.replay.pair(name)
        return p.side if p is not None else (name if name == self.floor.side else None)

    @property
    def identical(self) -> bool | None:
        """Every side token-identical on every finished prompt; None before any figure."""
        if not self.sides:
            return None
        return all(
            f.stats.sequences.n and f.stats.sequences.identical == f.stats.sequences.n for f in self.sides.values()
        )

    @property
    def first_divergence(self) -> int | None:
        firsts = [
            x
            for f in self.sides.values()
            if f.stats.worst_by_divergence and (x := f.stats.worst_by_divergence[0].first_divergence) is not None
        ]
        return min(firsts) if firsts else None

    @property
    def within_noise(self) -> bool | None:
        """Every side within the floor (None without a floor or figures)."""
        verdicts = [f.verdict for f in self.sides.values()]
        if not verdicts:
            return None
        judged = [v for v in verdicts if v is not None]
        if len(judged) < len(verdicts):
            return None
        return all(v.verdict == WITHIN for v in judged)

    @property
    def too_few_to_tell(self) -> bool:
        """No side exceeds the floor beyond sampling error, and some side is over it within it."""
        verdicts = [f.verdict.verdict for f in self.sides.values() if f.verdict is not None]
        return TOO_FEW in verdicts and EXCEEDS not in verdicts

    def to_json(self) -> dict[str, Any]:
        def figures(f: SideFigures | None) -> dict[str, Any] | None:
            if f is None:
                return None
            return {
                "side": f.side,
                "stats": f.stats.to_dict(),
                "verdict": f.verdict.to_dict() if f.verdict else None,
                "hist": dataclasses.asdict(f.hist) if f.hist else None,
                "verdicts": dict(f.verdicts),
                **{alias: f.verdicts.get(key) for key, alias in VERDICT_ALIASES.items()},
            }

        return {
            "options": dataclasses.asdict(self.options),
            "floor": dataclasses.asdict(self.floor),
            "n_prompts": self.n_prompts,
            "done": self.done,
            "skipped_too_long": list(self.skipped_too_long),
            "sides": {k: figures(v) for k, v in self.sides.items()},
            "floor_figures": figures(self.floor_figures),
            "headline": self.headline,
            "rate": self.rate,
            "replay": self.replay.to_json() if self.replay is not None else None,
            "cluster": self.cluster,
        }


def report_from_json(d: dict[str, Any]) -> WorkloadReport:
    def figures(f: dict[str, Any] | None) -> SideFigures | None:
        if not f:
            return None
        return SideFigures(
            side=f["side"],
            stats=WorkloadStats.from_dict(f["stats"]),
            verdict=FloorVerdict.from_dict(f["verdict"]) if f.get("verdict") else None,
            hist=DlogpHistogram.from_dict(f.get("hist")),
            verdicts={
                **{k: v for k, alias in VERDICT_ALIASES.items() if (v := f.get(alias))},
                **(f.get("verdicts") or {}),
            },
        )

    opts = {
        k: v for k, v in (d.get("options") or {}).items() if k in {f.name for f in dataclasses.fields(WorkloadOptions)}
    }
    floor = FloorSpec(**d["floor"])
    replay = replay_record_from_json(d.get("replay"), floor.side)
    sides = {k: f for k, v in (d.get("sides") or {}).items() if (f := figures(v)) is not None}
    if replay is not None:  # a replay stored before schema 3: its pairs' figures by key, now by name
        for p in replay.pairs:
            if p.key and p.key in sides and p.key != p.name and p.kind != "floor":
                sides[p.name] = sides.pop(p.key)
                sides[p.name].side = p.name
    return WorkloadReport(
        options=WorkloadOptions(**opts),
        floor=floor,
        n_prompts=d["n_prompts"],
        done=d.get("done", 0),
        skipped_too_long=list(d.get("skipped_too_long") or []),
        sides=sides,
        floor_figures=figures(d.get("floor_figures")),
        headline=d.get("headline", ""),
        rate=d.get("rate"),
        replay=replay,
        cluster=d.get("cluster"),
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def headline(report: WorkloadReport) -> str:
    """One line: how many prompts, and per side its share identical and its verdict against the floor."""
    mode = {"scored": "scored", "replay": "replayed"}.get(report.options.mode, "free-running")
    parts = []
    for name, f in report.sides.items():
        seq = f.stats.sequences
        verdict = f" ({f.verdict.verdict})" if f.verdict else ""
        parts.append(f"{name} {_pct(seq.share_identical)} identical{verdict}")
    done = f"{report.done}/{report.n_prompts}" if report.done < report.n_prompts else str(report.n_prompts)
    return f"{done} prompts, {mode}: " + ("; ".join(parts) if parts else "no figures yet")
