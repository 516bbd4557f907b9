"""The clipped-ratio measure: each of a replay's pairs' importance ratio ρ = p_trainer / p_rollout as the
trainer clips it (core.clipped: min(ρ, C), the share the clip changed, the share below 1 / C it leaves
unseen), pooled from the pair's stored samples (the floor's too) into the "clipped" family.

Not judged against the floor: the same samples' token figures are (SideFigures.verdict); the family says
what a trainer's clip makes of the mismatch. A recorded-only replay (parity_ui.commands.replay_recorded)
pools the same ClipStats as its rows come, with no store read; a run's trend follows the family over its
steps (core.trend.figures_of).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.clipped import ClipStats
from ..core.config import ParityConfig
from ..core.measures import CLIPPED
from ..core.types import Finding
from .base import MeasureRun, Mode, Plan

if TYPE_CHECKING:
    from ..core.workload_record import SideFigures, WorkloadReport
    from ..store import Store


class Clipped:
    spec = CLIPPED

    def wanted(self, cfg: ParityConfig, mode: Mode) -> bool:
        return mode == "replay"  # an RL trainer's clip: the ratio of a rollout's tokens under the trainer

    def preflight(self, plan: Plan) -> list[Finding]:
        return []

    def start(self, plan: Plan) -> MeasureRun:
        return ClippedRun()


class ClippedRun(MeasureRun):
    def pool(self, store: Store, run_id: str, report: WorkloadReport) -> None:
        """Each pair's family (and the floor's) from its stored pair samples (a resumed replay's earlier
        chunks too); a pair without a counted token keeps none ("not recorded")."""
        pool_clipped(store, run_id, report)


def pool_clipped(store: Store, run_id: str, report: WorkloadReport) -> None:
    figs: list[SideFigures] = [*report.sides.values(), *([report.floor_figures] if report.floor_figures else [])]
    for f in figs:  # each pair's figures are keyed by where its samples are stored (the floor's by its side)
        clip = ClipStats()
        for s in store.pair_samples(run_id, f.side):
            clip.add(s.logp_ref, s.logp_side)
        put_clipped(f, clip)


def put_clipped(f: SideFigures, clip: ClipStats) -> None:
    """The family onto a pair's figures (absent where no token was counted)."""
    family = clip.family()
    if family is None:
        f.stats.families.pop(CLIPPED.key, None)
    else:
        f.stats.families[CLIPPED.key] = family
