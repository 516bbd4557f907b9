"""Full next-token rows written a decode step at a time (vLLM's rows processor): one block per step.

A decode step yields one row for each of up to 256 sequences, and each sequence's rows are read back
as one [tokens, vocab] array by the scorer that meets them (full_distribution.read_rows). Writing each
row into its own sequence's file took one system call per row, 256 a step, from threads sharing
Python's lock with vLLM's decode loop (issue 31: a scored workload's work with the rows was 1.39-1.58x
the same run without them; 1.15-1.25x since, bench/figures/gpu-2026-11-26f). Here a step's rows go as
ONE contiguous block appended to the batch's log,
written in a few large calls; each sequence gets an index of where its rows are (JSON beside the path
the parent named, `path + INDEX`), and the reader gathers them with one indexed copy.

A log holds one batch of one engine (the requests added together, closed together: `close`), named
after its first sequence's file, so the parent's per-chunk clean-up (the files of sequence j: stem
ending `-j`) deletes it with the chunk it belongs to. Two files: the bfloat16 bits (int16) of rows that
are exactly bfloat16 (a bf16 model's logits, upcast: lossless, half the bytes) and float32 rows (a
float32 model's, or the rare row bfloat16 cannot hold). Index: per position [file, row], file 0 the
bits, 1 the float32 rows.

No vLLM and no torch here: numpy and the OS (unit-tested without either engine).
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from collections.abc import Callable

import numpy as np

INDEX = ".steps.json"  # a sequence's index: path + INDEX
BITS, WIDE = 0, 1
SUFFIX = {BITS: ".steps", WIDE: ".steps.f32"}
DTYPE: dict[int, np.dtype] = {BITS: np.dtype(np.int16), WIDE: np.dtype(np.float32)}


def narrowed(host: np.ndarray) -> np.ndarray:
    """A float32 array as bfloat16 bits (int16) when every value is exactly a bfloat16 (its low 16 bits
    zero: the logits of a bf16 model's lm_head, upcast), else the array itself. Lossless either way,
    and half the bytes to write, keep and read back for the bf16 models most runs compare."""
    bits = host.view(np.uint32)
    if (bits & 0xFFFF).any():
        return host
    return (bits >> 16).astype(np.uint16).view(np.int16)


def widened(arr: np.ndarray) -> np.ndarray:
    """A rows file's array as float32 (bfloat16 bits, int16, back to their exact float32 values)."""
    if arr.dtype == np.int16:
        return (arr.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(arr, dtype=np.float32)


def log_base(path: str) -> str:
    """A log's file name stem from its first sequence's path (dir/b-17.npy -> dir/b-17)."""
    return path[:-4] if path.endswith(".npy") else path


class StepLog:
    """One batch's rows, a block per decode step. `reserve` (the decode loop's thread, in step order)
    numbers a block's rows and records each sequence's; `write` (any thread) puts a block's bytes at
    their place; `append_wide` (any thread) adds one float32 row; `finish` writes the indices."""

    def __init__(self, first_path: str, vocab: int):
        self.base, self.vocab = log_base(first_path), vocab
        self.fds: dict[int, int] = {}
        self.next = {BITS: 0, WIDE: 0}
        self.index: dict[str, list[list[int]]] = {}  # path -> per position [file, row] ([-1, -1]: none)
        self.open_paths: set[str] = set()
        self.lock = threading.Lock()

    def add(self, path: str, tokens: int) -> None:
        if path not in self.index:
            self.index[path] = [[-1, -1] for _ in range(max(0, tokens))]
            self.open_paths.add(path)

    def _fd(self, kind: int) -> int:
        fd = self.fds.get(kind)
        if fd is None:
            fd = self.fds[kind] = os.open(self.base + SUFFIX[kind], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        return fd

    def reserve(self, kind: int, puts: list[tuple[str, int]]) -> int:
        """Rows for a block of len(puts) rows in file `kind`, row k being puts[k] = (path, position);
        returns the block's first row."""
        with self.lock:
            first = self.next[kind]
            self.next[kind] += len(puts)
            self._fd(kind)
            for k, (path, position) in enumerate(puts):
                rows = self.index.get(path)
                if rows is not None and 0 <= position < len(rows):
                    rows[position] = [kind, first + k]
        return first

    def write(self, kind: int, first: int, block: np.ndarray) -> None:
        """Block rows [first, first + len(block)) of file `kind` (one system call; the lock is Python's
        only for the call's start and end)."""
        size = DTYPE[kind].itemsize * self.vocab
        os.pwrite(self.fds[kind], np.ascontiguousarray(block, dtype=DTYPE[kind]).data.cast("B"), first * size)

    def append_wide(self, path: str, position: int, row: np.ndarray) -> None:
        """One float32 row for `path` at `position` (it replaces the row a bits block gave it)."""
        self.write(WIDE, self.reserve(WIDE, [(path, position)]), row[None])

    def finish(self, paths: list[str]) -> list[str]:
        """The indices of `paths` written (atomically); returns those this log never held. The log's
        files are closed once no sequence of it is open."""
        missing = []
        for p in paths:
            rows = self.index.get(p)
            if rows is None or p not in self.open_paths:
                missing.append(p)
                continue
            self.open_paths.discard(p)
            if rows[0][0] < 0:  # no row ever came: no index, and the reader names the file missing
                missing.append(p)
                continue
            doc = {
                "vocab": self.vocab,
                "files": {str(k): os.path.basename(self.base + SUFFIX[k]) for k in self.fds},
                "rows": rows,
            }
            part = p + INDEX + ".part"
            with open(part, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
            os.replace(part, p + INDEX)
        if not self.open_paths:
            self.close()
        return missing

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _take(path: str, vocab: int, rows: np.ndarray, out: np.ndarray) -> None:
    """Rows `rows` of a log file into `out` (one indexed copy out of a read-only memory map)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        table = np.frombuffer(m, dtype=out.dtype).reshape(-1, vocab)
        np.take(table, rows, axis=0, out=out)
        del table  # the map closes only once no array views it


def read_steps(index_path: str, alloc: Callable[[tuple[int, int], np.dtype], np.ndarray] = np.empty) -> np.ndarray:
    """A sequence's rows from its index: int16 bfloat16 bits where every row is one, else float32,
    gathered straight into `alloc(shape, dtype)` (the scorer's pinned buffer on a GPU: no second copy).
    Rows stop at the first position that has none (a sequence ends before max_tokens)."""
    with open(index_path) as f:
        doc = json.load(f)
    vocab = int(doc["vocab"])
    rows = np.asarray(doc["rows"], dtype=np.int64).reshape(-1, 2)
    n = int(np.argmax(rows[:, 0] < 0)) if (rows[:, 0] < 0).any() else len(rows)
    rows = rows[:n]
    base = os.path.dirname(index_path)
    file = {int(k): os.path.join(base, v) for k, v in doc["files"].items()}
    wide = rows[:, 0] == WIDE
    if not wide.any():
        out = alloc((n, vocab), DTYPE[BITS])
        if n:
            _take(file[BITS], vocab, rows[:, 1], out)
        return out
    out = alloc((n, vocab), DTYPE[WIDE])
    if wide.all():
        _take(file[WIDE], vocab, rows[:, 1], out)
        return out
    for kind, mask in ((WIDE, wide), (BITS, ~wide)):  # a few float32 rows among bits (a masked copy each)
        part = np.empty((int(mask.sum()), vocab), DTYPE[kind])
        _take(file[kind], vocab, rows[mask, 1], part)
        out[mask] = widened(part)
    return out
