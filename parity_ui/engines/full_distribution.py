"""Full next-token rows, compared where they meet (core.distribution: what is recorded and pooled).

Why not ship rows: a row is vocabulary x 4 bytes (49,152 x 4 = 192 KiB for the demo model), so a
128-token answer is 24 MiB per side; through the worker pipe (pickled) and into SQLite that would
dwarf everything else a run keeps. Instead:

1. The side whose rows exist first (the one that generated the tokens; in a replay the first scorer)
   writes them to a scratch .npy in the run's scratch dir (in memory, /dev/shm, where it has room:
   measures.scratch) — float32, exact for float32 logits, so two sides that agree bit for bit
   give KL = 0 exactly; or the bfloat16 bits where every value is one (a bf16 model's logits): as
   exact, half the bytes — `write_rows` from a whole tensor (HF), or a decode step at a time (vLLM's
   logits-processor hook, parity_ui.engines.vllm_full_rows: each step's rows one block of a log, an
   index per sequence beside its path, parity_ui.engines.step_rows).
2. The side that makes its rows second (the reference scoring those tokens, the floor, the trainer')
   reads the file while its own rows are still on its device, and computes the five per-position
   scalars there (`meet`), in float64, a block of rows at a time. Only the scalars cross the pipe,
   as optional columns of its TokenSteps.
3. The parent deletes the scratch files when the chunk is stored.

So each pair costs one write and one read of one side's rows, and one float64 pass over both rows on
the scorer's device: no second copy of the rows anywhere, no parent-side pass over vocab-sized data.

Runs inside workers (imports torch and numpy).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from ..core.distribution import DISTRIBUTION_COLUMNS, clamp_kl
from ..core.requests import Rows
from .step_rows import INDEX, narrowed, read_steps, widened  # noqa: F401 - narrowed, widened: the rows' two forms

BLOCK = 64  # rows per float64 pass: 64 x 49,152 x 8 B = 24 MiB per temporary
BIG = 1e30  # an infinite KL (a token one side gives probability 0) as a finite number JSON carries


def device_narrowed(rows: Any) -> tuple[Any, Any]:
    """`narrowed` on the device, for [n, vocab] float32 rows: their bfloat16 bits (int16) and, per row,
    whether it is NOT exactly bfloat16 (its bits then lose something), with no wait for the device."""
    bits = rows.view(torch.int32)
    return (bits >> 16).to(torch.int16), (bits & 0xFFFF).ne(0).any(dim=-1)


def write_rows(path: str, logits: Any) -> None:
    """[tokens, vocab] logits to an .npy, atomically (a reader never sees half a file): float32, or
    their bfloat16 bits where that is exact (checked on the device, so only the narrow copy moves)."""
    t = logits.detach().to(torch.float32).contiguous()
    bits, inexact = device_narrowed(t)
    arr = t.cpu().numpy() if bool(inexact.any()) else bits.cpu().numpy()
    part = path + ".part.npy"
    np.save(part, arr)
    os.replace(part, path)


def row_figures(ref: Any, side: Any, k: int) -> dict[str, Any]:
    """Per row of two [n, vocab] logit tensors (any float dtype, same device): KL both ways, total
    variation, top-1 agreement, top-k containment (the reference's argmax among the side's k best),
    as float64 / int64 tensors. Exact over the whole vocabulary: log-softmax in float64, then
    Σ p (log p − log q) with 0 · log 0 = 0; a token only one side can emit gives an infinite KL, kept
    as BIG; a KL below 0 is float rounding and clamped to 0 (core.distribution.clamp_kl)."""
    lr = torch.log_softmax(ref.to(torch.float64), dim=-1)
    ls = torch.log_softmax(side.to(torch.float64), dim=-1)
    pr, ps = lr.exp(), ls.exp()
    zero = torch.zeros((), dtype=torch.float64, device=lr.device)
    kl = torch.where(pr > 0, pr * (lr - ls), zero).sum(-1)
    kl_rev = torch.where(ps > 0, ps * (ls - lr), zero).sum(-1)
    tv = 0.5 * (pr - ps).abs().sum(-1)
    a_ref, a_side = lr.argmax(-1), ls.argmax(-1)
    kk = max(1, min(k, ls.shape[-1]))
    topk = (ls.topk(kk, dim=-1).indices == a_ref[:, None]).any(-1)
    clean = lambda x: torch.nan_to_num(x, nan=BIG, posinf=BIG).clamp(min=0.0)  # noqa: E731
    return {
        "kl": clean(kl),
        "kl_rev": clean(kl_rev),
        "tv": tv,
        "top1": (a_ref == a_side).to(torch.int64),
        "topk": topk.to(torch.int64),
    }


class RowsMissing(Exception):
    """The other side's rows are not there (it could not write them): the pair has no figures."""


def read_rows(path: str, pin: bool = False) -> Any:
    """A sequence's rows into host memory as a tensor (float32, or int16 bfloat16 bits): the .npy at
    `path` (write_rows: one read), or where vLLM wrote them a step at a time, its index beside it
    (step_rows: one gathered copy); pinned when `pin` (its copy to the GPU then needs no staging).
    RowsMissing when neither is there."""
    made: list[Any] = []

    def alloc(shape: tuple[int, int], dtype: Any) -> np.ndarray:  # gathered straight into pinned memory
        made.append(torch.empty(shape, dtype=torch.int16 if dtype == np.int16 else torch.float32, pin_memory=pin))
        return made[-1].numpy()

    try:
        if os.path.exists(path + INDEX):
            read_steps(path + INDEX, alloc)
            return made[-1]
        host = torch.from_numpy(np.load(path))  # at most one sequence's rows: the budget
    except FileNotFoundError:
        raise RowsMissing(f"no rows at {path}") from None
    return host.pin_memory() if pin else host


