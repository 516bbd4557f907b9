"""Delta debugging (Zeller and Hildebrandt, "Simplifying and Isolating Failure-Inducing Input", 2002):
ddmin over a set of differences, as a pure function of a test callback.

The direction, as `parity bisect` uses it: the items are the settings in which the diverging side
differs from the reference; a test flips a subset S of them to the reference's values and asks
whether that restores parity. ddmin minimises a set while a property holds; in its own words the
property is "the test fails" (the failure is still there). Here the property kept while the set
shrinks is **"flipping S restores parity"**, so:

- "fails" in ddmin's terms  = flipping S RESTORES parity (the set still holds the whole cause);
- "passes" in ddmin's terms = flipping S does NOT restore parity (some of the cause was left out),
  and so does a trial that could not run (it shows nothing restored).

ddmin needs the whole set to "fail" (flipping every difference restores parity) and the empty set
to "pass" (the side as it ran diverges); the caller checks both first and hands them in as `known`.
Then: split the current set c into n parts; if flipping a part restores parity, go on with that part
(n = 2); else if flipping a complement (c minus a part) does, go on with it (n = n - 1); else double
n, up to |c|; stop when n = |c| and nothing smaller restores parity. The result is 1-minimal:
flipping it restores parity, flipping it without any one of its settings does not (for a set of two,
every proper subset has been tried). Two settings that are needed together (an interaction) come
out as that pair. Outcomes are cached by set: a set met again costs no trial.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class BudgetSpent(Exception):
    """No trial is left in the budget (raised inside `ddmin`, never out of it)."""


@dataclass
class DdminResult(Generic[T]):
    minimal: tuple[T, ...]  # the smallest set known to restore parity (1-minimal when complete)
    complete: bool  # False: the budget ran out before 1-minimality was shown
    trials: int  # tests run by this call (cache hits and `known` outcomes not counted)
    cache_hits: int
    needed: tuple[T, ...] = ()  # members of `minimal` whose removal was tried and broke parity
    undecided: tuple[T, ...] = ()  # members not (yet) shown to be needed
    outcomes: dict[frozenset, bool] = field(default_factory=dict)  # every known set -> restores


def split(items: Sequence[T], n: int) -> list[tuple[T, ...]]:
    """`items` in n consecutive parts as equal as can be (the later parts take the remainder)."""
    out, start = [], 0
    for i in range(n):
        end = start + (len(items) - start) // (n - i)
        out.append(tuple(items[start:end]))
        start = end
    return out


def ddmin(
    items: Sequence[T],
    restores: Callable[[frozenset], bool],
    *,
    budget: int | None = None,
    known: dict[frozenset, bool] | None = None,
    arrange: Callable[[list[tuple[T, ...]]], list[tuple[T, ...]]] | None = None,
) -> DdminResult[T]:
    """A 1-minimal subset of `items` whose flipping restores parity (see the module docstring).

    `restores(S)` runs one trial; it may raise BudgetSpent itself. `budget`: at most this many calls
    to `restores`; when it runs out the result is the smallest restoring set found so far
    (`complete` False) with what is still undecided. `known`: outcomes already measured (the caller
    measures the empty set and the whole set first). `arrange` orders the candidates of one round
    (the parts, then the complements) without changing which ones are tried, e.g. so that trials
    that reuse a warm worker come first. Raises ValueError when `known` says the whole set does not
    restore parity or the empty set does (nothing to minimise)."""
    outcomes: dict[frozenset, bool] = dict(known or {})
    whole, empty = frozenset(items), frozenset[T]()
    if outcomes.get(whole) is False:
        raise ValueError("flipping every difference does not restore parity: there is nothing to minimise")
    if outcomes.get(empty) is True:
        raise ValueError("the side as it ran already restores parity: there is nothing to minimise")
    order = {x: i for i, x in enumerate(items)}
    counts = {"trials": 0, "hits": 0}

    def test(subset: tuple[T, ...]) -> bool:
        key = frozenset(subset)
        if key in outcomes:
            counts["hits"] += 1
            return outcomes[key]
        if budget is not None and counts["trials"] >= budget:
            raise BudgetSpent()
        counts["trials"] += 1
        outcomes[key] = bool(restores(key))
        return outcomes[key]

    def arranged(cands: list[tuple[T, ...]]) -> list[tuple[T, ...]]:
        return arrange(cands) if arrange is not None else cands

    c: tuple[T, ...] = tuple(items)
    n = 2
    try:
        while len(c) >= 2:
            parts = split(c, n)
            nxt = next((p for p in arranged(parts) if test(p)), None)
            if nxt is not None:
                c, n = nxt, 2
                continue
            # With two parts each complement is the other part: already tried.
            comps = [tuple(x for x in c if x not in set(p)) for p in parts] if n > 2 else []
            nxt = next((q for q in arranged(comps) if test(q)), None)
            if nxt is not None:
                c, n = nxt, max(n - 1, 2)
                continue
            if n >= len(c):
                break
            n = min(2 * n, len(c))
        complete = True
    except BudgetSpent:
        complete = False
    c = tuple(sorted(c, key=order.__getitem__))
    needed = tuple(x for x in c if outcomes.get(frozenset(c) - {x}) is False)
    undecided = tuple(x for x in c if x not in needed)
    if complete and undecided:  # 1-minimal means every member was shown needed
        complete = False
    return DdminResult(
        minimal=c,
        complete=complete,
        trials=counts["trials"],
        cache_hits=counts["hits"],
        needed=needed,
        undecided=undecided,
        outcomes=outcomes,
    )


def worst_case_trials(n: int) -> int:
    """Zeller and Hildebrandt's bound on ddmin's tests for n differences: n^2 + 3n (0 for n <= 1)."""
    return 0 if n <= 1 else n * n + 3 * n


def best_case_trials(n: int) -> int:
    """ddmin's tests when one setting is the cause and the first part tried always holds it: one
    halving after another, floor(log2 n)."""
    return 0 if n <= 1 else int(math.floor(math.log2(n)))


def one_at_a_time_trials(n: int) -> int:
    """Flipping each setting alone: n tests (which finds a single cause, never a needed pair)."""
    return n
