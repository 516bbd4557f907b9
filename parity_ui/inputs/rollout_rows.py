"""The rows of an RL run's rollout dump, whichever framework wrote it (parity_ui.inputs.rollouts opens
the dump; parity_ui.inputs.prime_rl, slime_dump, verl_dump and nemo_rl read each framework's step as it
writes it): the row type (`RolloutRow`), a row that could not be read (`BadRow`), the error naming it
(`DumpError`), and the field readers every format's row maker shares. A module of its own so the
readers and the opener both import it and neither imports the other's module back.

May import: core (the package's rule).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ParityError


@dataclass
class RolloutRow:
    """One sample of the run, as the replay needs it. Per-token columns have the response's length."""

    index: int  # the row's position in the dump (after skipped rows: still the dump's)
    where: str  # "line 3", "row 3", "sample 3": for messages
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float] | None = None  # the rollout engine's, as recorded
    trainer_logprobs: list[float] | None = None  # the trainer's recompute, when recorded
    loss_mask: list[int] | None = None  # 1 = the token is trained on; None: every token
    sampling: dict[str, Any] | None = None  # temperature, top_p, top_k, min_p, logprobs_mode (None: not recorded)
    policy_version: str | None = None
    has_routed_experts: bool = False
    # MoE: the rollout engine's expert ids, an integer array [len(prompt) + len(response) - 1, layers,
    # top_k]: row i is the routing at input position i (the forward that predicted token i + 1), as
    # vLLM's enable_return_routed_experts and slime's rollout_routed_experts give them
    routed_experts: Any = None
    reconstructed: bool = False  # ids re-tokenised from text (verl)
    text_note: str | None = None  # why this row's text does not survive decode -> encode (verl)
    # The rollout's kept set of each response token (the top-p nucleus it sampled from: slime's
    # rollout_top_p_token_ids / offsets); None: not recorded
    kept_ids: list[list[int]] | None = None
    # What else the framework recorded of the row, for people and the trend: rank, env, prefix-cache
    # and speculative-decoding counts, the sample's index in the run (parity_ui.inputs.step_dumps)
    facts: dict[str, Any] | None = None

    def mask(self) -> list[int]:
        return self.loss_mask if self.loss_mask is not None else [1] * len(self.response_ids)


@dataclass
class BadRow:
    where: str
    message: str


class DumpError(ParityError):
    code = "rollout-dump"


# -- what every format's row maker reads a field with ------------------------------------------------


def jsonl_records(p: Path, loads: Callable[[bytes], Any] = json.loads) -> Iterator[tuple[int, str, Any]]:
    """Each non-blank line's object as (index, "line N", object); a line that is no JSON object as a BadRow."""
    i = 0
    with p.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = loads(raw)
            except ValueError as e:  # json's, or orjson's (a json.JSONDecodeError too)
                why = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
                yield (
                    i,
                    f"line {n}",
                    BadRow(
                        f"line {n}",
                        f"not valid JSON ({why}); a truncated line (the dump was cut while written?)",
                    ),
                )
                i += 1
                continue
            if not isinstance(obj, dict):
                obj = BadRow(f"line {n}", f"a JSON {type(obj).__name__}, not an object")
            yield i, f"line {n}", obj
            i += 1


def ints(v: Any, name: str) -> list[int]:
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, (int, float)) and float(x).is_integer() for x in v):
        raise DumpError(f"{name} is not a list of token ids", f"write {name} as a list of integers")
    return [int(x) for x in v]


def floats(v: Any, name: str) -> list[float] | None:
    if v is None:
        return None
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, (int, float)) or x is None for x in v):
        raise DumpError(f"{name} is not a list of numbers", f"write {name} as a list of floats (one per token)")
    return [float(x) if x is not None else math.nan for x in v]


def routes_array(v: Any, name: str) -> Any:
    """A recorded routes column as an integer array [positions, layers, top_k]; None when absent."""
    if v is None:
        return None
    import numpy as np

    if hasattr(v, "detach"):  # a torch tensor (slime)
        v = v.detach().cpu().numpy()
    try:
        a = np.asarray(v)
    except ValueError:
        a = None
    if a is None or a.ndim != 3 or a.dtype.kind not in "iu":
        shape = "ragged" if a is None else ("x".join(map(str, a.shape)) or "a scalar") + f" {a.dtype}"
        raise DumpError(
            f"{name} is {shape}, not integers [prompt+response-1 positions, layers, top_k]",
            f"write {name} as the engine returns it (vLLM enable_return_routed_experts, slime "
            "rollout_routed_experts): one row per input position but the last",
        )
    return a


def sample_field(s: Any, k: str) -> Any:
    return s.get(k) if isinstance(s, dict) else getattr(s, k, None)
