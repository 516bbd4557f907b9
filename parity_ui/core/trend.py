"""A whole RL run's mismatch over its steps: the record `parity replay DIR` stores (a run of kind
"trend", its record in the store's `trends` table) and every view reads.

Each step of the run is replayed as its own run of kind "replay" (recorded-only where the dump holds
both the rollout's and the trainer's logprobs; with engines otherwise); the trend keeps, per step and
per policy version, the figures of the run's own pair (the recorded rollout against the trainer) and
the step's replay run id (a click opens it), and the change-points: where a figure jumps, with its
size against the steps before it (parity_ui.analysis.changepoint).

The figures (`TREND_FIGURES`): the pooled token figures of the pair (core.pooled: KL(side‖ref) k3 —
prime-rl's `mismatch_kl` —, |Δlogprob| quantiles, the ρ bands before any clipping, ρ min/mean/max),
the importance ratio as the trainer clips it (the clipped-ratio family, core.clipped: the share the
clip changed hides ρ ≪ 1: TRL #5243, NeMo-RL #3900), the routing agreement where routes were recorded
and replayed (the routing family), and the rollout's kept sets (their mean size, where the dump records
them: the trend's own figure; their mass where a step's figures carry the sampling family: a replay
does not score the recorded kept sets under the trainer yet). Every figure but the kept sets' size is
read off the step replay's pooled figures of the pair (figures_of), so the trend shows what the
step's own replay shows.

Pure: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .figures import FIGURES, Figure
from .measures import CLIPPED, ROUTING, SAMPLING
from .replay_record import RECORDED_TRAINER_PAIR, ReplayPair, ReplayRecord

# The trend's own figure (the recorded kept sets' size: of the dump's rows, not of a pair), registered
# here next to the pooled figures of core.figures it is shown with.
OWN: dict[str, Figure] = {
    f.key: f
    for f in (
        Figure(
            "kept_size_recorded",
            "kept set size (recorded)",
            "mean size of the rollout's kept top-p set, as the dump records it",
            higher_is_worse=False,
        ),
    )
}

# The trend's figures, in the table's and the plot's order; the first few are plotted by default.
TREND_FIGURES: tuple[str, ...] = (
    "k3",
    "outside_0.8_1.2",
    "outside_0.9_1.1",
    "outside_0.99_1.01",
    "outside_0.999_1.002",
    "rho_clipped_share",
    "rho_low_share",
    "rho_clipped_mean",
    "rho_min",
    "rho_mean",
    "rho_max",
    "abs_dlogp_mean",
    "abs_dlogp_p50",
    "abs_dlogp_p95",
    "abs_dlogp_p99",
    "abs_dlogp_max",
    "extreme_share",
    "route_same_set",
    "kept_mass_mean",
    "kept_size_recorded",
)
PLOTTED: tuple[str, ...] = ("k3", "outside_0.8_1.2", "abs_dlogp_p99", "rho_clipped_share")
# The figures a change-point is looked for in, most telling first (the trend names the earliest).
WATCHED: tuple[str, ...] = (
    "k3",
    "outside_0.8_1.2",
    "outside_0.99_1.01",
    "abs_dlogp_p99",
    "abs_dlogp_mean",
    "rho_clipped_share",
    "rho_low_share",
    "route_same_set",
    "kept_mass_mean",
)


def trend_figure(key: str) -> Figure:
    f = OWN.get(key) or FIGURES.get(key)
    if f is None:
        raise KeyError(f"unknown trend figure {key!r}; known: {', '.join(TREND_FIGURES)}")
    return f


@dataclass
class StepFigures:
    """One step's (or one policy version's within it) figures and counts."""

    rows: int = 0
    tokens: int = 0  # pairs pooled (masked and unscorable tokens left out)
    figures: dict[str, float | None] = field(default_factory=dict)


@dataclass
class TrendStep:
    step: int
    status: str  # "ok", "partial" (ranks missing, rows skipped), "skipped" (incomplete), "error"
    run_id: str | None = None  # the step's replay run (None: not replayed)
    figures: StepFigures = field(default_factory=StepFigures)
    pair: str | None = None  # the step replay's pair its figures are of (ReplayPair.name; followed_pair)
    versions: dict[str, StepFigures] = field(default_factory=dict)  # per policy version, where rows name one
    note: str | None = None  # why skipped, what is missing (ranks), the error
    files: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # prefix-cache hit rate, spec-decoding accept rate
    seconds: float | None = None  # the step's replay
    landed_s: float | None = None  # follow mode: from its completion (marker or last write) to its figures


@dataclass
class ChangePoint:
    figure: str
    step: int  # the first step of the new level
    before: float  # mean over the steps before it
    after: float  # mean over it and the steps after
    size: float  # after − before
    ratio: float | None  # after / before (None when before is 0)
    score: float  # |size| in units of the steps' own spread (the larger, the surer)

    def sentence(self) -> str:
        f = trend_figure(self.figure)
        how = f"{self.ratio:.3g}x" if self.ratio is not None and self.ratio > 0 else f"{self.size:+.3g}"
        return (
            f"{f.name} jumps at step {self.step}: {f.format(self.after)} from {f.format(self.before)} over the "
            f"steps before ({how}, {self.score:.1f} spreads)"
        )


@dataclass
class GateRule:
    """A threshold a follow can fail on: `figure > limit` (or `<` for a figure where lower is worse)."""

    figure: str
    op: str  # ">" or "<"
    limit: float

    def breached(self, value: float | None) -> bool:
        """Whether a step's value fails the rule. A figure the step could not measure (no scorable token,
        a figure this mode does not compute) fails it: a gate that cannot measure must not pass."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return True
        return value > self.limit if self.op == ">" else value < self.limit

    def text(self) -> str:
        return f"{self.figure} {self.op} {self.limit:g}"


