"""The last few values made from slow reads or builds (a stored run, its view), each made once."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class Recent:
    """Keeps the last `size` values; a key asked for while it is being made waits for that value
    instead of making it again (History's read ahead and a click on the same run)."""

    def __init__(self, size: int):
        self.size = size
        self._kept: OrderedDict[Hashable, Any] = OrderedDict()
        self._making: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], Any], keep: Callable[[Any], bool] = lambda value: True) -> Any:
        """The kept value of `key`, else make() (once, whoever asks meanwhile), kept when keep(value)."""
        while True:
            with self._lock:
                if key in self._kept:
                    self._kept.move_to_end(key)
                    return self._kept[key]
                making = self._making.get(key)
                if making is None:
                    self._making[key] = threading.Event()
                    break
            making.wait()  # then take it from the kept ones (or make it, if it was not kept)
        try:
            value = make()
            if keep(value):
                with self._lock:
                    self._kept[key] = value
                    while len(self._kept) > self.size:
                        self._kept.popitem(last=False)
            return value
        finally:
            with self._lock:
                self._making.pop(key).set()

    def peek(self, key: Hashable) -> Any:
        """The kept value of `key`, or None; makes nothing."""
        with self._lock:
            return self._kept.get(key)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
