"""HF teacher-forced scoring: many rows a forward pass, packed by length under a token budget.

Runs only inside a worker process (HfEngine.score_batch: a replay's trainer and floor, a scored
workload's reference, cross-scoring). One row per forward pass left a GPU mostly idle: on two H200s a
256-row x 256-token replay's trainer took 10.0 s where a bare script with 32 right-padded rows a
forward took 2.6 s (issue 44).

Rows are sorted by length and packed into forwards of at most `budget` tokens (rows x the longest
row's length, padding included). How a forward may hold rows of different lengths is the side's
`score_batch`:

- padded: right padding with an attention mask. In exact arithmetic a causal mask keeps every real
  position's logits what they are alone, but kernels need not agree: a longer key axis or a masked
  attention kernel may sum in another order. On the CPU in float32 (torch 2.13, transformers 5.19)
  the padded rows of a batch differ from the same rows alone by up to ~3e-5 in the logits (SmolLM2,
  sdpa and eager alike), while rows of one length batched without a mask give the same bits.
- same-length: only rows of one length share a forward, without a mask (the path of a row alone).
- one-row: one row per forward (what HfEngine.score does).
- auto: on a GPU, decided at load by `check()`: padded where padding gave the same bits as one row
  alone on this model, device, dtype and attention, else same-length where that did, else one-row
  (a few forwards of <= 96 tokens: milliseconds there). On the CPU same-length, without the check:
  the CPU's kernels are known not to keep padded rows' bits (above), and the check's forwards cost
  seconds there (6 s for SmolLM2 on 2 busy cores). Either way the first multi-row forward of the
  worker's life is checked again on its real rows (its shortest row, the one with the most padding,
  scored alone); a difference there drops to the next safer mode and rescores the call, so `auto`
  never moves a figure against one row alone, as far as checked.

Each row's columns are those HfEngine._score_columns gives it alone: float32 log-softmax of its own
logits rows, the chosen token's logprob and rank, the top-k.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.requests import ScoreRequest
from ..core.types import StepColumns
from .base import clean_logprob

MODES = ("auto", "padded", "same-length", "one-row")
SAFER = {"padded": "same-length", "same-length": "one-row", "one-row": "one-row"}
DEFAULT_TOKENS = {"cuda": 8192, "cpu": 4096}  # a forward's rows x width, padding included
LOGITS_BYTES = 2 * 2**30  # ... and at most this much for its logits ([rows, width, vocabulary])


def pack(lengths: list[int], budget: int, same_length: bool) -> list[list[int]]:
    """The rows (indices into `lengths`) of each forward: sorted by length, longest first, each forward
    at most `budget` tokens counted as rows x its longest row (a row longer than the budget goes
    alone); with `same_length`, a forward holds rows of one length only. Pure."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    for i in order:
        if out:
            last = out[-1]
            width = lengths[last[0]]  # the longest of the forward: rows come longest first
            fits = (len(last) + 1) * width <= budget
            if fits and (not same_length or lengths[i] == width):
                last.append(i)
                continue
        out.append([i])
    return out


def token_budget(asked: int | None, device: str, vocab: int, logit_bytes: int) -> int:
    """Tokens a forward may hold: the side's score_tokens, else the device's default, capped so that
    the forward's logits take at most LOGITS_BYTES."""
    if asked:
        return int(asked)
    base = DEFAULT_TOKENS["cuda" if device.startswith("cuda") else "cpu"]
    return max(1, min(base, LOGITS_BYTES // max(1, vocab * logit_bytes)))


def columns(own: Any, tokens: list[int], k: int, dist: dict[str, list[Any]] | None = None) -> StepColumns:
    """One row's steps as columns from its own logits rows `own` ([n, vocab], row j predicting
    tokens[j]): float32 log-softmax, the chosen token's logprob and rank, the top-k; four
    device-to-host copies."""
    import torch

    n = len(tokens)
    with torch.inference_mode():
        lp = torch.log_softmax(own.float(), dim=-1)
        chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None])  # [n, 1]
        ranks = ((lp > chosen).sum(dim=-1) + 1).tolist()
        top_v, top_i = torch.topk(lp, k, dim=-1)
        chosen_l, top_v_l, top_i_l = chosen[:, 0].tolist(), top_v.flatten().tolist(), top_i.flatten().tolist()
    return StepColumns(
        {
            "position": list(range(n)),
            "token_id": list(tokens),
            "text": [""] * n,
            "logprob": _cleaned(chosen_l),
            "rank": ranks,
            "top_n": [k] * n,
            "top_token_id": top_i_l,
            "top_logprob": _cleaned(top_v_l),
            "top_text": [""] * (n * k),
            **(dist or {}),
        }
    )


def _cleaned(values: list[float]) -> list[float]:
    """clean_logprob over a row's values, without a Python call per value where every value is finite
    (nearly always): their sum is finite exactly when each is (an inf or a NaN anywhere makes it inf
    or NaN; finite floats cannot overflow a float64 sum of this length)."""
    return values if math.isfinite(sum(values)) else list(map(clean_logprob, values))


def forward(model: Any, rows: list[list[int]]) -> Any:
    """The logits of `rows` in one forward pass ([rows, width, vocab]): right-padded with an attention
    mask where their lengths differ, without a mask where they do not (the path of a row alone)."""
    import torch

    width = max(map(len, rows))
    dev = model.device
    with torch.inference_mode():
        if all(len(r) == width for r in rows):
            return model(input_ids=torch.tensor(rows, device=dev)).logits
        pad = 0  # any id: a padded position is masked out of every real position's attention
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=dev)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=dev)
        return model(input_ids=ids, attention_mask=mask).logits


