"""The store's face: one `Store` object, holding the run database, with the named reads and writes the
commands and the app make. The commands take it from the service (parity_ui.commands.service_api:
`store`), the app from its runner; neither holds a Database or writes SQL.

Why an object rather than functions over a Database (as simonw/llm passes `db` to
`Response.log_to_db`): llm's callers are its own CLI and domain objects, all inside the package that
owns the schema. Here the callers sit in other layers (commands, the app) that may not import the
store (the app may not, by its folder rule): a Store handed to them by the service is the only door
they see, and its methods are the whole list of what they may read or write. The functions over a
Database stay the implementation (parity_ui.store.runs, .workloads, .checks), as llm keeps them:
the recorder writes through them inside its own transaction, and tests use them on a bare file.
Each method is one call into them, looked up when called (a test may replace a function).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from ..core.audit_record import AuditReport
from ..core.pooled import PairSample
from ..core.trend import TrendReport
from ..core.types import Localisation, Run
from ..inputs.prompts import PromptSpec
from . import audits, bisects, checks, runs, trends, weights, workloads


@dataclass
class StoredReport:
    """What a static report of a stored run shows, read for it (Store.for_report): the run (a
    workload's header and only the prompts whose panes the page shows; any other run whole), a
    workload's pair rows and prompt excerpts (its prompt table; None for another kind of run), the
    run's localisations and its images by content hash."""

    run: Run
    localisations: list[Localisation]
    images: Callable[[str], tuple[bytes, str] | None]
    pairs: list[dict[str, Any]] | None = None
    excerpts: dict[int, str] | None = None
    audit: AuditReport | None = None  # an audit run's record (parity_ui.store.audits)
    trend: TrendReport | None = None  # a trend run's record


class Store:
    """The run database's named reads and writes. Not thread-safe beyond SQLite's own rules: the
    app keeps one Store per thread (`another()`), the service one for its commands."""

    def __init__(self, db: Database):
        self.db = db

    @classmethod
    def open(cls, path: str | Path | None = None) -> Store:
        """Open (creating and migrating) the file at `path` (default $PARITY_DB, else ./runs.db)."""
        return cls(runs.open_db(path))

    def another(self) -> Store:
        """A Store on its own connection to the same file (a thread's reads; WAL: never waiting for a
        write). An in-memory database has no second connection: the same Store."""
        path = self.db.execute("PRAGMA database_list").fetchone()[2]
        return Store(runs.open_db(path)) if path else self

    # -- runs -----------------------------------------------------------------------------------------

    def get_run(self, run_id: str, prompts: list[int] | None = None) -> Run | None:
        """The stored run, or None; `prompts`: only these prompts' rows (runs.get_run)."""
        return runs.get_run(self.db, run_id, prompts=prompts)

    def list_runs(self, **filters: Any) -> list[runs.RunSummary]:
        """Newest first, filtered as runs.list_runs."""
        return runs.list_runs(self.db, **filters)

    def distinct_models(self) -> list[str]:
        return runs.distinct_models(self.db)

    def run_state(self, run_id: str) -> runs.RunState | None:
        """The run row's status, duration and headline (one read), or None."""
        return runs.run_state(self.db, run_id)

    def is_workload(self, run_id: str) -> bool:
        """Whether the run is a workload with a report (one read of its row)."""
        return runs.is_workload(self.db, run_id)

    def image_bytes(self, sha256: str) -> tuple[bytes, str] | None:
        return runs.image_bytes(self.db, sha256)

    def localisations_of(self, run_id: str) -> list[Localisation]:
        return runs.localisations_of(self.db, run_id)

    def save_localisation(self, loc: Localisation) -> Localisation:
        """Store a layer localisation with its run; fills its id and time."""
        return runs.save_localisation(self.db, loc)

    # -- workloads ------------------------------------------------------------------------------------

    def pair_rows(self, run_id: str) -> list[dict[str, Any]]:
        """Every (prompt, side) of a workload without its logprobs (a prompt table's rows)."""
        return runs.pair_rows(self.db, run_id)

    def prompt_excerpts(self, run_id: str) -> dict[int, str]:
        return runs.prompt_excerpts(self.db, run_id)

    def pair_samples(self, run_id: str, side: str) -> Iterator[PairSample]:
        """A side's stored samples, one prompt at a time (what the pooled figures are computed from)."""
        return runs.pair_samples(self.db, run_id, side)

    def route_agreements(self, run_id: str, side: str) -> Iterator[dict[str, Any]]:
        """A side's stored route agreements (JSON), one prompt at a time (the routing figures' source)."""
        return workloads.route_agreements(self.db, run_id, side)

    def kept_masses(self, run_id: str, side: str) -> Iterator[dict[str, Any]]:
        """A side's stored kept-mass records (JSON), one prompt at a time (the sampling figures' source)."""
        return workloads.kept_masses(self.db, run_id, side)

    def distribution_columns(self, run_id: str, side: str) -> Iterator[dict[str, list[Any]]]:
        """A side's stored kl/kl_rev/tv/top1/topk columns, one prompt at a time (the distribution figures')."""
        return workloads.distribution_columns(self.db, run_id, side)

    def prompts_done(self, run_id: str, sides: list[str]) -> set[int]:
        return runs.prompts_done(self.db, run_id, sides)

    def given_prompts(self, run_id: str) -> list[PromptSpec]:
        """The run's prompts as the user gave them; raises ParityError where they were not kept."""
        return workloads.given_prompts(self.db, run_id)

    def forked_sides(self, run_id: str, reference: str) -> set[str]:
        """The sides of a stored run whose tokens left the reference's on some prompt."""
        return bisects.forked_sides(self.db, run_id, reference)

    def prompt_forks(self, run_id: str, side: str) -> list[bisects.PromptFork]:
        """How each prompt of a stored run fared for `side` (a bisect takes the worst first)."""
        return bisects.prompt_forks(self.db, run_id, side)

    def bisect_lines(self, ids: list[str]) -> list[bisects.BisectLine]:
        """The listed bisects' rows, as a runs table lists them (ids not stored are left out)."""
        return bisects.bisect_lines(self.db, ids)

    def trial_counts(self, group_ids: list[str]) -> dict[str, int]:
        """The number of trial runs of each bisect group (History folds them under their bisect)."""
        return bisects.trial_counts(self.db, group_ids)

    def latest_bisect(self, run_id: str) -> Run | None:
        """The newest stored bisect of run `run_id` (its record; its prompts are not read), or None."""
        return bisects.latest_bisect(self.db, run_id)

    def for_report(self, run_id: str, panes: Callable[[Run], list[int]]) -> StoredReport | None:
        """The reads of a static report (parity_ui.render.report.stored_html_report): a workload's
        header, its prompt rows and the prompts `panes(header)` picks, not every prompt's tokens;
        any other run whole. None when there is no such run."""
        run = self.get_run(run_id, prompts=[])
        if run is None:
            return None
        if run.kind == "audit":  # its record is the page; its prompts' base streams are not shown
            return StoredReport(run, [], self.image_bytes, audit=self.audit_of(run_id))
        if run.kind == "trend":
            return StoredReport(run, [], self.image_bytes, trend=self.trend(run_id))
        if run.workload is None:
            return StoredReport(self.get_run(run_id) or run, self.localisations_of(run_id), self.image_bytes)
        return StoredReport(
            self.get_run(run_id, prompts=panes(run)) or run,
            self.localisations_of(run_id),
            self.image_bytes,
            self.pair_rows(run_id),
            self.prompt_excerpts(run_id),
        )

    # -- trends --------------------------------------------------------------------------------------

    def save_trend(self, run_id: str, report: TrendReport) -> None:
        """A trend's record as it now stands, in one transaction."""
        with self.db.atomic():
            trends.save_trend(self.db, run_id, report)

    def trend(self, run_id: str) -> TrendReport | None:
        """The trend run's record, or None."""
        return trends.trend(self.db, run_id)

    def trend_lines(self, ids: list[str]) -> dict[str, tuple[str, str]]:
        """{trend run id: (its directory, its headline)}: what History lists a trend with."""
        return trends.trend_lines(self.db, ids)

    # -- the gate's checks ----------------------------------------------------------------------------

    def save_check(
        self,
        run_id: str,
        group_id: str,
        created: str,
        spec_path: str,
        exit_code: int,
        result: dict[str, Any],
        cases: list[dict[str, Any]],
    ) -> None:
        """A check's results, its cases' rows and its run's headline, in one transaction."""
        checks.save_check(self.db, run_id, group_id, created, spec_path, exit_code, result, cases)

    def check_result(self, run_id: str) -> dict[str, Any] | None:
        return checks.check_result(self.db, run_id)

    def last_pass(self, case: str, models: tuple[str, ...], content_hash: str) -> str | None:
        """The workload run of the newest passing check of `case` on one of `models` with these prompts."""
        return checks.last_pass(self.db, case, models, content_hash)

    # -- invariance audits ----------------------------------------------------------------------------

    def save_audit(self, run_id: str, created: str, report: AuditReport) -> None:
        """An audit's record and its run's headline (written again as each axis finishes)."""
        audits.save_audit(self.db, run_id, created, report)

    def audit_of(self, run_id: str) -> AuditReport | None:
        """A stored audit's record, or None."""
        return audits.audit_of(self.db, run_id)

    # -- weight-sync checks (issue 41) ------------------------------------------------------------------

    def save_weight_check(self, run_id: str, created: str, report: dict[str, Any]) -> None:
        """A weight check's report (core.weights.WeightReport.to_dict()) and its run's headline."""
        weights.save_weight_check(self.db, run_id, created, report)

    def weight_check(self, run_id: str) -> dict[str, Any] | None:
        return weights.weight_check(self.db, run_id)

    def weight_checks(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest weight checks first, as the app's list shows them."""
        return weights.weight_checks(self.db, limit)
