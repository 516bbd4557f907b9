"""A rollout dump uploaded on the Compare tab: told apart from a workload file, read and described
before anything runs, and the replay request it makes (parity_ui.commands.replay through the service).

Pure (no gradio): parity_ui.ui.workload_input calls these for an uploaded .jsonl or .parquet file,
whose first row says whether it is a rollout dump. The app takes the formats with token ids in a
text file (parity-ui's own, NeMo-RL's); a slime .pt is a pickle and verl's text-only rows need the
trainer's chat template: both are replayed from the CLI (`parity replay FILE --model M`), as is a
dump over the app's upload limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.config import ParityConfig
from ..inputs.rollouts import FORMAT_NAMES, DumpError, detect_format, open_dump
from ..service import ReplayRequest

APP_FORMATS = ("parity", "nemo-rl")
CLI = "parity replay FILE --model MODEL"


@dataclass
class DumpPick:
    format: str
    rows: int
    description: str
    skipped: list[str] = field(default_factory=list)


def rollout_format(path: str) -> str | None:
    """The dump's format when the file is a rollout dump the app replays; None for any other file
    (a workload file, read as prompts). A text-only verl dump ({"input", "output"}) reads as prompts."""
    try:
        fmt = detect_format(path)
    except DumpError:
        return None
    return fmt if fmt in APP_FORMATS else None


def read_dump(path: str, name: str, fmt: str, *, skip_bad: bool, limit: int | None, shown: int = 5) -> DumpPick:
    """The dump's rows counted in one streaming pass (no tokenizer: the replay's own preflight checks
    them against the model when it runs). Raises DumpError naming a row that cannot be read."""
    dump = open_dump(path, fmt, on_bad="skip" if skip_bad else "stop")
    rows = with_lp = 0
    for row in dump.rows():
        if limit is not None and rows >= limit:
            break
        rows += 1
        with_lp += row.rollout_logprobs is not None
    if rows == 0:
        raise DumpError(f"{name} holds no row to replay", "check the file")
    lp = "" if with_lp == rows else f"; {rows - with_lp} without recorded logprobs"
    return DumpPick(
        fmt,
        rows,
        f"{name}: a rollout dump ({FORMAT_NAMES[fmt]}), {rows:,} rows{lp}",
        [f"{b.where}: {b.message}" for b in dump.bad[:shown]],
    )


def how(pick_rows: int) -> str:
    return (
        f"Runs as a replay of {pick_rows:,} rows: the run's own tokens forced through the sides (the first side "
        "is the trainer, the others re-run the rollout engine), against the logprobs it recorded; the worst "
        "tokens first (the text box is not used)."
    )


def replay_request(
    path: str,
    fmt: str,
    model: str,
    cfg: ParityConfig,
    *,
    trust: bool,
    skip_bad: bool,
    limit: int | None,
    floor: str,
    name: str | None = None,
) -> ReplayRequest:
    return ReplayRequest(
        dump=path,
        model=model,
        config=cfg,
        format=fmt,
        on_bad="skip" if skip_bad else "stop",
        name=name,
        limit=limit,
        floor=floor if floor in ("auto", "kernel", "none") else "auto",
        trust_remote_code=trust,
    )


def too_large_fix() -> str:
    """The upload limit's fix, for a dump: the CLI command that replays it."""
    return f"replay it from the command line: {CLI} (no size limit there, streamed)"
