"""The rows of vLLM's persistent batch that a V1 custom logits processor follows, kept in step with
the engine's BatchUpdate: one bookkeeping for every parity-ui processor (shared-seed sampling, full
rows), so a change in vLLM's batch protocol is met in one place.

Imports vLLM: loaded only by vLLM itself, inside a vLLM side's worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality


def follow_batch(
    rows: dict[int, Any],
    batch_update: BatchUpdate | None,
    key: str,
    make: Callable[[dict[str, Any], Any, list[int]], Any],
) -> None:
    """Apply a step's BatchUpdate to `rows` (batch index -> the processor's row), in vLLM's documented
    order: removed, added, moved. An added request takes part when its SamplingParams.extra_args carry
    `key`; `make(spec, prompt, outputs)` builds its row, or returns None when it cannot take part."""
    if batch_update is None:
        return
    for index in batch_update.removed:
        rows.pop(index, None)
    for index, params, prompt, outputs in batch_update.added:
        spec = (params.extra_args or {}).get(key) if params is not None else None
        row = make(spec, prompt, outputs) if spec is not None else None
        if row is None:
            rows.pop(index, None)
        else:
            rows[index] = row
    for a, b, direction in batch_update.moved:
        ra, rb = rows.pop(a, None), rows.pop(b, None)
        if ra is not None:
            rows[b] = ra
        if rb is not None and direction == MoveDirectionality.SWAP:
            rows[a] = rb
