"""Building many small objects at once (a stored 16k-token pair is ~200k steps and top-k entries).

CPython's cyclic collector runs every few hundred allocations and, as the young objects survive,
rescans the older generations too: about half the time of reopening a long run went there. These
objects hold no reference cycles, so nothing is lost by pausing the collector while they are made.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    # Re-enabled only by whoever found it enabled: overlapping uses from several threads end with
    # the collector on, never left off.
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
