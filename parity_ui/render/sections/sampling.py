"""The sampling measure's section (shared-seed draws): the sampled tokens' kept mass and both ratios on
the run screen and in `--json` (pooled over the run's comparisons, per side), each side's draws in its
`--json` stream, a workload's sampling family (figures table rows, its verdict)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.figures import FIGURES, SAMPLING_ROWS
from ...core.kept_mass import SAMPLING_COLUMNS
from ...core.measures import KEPT_MASS, SAMPLING
from ...core.pooled import WorkloadStats, pool_kept_mass
from ...core.types import Run, SideResult, step_column
from ...core.workload_record import SideFigures
from .base import Row, Section, family_rows, family_text_rows


class SamplingSection(Section):
    key = SAMPLING.key
    title = SAMPLING.title

    def run_lines(self, run: Run) -> list[str]:
        return sampling_lines(run)

    def stream_json(self, res: SideResult) -> dict[str, Any]:
        # Sampled tokens' draws (shared-seed sampling); absent when the side recorded none.
        if any(x is not None for x in step_column(res.steps, "kept")):
            return {"sampling": {name: step_column(res.steps, name) for name in SAMPLING_COLUMNS}}
        return {}

    def run_json(self, run: Run) -> dict[str, Any]:
        return {"sampling": sampling_figures(run)}

    def text_rows(self, stats: Sequence[WorkloadStats]) -> list[tuple[str, list[str]]]:
        return family_text_rows(stats, self.key, SAMPLING_ROWS, "tokens", "tokens drawn on both sides")

    def html_rows(self, sets: Sequence[SideFigures], row: Row) -> list[str]:
        return family_rows(sets, row, self.key, SAMPLING_ROWS, self.title, "tokens", "tokens drawn on both sides")


def sampling_figures(run: Run) -> dict[str, dict[str, float | None]]:
    """Per non-reference side, the sampling family's figures pooled over the run's prompts (sides
    that recorded no draws are left out)."""
    out = {}
    for side in dict.fromkeys(c.b for p in run.prompts for c in p.comparisons):
        pooled = pool_kept_mass(KEPT_MASS.of(c) for p in run.prompts for c in p.comparisons if c.b == side)
        if pooled is not None:
            out[side] = {"tokens": pooled.tokens, **pooled.figures()}
    return out


def sampling_lines(run: Run) -> list[str]:
    """The sampling family as terminal lines, by display name (core.figures)."""
    lines = []
    for side, figs in sampling_figures(run).items():
        lines.append(
            f"  sampled tokens, {side} against {run.reference} ({figs['tokens']} tokens drawn on both sides; "
            "reference = trainer, raw; side = rollout, processed):"
        )
        lines += [f"    {FIGURES[k].name}: {FIGURES[k].format(figs[k])}" for k in SAMPLING_ROWS]
    return lines