class ReadAhead:
    """The rows files of a batch of scoring items read on a thread, AHEAD items ahead of the one being
    scored, so the scorer's forward pass hides the read (and the pinning). Bounded: at most AHEAD+1
    sequences' rows in host memory."""

    AHEAD = 2

    def __init__(self, paths: list[str | None], pin: bool):
        from concurrent.futures import ThreadPoolExecutor

        self.paths, self.pin = paths, pin
        self.ex = ThreadPoolExecutor(1, thread_name_prefix="parity-rows-read")
        self.futures: dict[int, Any] = {}
        for i in range(min(self.AHEAD + 1, len(paths))):
            self._submit(i)

    def _submit(self, i: int) -> None:
        path = self.paths[i] if i < len(self.paths) else None
        if path and i not in self.futures:
            self.futures[i] = self.ex.submit(read_rows, path, self.pin)

    def take(self, i: int) -> Any:
        """Item i's rows on the host (None: it reads none); raises what the read raised."""
        self._submit(i + self.AHEAD)
        f = self.futures.pop(i, None)
        return f.result() if f is not None else None

    def close(self) -> None:
        self.ex.shutdown(wait=True, cancel_futures=True)
        self.futures.clear()


def load_rows(path: str | None, n: int, device: Any, host: Any) -> Any:
    """The first n rows of a rows file, read into `host` (read_rows), on `device`: one host-to-device
    copy (the bfloat16 bits, where the writer narrowed them, move as they are and become bfloat16
    there). `path` names the file in the error (None: the rows were handed over already read)."""
    if host.dim() != 2 or host.shape[0] < n:
        raise RowsMissing(f"{path or 'the rows read'} holds {host.shape[0] if host.dim() == 2 else 0} rows, {n} needed")
    on = host[:n].to(device, non_blocking=host.is_pinned())
    return on.view(torch.bfloat16) if host.dtype == torch.int16 else on


def meet(own: Any, rows: Rows, n: int, host: Any = None) -> dict[str, list[Any]]:
    """The five per-position columns of this engine's rows `own` ([>= n, vocab] logits on its device)
    against the rows in `rows.read` (`host`: that file already read), for the first n positions.
    Raises RowsMissing when the file is not there or holds fewer rows, ValueError when the
    vocabularies differ."""
    if host is None:
        if not rows.read:
            raise RowsMissing("no rows file named")
        host = read_rows(rows.read)  # RowsMissing when it is not there
    if host.dim() == 2 and host.shape[1] != own.shape[-1]:
        raise ValueError(
            f"the sides' vocabularies differ: {own.shape[-1]:,} logits here, {host.shape[1]:,} in the "
            "other side's rows (a padded lm_head?): their distributions cannot be compared token by token"
        )
    other = load_rows(rows.read, n, own.device, host)
    parts = []
    for s in range(0, n, BLOCK):
        e = min(n, s + BLOCK)
        mine, theirs = own[s:e], other[s:e]
        ref, side = (mine, theirs) if rows.read_is == "side" else (theirs, mine)
        figs = row_figures(ref, side, rows.k)
        parts.append(torch.stack([figs[c].to(torch.float64) for c in DISTRIBUTION_COLUMNS]))
    # One device-to-host copy for the sequence's five columns, not five per block.
    table = torch.cat(parts, dim=1).cpu().tolist() if parts else [[] for _ in DISTRIBUTION_COLUMNS]
    out: dict[str, list[Any]] = dict(zip(DISTRIBUTION_COLUMNS, table))
    out["top1"] = [int(x) for x in out["top1"]]
    out["topk"] = [int(x) for x in out["topk"]]
    out["kl"] = [clamp_kl(x) for x in out["kl"]]
    out["kl_rev"] = [clamp_kl(x) for x in out["kl_rev"]]
    return out


def attach(steps: list[Any], columns: dict[str, list[Any]]) -> None:
    """The columns onto the steps (TokenStep's optional distribution fields)."""
    for i, step in enumerate(steps):
        for c in DISTRIBUTION_COLUMNS:
            if i < len(columns.get(c, ())):
                setattr(step, c, columns[c][i])


def columns_for(own: Any, rows: Rows | None, n: int, ahead: Any = None) -> dict[str, list[Any]]:
    """What a scorer or generator does with its own rows `own` ([>= n, vocab]) for a request's `rows`:
    write them, meet the other side's (`ahead`: a callable giving that file already read, or raising
    what reading it raised); the five columns where they met, else {} (rows missing)."""
    if rows is None:
        return {}
    if rows.write:
        write_rows(rows.write, own[:n])
    if rows.read:
        try:
            return meet(own, rows, n, ahead() if ahead is not None else None)
        except RowsMissing:
            pass
    return {}


def handle(own: Any, rows: Rows | None, steps: list[Any]) -> None:
    """columns_for, attached to plain TokenSteps (HF generate's steps)."""
    attach(steps, columns_for(own, rows, len(steps)))
