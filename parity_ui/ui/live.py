"""The live view of a run in progress: RunEvents in, progress card and token panes out.

Pure (no gradio): the Compare tab feeds it the service's events from a queue and renders it at a
throttled rate. Sides generate one after the other, the reference first. A workload streams no
tokens: its live view (WorkloadLive) is a progress card with the prompts done and an ETA; a bisect's
(BisectLive), the trial under way and the trials done.
"""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Callable, Iterator

from ..core.runlog import RunEvent
from ..core.types import TokenStep
from ..render.cards import progress_html, status_progress_html
from ..render.report_parts import bisect_progress_html
from ..render.tokens import Stream, first_difference, panes_html
from ..render.workload import workload_progress_html


class SideStates:
    """What each side is doing now, from the status lines the pipeline tags with a side ("b: loading
    the weights", "hf: loaded in 3.1 s; waiting for b to load before generating", "b: first call since
    it loaded: warming up ...") and from its tokens: shown next to the side, with how long it has been so."""

    def __init__(self) -> None:
        self.state: dict[str, tuple[str, float]] = {}

    def feed(self, ev: RunEvent) -> None:
        if ev.kind == "progress":
            # A workload's sides take turns in each chunk: the side of this line works now, and one that
            # generated or scored before it has done its part (issue 46 item 14: it read "generating" on).
            # A line with no side is between calls: nobody works.
            for side, (what, _) in list(self.state.items()):
                if side != ev.side and what in ("generating", "scoring"):
                    self.state[side] = ("its part of the chunk done", time.monotonic())
        if ev.side is None:
            return
        if ev.kind in ("token", "progress"):
            doing = "scoring" if ev.kind == "progress" and " scoring " in ev.message else "generating"
            if self.state.get(ev.side, ("",))[0] != doing:
                self.state[ev.side] = (doing, time.monotonic())
            return
        if ev.kind == "side_done":
            self.state[ev.side] = ("done", time.monotonic())
        elif ev.kind == "status" and ev.message:
            what = ev.message.split(": ", 1)[1] if ev.message.startswith(f"{ev.side}: ") else ev.message
            self.state[ev.side] = (what, time.monotonic())

    def now(self) -> dict[str, str]:
        t = time.monotonic()
        return {
            side: what if what == "done" else f"{what} ({t - since:.0f} s)"
            for side, (what, since) in self.state.items()
        }


class LiveRun:
    streams_tokens = True  # its panes change as tokens arrive

    def __init__(self, sides: list[str], n_prompts: int, max_new_tokens: int | None):
        self.sides = sides
        self.n_prompts = n_prompts
        self.max_new_tokens = max_new_tokens
        self.steps: dict[str, dict[int, list[TokenStep]]] = {s: {} for s in sides}
        self.phase = "Queued: waiting for the engines"
        self.log: list[str] = []
        self.t0 = time.monotonic()
        self.first_token_s: float | None = None
        self.states = SideStates()

    def feed(self, ev: RunEvent) -> None:
        self.states.feed(ev)
        if ev.kind == "token" and ev.side in self.steps and ev.step is not None:
            if self.first_token_s is None:
                self.first_token_s = time.monotonic() - self.t0
            self.steps[ev.side].setdefault(ev.prompt_index or 0, []).append(ev.step)
            return
        if ev.message:
            self.log.append(ev.message)
        if ev.kind == "status":
            m = ev.message
            if m.startswith("preparing"):
                self.phase = "Preparing: model, tokenizer, config, sides"
            elif m.startswith(("starting", "loading")):
                self.phase = "Starting the sides (a warm side is reused)"
            elif ev.side is not None and ": generating" in m:
                self.phase = f"Generating: {ev.side}"
            elif m.startswith("cross-scoring"):
                self.phase = "Cross-scoring: teacher-forced"
            elif m.startswith("stored"):
                self.phase = "Comparing and storing"

    def counts(self) -> dict[str, int]:
        return {name: sum(len(v) for v in per.values()) for name, per in self.steps.items()}

    def progress(self) -> str:
        expected = self.max_new_tokens * self.n_prompts if self.max_new_tokens else None
        return progress_html(
            self.phase, self.log, self.counts(), expected, time.monotonic() - self.t0, self.states.now()
        )

    def panes(self, prompt_index: int = 0) -> str:
        per = [self.steps[s].get(prompt_index, []) for s in self.sides]
        ref_ids = [s.token_id for s in per[0]] if per else []
        streams = [
            Stream(
                name,
                name,
                steps,
                None if i == 0 else first_difference(ref_ids, [s.token_id for s in steps], finished=False),
            )
            for i, (name, steps) in enumerate(zip(self.sides, per))
        ]
        note = "Streaming as the sides generate (the reference first, then each side)"
        note += f": prompt {prompt_index} of {self.n_prompts}." if self.n_prompts > 1 else "."
        return panes_html(streams, live=True, note=note)


