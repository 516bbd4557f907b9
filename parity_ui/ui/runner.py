"""The app's one service, shared by every browser session (the sides' engines are one machine's
worth): a ParityService plus the one thing the app needs besides, a read connection per handler
thread.

Runs are serialised by the service's own lock and written through its connection. The History
tab reads through one connection per handler thread: with WAL, reads never wait for a run's write.
"""
from __future__ import annotations

import threading
from typing import Any

from ..service import ParityService


class AppService(ParityService):
    def __init__(self, db_path: str | None = None):
        super().__init__(db_path)
        self._local = threading.local()

    @property
    def reader(self) -> Any:
        """A read connection for the calling thread (WAL: reads never wait for a run's write)."""
        from ..store.runs import open_db

        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = open_db(self.db_path)
        return db
