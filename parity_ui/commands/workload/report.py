"""A workload run's report: what was asked (mode, floor, source), how far it got, and the pooled
figures of each side against the reference next to the reference's own noise floor.

Stored as the run's `workload_json` (and its one-line `headline` for the history list). The figures
are computed from the stored pair samples (`pooled`), never from what a process held in memory, so
a stopped, failed or resumed run reports exactly what is in the database. Its terminal screen is
parity_ui.render.text.format_workload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.pooled import Accumulator, compare_to_floor
from ...core.workload_record import DlogpHistogram, SideFigures, WorkloadReport, headline

if TYPE_CHECKING:
    from ...store import Store


def side_figures(store: Store, run_id: str, side: str) -> SideFigures:
    """A side's pooled figures and its |dlogp| histogram, in one read of its stored pair samples
    (one prompt at a time); no verdict."""
    acc, hist = Accumulator(), DlogpHistogram()
    for sample in store.pair_samples(run_id, side):
        acc.add(sample)
        hist.add(sample.logp_side, sample.logp_ref)
    return SideFigures(side, acc.result(), hist=hist)


def pooled(store: Store, run_id: str, report: WorkloadReport, sides: list[str]) -> WorkloadReport:
    """The report with every side's figures (and the floor's) computed from the store, each side
    judged against the floor, and the headline."""
    floor = report.floor.side
    report.floor_figures = side_figures(store, run_id, floor) if floor else None
    report.sides = {}
    for name in sides:
        figs = side_figures(store, run_id, name)
        figs.verdict = compare_to_floor(figs.stats, report.floor_figures.stats) if report.floor_figures else None
        report.sides[name] = figs
    report.headline = headline(report)
    return report


def pooled_routing(store: Store, run_id: str, report: WorkloadReport) -> None:
    """MoE (routes=true): each side's routing family (and the floor's) from every stored route
    agreement of the run, so a resumed run pools its earlier chunks too, and each side's share of
    routes differing judged against the floor's. Sides with no stored agreement keep None ("not
    recorded")."""
    from ...analysis.routes import route_figures
    from ...core.pooled import routing_against_floor
    from ...core.routes import agreement_from_json

    def figures(side: str) -> dict | None:
        got = route_figures(agreement_from_json(a) for a in store.route_agreements(run_id, side))
        return got if got.get("cells") else None

    floor = report.floor_figures
    if floor is not None:
        floor.stats.routing = figures(floor.side)
    for name, figs in report.sides.items():
        figs.stats.routing = figures(name)
        figs.routing_verdict = routing_against_floor(figs.stats.routing, floor.stats.routing if floor else None)


def pooled_sampling(store: Store, run_id: str, report: WorkloadReport) -> None:
    """Shared-seed sampling: each side's sampling family (and the floor's) from every stored kept-mass
    record of the run (a resumed run pools its earlier chunks too, as pooled_routing), each side judged
    against the floor. A run with no stored record is left as it is ("not recorded")."""
    from ...core.kept_mass import kept_mass_from_json
    from ...core.pooled import pool_kept_mass, sampling_report

    names = [*report.sides, *([report.floor_figures.side] if report.floor_figures is not None else [])]
    kept = {n: pool_kept_mass(kept_mass_from_json(k) for k in store.kept_masses(run_id, n)) for n in names}
    kept = {n: k for n, k in kept.items() if k is not None}
    if kept:
        sampling_report(report, kept)
