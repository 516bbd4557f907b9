"""vLLM's prompt logprobs of a request gathered as flat columns, and a continuation's steps made from
them as StepColumns straight away (VllmEngine.score_batch: a replay's rollout re-run, cross-scoring).

Per position vLLM returns the scored token (with its rank) then the top-k. The per-position path
(`vllm_engine._step_from_logprobs`: a dict of Logprob objects per position, a TokenStep with its
TopLogprobs, then StepColumns.from_steps in the worker) cost ~4 us a token in Python, ~2 s of a
1,000 x 512-token replay on top of vLLM's own work. Here vLLM is asked for its flat container
(SamplingParams.flat_logprobs, where this vLLM has it: no dict or Logprob per position) and the
columns are filled from its lists. The result is the per-position path's, value for value: a
position's entries are read with a dict's semantics (a token listed twice, as the scored token and
again in the top-k, keeps its first place and its last values), ranked by rank with ties in that
order, the top-k those of rank <= k. The older list of dicts is read the same way.

No vLLM import here: the containers are read by their attributes (unit-tested without vLLM).
"""

from __future__ import annotations

from typing import Any

from ..core.types import StepColumns
from .base import clean_logprob

_NO_RANK = 1 << 30  # an entry without a rank sorts last, as in _step_from_logprobs


def _key(rank: int | None) -> int:
    return _NO_RANK if rank is None else rank


class PromptLogprobs:
    """One request's prompt logprobs, position by position, as flat lists: position p's entries are
    token_ids/logprobs/ranks[starts[p]:ends[p]] (none: a position vLLM scored nothing at, position 0)."""

    __slots__ = ("starts", "ends", "token_ids", "logprobs", "ranks")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.ranks: list[int | None] = []

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, piece: Any) -> None:
        """The next positions, as one RequestOutput.prompt_logprobs brought them (DELTA outputs: a
        long prompt's come in pieces): vLLM's FlatLogprobs, or a list of {token id: Logprob} | None."""
        if hasattr(piece, "start_indices"):  # FlatLogprobs: its indices point into its own lists
            off = len(self.token_ids)
            self.starts += [s + off for s in piece.start_indices]
            self.ends += [e + off for e in piece.end_indices]
            self.token_ids += piece.token_ids
            self.logprobs += piece.logprobs
            self.ranks += piece.ranks
            return
        for entry in piece:
            self.starts.append(len(self.token_ids))
            if entry:
                for tid, lp in entry.items():
                    self.token_ids.append(tid)
                    self.logprobs.append(lp.logprob)
                    self.ranks.append(lp.rank)
            self.ends.append(len(self.token_ids))

    def columns(self, base: int, tokens: list[int], k: int) -> StepColumns:
        """The steps of `tokens`, scored at positions base, base + 1, ... (prompt_logprobs[p] scores
        the p-th id of prompt + continuation): the token's logprob and rank, the top-k (k: the item's
        logprobs), as _step_from_logprobs and StepColumns.from_steps make them."""
        starts, ends, tids, lps, ranks = self.starts, self.ends, self.token_ids, self.logprobs, self.ranks
        n = len(tokens)
        logprob: list[float | None] = []
        rank: list[int | None] = []
        top_n: list[int] = []
        top_id: list[int] = []
        top_lp: list[float] = []
        for j in range(n):
            s, e = starts[base + j], ends[base + j]
            if s == e:  # no entry: no logprob, no rank, no top-k
                logprob.append(None)
                rank.append(None)
                top_n.append(0)
                continue
            tid = tokens[j]
            if e - s == 2:  # prompt_logprobs=1, the replay's: the scored token and the best one, in place
                a, b = s, s + 1
                ta, tb = tids[a], tids[b]
                order = [b] if ta == tb else [b, a] if _key(ranks[b]) < _key(ranks[a]) else [a, b]
                at: int | None = b if tid == tb else a if tid == ta else None
            else:
                # A dict's semantics: each token once, at its first place, with its last entry's values.
                last: dict[int, int] = {}
                for i in range(s, e):
                    last[tids[i]] = i
                at = last.get(tid)
                order = sorted(last.values(), key=lambda i: _key(ranks[i]))
            if at is None:
                logprob.append(None)
                rank.append(None)
            else:
                logprob.append(clean_logprob(float(lps[at])))
                rank.append(ranks[at])
            kept = [i for i in order if ranks[i] is not None and ranks[i] <= k][:k]  # type: ignore[operator]
            top_n.append(len(kept))
            top_id += [int(tids[i]) for i in kept]
            top_lp += [clean_logprob(float(lps[i])) for i in kept]
        return StepColumns(
            {
                "position": list(range(n)),
                "token_id": [int(t) for t in tokens],
                "text": [""] * n,
                "logprob": logprob,
                "rank": rank,
                "top_n": top_n,
                "top_token_id": top_id,
                "top_logprob": top_lp,
                "top_text": [""] * len(top_id),
            }
        )
