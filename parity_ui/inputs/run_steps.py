"""A whole RL run's directory of step dumps: which steps are there, in which framework's format, what
each step is made of, and whether it is complete (`scan_run`, `readiness`).

What a step is, per format (the layouts each framework writes; docs/rollouts.md):
- prime-rl: `.../token_exports/step_<N>/rank_<R>.jsonl`; complete once its `STABLE` marker is there;
  every rank's file is part of it, and a rank absent from the numbering (or present in the run's other
  steps) is named;
- verl (rollout skip dump): `.../<N>/gen_batch.dp`; complete once `meta.json` is written after it;
- NeMo-RL: `train_data_step<N>.jsonl` (written in one go, no marker): complete once it stopped growing
  and ends with a whole line;
- slime: `rollout_data/<id>.pt` (or `rollout_<id>.pt`) with its train dump (`train_data/<id>.pt`) where
  the run writes them: complete once both stopped growing (a train dump the run writes for its other
  steps but not yet for this one is waited for); `eval_<id>.pt` are evaluations, left out and named;
- parity-ui's own format (and verl's text dump): a `.jsonl` / `.parquet` per step whose name carries
  the step's number (`step_3.jsonl`, `rollouts-3.parquet`, `3.jsonl`): complete once it stopped growing.

A directory mixing formats, or several runs' token exports, is refused naming each; a directory with
no step names what it looked for (and that NeMo-RL writes no step dumps when
`env.should_log_nemo_gym_responses` is set).

May import: core (the package's rule).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import nemo_rl, prime_rl, slime_dump, verl_dump
from .rollouts import DumpError, _first_json, _format_of_keys

SETTLE_S = 5.0  # a file no longer written to for this long (and whole) is complete, where no marker says so
MAX_DEPTH = 6  # how deep a run directory is searched
_NEMO = re.compile(r"^train_data_step(\d+)\.jsonl$")
_NUMBER = re.compile(r"(\d+)")
_STEP_NUMBER = re.compile(r"(?:step|rollout|iter|global_step)[_-]?(\d+)", re.IGNORECASE)


def step_of(stem: str) -> int:
    """The step a file's name says: the number after "step" (or rollout, iter: step_7_bf16 is step 7,
    step1_qwen3 step 1, not 16 and 3), else its last number (gen-0005 is step 5)."""
    m = _STEP_NUMBER.search(stem)
    return int(m.group(1)) if m else int(_NUMBER.findall(stem)[-1])


@dataclass
class StepSource:
    """One step of the run: what `open_dump` opens (`path`, in `format`) and what it is made of."""

    step: int
    format: str
    path: Path
    files: list[Path] = field(default_factory=list)
    marker: Path | None = None  # the file whose presence completes the step; None: the format writes none
    ranks: list[int] = field(default_factory=list)  # prime-rl
    missing_ranks: list[int] = field(default_factory=list)
    wants_train: bool = False  # slime: the run writes train dumps, so this step must have one

    def describe(self) -> str:
        return f"step {self.step} ({self.path})"


@dataclass
class RunLayout:
    root: Path
    format: str
    steps: list[StepSource]  # by step number
    ignored: list[str] = field(default_factory=list)  # what was left out, and why (eval dumps, other formats)


def _walk(root: Path) -> list[tuple[Path, list[str], list[str]]]:
    out = []
    base = len(root.parts)
    for d, dirs, files in os.walk(root):
        here = Path(d)
        if len(here.parts) - base >= MAX_DEPTH:
            dirs[:] = []
        dirs.sort()
        out.append((here, dirs, sorted(files)))
    return out


def _file_format(p: Path) -> str | None:
    """The format of a step file that carries its number in its name (parity's, verl's text), else None."""
    if p.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq

            keys = set(pq.ParquetFile(p).schema_arrow.names)
        except Exception:  # noqa: BLE001 - not a whole parquet file (yet): not a step
            return None
    else:
        try:
            first = _first_json(p)
        except OSError:
            return None
        keys = set(first) if first else set()
    fmt = _format_of_keys(keys)
    return fmt if fmt in ("parity", "verl") else None


def scan_run(root: str | Path, fmt: str = "auto") -> RunLayout:
    """The run's steps found under `root` (a directory), in one format. Raises DumpError: no such
    directory, no step found, formats (or prime-rl runs) mixed, two steps with one number."""
    root = Path(root)
    if not root.is_dir():
        raise DumpError(f"{root} is not a directory of step dumps", "give the run's dump directory")
    found: dict[str, list[StepSource]] = {}
    ignored: list[str] = []
    exports: set[Path] = set()
    slime_train_seen = False
    for here, dirs, files in _walk(root):
        if prime_rl.is_step_dir(here):
            n = prime_rl.step_number(here)
            ranks = [r for r, _ in prime_rl.rank_files(here)]
            exports.add(here.parent)
            found.setdefault("prime-rl", []).append(
                StepSource(
                    step=int(n or 0),
                    format="prime-rl",
                    path=here,
                    files=[p for _, p in prime_rl.rank_files(here)],
                    marker=here / prime_rl.STABLE,
                    ranks=ranks,
                )
            )
            dirs[:] = []
            continue
        if verl_dump.is_step_dir(here):
            n = verl_dump.step_number(here)
            if n is None:
                ignored.append(f"{here}: a gen_batch.dp whose step is not known (no meta.json, not a number)")
            else:
                found.setdefault("verl-dp", []).append(
                    StepSource(
                        step=n,
                        format="verl-dp",
                        path=here,
                        files=[here / verl_dump.GEN_BATCH],
                        marker=here / verl_dump.META,
                    )
                )
            dirs[:] = []
            continue
        for name in files:
            p = here / name
            m = _NEMO.match(name)
            if m:
                found.setdefault("nemo-rl", []).append(
                    StepSource(step=int(m.group(1)), format="nemo-rl", path=p, files=[p])
                )
                continue
            if name.endswith(".pt"):
                if name.startswith("eval_"):
                    ignored.append(f"{p}: an evaluation dump (not a training step)")
                    continue
                if here.name == "train_data" or name.startswith("train_"):
                    slime_train_seen = True
                    continue
                rid = slime_dump.rollout_id(p)
                if rid is not None:
                    train = slime_dump.train_dump_for(p)
                    found.setdefault("slime", []).append(
                        StepSource(step=rid, format="slime", path=p, files=[p, *([train] if train else [])])
                    )
                continue
            if name.endswith((".jsonl", ".parquet")):
                numbers = _NUMBER.findall(p.stem)
                f = _file_format(p) if numbers else None
                if f is not None:
                    found.setdefault(f, []).append(StepSource(step=step_of(p.stem), format=f, path=p, files=[p]))
    if fmt != "auto":
        for other, steps in found.items():
            if other != fmt:
                ignored.append(f"{len(steps)} {other} step(s) left out (--format {fmt})")
        found = {fmt: found.get(fmt, [])}
    found = {k: v for k, v in found.items() if v}
    if not found:
        raise DumpError(
            f"no step dumps under {root}",
            "give the directory a run writes its step dumps to: prime-rl's output_dir (token_exports/step_N/), "
            "slime's --dump-details directory (rollout_data/, train_data/), NeMo-RL's log directory "
            "(train_data_stepN.jsonl), verl's skip.rollout.dump_dir, or files of parity-ui's format named with "
            f"their step (step_N.jsonl). {nemo_rl.SKIPPED_WHEN}",
        )
    if len(found) > 1:
        listed = "; ".join(
            f"{k}: {len(v)} step(s), e.g. {v[0].path.relative_to(root)}" for k, v in sorted(found.items())
        )
        raise DumpError(
            f"{root} mixes the step dumps of several formats ({listed})",
            "point at one run's directory, or pass --format to read one of them",
        )
    ((fmt_found, steps),) = found.items()
    if fmt_found == "prime-rl" and len(exports) > 1:
        raise DumpError(
            f"{root} holds the token exports of {len(exports)} runs: "
            + ", ".join(str(e.relative_to(root)) for e in sorted(exports)),
            "point at one run's token_exports directory",
        )
    steps.sort(key=lambda s: s.step)
    twice = sorted({s.step for s in steps if sum(t.step == s.step for t in steps) > 1})
    if twice:
        paths = [str(s.path.relative_to(root)) for s in steps if s.step in twice]
        raise DumpError(
            f"step {twice[0]} is dumped more than once under {root} ({', '.join(paths[:4])})",
            "point at one run's directory (two runs, or a copy, share it)",
        )
    if fmt_found == "prime-rl":  # a rank every other step has, missing from this one
        expected = max((max(s.ranks) + 1 for s in steps if s.ranks), default=0)
        for s in steps:
            s.missing_ranks = prime_rl.missing_ranks(s.ranks, expected)
    if fmt_found == "slime" and slime_train_seen:
        for s in steps:
            s.wants_train = True
    return RunLayout(root=root, format=fmt_found, steps=steps, ignored=ignored)


@dataclass
class Readiness:
    ready: bool
    why: str  # what completes it (or what it waits for)
    since: float | None = None  # when it became complete (the marker's or the last write's time)


def readiness(src: StepSource, *, settle_s: float = SETTLE_S, now: float | None = None) -> Readiness:
    """Whether the step is complete: its marker there (prime-rl, verl), else every file whole and not
    written to for `settle_s`."""
    now = time.time() if now is None else now
    if src.marker is not None:
        if src.marker.exists():
            return Readiness(True, f"{src.marker.name} written", src.marker.stat().st_mtime)
        return Readiness(False, f"no {src.marker.name} marker yet (the step is being written, or was cut)")
    if src.wants_train and len(src.files) < 2:
        fresh = slime_dump.train_dump_for(src.path)
        if fresh is None:
            return Readiness(False, "its train dump is not there yet (the run writes one per step)")
        src.files.append(fresh)
    last = 0.0
    for p in src.files:
        try:
            st = p.stat()
        except OSError:
            return Readiness(False, f"{p.name} is gone")
        last = max(last, st.st_mtime)
        if p.suffix == ".jsonl" and st.st_size:
            with p.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    return Readiness(False, f"{p.name} ends inside a line (still being written, or cut)")
    age = now - last
    if age < settle_s:
        return Readiness(False, f"written to {age:.1f}s ago (complete once unchanged for {settle_s:g}s)")
    return Readiness(True, f"unchanged for {age:.0f}s", last)


def parse_steps(text: str | None) -> set[int] | None:
    """`--steps 3`, `1-10`, `1-5,8,12-`: the steps wanted (None: all). Raises ValueError."""
    if not text:
        return None
    wanted: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--steps {text!r}: write steps as 3, 1-10 or 5- (from step 5 on), comma-separated")
        if not dash:
            wanted.add(int(lo))
        elif hi:
            wanted.update(range(int(lo), int(hi) + 1))
        else:  # "5-": from step 5 on, kept as -5
            wanted.add(-int(lo))
    return wanted


def step_wanted(step: int, wanted: set[int] | None) -> bool:
    """Whether `step` is among `parse_steps`'s answer (an open range "5-" is kept as -5)."""
    if wanted is None:
        return True
    return step in wanted or any(w < 0 and step >= -w for w in wanted)
