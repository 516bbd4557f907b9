"""A workload file uploaded on the Compare tab (.jsonl or .parquet): which prompts of it run and
how (the "Workload options"), read and described before anything runs, and the request it makes.

Pure (no gradio): the Compare tab keeps a `WorkloadPick` in a gr.State and calls these. The rule is
the CLI's: a file of two or more prompts, or any .parquet file, runs as a workload
(parity_ui.commands.workload.run); a .jsonl file of one prompt runs as one comparison.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ..core.cluster import parse_cluster, parse_replicas
from ..core.errors import ParityError, PromptError
from ..core.workload_record import FLOORS, MODES, WorkloadOptions
from ..inputs.prompts import MAX_PROMPT_FILE_BYTES, check_upload_size
from ..inputs.workload_source import WORKLOAD_FILE_TYPES, Workload, load_workload
from ..render.cards import error_html, esc
from . import replay_input

# An upload is held whole by the app (gradio writes it to a temporary file first): the app's upload
# limit (launch max_file_size), refused again here with a fix that names the CLI for larger files.
UPLOAD_MAX_BYTES = MAX_PROMPT_FILE_BYTES
SKIPPED_SHOWN = 5


@dataclass
class WorkloadPick:
    """The uploaded workload file and its options, as the page last set them. `path` None: no file
    (the options are kept for the next one). `error`: why the file or the options were refused
    (Run then stores that as an error run)."""

    path: str | None = None
    name: str = ""
    field: str | None = None
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    skip_bad: bool = False
    mode: str = "free"
    floor: str = "auto"
    cluster: str = ""  # a Ray cluster to run on ("local", an address; "" in process): parity_ui.core.cluster
    replicas: str = ""  # replicas of each side there ("2", "ref=1,b=4"; "" one each)
    prompts: int = 0  # prompts the selection holds (after limit/sample)
    parquet: bool = False
    description: str = ""  # Workload.describe()
    skipped: list[str] = dataclasses.field(default_factory=list)  # the first skipped rows, each "where: what"
    error: str | None = None
    fix: str = ""
    rollout: str | None = None  # a rollout dump's format: runs as a replay (parity_ui.ui.replay_input)

    @property
    def active(self) -> bool:
        return self.path is not None

    @property
    def is_workload(self) -> bool:
        """Runs as a workload (else as one comparison): the CLI's rule. A rollout dump: as a replay."""
        return self.rollout is not None or self.prompts > 1 or self.parquet

    def options(self) -> WorkloadOptions:
        cluster = parse_cluster(self.cluster)  # checked by with_options: it raises nothing here
        return WorkloadOptions(
            mode=self.mode,
            floor=self.floor,
            cluster=cluster,
            replicas=parse_replicas(self.replicas) if cluster and self.replicas else {},
        )


