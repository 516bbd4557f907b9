"""A workload's chunks on a Ray cluster: the same chunk function as in process
(Workload.run_chunk: generate or force, compare, explain, store), run for several blocks at once, each
block's verbs answered by an idle replica of each side (parity_ui.run.cluster.ClusterSides).

A block is a chunk (--chunk prompts). Blocks are handed out in order to a few driver threads, as
many as there are live replicas; each thread runs one block's chunk function with the driver lock
held except while a replica works, so the store is written by one block at a time, in the driver
only. A replica that fails loses its block's unfinished work only: the block goes back to the front
of the queue and runs again on another replica, at most MAX_ATTEMPTS times; then, or when a side
has no replica left, the run stops with what finished stored, and `parity resume` goes on.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...core.errors import CancelledError, EngineError
from ...core.runlog import EventCallback, RunEvent
from ...core.workload_record import WorkloadReport
from ...run.cluster import ReplicaLost

if TYPE_CHECKING:
    from ...run.cluster import ClusterSides

MAX_ATTEMPTS = 3  # a block runs at most this often, a replica lost each time, before the run stops


def run_blocks(
    chunk: Callable[[Any, list[int]], None],
    sides: ClusterSides,
    todo: list[int],
    size: int,
    progress: BlockProgress,
    on_done: Callable[[list[int]], None],
) -> None:
    """Run `chunk(sides, block)` for every block of `todo` (blocks of `size`), a few at once. `on_done`
    runs (under the driver lock) after each block is stored. Raises the first failure (CancelledError
    on Stop, EngineError when a block ran out of attempts or a side out of replicas) once the blocks
    under way have ended; every block finished before it is stored."""
    queue = deque((k, todo[s : s + size]) for k, s in enumerate(range(0, len(todo), size)))
    attempts: Counter[int] = Counter()
    failures: list[BaseException] = []
    running = [0]
    cond = sides.idle  # a Condition on the driver lock

    def next_block() -> tuple[int, list[int]] | None:
        while not failures and not sides.pool.cancelled:
            if queue:
                return queue.popleft()
            if running[0] == 0:
                return None
            cond.wait(0.25)  # a block under way may come back (its replica lost)
        return None

    def work() -> None:
        with sides.lock:
            while True:
                got = next_block()
                if got is None:
                    return
                k, block = got
                running[0] += 1
                progress.started(k, len(block))
                try:
                    chunk(sides, block)
                    on_done(block)
                    progress.finished(len(block))
                except ReplicaLost as e:
                    attempts[k] += 1
                    progress.dropped()
                    if attempts[k] < MAX_ATTEMPTS and sides.alive(e.side):
                        sides.retried += 1
                        queue.appendleft((k, block))
                        progress.emit(
                            RunEvent(
                                "status",
                                f"block {k + 1} runs again ({e.side} replica {e.index} "
                                f"lost: {e.why}; attempt {attempts[k] + 1} of {MAX_ATTEMPTS})",
                            )
                        )
                    else:
                        failures.append(
                            EngineError(
                                f"block {k + 1} could not be finished: {e.message}"
                                + ("" if sides.alive(e.side) else f"; no replica of {e.side} is left"),
                                "every finished block is stored: 'parity resume RUN_ID' goes on with the rest",
                            )
                        )
                except BaseException as e:  # noqa: BLE001 - the first failure ends the run, raised below
                    progress.dropped()
                    failures.append(e)
                finally:
                    running[0] -= 1
                    cond.notify_all()

    threads = [
        threading.Thread(target=work, name=f"parity-block-{i}", daemon=True)
        for i in range(min(sides.concurrency, len(queue)))
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException:  # Ctrl-C: the replicas stop at their next token, the blocks under way end
        sides.pool.cancel(by_user=False)
        raise
    if failures:
        stop = next((f for f in failures if isinstance(f, CancelledError)), None)
        raise stop or failures[0]
    if sides.pool.cancelled:
        raise CancelledError("the run was stopped", "")


class BlockProgress:
    """Where a cluster workload is: finished prompts, and inside each block under way its calls (each
    side's generate, each scoring) and its tokens so far, as one share of the work; a "progress" event
    at most every EVERY_S with the prompts done, the blocks and replicas busy, and the time left from
    the pace so far. The workload's _generate and _scored call `call`, `counts` and `call_done` from the
    block's thread (under the driver lock), as they call Progress's in process."""

    EVERY_S = 1.0

    def __init__(
        self,
        emit: EventCallback,
        report: WorkloadReport,
        todo: int,
        max_new: int,
        n_blocks: int,
        calls: int,
        busy: Callable[[], list[str]],
        replicas: int,
    ):
        self.emit, self.report, self.todo, self.max_new = emit, report, max(todo, 1), max(max_new, 1)
        self.n_blocks, self.calls, self.busy, self.replicas = n_blocks, max(calls, 1), busy, replicas
        self.t0 = time.perf_counter()
        self.done = 0  # prompts of the blocks finished in this run
        self.blocks: dict[int, dict[str, Any]] = {}  # thread id -> the block it runs
        self.last = 0.0

    def _mine(self) -> dict[str, Any]:
        return self.blocks.setdefault(threading.get_ident(), {"k": 0, "size": 0, "call_i": 0, "tokens": {}, "what": ""})

    def started(self, k: int, size: int) -> None:
        self.blocks[threading.get_ident()] = {"k": k, "size": size, "call_i": 0, "tokens": {}, "what": ""}

    def call(self, side: str, what: str) -> None:
        b = self._mine()
        b["what"], b["tokens"] = f"{side} {what}", {}
        self.tell()

    def counts(self, moved: dict[int, int]) -> None:
        # Called from the thread that waits for the replica, which is the block's own thread.
        self._mine()["tokens"].update(moved)
        self.tell()

    def call_done(self) -> None:
        b = self._mine()
        b["call_i"], b["tokens"] = b["call_i"] + 1, {}

    def dropped(self) -> None:
        self.blocks.pop(threading.get_ident(), None)

    def finished(self, size: int) -> None:
        self.blocks.pop(threading.get_ident(), None)
        self.done += size
        self.tell(force=True)

    def fraction(self) -> float:
        inside = 0.0
        for b in self.blocks.values():
            tokens = sum(min(n, self.max_new) for n in b["tokens"].values()) / max(b["size"] * self.max_new, 1)
            inside += b["size"] * min(1.0, (b["call_i"] + tokens) / self.calls)
        return min(1.0, (self.done + inside) / self.todo)

    def tell(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.EVERY_S:
            return
        self.last = now
        r, f = self.report, self.fraction()
        spent = now - self.t0
        left = time_left_text(spent, f)
        busy = self.busy()
        doing = (
            f"{len(self.blocks)} of {self.n_blocks} block(s) under way on {len(busy)} of {self.replicas} replica(s)"
            + (f" ({', '.join(busy)})" if busy else "")
        )
        line = progress_line(r.done, r.n_prompts, f, left, r.rate, doing)
        self.emit(RunEvent("progress", line, prompt_index=r.done, fraction=f))


def progress_line(done: int, n: int, fraction: float, left: str, rate: float | None, doing: str = "") -> str:
    """A workload's progress, in the one wording every progress event uses (in process and on a
    cluster, inside a chunk and between chunks: issue 46 item 20 had two, and a test caught whichever
    a throttle let through): the share of the work and the time left first (they move inside a chunk;
    the prompts stored move only when one ends: item 14's "0/12 prompts done" for a whole one-chunk
    run), then the prompts stored with their rate, then what runs now.
    "40% of the work, about 2 min left; 128/1000 prompts stored, 2.10 prompts/s; chunk 3 of 16: b generating"."""
    stored = f"{done}/{n} prompts stored" + (f", {rate:.2f} prompts/s" if rate else "")
    return f"{100 * fraction:.0f}% of the work, {left}; {stored}" + (f"; {doing}" if doing else "")


def duration_text(seconds: float) -> str:
    """A time left as people say it: seconds, minutes, then hours."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def time_left_text(spent: float, fraction: float) -> str:
    """The ETA both progress lines (in process and on a cluster) print: the time spent scaled by the
    share of work left; none before 1% of the work is done."""
    if fraction >= 0.01 and spent > 0:
        return f"about {duration_text(spent * (1 - fraction) / fraction)} left"
    return "time left: after the first tokens"
