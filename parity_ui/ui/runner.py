"""The app's one ParityService, shared by every browser session (the sides' engines are one
machine's worth).

Runs are serialised by the service's own lock and written through its connection. The History
tab reads through one connection per handler thread: with WAL, reads never wait for a run's write.
"""
from __future__ import annotations

import threading
from typing import Any

from ..core.config import ParityConfig
from ..run.prepare import RunRequest
from ..inputs.prompts import PromptSpec
from ..core.runlog import EventCallback
from ..service import ParityService
from ..store.runs import open_db
from ..core.types import Localisation, ModelInfo, Run


class ServiceRunner:
    def __init__(self, db_path: str | None = None):
        self.service = ParityService(db_path)
        self.db_path = db_path
        self._local = threading.local()

    def run(self, req: RunRequest, on_event: EventCallback | None = None) -> Run:
        """Blocking; the run is stored by the service. Calls queue behind each other."""
        return self.service.run(req, on_event)

    def record_failure(self, model: str, prompts: list[PromptSpec], config: dict[str, Any], error: Any,
                       kind: str = "compare") -> Run:
        return self.service.record_failure(model, prompts, config, error, kind=kind)

    def run_workload(self, req: Any, on_event: EventCallback | None = None) -> Run:
        """A workload (parity_ui.commands.workload.run.run_workload): blocking, stored as it goes; queues like `run`."""
        from ..commands.workload.run import run_workload

        return run_workload(self.service, req, on_event)

    def resume_workload(self, run_id: str, on_event: EventCallback | None = None) -> Run:
        """Go on with a stopped or failed workload. Raises ParityError when there is nothing to resume."""
        from ..commands.workload.run import resume_workload

        return resume_workload(self.service, run_id, on_event)

    def bisect(self, run_id: str, sides: Any = None, prompts: Any = None,
               on_event: EventCallback | None = None) -> Run:
        """Which setting? (parity_ui.commands.setting_bisect) for a pair of a stored comparison or workload: `sides` one
        of its pairs that differ (parity_ui.commands.which_setting; None: the reference and the first side that
        differs), on its `prompts` worst prompts (None: 8). Blocking; queues like `run`. Returns the
        stored bisect (kind "bisect"; status ok / diverged / error / cancelled, an error naming its
        fix). Raises ParityError naming the problem and the fix, with nothing stored, for an unknown
        run, a run with no pair that differs, or a pair or number of prompts it cannot take."""
        from ..commands.which_setting import checked_request

        pair, n = checked_request(self.db, run_id, sides, prompts)
        return self.service.bisect(run_id.strip(), pair, prompts=n, emit=on_event)

    def localise(self, run_id: str, prompt_index: int, side: str | None) -> Localisation:
        """Layer localisation of a stored run's comparison (`side` against the reference); stored,
        also when it fails (the failure says why and how to fix it)."""
        from ..core.errors import ParityError
        from ..store.runs import get_run

        run = get_run(self.service.db, run_id)
        if run is None:
            raise ParityError(f"no run {run_id!r}", "open a stored run first")
        pair = (run.reference, side) if side and run.reference and side != run.reference else None
        return self.service.localise(run, prompt_index, None, pair)

    def cancel(self) -> None:
        self.service.cancel()  # sets the workers' cancel events: safe from any thread

    def describe(self, model: str, trust_remote_code: bool = False) -> ModelInfo:
        return self.service.describe(model, trust_remote_code)

    def mapping(self, model: str, cfg: ParityConfig, trust_remote_code: bool = False) -> list[Any]:
        return self.service.mapping(model, cfg, trust_remote_code)

    @property
    def db(self) -> Any:
        """A read connection for the calling thread (WAL: reads never wait for a run's write)."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = open_db(self.db_path)
        return db

    def close(self) -> None:
        self.service.close()
