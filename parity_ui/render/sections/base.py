"""The section protocol: what a measure shows in each view. Every method has a default that shows
nothing, so a section implements the views it has a part in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...core.pooled import WorkloadStats
from ...core.types import Comparison, Run, SideResult
from ...core.workload_record import SideFigures, WorkloadReport

Row = Callable[..., str]  # render.workload's row maker: row(name, cells, check=None, key=None)


class Section:
    key: str = ""  # the measure's key (core.measures): its records, its pooled family, its verdict
    title: str = ""

    # -- one comparison -------------------------------------------------------------------------------

    def comparison_lines(self, c: Comparison) -> list[str]:
        """Its lines under a comparison on the run screen (indented 4)."""
        return []

    def comparison_html(self, c: Comparison) -> str:
        """Its part of a comparison's card."""
        return ""

    def run_lines(self, run: Run) -> list[str]:
        """Its lines on the run screen after the prompts (indented 2)."""
        return []

    def stream_json(self, res: SideResult) -> dict[str, Any]:
        """Its keys in a side's stream of `--json` (absent when the side recorded nothing of it)."""
        return {}

    def run_json(self, run: Run) -> dict[str, Any]:
        """Its top-level keys of `--json`."""
        return {}

    # -- a workload -----------------------------------------------------------------------------------

    def text_rows(self, stats: Sequence[WorkloadStats]) -> list[tuple[str, list[str]]]:
        """Its rows of the CLI's figures table: (label, one cell per column), each side then the floor."""
        return []

    def html_rows(self, sets: Sequence[SideFigures], row: Row) -> list[str]:
        """Its rows of the app's and the report's figures table (made with render.workload's `row`)."""
        return []

    def html_verdicts(self) -> bool:
        """Whether its verdict is listed under the app's figures table (the CLI lists every one)."""
        return True

    def html_extra(self, report: WorkloadReport) -> str:
        """A chart after the figures table."""
        return ""

    def workload_lines(self, report: WorkloadReport) -> list[str]:
        """Its own part of a workload's CLI screen, after the figures (a replay's pairs table)."""
        return []

    def workload_html(self, report: WorkloadReport, pick: str | None = None) -> str:
        """Its own part of a workload's view and report (a replay's pairs and worst tokens); `pick`: the
        app's view prefix, so a row can open its tokens."""
        return ""


def family_rows(
    sets: Sequence[SideFigures], row: Row, key: str, keys: Sequence[str], title: str, count_key: str, count_label: str
) -> list[str]:
    """A pooled family's rows of the HTML figures table: a header row, its count, then its figures by
    display name; none where no column recorded it."""
    from ...core.figures import FIGURES
    from ..markup import esc

    got = [f.stats.family(key) or {} for f in sets]
    if not any(got):
        return []
    out = [f'<tr class="wl-family"><th colspan="{len(sets) + 1}">{esc(title)}</th></tr>']
    out.append(row(count_label, [str(int(g.get(count_key) or 0)) if g else "–" for g in got]))
    out += [row(FIGURES[k].name, [FIGURES[k].format(g.get(k)) for g in got], key=k) for k in keys]
    return out


def family_text_rows(
    stats: Sequence[WorkloadStats], key: str, keys: Sequence[str], count_key: str, count_label: str
) -> list[tuple[str, list[str]]]:
    """A pooled family's rows of the CLI's figures table: its figures by display name, then its count;
    none where no column recorded it."""
    from ...core.figures import FIGURES

    got = [x.family(key) for x in stats]
    if not any(got):
        return []
    rows = [(FIGURES[k].name, [FIGURES[k].format((g or {}).get(k), "-") for g in got]) for k in keys]
    rows.append((count_label, [str(int((g or {}).get(count_key) or 0)) for g in got]))
    return rows
