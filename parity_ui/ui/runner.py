"""The app's one service, shared by every browser session (the sides' engines are one machine's
worth): a ParityService plus the one thing the app needs besides, a store on a read connection per
handler thread.

Runs are serialised by the service's own lock and written through its store. The History tab and
the views read through `reader`, one connection per handler thread: with WAL, reads never wait for
a run's write.
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
        """The store (parity_ui.store.Store) on the calling thread's read connection (an in-memory
        database's own store)."""
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = self.store.another()
        return store
