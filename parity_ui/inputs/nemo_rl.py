"""NeMo-RL's `train_data_step{N}.jsonl` as NeMo-RL writes it: `Logger.log_batched_dict_as_jsonl`
(nemo_rl/utils/logger.py) writes one line per sample from `make_microbatch_iterator(1)`, so every
field of a line is a one-sample batch: `"token_ids": [[...]]`, `"input_lengths": [n]`,
`"rewards": [r]`, plus its `"idx"`. `unbatched` turns such a line into the flat row
parity_ui.inputs.rollouts reads (a line already flat is left as it is).

The file is not written at all when `env.should_log_nemo_gym_responses` is true
(nemo_rl/algorithms/grpo.py `_should_log_nemo_gym_responses`; several NeMo Gym recipes set it): NeMo
Gym and its W&B tables log the responses then, without token ids or logprobs. `SKIPPED_WHEN` says so
wherever a user looks for the missing files (docs/rollouts.md, the trend's "no steps" error).

May import: core (the package's rule).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SKIPPED_WHEN = (
    "NeMo-RL writes no train_data_step*.jsonl when env.should_log_nemo_gym_responses is true (several "
    "NeMo Gym recipes set it; NeMo Gym logs the responses instead, without token ids or logprobs): set it "
    "to false in the run's config to get the step dumps"
)
# The fields NeMo-RL logs per token (a one-sample batch of one sequence: [[...]]).
_PER_TOKEN = ("token_ids", "token_loss_mask", "advantages", "generation_logprobs", "prev_logprobs")


def unbatched(rec: dict[str, Any]) -> dict[str, Any]:
    """A line of one-sample batches as a flat row."""
    ids = rec.get("token_ids")
    if not (isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], list)):
        return rec
    out = dict(rec)
    for k, v in rec.items():
        if isinstance(v, list) and len(v) == 1 and (k in _PER_TOKEN or not isinstance(v[0], list)):
            out[k] = v[0]
    return out


def records(recs: Iterator[tuple[int, str, Any]]) -> Iterator[tuple[int, str, Any]]:
    for i, where, rec in recs:
        yield i, where, unbatched(rec) if isinstance(rec, dict) else rec
