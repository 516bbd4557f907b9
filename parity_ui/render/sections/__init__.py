"""One section of the views per measure (parity_ui.measures; their records: parity_ui.core.measures).

Each module is one measure's part of every view, behind the small protocol of `base.Section`: its lines
on the run screen (per comparison, after the prompts), its part of a comparison's card, its `--json`
keys (per side's stream, per run), its rows of a workload's figures table (the CLI screen and the app /
report), its verdict lines, its charts. The views (render.report, render.cards, render.text,
render.workload) loop over SECTIONS and name no family themselves.
"""

from __future__ import annotations

from ...core.workload_record import WorkloadReport
from .base import Section
from .clipped import ClippedSection
from .distribution import DistributionSection
from .replay_pairs import ReplayPairsSection
from .routing import RoutingSection
from .sampling import SamplingSection

SECTIONS: tuple[Section, ...] = (
    RoutingSection(),
    DistributionSection(),
    SamplingSection(),
    ClippedSection(),
    ReplayPairsSection(),
)


def workload_html(report: WorkloadReport | None, pick: str | None = None) -> str:
    """Every measure's own part of a workload's view (a replay's pairs and worst tokens); "" for a run
    without workload figures."""
    if report is None:
        return ""
    return "".join(s.workload_html(report, pick) for s in SECTIONS)


__all__ = ["SECTIONS", "Section", "workload_html"]
