"""A workload run's report: what was asked (mode, floor, source), how far it got, and the pooled
figures of each side against the reference next to the reference's own noise floor.

Stored as the run's `workload_json` (and its one-line `headline` for the history list). The figures
are computed from the stored pair samples (parity_ui.measures.tokens.pool_tokens) and each measure's
stored records (parity_ui.measures: routes, kept mass, full rows), never from what a process held in
memory, so a stopped, failed or resumed run reports exactly what is in the database. Its terminal
screen is parity_ui.render.text.format_workload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.workload_record import WorkloadReport, headline
from ...measures.tokens import pool_tokens

if TYPE_CHECKING:
    from ...store import Store

__all__ = ["headline", "pool_tokens", "pooled"]


def pooled(store: Store, run_id: str, report: WorkloadReport, sides: list[str]) -> WorkloadReport:
    """The report with every pair's token figures (and the floor's) computed from the store, each judged
    against the floor, and the headline."""
    pool_tokens(store, run_id, report, sides)
    report.headline = headline(report)
    return report
