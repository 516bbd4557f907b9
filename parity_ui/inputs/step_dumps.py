"""One training step of a framework whose step is a directory or a framework's own pickle, told apart
and opened for parity_ui.inputs.rollouts.open_dump: prime-rl's token export step (`step_<N>/`, all
ranks joined: parity_ui.inputs.prime_rl) and verl's rollout skip dump (`<step>/gen_batch.dp`:
parity_ui.inputs.verl_dump); and NeMo-RL's one-sample batches flattened (parity_ui.inputs.nemo_rl).

May import: core (the package's rule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import nemo_rl, prime_rl, verl_dump
from .rollout_rows import RolloutRow


def detect_step_format(p: Path) -> str | None:
    """ "prime-rl" or "verl-dp" for a path that is (or is inside) such a step, else None."""
    if prime_rl.is_step_dir(p) or (p.is_file() and prime_rl.is_step_dir(p.parent) and p.suffix == ".jsonl"):
        return "prime-rl"
    if verl_dump.is_step_dir(p) or p.name == verl_dump.GEN_BATCH:
        return "verl-dp"
    return None


@dataclass
class OpenedStep:
    """A step as opened: the path it is known by, what to say of it, its records and its row maker
    (parity_ui.inputs.rollouts.open_dump streams them through its bad-row guard)."""

    path: str
    records: Callable[[], Iterator[tuple[int, str, Any]]]
    make: Callable[[Any, int, str], RolloutRow]
    notes: list[str] = field(default_factory=list)


def open_step(fmt: str, p: Path, *, trust_pickle: bool) -> OpenedStep:
    """The step at `p` in `fmt` ("prime-rl" or "verl-dp"). Raises DumpError (a refused pickle, verl
    not importable); a missing rank is named in the notes."""
    if fmt == "prime-rl":
        step_dir = prime_rl.step_dir_of(p)
        ranks = [r for r, _ in prime_rl.rank_files(step_dir)]
        notes = [
            f"prime-rl token export {step_dir.name}: ranks {', '.join(map(str, ranks))} joined"
            + ("" if prime_rl.is_stable(step_dir) else "; no STABLE marker: the step may still be written")
        ]
        gone = prime_rl.missing_ranks(ranks)
        if gone:
            notes.append(f"ranks {', '.join(map(str, gone))} are missing from {step_dir.name}")
        notes.append(
            "prime-rl's logprobs are of the temperature-scaled distribution on both sides (the export "
            "does not record the temperature): an engine re-run scores T=1"
        )
        return OpenedStep(str(step_dir), lambda: prime_rl.records(step_dir), prime_rl.row, notes)
    step_dir = verl_dump.step_dir_of(p)
    data = verl_dump.load(step_dir, trust_pickle)
    return OpenedStep(
        str(step_dir / verl_dump.GEN_BATCH),
        lambda: verl_dump.records(data),
        verl_dump.row,
        ["verl's rollout dump has no trainer logprobs: the trainer is replayed as an engine"],
    )


def nemo_unbatched(records: Iterator[tuple[int, str, Any]]) -> Iterator[tuple[int, str, Any]]:
    return nemo_rl.records(records)