@dataclass
class TrendReport:
    root: str
    format: str
    mode: str  # "recorded" (no engine) or "engines" (each step replayed with the sides)
    pair: str = ""  # the pair whose figures the trend follows (ReplayPair.name: its first step's)
    steps: list[TrendStep] = field(default_factory=list)
    changes: list[ChangePoint] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # mixed models, missing ranks, skipped steps, named
    gate: list[GateRule] = field(default_factory=list)
    breach: dict[str, Any] | None = None  # the first step a gate rule failed at: {step, rule, value}
    follow: bool = False
    headline: str = ""

    def step(self, n: int) -> TrendStep | None:
        return next((s for s in self.steps if s.step == n), None)

    def series(self, figure: str) -> tuple[list[int], list[float | None]]:
        done = [s for s in self.steps if s.status in ("ok", "partial")]
        return [s.step for s in done], [s.figures.figures.get(figure) for s in done]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def trend_from_json(d: Mapping[str, Any]) -> TrendReport:
    def figs(x: Mapping[str, Any] | None) -> StepFigures:
        return StepFigures(**x) if x else StepFigures()

    steps = [
        TrendStep(
            **{
                **s,
                "figures": figs(s.get("figures")),
                "versions": {k: figs(v) for k, v in (s.get("versions") or {}).items()},
            }
        )
        for s in d.get("steps") or []
    ]
    return TrendReport(
        **{
            **d,
            "steps": steps,
            "changes": [ChangePoint(**c) for c in d.get("changes") or []],
            "gate": [GateRule(**g) for g in d.get("gate") or []],
        }
    )


def parse_gate(items: Iterable[str]) -> list[GateRule]:
    """`FIGURE>LIMIT` or `FIGURE<LIMIT` each (e.g. "k3>0.001", "outside_0.8_1.2>0.02"). Raises ValueError
    naming the problem and the known figures."""
    out = []
    for item in items:
        text = item.replace(" ", "")
        op = ">" if ">" in text else "<" if "<" in text else None
        if op is None:
            raise ValueError(f"--fail-on {item!r}: write FIGURE>LIMIT or FIGURE<LIMIT, e.g. k3>0.001")
        key, _, limit = text.partition(op)
        try:
            trend_figure(key)
        except KeyError:
            raise ValueError(f"--fail-on {item!r}: unknown figure {key!r}; known: {', '.join(TREND_FIGURES)}") from None
        try:
            value = float(limit)
        except ValueError:
            raise ValueError(f"--fail-on {item!r}: {limit!r} is not a number") from None
        out.append(GateRule(key, op, value))
    return out


def followed_pair(record: ReplayRecord | None) -> ReplayPair | None:
    """The pair of a step's replay the trend follows: the run's own mismatch as the run itself recorded
    it (the recorded rollout against the dump's own trainer logprobs) where the dump has both, else the
    replay's own pair (ReplayRecord.main: the recorded rollout, or an engine re-run, against the trainer
    replayed as an engine)."""
    if record is None:
        return None
    return next((p for p in record.pairs if p.kind == RECORDED_TRAINER_PAIR), None) or record.main


def figures_of(stats: Any, kept_size: float | None = None) -> dict[str, float | None]:
    """The trend's figures of one pooled pair (a core.pooled.WorkloadStats: its token figures and its
    families: the clipped ratio, routes, kept mass) and the recorded kept sets' mean size."""
    from .figures import BAND_KEYS

    t = stats.tokens
    out: dict[str, float | None] = {
        "k3": t.k3,
        "rho_min": t.rho_min,
        "rho_mean": t.rho_mean,
        "rho_max": t.rho_max,
        "abs_dlogp_mean": t.abs_dlogp_mean,
        "abs_dlogp_p50": t.abs_dlogp_p50,
        "abs_dlogp_p95": t.abs_dlogp_p95,
        "abs_dlogp_p99": t.abs_dlogp_p99,
        "abs_dlogp_max": t.abs_dlogp_max,
        "extreme_share": t.extreme_share,
    }
    for key, band in zip(BAND_KEYS, t.outside):
        out[key] = band.outside
    clipped = stats.family(CLIPPED.key) or {}
    out.update({k: v for k, v in clipped.items() if k != "tokens"})
    routing = stats.family(ROUTING.key) or {}
    if routing.get("route_same_set") is not None:
        out["route_same_set"] = routing["route_same_set"]
    sampling = stats.family(SAMPLING.key) or {}
    if sampling.get("kept_mass_mean") is not None:
        out["kept_mass_mean"] = sampling["kept_mass_mean"]
    if kept_size is not None:
        out["kept_size_recorded"] = kept_size
    return out