@dataclass
class Check:
    """What the load-time check found: the largest |logit difference| against one row alone of a
    right-padded batch and of a batch of rows of one length (0.0: the same bits)."""

    padded: float
    same_length: float

    def mode(self) -> str:
        return "padded" if self.padded == 0.0 else "same-length" if self.same_length == 0.0 else "one-row"


def check(model: Any, width: int = 96, seed: int = 0) -> Check:
    """Rows of a few lengths (random ids, a fixed seed) scored alone, right-padded together, and rows
    of one length together: the largest logit difference of each batch against the rows alone."""
    import torch

    vocab = int(model.get_output_embeddings().weight.shape[0])
    rnd = random.Random(seed)
    lengths = [width, width - 13, width // 2 + 3, 11]
    rows = [[rnd.randrange(vocab) for _ in range(n)] for n in lengths]
    same = [rows[0]] + [[rnd.randrange(vocab) for _ in range(width)] for _ in range(2)]

    def worst(batch: list[list[int]]) -> float:
        got = forward(model, batch)
        d = 0.0
        for i, r in enumerate(batch):
            alone = forward(model, [r])[0]
            d = max(d, float((got[i, : len(r)].float() - alone.float()).abs().max()))
        return d

    with torch.inference_mode():
        return Check(padded=worst(rows), same_length=worst(same))


class BatchScorer:
    """HfEngine's batched score_batch: `mode` (padded, same-length or one-row; auto resolved at load) and
    `budget` tokens a forward. `spot_check`: the first multi-row forward's shortest row is scored
    alone as well, and a difference drops the mode (SAFER) and rescores the call."""

    def __init__(self, model: Any, mode: str, budget: int, spot_check: bool, log: Callable[[str], None]):
        self.model, self.mode, self.budget = model, mode, budget
        self.spot_check, self.log = spot_check, log

    def score(
        self,
        items: list[ScoreRequest],
        should_stop: Callable[[], bool],
        alone: Callable[[int], StepColumns],
    ) -> list[StepColumns]:
        """Each item's columns, in order; with a Stop, the items before the first one not scored.
        Items that write or meet full rows (full_distribution), and every item with mode one-row, go
        through `alone(i)` (HfEngine._score_columns), in order."""
        while True:
            done = self._score(items, should_stop, alone)
            if done is not None:
                return done

    def _score(
        self, items: list[ScoreRequest], should_stop: Callable[[], bool], alone: Callable[[int], StepColumns]
    ) -> list[StepColumns] | None:
        got: dict[int, StepColumns] = {}
        batched = [i for i, it in enumerate(items) if it.rows is None and it.continuation]
        if self.mode == "one-row" or len(batched) < 2:
            batched = []
        lengths = [len(items[i].prompt) + len(items[i].continuation) for i in batched]
        # The forwards in the order of their first item: a Stop then leaves the longest prefix it can.
        for group in sorted(pack(lengths, self.budget, self.mode == "same-length"), key=min):
            if should_stop():
                return _prefix(got, len(items))
            rows = [batched[g] for g in group]
            if len(rows) == 1:
                got[rows[0]] = alone(rows[0])
                continue
            logits = forward(self.model, [items[i].prompt + items[i].continuation for i in rows])
            for b, i in enumerate(rows):
                it = items[i]
                base, n = len(it.prompt), len(it.continuation)
                got[i] = columns(logits[b, base - 1 : base - 1 + n], list(it.continuation), max(it.logprobs, 1))
            del logits
            if self.spot_check:
                self.spot_check = False
                i = rows[-1]  # the shortest row: the most padding
                again = alone(i)
                if again.columns() != got[i].columns():
                    safer = SAFER[self.mode]
                    self.log(
                        f"score_batch={self.mode}: row {i} of a {len(rows)}-row forward differed from the same "
                        f"row alone on this run's rows; scoring {safer} from now on"
                    )
                    self.mode = safer
                    self.spot_check = safer != "one-row"  # the safer mode's first forward checked too
                    return None  # the whole call again, in the safer mode
        for i in range(len(items)):
            if i not in got:
                if should_stop():
                    return _prefix(got, len(items))
                got[i] = alone(i)
        return [got[i] for i in range(len(items))]


def _prefix(got: dict[int, StepColumns], n: int) -> list[StepColumns]:
    """The scored items before the first one not scored (a Stop): what the callers zip with their items."""
    out = []
    for i in range(n):
        if i not in got:
            break
        out.append(got[i])
    return out


def describe(mode: str, budget: int, found: Check | None, asked: str) -> str:
    """The resolved setting, as recorded with the run."""
    how = {
        "padded": f"rows by length, right-padded, up to {budget} tokens a forward",
        "same-length": f"rows of one length together, up to {budget} tokens a forward",
        "one-row": "one row per forward",
    }[mode]
    if found is None:
        if asked != "auto":
            return f"{how} (as asked)"
        return f"{how} (auto on the CPU, whose kernels move right-padded rows' bits; the first forward checked)"
    pad = "the same bits" if found.padded == 0.0 else f"logits up to {found.padded:.3g} apart"
    same = "the same bits" if found.same_length == 0.0 else f"logits up to {found.same_length:.3g} apart"
    why = "as asked" if asked != "auto" else "auto"
    return f"{how} ({why}; checked at load against one row alone: right padding {pad}, rows of one length {same})"
