"""prime-rl's per-token trainer export (`trainer.enable_token_export`), one training step of it: the
directory `token_exports/step_<N>/` holding `rank_<R>.jsonl` (one JSON object per sequence, written by
each data-parallel rank) and, once every rank flushed, a `STABLE` marker file.

Read as prime-rl writes it (src/prime_rl/trainer/rl/token_export.py; the versions checked are named in
docs/rollouts.md): each record has `schema_version` (1), `step` (and, before prime-rl #3189, `export_step`
and `run_id`, with `<run_id>/token_exports/step_<N>/` for several runs), `rank`, `micro_step`,
`micro_sequence_idx`, `export_sequence_idx`, `env_name`, then per-token arrays aligned to `token_ids`
(prompt + completion, padding trimmed): `position_ids`, `loss_mask` (booleans), `inference_logprobs` (the
rollout engine's; 0 on the prompt), `trainer_logprobs` (shifted right by the trainer, so position i holds
the logprob of token i), `mismatch_kl`, `importance_ratio`, ... Non-finite floats are written as null.

A row: the prompt is every token before the first one the loss mask keeps; the response is the rest
(a multi-turn completion keeps its environment's tokens, masked). Both logprob columns are of the
temperature-scaled distribution (the trainer divides its logits by each token's sampling temperature,
which the export does not record), so recorded vs trainer compares like with like.

All ranks of a step are joined, rank by rank. A rank that is missing from the numbering (rank_0 and
rank_2 but no rank_1) is named by `missing_ranks`; a step without its STABLE marker is incomplete.

May import: core (the package's rule).
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .rollout_rows import DumpError, RolloutRow, floats, ints, jsonl_records

SCHEMA_VERSION = 1
STABLE = "STABLE"  # the marker prime-rl touches in a step's directory once every rank flushed
_RANK = re.compile(r"^rank_(\d+)\.jsonl$")
_STEP = re.compile(r"^step_(\d+)$")


def step_number(step_dir: Path) -> int | None:
    m = _STEP.match(step_dir.name)
    return int(m.group(1)) if m else None


def rank_files(step_dir: Path) -> list[tuple[int, Path]]:
    """The step's rank files, by rank."""
    out = []
    for f in step_dir.iterdir() if step_dir.is_dir() else ():
        m = _RANK.match(f.name)
        if m and f.is_file():
            out.append((int(m.group(1)), f))
    return sorted(out)


def is_step_dir(p: Path) -> bool:
    return p.is_dir() and step_number(p) is not None and bool(rank_files(p))


def is_stable(step_dir: Path) -> bool:
    return (step_dir / STABLE).exists()


def missing_ranks(ranks: list[int], expected: int | None = None) -> list[int]:
    """Ranks absent from 0..max (or 0..expected-1): a data-parallel rank whose file is not there."""
    top = (expected if expected is not None else (max(ranks) + 1 if ranks else 0)) - 1
    have = set(ranks)
    return [r for r in range(top + 1) if r not in have]


def step_dir_of(p: Path) -> Path:
    """The step directory a path names: the directory itself, or a rank file's folder."""
    return p if p.is_dir() else p.parent


def _loads() -> Any:
    """orjson's parser where it is importable (it comes with gradio; ~2.6x json's speed on these
    records, the same values), else json's: an export is ~80 kB of JSON per sequence."""
    try:
        import orjson

        return orjson.loads
    except ImportError:
        import json

        return json.loads


def records(step_dir: Path) -> Iterator[tuple[int, str, Any]]:
    """Every record of every rank of the step, rank by rank, renumbered across ranks."""
    i = 0
    loads = _loads()
    for rank, path in rank_files(step_dir):
        for _, where, rec in jsonl_records(path, loads):
            yield i, f"rank {rank}, {where}", rec
            i += 1


def _fast_floats(v: Any, name: str) -> list[float]:
    """A column of numbers (null: NaN, as prime-rl writes a non-finite float) at C speed where it holds
    numbers only; else the readers' checked path (which names a column that is not numbers)."""
    try:
        return array("d", v).tolist()
    except TypeError:
        return floats(v, name) or []


def _fast_ints(v: Any, name: str) -> list[int]:
    try:
        return array("q", v).tolist()
    except (TypeError, OverflowError):
        return ints(v, name)


def row(rec: dict[str, Any], i: int, where: str) -> RolloutRow:
    """One exported sequence as a RolloutRow. Raises DumpError naming the problem."""
    version = rec.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DumpError(
            f"schema_version {version!r}: parity-ui reads prime-rl's token export schema {SCHEMA_VERSION}",
            "export with a prime-rl whose token_export.py writes SCHEMA_VERSION = 1 (docs/rollouts.md names the "
            "versions checked), or convert the rows to parity-ui's rollout format",
        )
    missing = [k for k in ("token_ids", "loss_mask", "inference_logprobs", "trainer_logprobs") if rec.get(k) is None]
    if missing:
        raise DumpError(f"no {', '.join(missing)} (a prime-rl token export record has them)", "")
    ids = _fast_ints(rec["token_ids"], "token_ids")
    mask = [1 if m else 0 for m in rec["loss_mask"]]
    cols: dict[str, list[float]] = {k: _fast_floats(rec[k], k) for k in ("inference_logprobs", "trainer_logprobs")}
    lengths = {"loss_mask": len(mask), **{k: len(v) for k, v in cols.items()}}
    for name, n in lengths.items():
        if n != len(ids):
            raise DumpError(
                f"{name} has {n} entries for {len(ids)} token_ids",
                "prime-rl writes every per-token array aligned to token_ids: the file was cut or edited",
            )
    start = next((k for k, m in enumerate(mask) if m), None)
    if start is None or start == 0:
        raise DumpError("loss_mask keeps no token after a prompt", "the row has no completion to compare; drop it")
    step = rec.get("export_step") if rec.get("export_step") is not None else rec.get("step")
    facts = {
        k: rec[k]
        for k in ("rank", "micro_step", "micro_sequence_idx", "export_sequence_idx", "env_name", "run_id")
        if rec.get(k) is not None
    }
    if step is not None:
        facts["step"] = int(step)
    return RolloutRow(
        index=i,
        where=where,
        prompt_ids=ids[:start],
        response_ids=ids[start:],
        rollout_logprobs=cols["inference_logprobs"][start:],
        trainer_logprobs=cols["trainer_logprobs"][start:],
        loss_mask=mask[start:],
        sampling=None,
        facts=facts,
    )
