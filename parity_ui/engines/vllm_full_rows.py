"""vLLM's full next-token rows, written as it generates: a V1 custom logits processor (loaded by
name, `LLM(logits_processors=["parity_ui.engines.vllm_full_rows:FullRowsLogitsProcessor", ...])`), no
patched vLLM. Asking vLLM for full-vocabulary logprobs instead is slow (vllm#14300) and would ship
the rows through its output objects; the processor sees each decode step's float32 logits anyway.

A request takes part when its SamplingParams.extra_args carry `parity_rows` ({"path", "tokens"}); the
processor writes row `position` (the request's generated-token count) of an .npy
(parity_ui.engines.full_distribution.RowFile: float32, or bfloat16 bits where exact), and changes nothing: it returns the logits as they
came. It says it is NOT argmax-invariant so vLLM calls it for greedy requests too (vLLM skips
argmax-invariant processors when it samples greedily); it must come before the shared-seed processor
in the list, which masks the row it draws from. The files are closed by the engine after the step
(`close`): the processor runs in the engine's process when vLLM's executor is in process (one GPU
or the CPU); with tensor or pipeline parallelism it runs in vLLM's workers and the engine reports the
rows as not written.

On a GPU the step's rows are copied to pinned host memory without waiting (a CUDA event marks when
they are there) and written by one background thread (`_Writer`): before, each step waited for its
device-to-host copy and its file writes, and the decode loop with it (issue 31: the full
distribution cost 2.7x the run without it on an H100). `close` waits for the writes in flight.

Imports vLLM: loaded only by vLLM itself, inside a vLLM side's worker.
"""
from __future__ import annotations

import queue
import threading
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from .full_distribution import RowFile, device_narrowed
from .vllm_batch_rows import follow_batch

EXTRA_ARGS_KEY = "parity_rows"
OPEN: dict[str, RowFile] = {}  # path -> its file, until the engine closes it
SLOTS = 3  # pinned host buffers in flight: the GPU runs up to two steps ahead of the writer
THREADS = 4  # a step's rows written by this many threads (each pwrite lets go of the GIL: copies in parallel)


