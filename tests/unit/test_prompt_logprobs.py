"""vLLM's prompt logprobs read as columns (parity_ui.engines.prompt_logprobs, VllmEngine.score_batch) give
exactly what the per-position path gave (vllm_engine._step_from_logprobs then StepColumns.from_steps),
from vLLM's flat container and from its list of dicts alike, in one piece or in DELTA pieces: the same
logprobs (their bits), ranks, top-k and its order, also where the scored token is listed twice, ranks
tie or are missing, a position has no entry, the item asks for fewer than the request's top-k, or a
logprob is -inf or NaN. Entries are made the way vLLM's append_logprobs_for_next_position makes them."""
from __future__ import annotations

import math
import pickle
import random
from dataclasses import dataclass
from types import SimpleNamespace

from parity_ui.core.types import StepColumns
from parity_ui.engines.prompt_logprobs import PromptLogprobs
from parity_ui.engines.vllm_engine import _step_from_logprobs


@dataclass
class Logprob:  # the fields of vllm.logprobs.Logprob that parity-ui reads
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def _position(rnd: random.Random, scored: int, top: int) -> list[tuple[int, float, int | None]]:
    """(token id, logprob, rank) entries of one position: the scored token with its rank, then the top-k
    with ranks 1..k (vLLM's order), with the odd cases mixed in."""
    ids = rnd.sample(range(50), top)
    lps = sorted((-rnd.random() * 6 for _ in range(top)), reverse=True)
    if rnd.random() < 0.3:  # the scored token is among the best: listed twice
        scored = ids[rnd.randrange(top)]
    rank = next((r + 1 for r, t in enumerate(ids) if t == scored), rnd.choice([top + 1, 7, 1, 2]))
    lp = rnd.choice([-rnd.random() * 9, -math.inf, math.nan, lps[0]]) if rnd.random() < 0.2 else -rnd.random() * 9
    entries = [(scored, lp, rank if rnd.random() > 0.05 else None)]
    entries += [(t, v, r + 1) for r, (t, v) in enumerate(zip(ids, lps))]
    return entries


def _case(seed: int, top: int, n: int = 40, base: int = 3):
    rnd = random.Random(seed)
    tokens = [rnd.randrange(50) for _ in range(n)]
    positions: list[list | None] = [None] + [_position(rnd, rnd.randrange(50), top) for _ in range(base - 1)]
    for j, t in enumerate(tokens):
        positions.append(None if rnd.random() < 0.05 else _position(rnd, t if rnd.random() < 0.95 else 99, top))
    dicts = [None if p is None else {t: Logprob(v, r) for t, v, r in p} for p in positions]
    return tokens, base, positions, dicts


def _flat(positions) -> SimpleNamespace:
    """vLLM's FlatLogprobs fields, filled as its append_fast does (every entry, no dict)."""
    f = SimpleNamespace(start_indices=[], end_indices=[], token_ids=[], logprobs=[], ranks=[], decoded_tokens=[])
    for p in positions:
        f.start_indices.append(len(f.token_ids))
        for t, v, r in p or []:
            f.token_ids.append(t)
            f.logprobs.append(v)
            f.ranks.append(r)
            f.decoded_tokens.append(None)
        f.end_indices.append(len(f.token_ids))
    return f


def _bits(cols: StepColumns) -> dict:
    """The columns with every float as its bits (NaN equal to itself, -0.0 apart from 0.0)."""
    out = cols.columns()
    for name in ("logprob", "top_logprob"):
        out[name] = [None if x is None else float(x).hex() for x in out[name]]
    return out


def test_columns_equal_the_per_position_path_bit_for_bit():
    for seed in range(60):
        top = 1 + seed % 4
        tokens, base, positions, dicts = _case(seed, top)
        for k in sorted({1, top, max(1, top - 1)}):
            before = StepColumns.from_steps(
                [_step_from_logprobs(j, t, dicts[base + j], k) for j, t in enumerate(tokens)]
            )
            flat, listed, split = PromptLogprobs(), PromptLogprobs(), PromptLogprobs()
            flat.add(_flat(positions))
            listed.add(dicts)
            cut = 1 + seed % (len(positions) - 1)  # DELTA outputs: the positions in two pieces
            split.add(_flat(positions[:cut]))
            split.add(dicts[cut:])
            for got in (flat, listed, split):
                assert len(got) == len(positions)
                cols = got.columns(base, tokens, k)
                assert _bits(cols) == _bits(before), (seed, k)
                assert list(cols) == list(before)  # and step for step, as the views read them
                assert _bits(pickle.loads(pickle.dumps(cols))) == _bits(before)  # across the worker's pipe


def test_a_twice_listed_token_keeps_its_first_place_and_its_last_values():
    """The scored token (rank 3 by its own count) listed again in the top-k at rank 1: a dict keeps the
    top-k's entry; ties keep the listing order."""
    positions = [None, [(7, -0.5, 3), (7, -0.25, 1), (4, -0.75, 2)], [(9, -1.0, 1), (2, -1.0, 1)]]
    got = PromptLogprobs()
    got.add(_flat(positions))
    cols = got.columns(1, [7, 9], 2)
    assert cols.logprob == [-0.25, -1.0] and cols.rank == [1, 1]
    assert cols.top_token_id == [7, 4, 9, 2] and cols.top_logprob == [-0.25, -0.75, -1.0, -1.0]
