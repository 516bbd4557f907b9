"""The shared-seed draw inside vLLM: a V1 custom logits processor (vLLM loads it by name,
`LLM(logits_processors=["parity_ui.engines.vllm_shared_seed:SharedSeedLogitsProcessor"])`), no
patched vLLM.

A request takes part when its SamplingParams.extra_args carry `parity_shared_seed` (the settings and
a tag naming the request); vLLM samples it greedily (temperature 0, set by the mapper), so the
processor's masked row (parity_ui.engines.shared_seed.force) decides the token, and vLLM's raw
logprobs, taken before any processor, stay the model's. It is not argmax-invariant, so vLLM applies
it before its greedy argmax (0.26 and 0.32 both apply non-argmax-invariant processors ahead of
sampling, greedy or not).

The position of a row is its request's generated-token count: vLLM hands the processor a live
reference to the request's output token list. The records of each draw (margin, kept set, S) are
left in `RECORDS[tag][position]` for the engine (parity_ui.engines.vllm_engine) to read after the
step: the processor runs in the engine's process when vLLM's executor is in process (one GPU or the
CPU); with tensor or pipeline parallelism it runs in vLLM's GPU workers and records nothing here
(the tokens are the same; the margins read "not recorded").

Imports vLLM: loaded only by vLLM itself, inside a vLLM side's worker.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from .shared_seed import EXTRA_ARGS_KEY, Drawn, Settings, draw, force, prompt_key
from .vllm_batch_rows import follow_batch

RECORDS: dict[str, dict[int, Drawn]] = {}


class _Row:
    __slots__ = ("settings", "key", "outputs", "tag")

    def __init__(self, settings: Settings, key: int, outputs: list[int], tag: str):
        self.settings, self.key, self.outputs, self.tag = settings, key, outputs, tag


class SharedSeedLogitsProcessor(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _Row] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        spec = (sampling_params.extra_args or {}).get(EXTRA_ARGS_KEY)
        if spec is not None:
            Settings.from_dict(spec)  # raises on a malformed spec

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the token: vLLM must apply it before its greedy argmax

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        follow_batch(
            self.rows,
            batch_update,
            EXTRA_ARGS_KEY,
            lambda spec, prompt, outputs: (
                None
                if prompt is None
                else _Row(Settings.from_dict(spec), prompt_key(prompt), outputs, str(spec.get("tag", "")))
            ),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        # Rows with the same settings draw together (every row of a parity-ui run shares them).
        groups: dict[Settings, list[int]] = {}
        for index, row in self.rows.items():
            if index < logits.shape[0]:
                groups.setdefault(row.settings, []).append(index)
        for settings, indices in groups.items():
            rows = [self.rows[i] for i in indices]
            at = torch.tensor(indices, device=logits.device)
            keys = [(r.key, len(r.outputs)) for r in rows]
            chosen, drawn = draw(logits.index_select(0, at), settings, keys)
            logits.index_copy_(0, at, force(logits.index_select(0, at), chosen))
            for r, (_, position), d in zip(rows, keys, drawn):
                if r.tag:
                    RECORDS.setdefault(r.tag, {})[position] = d
        return logits
