"""The clipped-ratio measure's section (a replay's pairs: core.clipped): the importance ratio as the
trainer clips it, as rows of a workload's figures table on the CLI screen and in the app and the report
(each pair's column, the floor's too). Not judged, so no verdict line."""

from __future__ import annotations

from collections.abc import Sequence

from ...core.clipped import CLIPPED_ROWS
from ...core.measures import CLIPPED
from ...core.pooled import WorkloadStats
from ...core.workload_record import SideFigures
from .base import Row, Section, family_rows, family_text_rows


class ClippedSection(Section):
    key = CLIPPED.key
    title = CLIPPED.title

    def text_rows(self, stats: Sequence[WorkloadStats]) -> list[tuple[str, list[str]]]:
        return family_text_rows(stats, self.key, CLIPPED_ROWS, "tokens", "tokens (clipped ratio)")

    def html_rows(self, sets: Sequence[SideFigures], row: Row) -> list[str]:
        return family_rows(sets, row, self.key, CLIPPED_ROWS, self.title, "tokens", "tokens")
