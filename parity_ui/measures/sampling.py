"""The sampling measure (shared-seed draws): each pair's kept sets and both importance ratios, from the
draws both sides recorded (core.kept_mass, analysis.kept_mass), pooled into the sampling family and
judged against the floor's by Wilson intervals (core.pooled.sampling_against_floor).

Its engine half: parity_ui.engines.shared_seed (and vllm_shared_seed), which record each draw's
margin, kept set and mass on the sampled steps (core.measures SAMPLING columns).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..analysis.kept_mass import kept_mass
from ..core.config import ParityConfig
from ..core.kept_mass import KeptMass, kept_mass_from_json
from ..core.measures import KEPT_MASS, SAMPLING
from ..core.pooled import pool_kept_mass, sampling_against_floor
from ..core.types import Finding
from ..core.workload_record import put_family
from .base import MeasureRun, Mode, PairSeen, Plan

if TYPE_CHECKING:
    from ..core.workload_record import WorkloadReport
    from ..store import Store


class Sampling:
    spec = SAMPLING

    def wanted(self, cfg: ParityConfig, mode: Mode) -> bool:
        # Wherever every side generates: whether it drew is its engine's to record (shared-seed sampling
        # records each draw; greedy or native sampling none, and the pair keeps no record). A scored
        # workload is greedy and a replay forces its tokens: nothing is drawn there.
        return mode in ("compare", "free")

    def preflight(self, plan: Plan) -> list[Finding]:
        return []

    def start(self, plan: Plan) -> MeasureRun:
        return SamplingRun()


class SamplingRun(MeasureRun):
    def harvest(self, pair: PairSeen) -> None:
        KEPT_MASS.put(pair.c, kept_mass(pair.c, pair.a, pair.b))  # stored with the comparison; pooled from the store

    def pool(self, store: Store, run_id: str, report: WorkloadReport) -> None:
        """Each side's family (and the floor's) from every stored kept-mass record of the run (a resumed
        run pools its earlier chunks too), each side judged against the floor. A run with no stored
        record is left as it is ("not recorded")."""
        pool_sampling(store, run_id, report)


def pool_sampling(store: Store, run_id: str, report: WorkloadReport) -> None:
    names = [*report.sides, *([report.floor_figures.side] if report.floor_figures is not None else [])]
    kept = {n: pool_kept_mass(kept_mass_from_json(k) for k in store.kept_masses(run_id, n)) for n in names}
    kept = {n: k for n, k in kept.items() if k is not None}
    if kept:
        sampling_report(report, kept)


def sampling_report(report: WorkloadReport, kept: Mapping[str, KeptMass]) -> None:
    """The sampling family onto a workload report (core.workload_record.WorkloadReport): each side's and
    the floor's pooled KeptMass as figures (`stats.families["sampling"]`), each side judged against the floor."""

    def figures(name: str) -> dict[str, Any] | None:
        k = kept.get(name)
        # sets_compared: kept_sets_differ's own count (tokens and the forks' sets), what its interval is over
        return (
            {"tokens": k.tokens, "sets_compared": k.sets_compared, **k.figures()}
            if k is not None and k.tokens
            else None
        )

    put_family(report, "sampling", figures, sampling_against_floor)
