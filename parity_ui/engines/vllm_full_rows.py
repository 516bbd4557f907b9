"""vLLM's full next-token rows, written as it generates: a V1 custom logits processor (loaded by
name, `LLM(logits_processors=["parity_ui.engines.vllm_full_rows:FullRowsLogitsProcessor", ...])`), no
patched vLLM. Asking vLLM for full-vocabulary logprobs instead is slow (vllm#14300) and would ship
the rows through its output objects; the processor sees each decode step's float32 logits anyway.

A request takes part when its SamplingParams.extra_args carry `parity_rows` ({"path", "tokens"}); the
processor writes row `position` (the request's generated-token count) of a float32 .npy
(parity_ui.engines.full_distribution.RowFile), and changes nothing: it returns the logits as they
came. It says it is NOT argmax-invariant so vLLM calls it for greedy requests too (vLLM skips
argmax-invariant processors when it samples greedily); it must come before the shared-seed processor
in the list, which masks the row it draws from. The files are closed by the engine after the step
(`close`): the processor runs in the engine's process when vLLM's executor is in process (one GPU
or the CPU); with tensor or pipeline parallelism it runs in vLLM's workers and the engine reports the
rows as not written.

Imports vLLM: loaded only by vLLM itself, inside a vLLM side's worker.
"""
from __future__ import annotations

from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from .full_distribution import RowFile
from .vllm_batch_rows import follow_batch

EXTRA_ARGS_KEY = "parity_rows"
OPEN: dict[str, RowFile] = {}  # path -> its file, until the engine closes it


class _Row:
    __slots__ = ("path", "tokens", "outputs")

    def __init__(self, path: str, tokens: int, outputs: list[int]):
        self.path, self.tokens, self.outputs = path, tokens, outputs


class FullRowsLogitsProcessor(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _Row] = {}

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
        # One device-to-host copy for the step's rows, not one per request.
        host = logits.index_select(0, torch.tensor(indices, device=logits.device)).to("cpu", torch.float32)
        for k, index in enumerate(indices):
            row = self.rows[index]
            f = OPEN.get(row.path)
            if f is None:
                f = OPEN[row.path] = RowFile(row.path, row.tokens, logits.shape[1])
            f.put(len(row.outputs), host[k])
        return logits


def close(paths: list[str]) -> list[str]:
    """Close the files of `paths` (renamed into place); returns the paths that were never opened."""
    missing = []
    for p in paths:
        f = OPEN.pop(p, None)
        if f is None:
            missing.append(p)
        else:
            f.close()
    return missing
