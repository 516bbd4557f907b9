"""The measures: one module per figure family, the way the kinds registry serves engines.

Each module implements the protocol of `base` (when it is wanted, what preflight says, what it asks of
the sides, what it harvests, how it pools and judges); the runners (parity_ui.commands: a comparison,
a workload, a replay) call every active measure at the same fixed points through `start` and the
`Active` set it returns, and name no family themselves. What the records keep of a measure is declared
in parity_ui.core.measures; its engine half (processors, hooks) is in parity_ui.engines; its section of
the views in parity_ui.render.sections.

May import: core, inputs, analysis, run, store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.runlog import EventCallback, phase
from ..core.types import Run, SideResult, TokenStep
from ..run.sideset import SideSet
from .base import Made, Measure, MeasureRun, Mode, PairSeen, Plan, ScoreAsk
from .clipped import Clipped
from .distribution import Distribution
from .replay_pairs import ReplayPairs, RowSeen
from .routes import Routing
from .sampling import Sampling
from .tokens import Tokens

if TYPE_CHECKING:
    from ..core.workload_record import WorkloadReport
    from ..store import Store

# In the order the runners call them: the tokens' pair sample first (a route replay's figures are
# measured against it), then the families.
MEASURES: tuple[Measure, ...] = (Tokens(), Routing(), Sampling(), Distribution(), ReplayPairs(), Clipped())


class Active:
    """A run's active measures, each hook called on every one in registry order."""

    def __init__(self, runs: dict[str, MeasureRun]):
        self.runs = runs

    def __contains__(self, key: str) -> bool:
        return key in self.runs

    def get(self, key: str) -> MeasureRun | None:
        return self.runs.get(key)

    def generate_fields(self, side: str, order: Sequence[int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for m in self.runs.values():
            out.update(m.generate_fields(side, order))
        return out

    def score_fields(self, ask: ScoreAsk) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for m in self.runs.values():
            out.update(m.score_fields(ask))
        return out

    def on_scored(self, ask: ScoreAsk, steps: Sequence[TokenStep]) -> None:
        for m in self.runs.values():
            m.on_scored(ask, steps)

    def collect(self, sides: SideSet, made: Made) -> None:
        for m in self.runs.values():
            m.collect(sides, made)

    def after_compare(self, sides: SideSet, run: Run, emit: EventCallback) -> list[SideResult]:
        """A comparison's measures' own engine calls, each timed as its phase (run.timings)."""
        changed: list[SideResult] = []
        for m in self.runs.values():
            if m.compare_phase is not None:
                with phase(run, m.compare_phase):
                    changed += m.after_compare(sides, run, emit)
        return changed

    def harvest(self, pair: PairSeen) -> None:
        for m in self.runs.values():
            m.harvest(pair)

    def sample(self, pair: PairSeen) -> None:
        for m in self.runs.values():
            m.sample(pair)

    def calls_engines(self) -> bool:
        """Whether a measure makes engine calls of its own while a chunk is under way (routes)."""
        return any(m.calls_engines for m in self.runs.values())

    def row(self, seen: Any) -> None:
        for m in self.runs.values():
            m.row(seen)

    def pairs(self) -> list[str]:
        return [name for m in self.runs.values() for name in m.pairs()]

    def end_chunk(self, chunk: Sequence[int]) -> None:
        for m in self.runs.values():
            m.end_chunk(chunk)

    def close(self) -> None:
        for m in self.runs.values():
            m.close()

    def pool(self, store: Store, run_id: str, report: WorkloadReport) -> None:
        """Every family onto the report, from the store (the token figures first: the runner pools them,
        the families go onto their pairs)."""
        for m in self.runs.values():
            m.pool(store, run_id, report)


def wanted(plan: Plan) -> list[Measure]:
    return [m for m in MEASURES if m.wanted(plan.config, plan.mode)]


def preflight(plan: Plan) -> None:
    """Every measure's preflight findings onto the run (a refusal raises ConfigError, before anything
    loads): asked of all of them, wanted or not (a setting for one that is off can be named too)."""
    for m in MEASURES:
        plan.findings.extend(f for f in m.preflight(plan) if f not in plan.findings)


def start(plan: Plan) -> Active:
    """The preflight, then each wanted measure's state for the run."""
    preflight(plan)
    return Active({m.spec.key: m.start(plan) for m in wanted(plan)})


__all__ = [
    "MEASURES",
    "Active",
    "Made",
    "Measure",
    "MeasureRun",
    "Mode",
    "PairSeen",
    "Plan",
    "RowSeen",
    "ScoreAsk",
    "start",
]