def is_workload_file(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in WORKLOAD_FILE_TYPES


def load(pick: WorkloadPick) -> Workload:
    """Read the picked file's prompts as its options say. Raises PromptError (ParityError) naming the
    problem and the fix: the file's type or size, a broken line or row, a missing field."""
    if pick.path is None:
        raise PromptError("no workload file was uploaded", "upload a .jsonl or .parquet file")
    return load_workload(
        pick.path,
        field=pick.field,
        limit=pick.limit,
        sample=pick.sample,
        seed=pick.seed,
        on_bad="skip" if pick.skip_bad else "stop",
        max_bytes=UPLOAD_MAX_BYTES,
    )


def select(pick: WorkloadPick) -> WorkloadPick:
    """The pick with its file read: how many prompts, the description and the skipped rows, or the
    error (never raises for the file's problems)."""
    pick = dataclasses.replace(
        pick,
        prompts=0,
        description="",
        skipped=[],
        error=None,
        fix="",
        rollout=None,
        parquet=pick.name.lower().endswith(".parquet"),
    )
    if pick.path is None:
        return pick
    fmt = replay_input.rollout_format(pick.path)
    if fmt is not None:
        return _dump(pick, fmt)
    try:
        check_upload_size(pick.name, os.path.getsize(pick.path), "workload file")  # before anything reads it
        w = load(pick)
    except ParityError as e:
        return dataclasses.replace(pick, error=e.message, fix=e.fix)
    except OSError as e:  # the upload's temporary file went away
        return dataclasses.replace(
            pick, error=f"the uploaded file {pick.name!r} cannot be read ({e.strerror})", fix="upload it again"
        )
    return dataclasses.replace(
        pick,
        prompts=len(w.prompts),
        description=w.describe(),
        skipped=[f"{b.where}: {b.message}" for b in w.skipped[:SKIPPED_SHOWN]],
    )


def _dump(pick: WorkloadPick, fmt: str) -> WorkloadPick:
    """The pick of a rollout dump: its rows counted, or why it is refused (too large: the CLI)."""
    pick = dataclasses.replace(pick, rollout=fmt)
    path = pick.path
    assert path is not None  # select() reads a dump only when a file was given
    try:
        check_upload_size(pick.name, os.path.getsize(path), "rollout dump")
        d = replay_input.read_dump(path, pick.name, fmt, skip_bad=pick.skip_bad, limit=pick.limit, shown=SKIPPED_SHOWN)
    except ParityError as e:
        fix = replay_input.too_large_fix() if "upload limit" in e.message else e.fix
        return dataclasses.replace(pick, error=e.message, fix=fix)
    except OSError as e:
        return dataclasses.replace(
            pick, error=f"the uploaded file {pick.name!r} cannot be read ({e.strerror})", fix="upload it again"
        )
    return dataclasses.replace(pick, prompts=d.rows, description=d.description, skipped=d.skipped)


def uploaded(pick: WorkloadPick, path: str) -> WorkloadPick:
    """A newly uploaded file, read with the options already set."""
    return select(dataclasses.replace(pick, path=path, name=os.path.basename(path)))


def cleared(pick: WorkloadPick) -> WorkloadPick:
    """No file (the text box runs again); the options stay for the next file."""
    return dataclasses.replace(
        pick, path=None, name="", prompts=0, description="", skipped=[], error=None, fix="", rollout=None
    )


def _count(label: str, value: Any) -> int | None:
    """A gr.Number's value as a count of prompts: None when empty or 0 (the page sends an emptied
    number as 0). PromptError for a fraction or a negative number."""
    if value is None or value == "" or value == 0:
        return None
    try:
        n = float(value)
    except (TypeError, ValueError):
        raise PromptError(
            f"{label} is {value!r}", f"give {label} as a whole number of prompts, or leave it empty"
        ) from None
    if n != int(n) or n < 1:
        raise PromptError(
            f"{label} is {value!r}", f"give {label} as a whole number of prompts, 1 or more, or 0 (all of them)"
        )
    return int(n)


def with_options(
    pick: WorkloadPick,
    mode: str,
    floor: str,
    field_name: str | None,
    limit: Any,
    sample: Any,
    skip_bad: bool,
    cluster: str | None = None,
    replicas: str | None = None,
) -> WorkloadPick:
    """The pick with the page's options; the file is read again when the selection changed (field,
    limit, sample, skipping). A bad option becomes the pick's error, like a bad file. `cluster` and
    `replicas` (None: unchanged) are checked here, so Run starts on the cluster the user named."""
    new = dataclasses.replace(
        pick,
        mode=mode if mode in MODES else pick.mode,
        floor=floor if floor in FLOORS else pick.floor,
        field=(field_name or "").strip() or None,
        skip_bad=bool(skip_bad),
        cluster=pick.cluster if cluster is None else cluster.strip(),
        replicas=pick.replicas if replicas is None else replicas.strip(),
    )
    try:
        parse_cluster(new.cluster)
        if new.replicas:
            parse_replicas(new.replicas)
        new.limit, new.sample = _count("limit", limit), _count("sample", sample)
    except ParityError as e:
        return dataclasses.replace(new, error=e.message, fix=e.fix, prompts=0, description="", skipped=[])
    selection = ("path", "field", "limit", "sample", "seed", "skip_bad")
    if pick.error or any(getattr(new, k) != getattr(pick, k) for k in selection):
        return select(new)
    return new


def note_html(pick: WorkloadPick) -> str:
    """What the page says under the upload: the file refused (the problem and the fix), or what runs:
    the description, the skipped rows, and how."""
    if not pick.active:
        return ""
    if pick.error:
        return error_html(pick.error, pick.fix, "Workload file refused")
    if pick.rollout is not None:
        how = replay_input.how(pick.prompts)
    elif pick.is_workload:
        how = (
            f"Runs as a workload: mode {pick.mode}, floor {pick.floor}; each side's pooled figures next to the "
            "reference's own noise (the text box is not used)."
        )
    else:
        how = "One prompt: runs as one comparison (the text box is not used)."
    skipped = "".join(f"<li>{esc(s)}</li>" for s in pick.skipped)
    skipped = f'<ul class="pc-findings">{skipped}</ul>' if skipped else ""
    return (
        f'<div class="pc-card pc-notice wl-pick" data-prompts="{pick.prompts}"><b>{esc(pick.description)}</b>'
        f"<div>{esc(how)}</div>{skipped}</div>"
    )


def source_record(w: Workload, name: str) -> dict[str, Any]:
    """How the prompts were chosen, stored with the run (WorkloadOptions.source): the file by its name
    (an upload's temporary path means nothing later)."""
    return {
        "path": name,
        "uploaded": True,
        "format": w.format,
        "field": w.field,
        "rows": w.total_rows,
        "prompts": len(w.prompts),
        "sampled": w.sampled,
        "seed": w.seed,
        "limit": w.limit,
        "skipped_rows": w.skipped_count,
        "content_hash": w.content_hash,
        "description": w.describe(),
    }
