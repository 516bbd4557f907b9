"""A run's life as a record: created when it starts, timed per phase, failures turned into a status.

Shared by every command that stores runs (compare, probe, sweep), so a run looks the same whoever
made it and whatever stopped it.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .. import __version__
from .errors import CancelledError, ParityError
from .types import ModelInfo, PromptResult, Run, TokenStep

# The phases a run's time is split into (Run.timings), in order.
PHASES = ("prepare", "start", "check", "load", "generate", "compare", "routes", "cross_score", "explain", "store")


@dataclass
class RunEvent:
    """Progress for a live view: status lines, and each token as a side makes it."""

    kind: str  # "status" | "token" | "side_done" | "progress" (a workload: prompt_index = prompts done)
    message: str = ""
    side: str | None = None
    prompt_index: int | None = None
    step: TokenStep | None = None
    fraction: float | None = None  # a workload's "progress": the share of its work done (inside chunks too)


EventCallback = Callable[[RunEvent], None]


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), to tell a live process from a
    later one that reuses its pid. None when it is not running."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def this_owner() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": process_start_time(os.getpid())}


def owner_alive(owner: dict[str, Any] | None) -> bool | None:
    """Whether the process that owns a running run is still running; None when it ran on another host."""
    if not owner or owner.get("host") != socket.gethostname():
        return None
    start = process_start_time(int(owner.get("pid", -1)))
    return start is not None and start == owner.get("start")


def new_run(
    run_id: str,
    model: str,
    config: dict[str, Any],
    prompts: list[Any],
    *,
    kind: str = "compare",
    group_id: str | None = None,
) -> Run:
    """A run as it starts: status "running", the prompts as given, owned by this process."""
    return Run(
        id=run_id,
        created_utc=utcnow(),
        model=ModelInfo(name=model, path=""),
        config=config,
        status="running",
        group_id=group_id,
        kind=kind,
        owner=this_owner(),
        versions={"parity_ui": __version__, "python": platform.python_version()},
        prompts=[
            PromptResult(
                index=i,
                prompt_text=getattr(p, "text", None) or "",
                prompt_token_ids=[],
                messages=getattr(p, "messages", None),
                given=_given(p),
            )
            for i, p in enumerate(prompts)
        ],
    )


def _given(spec: Any) -> dict[str, Any] | None:
    """The prompt as the user gave it, for a run that must be repeated or resumed: text or messages
    (images by name and hash; their bytes are stored apart)."""
    if spec is None:
        return None
    images = [img.meta() for img in getattr(spec, "images", None) or []]
    return {
        "text": getattr(spec, "text", None),
        "messages": getattr(spec, "messages", None),
        **({"images": images} if images else {}),
    }


def record_failure(run: Run, exc: BaseException) -> None:
    """The one place an exception becomes a run's status, message and code."""
    if isinstance(exc, CancelledError):
        run.status, run.error, run.error_code = "cancelled", str(exc), exc.code
    elif isinstance(exc, ParityError):
        run.status, run.error, run.error_code = "error", str(exc), exc.code
    elif isinstance(exc, KeyboardInterrupt):
        run.status, run.error, run.error_code = "interrupted", "interrupted (Ctrl-C)", "interrupted"
    else:  # an internal bug: still stored and reported, never a dead app
        run.status, run.error, run.error_code = "error", f"internal error: {type(exc).__name__}: {exc}", "internal"
        traceback.print_exception(exc, file=sys.stderr)


@contextmanager
def phase(run: Run, name: str) -> Iterator[None]:
    """Add the time spent in the block to run.timings[name]."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        run.timings[name] = round(run.timings.get(name, 0.0) + time.perf_counter() - t0, 4)


def finish(run: Run, t0: float) -> None:
    run.duration_ms = int((time.perf_counter() - t0) * 1000)
    run.owner = None
