"""The app's one ParityService, owned by one thread.

The service's SQLite connection may only be used by the thread that created it, and gradio calls
handlers from a pool of threads. So the service is created, and every call that writes runs
(`run`, `record_failure`), happens on one dedicated thread; the History tab reads through a
connection per thread. The engines are shared by every browser session either way.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..config import ParityConfig
from ..prompts import PromptSpec
from ..service import EventCallback, ParityService, RunRequest
from ..store import open_db
from ..types import ModelInfo, Run


class ServiceRunner:
    def __init__(self, db_path: str | None = None):
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="parity-engines")
        self.service: ParityService = self._thread.submit(ParityService, db_path).result()
        self.db_path = db_path
        self._local = threading.local()

    def run(self, req: RunRequest, on_event: EventCallback | None = None) -> Run:
        """Blocking; the run is stored by the service. Calls queue behind each other."""
        return self._thread.submit(self.service.run, req, on_event).result()

    def record_failure(self, model: str, prompts: list[PromptSpec], config: dict[str, Any], error: Any) -> Run:
        return self._thread.submit(self.service.record_failure, model, prompts, config, error).result()

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
        self._thread.submit(self.service.close).result()
        self._thread.shutdown()
