"""vLLM's full next-token rows, written as it generates: a V1 custom logits processor (loaded by
name, `LLM(logits_processors=["parity_ui.engines.vllm_full_rows:FullRowsLogitsProcessor", ...])`), no
patched vLLM. Asking vLLM for full-vocabulary logprobs instead is slow (vllm#14300) and would ship
the rows through its output objects; the processor sees each decode step's float32 logits anyway.

A request takes part when its SamplingParams.extra_args carry `parity_rows` ({"path", "tokens"}); the
processor puts row `position` (the request's generated-token count) of it in the batch's step log
(parity_ui.engines.step_rows: each step's rows ONE block, float32 or bfloat16 bits where exact, an
index per sequence beside its path), and changes nothing: it returns the logits as they came. It says
it is NOT argmax-invariant so vLLM calls it for greedy requests too (vLLM skips argmax-invariant
processors when it samples greedily); it must come before the shared-seed processor in the list, which
masks the row it draws from. The indices are written by the engine after the batch (`close`): the
processor runs in the engine's process when vLLM's executor is in process (one GPU or the CPU); with
tensor or pipeline parallelism it runs in vLLM's workers and the engine reports the rows as not
written.

On a GPU the step's rows are narrowed there, copied to pinned host memory on a side stream (a CUDA
event marks when they are there) and written by a background thread (`_Writer`), so the decode loop
waits for neither. Issue 31's history: waiting for each step's copy and writes cost 2.7x the run
without rows on an H100; writing each row into its own sequence's file after that still left the run
at 1.39-1.58x the same run without rows (256 system calls a step from threads sharing Python's lock
with the decode loop). A step is now one block, written in THREADS large calls (1.15-1.25x).

Imports vLLM: loaded only by vLLM itself, inside a vLLM side's worker.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from .full_distribution import device_narrowed
from .step_rows import BITS, WIDE, StepLog, narrowed
from .vllm_batch_rows import follow_batch

EXTRA_ARGS_KEY = "parity_rows"
OPEN: dict[str, StepLog] = {}  # path -> the log its rows go to, until the engine closes it
CURRENT: StepLog | None = None  # the batch's log, which sequences new to the processor join
SLOTS = 3  # pinned host buffers in flight: the GPU runs up to two steps ahead of the writer
THREADS = 4  # a step's block written in this many parts at once (each pwrite lets go of the GIL)

Put = tuple[str, int]  # a row's sequence (its path) and position


class _Writer:
    """A step's rows from the GPU to their log without the decode loop waiting for either.

    On the engine's stream: the rows' bfloat16 bits and a flag per row that it is not exactly bfloat16.
    On a side stream: the copy to pinned host buffers (so it overlaps the next step's kernels instead of
    queueing in front of them), marked by a CUDA event. On a thread: wait for the event, write the block
    (THREADS parts at once). A bf16 model's rows are all exactly bfloat16, so only their bits cross
    (half the bytes); the rare row that is not is fetched alone by the writer and added as float32;
    where most rows are not (a float32 model, soft-capped logits) float32 blocks cross instead, from
    the next step on. Buffers are reused, SLOTS of them: when all are in flight the next step waits
    (backpressure)."""

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
            slot = (
                torch.empty((rows, vocab), dtype=torch.float32, pin_memory=self.pin),
                torch.empty((rows, vocab), dtype=torch.int16, pin_memory=self.pin),
                torch.empty((rows,), dtype=torch.bool, pin_memory=self.pin),
            )
        return slot

    def step(self, rows: torch.Tensor, log: StepLog, puts: list[Put]) -> None:
        """A decode step's float32 rows [n, vocab] on the GPU, row k for puts[k], into `log`."""
        n = rows.shape[0]
        bits, inexact = device_narrowed(rows)
        if self.narrow is None:  # one wait, at the engine's first step with rows
            self.narrow = not bool(inexact.any())
        kind = BITS if self.narrow else WIDE
        first = log.reserve(kind, puts)  # here, in step order: the rows' places are the decode loop's order
        slot = self.buffer(n, rows.shape[1])
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=rows.device)
        self.stream.wait_stream(torch.cuda.current_stream(rows.device))
        with torch.cuda.stream(self.stream):
            if kind == BITS:
                slot[1][:n].copy_(bits, non_blocking=True)
            else:
                slot[0][:n].copy_(rows, non_blocking=True)
            slot[2][:n].copy_(inexact, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        # The job holds the GPU tensors until the writer is done with them (the allocator cannot hand
        # their memory to another kernel while the side stream still reads it).
        self.jobs.put((event, slot, log, kind, first, puts, (rows, bits, inexact)))

    def submit(self, event: Any, slot: tuple[torch.Tensor, ...], log: StepLog, puts: list[Put]) -> None:
        """A step already on the host (float32 in slot[0], bits in slot[1], flags in slot[2])."""
        self.jobs.put((event, slot, log, BITS, log.reserve(BITS, puts), puts, None))

    def drain(self) -> None:
        self.jobs.join()

    def _write(
        self,
        event: Any,
        slot: tuple[torch.Tensor, ...],
        log: StepLog,
        kind: int,
        first: int,
        puts: list[Put],
        held: Any,
    ) -> None:
        event.synchronize()
        n = len(puts)
        block = (slot[1] if kind == BITS else slot[0])[:n].numpy()
        parts = [(a, min(n, a + -(-n // THREADS))) for a in range(0, n, -(-n // THREADS))]
        if self.pool is not None and len(parts) > 1:
            for _ in self.pool.map(lambda ab: log.write(kind, first + ab[0], block[ab[0] : ab[1]]), parts):
                pass
        else:
            log.write(kind, first, block)
        if kind != BITS:
            return
        bad = [int(k) for k in slot[2].numpy()[:n].nonzero()[0]]
        if not bad:
            return
        # The few rows bfloat16 cannot hold, fetched alone (from the GPU, or the host slot in tests)
        got = held[0][bad].to("cpu").numpy() if held is not None else slot[0][:n].numpy()[bad]
        for i, k in enumerate(bad):
            log.append_wide(puts[k][0], puts[k][1], got[i])
        if len(bad) > n // 2:  # mostly not bfloat16: float32 across from the next step on
            self.narrow = False

    def _run(self) -> None:
        while True:
            event, slot, log, kind, first, puts, held = self.jobs.get()
            try:
                self._write(event, slot, log, kind, first, puts, held)
            except BaseException as e:  # reported by close(): the rows of this step are incomplete
                self.errors.append(e)
            finally:
                self.free.put(slot)
                del held
                self.jobs.task_done()


WRITER: _Writer | None = None  # the GPU's writer (one per engine process)


def _log_for(path: str, tokens: int, vocab: int) -> StepLog:
    """The log a sequence's rows go to: its own once it has one, else the batch's (a new one when the
    last batch's was closed)."""
    global CURRENT
    log = OPEN.get(path)
    if log is None:
        if CURRENT is None or CURRENT.vocab != vocab:
            CURRENT = StepLog(path, vocab)
        log = OPEN[path] = CURRENT
        log.add(path, tokens)
    return log


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
        follow_batch(
            self.rows,
            batch_update,
            EXTRA_ARGS_KEY,
            lambda spec, _prompt, outputs: _Row(str(spec["path"]), int(spec["tokens"]), outputs),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        vocab = logits.shape[1]
        groups: dict[int, tuple[StepLog, list[int], list[Put]]] = {}  # one log a step, but for a batch's seam
        for i, row in self.rows.items():
            if i < logits.shape[0]:
                log = _log_for(row.path, row.tokens, vocab)
                g = groups.setdefault(id(log), (log, [], []))
                g[1].append(i)
                g[2].append((row.path, len(row.outputs)))
        for log, indices, puts in groups.values():
            index = torch.tensor(indices, device=logits.device)
            if logits.device.type == "cuda" and WRITER is not None:
                # Not waited for here: the writer copies on a side stream and writes on its threads.
                WRITER.step(logits.index_select(0, index).to(torch.float32), log, puts)
                continue
            # The CPU: one copy for the step's rows, written here (no device to overlap with).
            host = logits.index_select(0, index).to("cpu", torch.float32).numpy()
            bits = narrowed(host)
            kind = BITS if bits.dtype == np.int16 else WIDE
            log.write(kind, log.reserve(kind, puts), bits)
        return logits


def close(paths: list[str]) -> list[str]:
    """The indices of `paths` written (each sequence's rows readable from then on); returns the paths
    that have no rows (never seen here, or a write failed)."""
    global CURRENT
    missing: list[str] = []
    if WRITER is not None:  # the rows still in flight reach their logs first
        WRITER.drain()
        if WRITER.errors:
            failed, WRITER.errors[:] = WRITER.errors[0], []
            for p in paths:  # a write failed (a full disk?): these rows are incomplete, nobody meets them
                log = OPEN.pop(p, None)
                if log is not None:
                    log.close()
                missing.append(p)
            if CURRENT is not None and not CURRENT.fds:
                CURRENT = None
            print(f"parity-ui: full rows not written: {failed!r}", flush=True)
            return missing
    by_log: dict[int, tuple[StepLog, list[str]]] = {}
    for p in paths:
        log = OPEN.pop(p, None)
        if log is None:
            missing.append(p)
        else:
            by_log.setdefault(id(log), (log, []))[1].append(p)
    for log, ps in by_log.values():
        missing += log.finish(ps)
    if CURRENT is not None and not CURRENT.open_paths:
        CURRENT = None  # the next batch starts its own log
    return missing
