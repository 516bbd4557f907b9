"""The passes an audit asks of one loaded engine: each the same prompts served another way, each made
once and shared by every axis that reads it (the first axis to ask for a pass pays for it).

- alone: each prompt alone (batch 1);
- batch: every prompt in one full batch (prompt i at slot i), and `again`: the same batch once more;
- shuffled: the same batch submitted in a shuffled order (its slots recorded);
- warm: the prefix cache filled with each prompt's block-aligned prefix (a request of its own,
  served first), then the batch again; every request reports its cached tokens;
- rescored: each prompt's `alone` tokens teacher-forced in one prefill, alone.

Every pass but `warm` empties the engine's prefix cache before each of its batches
(GenerateRequest.fresh_cache): a cold pass reads nothing an earlier one left, and the cache is the
prefix axis's alone.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from ...core.requests import GenerateRequest, ScoreRequest
from ...core.types import SideResult, TokenStep, step_column
from ...run.pipeline import Sides
from ...run.plan import SidePlan


@dataclass
class Stream:
    """One prompt's stream as an axis compares it: token ids and the chosen tokens' logprobs."""

    ids: list[int]
    logprobs: list[float | None]
    result: SideResult  # what the engine returned (the pair run shows it)
    slot: str = ""
    cached: int | None = None


def stream_of(res: SideResult, slot: str = "") -> Stream:
    return Stream(list(res.token_ids), list(step_column(res.steps, "logprob")), res, slot, res.cached_tokens)


@dataclass
class Passes:
    """The passes of one side's engine (`sides`, its loaded set) over the run's prompt ids."""

    sides: Sides
    plan: SidePlan
    prompts: list[list[int]]
    logprobs: int
    batch_size: int  # the full batch (every prompt, unless the audit asked for less)
    greedy: bool
    seed: int = 0
    made: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # pass -> its engine time
    order: list[int] = field(default_factory=list)  # the shuffled pass's submission order

    @property
    def name(self) -> str:
        return self.plan.name

    def _generate(
        self, ids: list[list[int]], batch: int, *, fresh: bool = True, max_tokens: int | None = None
    ) -> list[SideResult]:
        sampling = dict(self.plan.args.sampling)
        if max_tokens is not None:
            sampling["max_tokens"] = max_tokens
        req = GenerateRequest(
            prompts=ids, sampling=sampling, batch_size=batch, logprobs=self.logprobs, stream=False, fresh_cache=fresh
        )
        return self.sides.generate(self.name, req)

    def _timed(self, key: str, make: Any) -> Any:
        if key not in self.made:
            t = time.perf_counter()
            self.made[key] = make()
            self.seconds[key] = round(time.perf_counter() - t, 3)
        return self.made[key]

    def slot(self, i: int) -> str:
        n = len(self.prompts)
        b = self.batch_size
        if b >= n:
            return f"slot {i} of a batch of {n}"
        return f"slot {i % b} of batch {i // b + 1} ({b} a batch)"

    # -- the passes -----------------------------------------------------------------------------------

    def alone(self, only: list[int] | None = None) -> dict[int, Stream]:
        """Each prompt alone (those in `only`, else all): a pass of every prompt made once serves both;
        `only` on an engine that has not made it generates just those (a second engine's long prompts)."""
        if only is None or "alone" in self.made:
            full = self._timed("alone", lambda: self._generate(self.prompts, 1))
            return {i: stream_of(full[i], "alone") for i in (range(len(self.prompts)) if only is None else only)}
        some = self._timed(f"alone{only}", lambda: self._generate([self.prompts[i] for i in only], 1))
        return {i: stream_of(r, "alone") for i, r in zip(only, some)}

    def batch(self) -> dict[int, Stream]:
        res = self._timed("batch", lambda: self._generate(self.prompts, self.batch_size))
        return {i: stream_of(r, self.slot(i)) for i, r in enumerate(res)}

    def again(self) -> dict[int, Stream]:
        res = self._timed("again", lambda: self._generate(self.prompts, self.batch_size))
        return {i: stream_of(r, self.slot(i)) for i, r in enumerate(res)}

    def shuffled(self) -> dict[int, Stream]:
        """The full batch submitted in a shuffled order (seeded); streams back in prompt order."""

        def make() -> list[SideResult]:
            order = list(range(len(self.prompts)))
            rnd = random.Random(self.seed)
            while len(order) > 1 and order == sorted(order):  # a shuffle that moved nothing is no shuffle
                rnd.shuffle(order)
            self.order = order
            res = self._generate([self.prompts[j] for j in order], self.batch_size)
            back: list[SideResult | None] = [None] * len(order)
            for slot, j in enumerate(order):
                back[j] = res[slot]
            return [r for r in back if r is not None]

        res = self._timed("shuffled", make)
        where = {j: slot for slot, j in enumerate(self.order)}
        return {i: stream_of(r, f"{self.slot(where.get(i, i))} (shuffled)") for i, r in enumerate(res)}

    def warm(self, block: int) -> tuple[dict[int, Stream], dict[int, int]]:
        """The prefix cache emptied, each prompt's longest block-aligned prefix served first (one token
        each, in one batch), then the full batch as `batch` serves it. Returns the streams and each
        prompt's prefix length (0: shorter than one block, nothing to cache)."""
        prefix = {i: ((len(p) - 1) // block) * block if block > 0 else 0 for i, p in enumerate(self.prompts)}

        def make() -> list[SideResult]:
            firsts = [self.prompts[i][:k] for i, k in prefix.items() if k > 0]
            if firsts:  # in ONE batch: the cache is emptied before each batch of a request
                self._generate(firsts, len(firsts), fresh=True, max_tokens=1)
            return self._generate(self.prompts, self.batch_size, fresh=not firsts)

        res = self._timed("warm", make)
        return {i: stream_of(r, self.slot(i)) for i, r in enumerate(res)}, prefix

    def rescored(self) -> dict[int, Stream]:
        """Each prompt's `alone` tokens teacher-forced in ONE prefill, each alone (a batch would mix in the
        batch axis). Greedy: where the prefill's own best token is another, that is the stream's token
        there (the prefill would have decoded otherwise)."""
        alone = self.alone()

        def make() -> dict[int, list[TokenStep]]:
            out: dict[int, list[TokenStep]] = {}
            for i, s in alone.items():
                if not s.ids:
                    out[i] = []
                    continue
                req = ScoreRequest(prompt=self.prompts[i], continuation=s.ids, logprobs=max(self.logprobs, 1))
                out[i] = list(self.sides.score(self.name, req))
            return out

        scored = self._timed("rescored", make)
        streams = {}
        for i, steps in scored.items():
            ids = []
            for tok, st in zip(alone[i].ids, steps):
                best = st.top[0].token_id if st.top else tok
                ids.append(best if self.greedy and st.rank is not None and st.rank != 1 else tok)
            res = SideResult(
                side=self.name,
                prompt_index=i,
                token_ids=list(alone[i].ids),
                steps=steps,
                finish_reason="scored",
            )
            streams[i] = Stream(ids, [st.logprob for st in steps], res, "one prefill, alone")
        return streams