class _Writer:
    """A step's rows from the GPU to their files without the decode loop waiting for either.

    On the engine's stream: each row's bfloat16 bits and a flag that a row is not exactly bfloat16.
    On a side stream: the copy to pinned host buffers (so it overlaps the next step's kernels instead of
    queueing in front of them), marked by a CUDA event. On a thread: wait for the event, write each row
    with one pwrite (THREADS at once). A bf16 model's rows are all exactly bfloat16, so only their
    bits cross (half the bytes); the rare row that is not is fetched alone by the writer; where most rows
    are not (a float32 model, soft-capped logits) the float32 rows cross instead, from the next step on.
    Buffers are reused, SLOTS of them: when all are in flight the next step waits (backpressure)."""

    def __init__(self, rows_per_buffer: int, pin: bool):
        from concurrent.futures import ThreadPoolExecutor

        self.rows, self.pin = max(1, rows_per_buffer), pin
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.free: queue.Queue[Any] = queue.Queue()
        self.made = 0
        self.errors: list[BaseException] = []
        self.narrow: bool | None = None  # bits or float32 across; decided at the first step
        self.stream: Any = None
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="parity-rows-write") if THREADS > 1 else None
        threading.Thread(target=self._run, name="parity-rows-writer", daemon=True).start()

    def buffer(self, n: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A free slot: pinned host buffers for a step's float32 rows, their bfloat16 bits and the
        not-bfloat16 flags."""
        if self.made < SLOTS and self.free.empty():
            self.made += 1
            slot = None
        else:
            slot = self.free.get()
        if slot is None or slot[0].shape[0] < n or slot[0].shape[1] != vocab:
            rows = max(n, self.rows)
            slot = (torch.empty((rows, vocab), dtype=torch.float32, pin_memory=self.pin),
                    torch.empty((rows, vocab), dtype=torch.int16, pin_memory=self.pin),
                    torch.empty((rows,), dtype=torch.bool, pin_memory=self.pin))
        return slot

    def step(self, rows: torch.Tensor, puts: list[tuple[RowFile, int]]) -> None:
        """A decode step's float32 rows [n, vocab] on the GPU, row k for puts[k] (file, position)."""
        n = rows.shape[0]
        bits, inexact = device_narrowed(rows)
        if self.narrow is None:  # one wait, at the engine's first step with rows
            self.narrow = not bool(inexact.any())
        narrow = bits if self.narrow else None  # the bfloat16 bits
        slot = self.buffer(n, rows.shape[1])
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=rows.device)
        self.stream.wait_stream(torch.cuda.current_stream(rows.device))
        with torch.cuda.stream(self.stream):
            if narrow is not None:
                slot[1][:n].copy_(narrow, non_blocking=True)
            else:
                slot[0][:n].copy_(rows, non_blocking=True)
            slot[2][:n].copy_(inexact, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        # The job holds the GPU tensors until the writer is done with them (the allocator cannot hand
        # their memory to another kernel while the side stream still reads it).
        self.jobs.put((event, slot, puts, rows, narrow, inexact))

    def submit(self, event: Any, slot: tuple[torch.Tensor, ...], puts: list[tuple[RowFile, int]]) -> None:
        """A step already on the host (float32 in slot[0], bits in slot[1] where slot[2] is False)."""
        self.jobs.put((event, slot, puts, None, True, None))

    def drain(self) -> None:
        self.jobs.join()

    def _write(self, event: Any, slot: tuple[torch.Tensor, ...], puts: list[tuple[RowFile, int]], rows: Any,
               narrow: Any) -> None:
        event.synchronize()
        n = len(puts)
        wide_h, narrow_h, inexact = slot[0].numpy(), slot[1].numpy(), slot[2].numpy()[:n]
        fetched: dict[int, Any] = {}
        if narrow is not None:
            bad = [int(k) for k in inexact.nonzero()[0]]
            if bad and rows is not None:  # the few rows bfloat16 cannot hold, fetched alone
                got = rows[bad].to("cpu").numpy()
                fetched = {k: got[i] for i, k in enumerate(bad)}
            elif bad:
                fetched = {k: wide_h[k] for k in bad}
            if len(bad) > n // 2:  # mostly not bfloat16: float32 across from the next step on
                self.narrow = False

        def write(ks: range) -> None:
            for k in ks:
                f, position = puts[k]
                if narrow is None:
                    f.put_row(position, wide_h[k], None)
                elif k in fetched:
                    f.put_row(position, fetched[k], None)
                else:
                    f.put_row(position, None, narrow_h[k])

        if self.pool is not None and n >= 2 * THREADS:
            for _ in self.pool.map(write, [range(g, n, THREADS) for g in range(THREADS)]):
                pass
        else:
            write(range(n))

    def _run(self) -> None:
        while True:
            event, slot, puts, rows, narrow, _flags = self.jobs.get()
            try:
                self._write(event, slot, puts, rows, narrow)
            except BaseException as e:  # reported by close(): the rows of this step are incomplete
                self.errors.append(e)
            finally:
                self.free.put(slot)
                del rows, narrow, _flags
                self.jobs.task_done()


WRITER: _Writer | None = None  # the GPU's writer (one per engine process)


class _Row:
    __slots__ = ("path", "tokens", "outputs")

    def __init__(self, path: str, tokens: int, outputs: list[int]):
        self.path, self.tokens, self.outputs = path, tokens, outputs


class FullRowsLogitsProcessor(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        global WRITER
        self.rows: dict[int, _Row] = {}
        if device.type == "cuda" and WRITER is None:
            sched = getattr(vllm_config, "scheduler_config", None)
            WRITER = _Writer(int(getattr(sched, "max_num_seqs", 0) or 256), bool(is_pin_memory))

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        spec = (sampling_params.extra_args or {}).get(EXTRA_ARGS_KEY)
        if spec is not None and not (isinstance(spec, dict) and spec.get("path") and int(spec.get("tokens", 0)) > 0):
            raise ValueError(f"{EXTRA_ARGS_KEY} needs a path and a token count, got {spec!r}")

    def is_argmax_invariant(self) -> bool:
        return False  # vLLM must call it on greedy requests too (it changes nothing)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        follow_batch(self.rows, batch_update, EXTRA_ARGS_KEY,
                     lambda spec, _prompt, outputs: _Row(str(spec["path"]), int(spec["tokens"]), outputs))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        indices = [i for i in self.rows if i < logits.shape[0]]
        if not indices:
            return logits
        index = torch.tensor(indices, device=logits.device)
        files = []
        for k, i in enumerate(indices):
            row = self.rows[i]
            f = OPEN.get(row.path)
            if f is None:
                f = OPEN[row.path] = RowFile(row.path, row.tokens, logits.shape[1])
            files.append((f, len(row.outputs)))
        if logits.device.type == "cuda" and WRITER is not None:
            # Not waited for here: the writer copies on a side stream and writes on its threads.
            WRITER.step(logits.index_select(0, index).to(torch.float32), files)
            return logits
        # The CPU: one copy for the step's rows, written here (no device to overlap with).
        host = logits.index_select(0, index).to("cpu", torch.float32).numpy()
        for k, (f, position) in enumerate(files):
            f.put_host(position, host[k])
        return logits


def close(paths: list[str]) -> list[str]:
    """Close the files of `paths` (renamed into place); returns the paths that were never opened."""
    missing = []
    if WRITER is not None:  # the rows still in flight reach their files first
        WRITER.drain()
        if WRITER.errors:
            failed, WRITER.errors[:] = WRITER.errors[0], []
            for p in paths:  # a write failed (a full disk?): these files are incomplete, nobody meets them
                f = OPEN.pop(p, None)
                if f is not None:
                    f.discard()
                missing.append(p)
            print(f"parity-ui: full rows not written: {failed!r}", flush=True)
            return missing
    for p in paths:
        f = OPEN.pop(p, None)
        if f is None:
            missing.append(p)
        else:
            f.close()
    return missing
