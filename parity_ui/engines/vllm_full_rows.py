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

from .full_distribution import RowFile
from .vllm_batch_rows import follow_batch

EXTRA_ARGS_KEY = "parity_rows"
OPEN: dict[str, RowFile] = {}  # path -> its file, until the engine closes it
SLOTS = 3  # pinned host buffers in flight: the GPU runs up to two steps ahead of the writer


class _Writer:
    """One thread that waits for a step's host copy (its CUDA event) and puts its rows into their
    files, so the decode loop never waits for either. Host buffers are pinned (the copy is then truly
    asynchronous) and reused: SLOTS of them, each [max_num_seqs, vocab] float32; when all are in
    flight the next step waits for one (backpressure, not unbounded memory)."""

    def __init__(self, rows_per_buffer: int, pin: bool):
        self.rows, self.pin = max(1, rows_per_buffer), pin
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.free: queue.Queue[Any] = queue.Queue()
        self.made = 0
        self.errors: list[BaseException] = []
        threading.Thread(target=self._run, name="parity-rows-writer", daemon=True).start()

    def buffer(self, n: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A free slot: pinned host buffers for a step's float32 rows, their bfloat16 bits and a flag per
        row that it is not exactly bfloat16 (the narrowing is done on the GPU: the writer only copies)."""
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

    def submit(self, event: Any, slot: tuple[torch.Tensor, ...], puts: list[tuple[RowFile, int]]) -> None:
        self.jobs.put((event, slot, puts))

    def drain(self) -> None:
        self.jobs.join()

    def _run(self) -> None:
        while True:
            event, slot, puts = self.jobs.get()
            try:
                event.synchronize()
                wide, narrow, inexact = (t.numpy() for t in slot)
                for k, (f, position) in enumerate(puts):
                    f.put_row(position, wide[k], None if inexact[k] else narrow[k])
            except BaseException as e:  # reported by close(): the rows of this step are incomplete
                self.errors.append(e)
            finally:
                self.free.put(slot)
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
            # One copy for the step's rows into a pinned buffer, not waited for here: the writer
            # thread waits for its event and writes them while the GPU goes on.
            n = len(indices)
            wide, narrow, inexact = WRITER.buffer(n, logits.shape[1])
            rows = logits.index_select(0, index).to(torch.float32)
            bits = rows.view(torch.int32)
            wide[:n].copy_(rows, non_blocking=True)
            narrow[:n].copy_((bits >> 16).to(torch.int16), non_blocking=True)  # the bfloat16 bits
            inexact[:n].copy_((bits & 0xFFFF).ne(0).any(dim=1), non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            WRITER.submit(event, (wide, narrow, inexact), files)
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
