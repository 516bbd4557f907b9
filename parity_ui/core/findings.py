"""The typed records a comparison and a probe carry besides the token streams: why two streams
forked (Explanation), how each side scores the other's tokens (CrossScores), and what a
determinism probe found (ProbeReport).

Each is stored as JSON in its own column; `to_json()` gives exactly the shape stored before these
were typed (a cross-score's directions keyed "<generator>_by_<scorer>", a failure as {"error": ...}),
and `*_from_json` reads every shape a release wrote (unknown keys are ignored, missing ones default).
Plain data: no module here imports anything heavy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# engines.base.clean_logprob stores a masked (-inf) logprob as -1e30: anything below this was masked by a
# logits processor, not predicted (explain, crossscore and the workload statistics leave it out).
MASKED_LOGPROB = -1e20


def _fields(cls: Any, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


# -- the explanation of a fork (parity_ui.analysis.explain) -------------------------------------------------


@dataclass
class SideAtFork:
    """One side at the first divergence: its choice, its confidence, where it put the other's token."""

    name: str
    token_id: int | None = None
    text: str = ""
    logprob: float | None = None
    top12_margin: float | None = None
    other_token_rank: int | None = None  # 1-based within the recorded top-k; None: outside it
    other_token_logprob: float | None = None
    margin_over_other: float | None = None
    recorded_k: int | None = None
    # Shared-seed sampling (parity_ui.engines.shared_seed): the side's draw at the fork.
    sampling_margin: float | None = None  # its perturbed top-2 gap, nats
    kept: int | None = None  # the kept set it drew from
    kept_mass: float | None = None  # that set's mass S under the side's raw distribution


@dataclass
class Explanation:
    """The verdict on one comparison's first divergence: "identical" | "numerical near-tie" | "router near-tie" |
    "kept-set near-tie" | "kept sets differ" (shared-seed sampling: the sides drew from different kept sets) |
    "real disagreement" | "masked token" | "length" | "sampling" | "error", a summary for a human,
    and the figures it rests on (those of other verdicts stay None)."""

    verdict: str
    summary: str
    thresholds: dict[str, float] = field(default_factory=dict)
    differing_settings: list[str] = field(default_factory=list)
    index: int | None = None
    noise_before: float | None = None  # the largest logprob gap before the fork
    sides: list[str] = field(default_factory=list)
    a: SideAtFork | None = None
    b: SideAtFork | None = None
    accepted_by_vllm_rule: bool | None = None
    largest_margin: float | None = None
    tie_bound: float | None = None
    # verdict "length": one side stopped earlier
    stopped_side: str | None = None
    stopped_after: int | None = None
    stopped_finish_reason: str | None = None
    stop_token_id: int | None = None
    continued_side: str | None = None
    continued_to: int | None = None
    # MoE (routes recorded): the first (token, layer) whose experts differ and the router margin there
    route_step: int | None = None
    route_layer: int | None = None
    route_margin: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def explanation_from_json(data: dict[str, Any] | None) -> Explanation | None:
    if not data:
        return None
    d = _fields(Explanation, data)
    for side in ("a", "b"):
        if isinstance(d.get(side), dict):
            d[side] = SideAtFork(**_fields(SideAtFork, d[side]))
    return Explanation(**{"verdict": "", "summary": "", **d})


# -- teacher-forced cross-scores (parity_ui.analysis.crossscore) ---------------------------------------------


@dataclass
class RatioRange:
    min: float
    mean: float
    max: float


@dataclass
class GapStats:
    """One generated sequence scored by another side: own - teacher-forced logprob per position."""

    generator: str
    scorer: str
    positions: int
    skipped: int  # positions where either logprob was missing or masked
    gaps: list[float | None] = field(default_factory=list)
    other_rank: list[int | None] = field(default_factory=list)  # the scorer's rank of each token
    other_disagrees: int = 0  # positions where the scorer would have picked another token
    mean_gap: float | None = None
    mean_abs_gap: float | None = None
    max_abs_gap: float | None = None
    rms_gap: float | None = None
    share_outside_band: float | None = None
    ratio_band: list[float] = field(default_factory=list)
    importance_ratio: RatioRange | None = None  # exp(logp_reference - logp_side), before any clipping


def gap_stats_from_json(data: dict[str, Any] | None) -> GapStats | None:
    if not isinstance(data, dict):
        return None
    d = _fields(GapStats, data)
    if isinstance(d.get("importance_ratio"), dict):
        d["importance_ratio"] = RatioRange(**_fields(RatioRange, d["importance_ratio"]))
    return GapStats(**{"generator": "", "scorer": "", "positions": 0, "skipped": 0, **d})


@dataclass
class CrossScores:
    """Each direction of one comparison, keyed "<generator>_by_<scorer>" (None: the generator made
    no tokens), or why cross-scoring failed."""

    directions: dict[str, GapStats | None] = field(default_factory=dict)
    error: str | None = None

    def get(self, key: str) -> GapStats | None:
        return self.directions.get(key)

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        return {k: None if v is None else dataclasses.asdict(v) for k, v in self.directions.items()}


def cross_scores_from_json(data: dict[str, Any] | None) -> CrossScores | None:
    if data is None:
        return None
    if "error" in data:
        return CrossScores(error=str(data["error"]))
    return CrossScores(directions={k: gap_stats_from_json(v) for k, v in data.items()})


# -- a determinism probe (parity_ui.commands.probes) ---------------------------------------------------------


@dataclass
class OutputsSummary:
    """Repeated generations of one prompt: distinct outputs (counts most common first) and the first fork."""

    runs: int
    distinct: int
    first_fork: int | None
    counts: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


@dataclass
class SideProbe:
    side: str
    batch_invariant: bool
    alone: OutputsSummary
    batched: OutputsSummary
    alone_vs_batched: OutputsSummary

    @property
    def stable(self) -> bool:
        return all(s.distinct == 1 for s in (self.alone, self.batched, self.alone_vs_batched))


@dataclass
class BatchInvariantSupport:
    supported: bool
    detail: str = ""


@dataclass
class ProbeReport:
    """Every probed setup (a side, and "<side>+batch_invariant" where that mode exists), by label."""

    n: int
    batch: int
    batch_invariant: BatchInvariantSupport
    sides: dict[str, SideProbe] = field(default_factory=dict)

    @property
    def stable(self) -> bool:
        return all(p.stable for p in self.sides.values())

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def probe_report_from_json(data: dict[str, Any] | None) -> ProbeReport | None:
    if not data:
        return None

    def summary(d: dict[str, Any] | None) -> OutputsSummary:
        return OutputsSummary(**{"runs": 0, "distinct": 0, "first_fork": None, **_fields(OutputsSummary, d or {})})

    sides = {
        label: SideProbe(
            side=e.get("side", label),
            batch_invariant=bool(e.get("batch_invariant")),
            alone=summary(e.get("alone")),
            batched=summary(e.get("batched")),
            alone_vs_batched=summary(e.get("alone_vs_batched")),
        )
        for label, e in (data.get("sides") or {}).items()
    }
    bi = data.get("batch_invariant") or {}
    return ProbeReport(
        n=int(data.get("n") or 0),
        batch=int(data.get("batch") or 0),
        batch_invariant=BatchInvariantSupport(bool(bi.get("supported")), bi.get("detail") or ""),
        sides=sides,
    )