class WorkloadLive:
    """A workload in progress: the phase, prompts done of all (the runner's "progress" events carry
    them in prompt_index, and their message the rate and the time left), the last status lines."""

    streams_tokens = False  # chunks are generated whole: nothing to show between progress lines

    def __init__(self, n_prompts: int, source: str = ""):
        self.n_prompts = n_prompts
        self.source = source
        self.done = 0
        self.eta = ""  # the newest progress line (commands.workload.blocks.progress_line)
        self.fraction: float | None = None  # the share of the work done, inside a chunk too
        self.phase = "Queued: waiting for the engines"
        self.log: list[str] = []
        self.t0 = time.monotonic()
        self.states = SideStates()

    def feed(self, ev: RunEvent) -> None:
        self.states.feed(ev)
        if ev.kind == "progress":
            self.done = ev.prompt_index or 0
            self.eta = ev.message
            self.fraction = ev.fraction
            self.phase = (
                "Generating, comparing and storing, blocks at once on the cluster's replicas"
                if " replica(s)" in ev.message
                else "Generating, comparing and storing, a chunk at a time"
            )
            return
        if ev.kind == "token":
            return
        if ev.message:
            self.log.append(ev.message)
        m = ev.message
        if ev.kind == "status":
            if m.startswith("preparing"):
                self.phase = "Preparing: tokenizing every prompt"
            elif m.startswith("resuming"):
                self.phase = "Resuming: the prompts not done yet"
            elif m.startswith("generating"):
                self.phase = "Generating, comparing and storing, a chunk at a time"
            elif m.startswith(("starting", "loading")) or (
                ev.side is not None and self.fraction is None and not self.phase.startswith("Generating")
            ):
                self.phase = "Starting the sides (a warm side is reused)"
            elif m.startswith("stored"):
                self.phase = "Stored"

    def progress(self) -> str:
        return workload_progress_html(
            self.phase,
            self.done,
            self.n_prompts,
            self.eta,
            self.log,
            time.monotonic() - self.t0,
            self.source,
            self.fraction,
            self.states.now(),
        )


class StatusLive:
    """A command in progress that says where it is in status lines (an audit: each axis as it starts
    and ends; a weight check: the digests, the probe): its phase and its last LINES lines. Until its
    first event the phase is its title, or, while it waits for another run, which run
    (active_run.RunGate.draw sets it)."""

    streams_tokens = False
    LINES = 14

    def __init__(self, title: str):
        self.title = title
        self.phase = title
        self.log: list[str] = []
        self.t0 = time.monotonic()

    def feed(self, ev: RunEvent) -> None:
        if ev.kind == "token" or not ev.message:
            return
        self.phase = self.title
        self.log.append(ev.message.strip())
        del self.log[: -self.LINES]

    def progress(self) -> str:
        return status_progress_html(self.phase, self.log, time.monotonic() - self.t0)


class BisectLive:
    """A bisect in progress (parity_ui.commands.setting_bisect's status lines): its own id (its first line names it, so
    the view can read its stored record as trials finish), the trial under way, the trials done, the
    estimate, the last lines. A trial's own lines come indented ("  trial 3: ...")."""

    streams_tokens = False
    _OPENS = re.compile(r"^bisect (\w+) of run ")
    _DONE = re.compile(r"^trial (\d+): (RESTORES|DIVERGES|FAILED)")
    _STARTS = re.compile(r"^trial (\d+): ")

    def __init__(self, pair: str = ""):
        self.pair = pair
        self.bisect_id: str | None = None
        self.trials = 0
        self.changed = False  # a trial finished since `take_changed` was last asked
        self.estimate = ""
        self.phase = "Queued: waiting for the engines"
        self.log: list[str] = []
        self.t0 = time.monotonic()

    def feed(self, ev: RunEvent) -> None:
        if ev.kind == "token" or not ev.message:
            return
        m = ev.message
        self.log.append(m.strip())
        if (opened := self._OPENS.match(m)) is not None:
            self.bisect_id = opened.group(1)
            self.phase = f"Which setting? {self.pair}: checking the settings that differ"
        elif m.startswith("estimate"):
            self.estimate = m.partition(": ")[2]
        elif (done := self._DONE.match(m)) is not None:
            self.trials, self.changed = int(done.group(1)), True
        elif (start := self._STARTS.match(m)) is not None:
            self.phase = f"Trial {start.group(1)}: {m.partition(': ')[2]}"
        elif m.startswith("RESULT"):
            self.phase = "Stored"

    def take_changed(self) -> bool:
        """Whether a trial finished since the last call (the view then reads the stored record)."""
        changed, self.changed = self.changed, False
        return changed

    def progress(self) -> str:
        return bisect_progress_html(self.phase, self.trials, self.estimate, self.log, time.monotonic() - self.t0)


def follow(events: queue.Queue, feed: Callable[[RunEvent], None], every: float) -> Iterator[object]:
    """What a worker thread puts on `events`: each RunEvent goes to `feed`; yields None at most
    every `every` seconds (time to redraw), then the final item (a Run, or the exception the worker
    hit) and stops."""
    last = time.monotonic()
    while True:
        try:
            item = events.get(timeout=every)
        except queue.Empty:
            item = None
        if item is not None and not isinstance(item, RunEvent):
            yield item
            return
        if item is not None:
            feed(item)
        if time.monotonic() - last >= every:
            last = time.monotonic()
            yield None
