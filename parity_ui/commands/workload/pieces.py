"""A chunk's teacher-forced scoring in pieces, on a thread, so that the parent's own work on one piece
(decoding, the reference's view, comparing, explaining) overlaps the scorer's next piece.

Before, a scored chunk ran strictly one after the other: the scorer scored every sequence, then the
parent decoded and compared them all while the engines sat idle (issue 33: the scored workload's
work was 1.33x the bare engines'). Here the scoring calls run in order on one background thread,
PIECE sequences per call where the scorer gives each sequence the bits it gets alone (an HF side: its
engine packs a call's rows into forwards only where that keeps them, parity_ui.engines.hf_score, so the
numbers are the same in any grouping); a scorer that batches what it is handed
(vLLM's prompt logprobs: batch composition may move its numbers) keeps one call for the chunk, as
before. Only the scoring runs on the thread: the parent's work and the store stay on the caller's
thread. A Stop or an engine failure in a call reaches the caller when it asks for that piece.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

# Sequences per scoring call of a per-item scorer: small enough that the first piece comes back
# soon (the overlap starts), large enough that a call's round trip is noise beside its forwards.
PIECE = 32


def pieces(n: int, per_item: bool, piece: int = PIECE) -> list[range]:
    """The index ranges of n sequences scored together: `piece` at a time for a per-item scorer, else one."""
    size = piece if per_item else max(n, 1)
    return [range(lo, min(lo + size, n)) for lo in range(0, n, size)]


def scored_in_pieces(
    calls: Sequence[Callable[[range], Any]], parts: list[range], threaded: bool = True
) -> Generator[tuple[range, list[Any]], None, None]:  # a generator: closing() stops it early
    """For each part, in order: (part, [call(part) for call in calls]), the calls of every part made in
    order on one background thread, running ahead of the caller. An exception a call raised is raised
    here when its part is reached; leaving early cancels the calls not started yet (the running one
    finishes: an engine stops at a Stop by itself). Not `threaded` (a block on a Ray cluster, whose
    calls hand the driver lock over from the block's own thread): each call on the caller's thread."""
    if not threaded:
        for part in parts:
            yield part, [call(part) for call in calls]
        return
    failed: list[BaseException] = []

    def guarded(call: Callable[[range], Any], part: range) -> Any:
        if failed:  # an earlier call failed: the caller raises that at its part and never reads this one
            return None
        try:
            return call(part)
        except BaseException as e:
            failed.append(e)
            raise

    ex = ThreadPoolExecutor(1, thread_name_prefix="parity-score")
    try:
        futures: list[list[Future[Any]]] = [[ex.submit(guarded, call, part) for call in calls] for part in parts]
        for part, fs in zip(parts, futures):
            yield part, [f.result() for f in fs]
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
