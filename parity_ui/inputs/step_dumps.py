"""One training step of a framework whose step is a directory or a framework's own pickle, told apart
and opened for parity_ui.inputs.rollouts.open_dump: prime-rl's token export step (`step_<N>/`, all
ranks joined: parity_ui.inputs.prime_rl) and verl's rollout skip dump (`<step>/gen_batch.dp`:
parity_ui.inputs.verl_dump); and NeMo-RL's one-sample batches flattened (parity_ui.inputs.nemo_rl).

May import: core (the package's rule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import nemo_rl, prime_rl, verl_dump
from .rollouts import RolloutDump


def detect_step_format(p: Path) -> str | None:
    """ "prime-rl" or "verl-dp" for a path that is (or is inside) such a step, else None."""
    if prime_rl.is_step_dir(p) or (p.is_file() and prime_rl.is_step_dir(p.parent) and p.suffix == ".jsonl"):
        return "prime-rl"
    if verl_dump.is_step_dir(p) or p.name == verl_dump.GEN_BATCH:
        return "verl-dp"
    return None


def open_step(
    dump: RolloutDump,
    p: Path,
    *,
    trust_pickle: bool,
    guard: Callable[[Iterator[tuple[int, str, Any]], Callable[[Any, int, str], Any]], Iterator[Any]],
) -> None:
    """Fill `dump` (its rows, its notes) for the step at `p`. Raises DumpError (a refused pickle, verl
    not importable, a missing rank named in the notes)."""
    if dump.format == "prime-rl":
        step_dir = prime_rl.step_dir_of(p)
        ranks = [r for r, _ in prime_rl.rank_files(step_dir)]
        dump.path = str(step_dir)
        dump.notes.append(
            f"prime-rl token export {step_dir.name}: ranks {', '.join(map(str, ranks))} joined"
            + ("" if prime_rl.is_stable(step_dir) else "; no STABLE marker: the step may still be written")
        )
        gone = prime_rl.missing_ranks(ranks)
        if gone:
            dump.notes.append(f"ranks {', '.join(map(str, gone))} are missing from {step_dir.name}")
        dump.notes.append(
            "prime-rl's logprobs are of the temperature-scaled distribution on both sides (the export "
            "does not record the temperature): an engine re-run scores T=1"
        )
        dump.rows_fn = lambda: guard(prime_rl.records(step_dir), prime_rl.row)
        return
    step_dir = verl_dump.step_dir_of(p)
    data = verl_dump.load(step_dir, trust_pickle)
    dump.path = str(step_dir / verl_dump.GEN_BATCH)
    dump.notes.append("verl's rollout dump has no trainer logprobs: the trainer is replayed as an engine")
    dump.rows_fn = lambda: guard(verl_dump.records(data), verl_dump.row)


def nemo_unbatched(records: Iterator[tuple[int, str, Any]]) -> Iterator[tuple[int, str, Any]]:
    return nemo_rl.records(records)
