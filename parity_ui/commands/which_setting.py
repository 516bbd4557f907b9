"""Which setting? in the app: which pairs of a stored run's sides a bisect (parity_ui.commands.setting_bisect) can start
from, the request checked before anything runs, and the bisects stored for a run.

A pair differs when its side left the reference: in a comparison, tokens not identical on some
prompt; in a workload, its pooled figures beyond the reference's noise floor (or, without a floor,
tokens not identical on some prompt). Only such a pair is offered, and only where the bisect has a
setting to flip (parity_ui.core.bisect_factors): a pair that agrees has nothing to search, a pair that
differs only in the engine itself has nothing to flip, and saying so before the click is cheaper than
a stored error after two trials. Reads the store only; the bisect itself is the service's
(`ParityService.which_setting` checks, then bisects).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.bisect_factors import differences
from ..core.bisect_record import DEFAULT_PROMPTS, KIND, MAX_PROMPTS, TRIAL_KIND, bisect_line, pair_value, parse_pair  # noqa: F401 - the view's names
from ..core.config import config_from_dict
from ..core.errors import ParityError
from ..core.types import Run
from ..store import Store
from .setting_bisect import nothing_to_flip

BISECTABLE_KINDS = ("compare", "workload")

__all__ = [
    "BisectChoice",
    "bisect_choice",
    "checked_request",
    "pair_value",
    "parse_pair",
    "bisect_lines",
    "latest_bisect",
    "DEFAULT_PROMPTS",
    "MAX_PROMPTS",
]


@dataclass
class BisectChoice:
    """The pairs of a stored run a bisect can search: (reference, side) for each side that differs
    from the reference, in the run's side order. None of them: `problem` and `fix` say why."""

    run_id: str
    pairs: list[tuple[str, str]] = field(default_factory=list)
    problem: str = ""
    fix: str = ""
    nothing_to_flip: bool = False  # some pair differs, but only in what a bisect cannot flip (the engine)

    @property
    def default(self) -> tuple[str, str] | None:
        """The reference against the first side that differs."""
        return self.pairs[0] if self.pairs else None

    def error(self) -> ParityError:
        return ParityError(self.problem, self.fix, code="bisect-pair")


def _differing_sides(store: Store, run: Run) -> list[str]:
    ref = run.reference
    if ref is None:  # a run with no side: nothing differs
        return []
    if run.workload is not None:
        out = []
        for name, figs in run.workload.sides.items():
            v = figs.verdict.verdict if figs.verdict is not None else None
            seq = figs.stats.sequences
            if v == "exceeds noise" or (v != "within noise" and seq.n and seq.identical < seq.n):
                out.append(name)
    else:
        out = list(store.forked_sides(run.id, ref))
    order = [s.name for s in run.sides]
    return sorted((s for s in out if s in order and s != ref), key=order.index)


def _nothing_to_flip(run: Run, ref: str, side: str) -> ParityError | None:
    """Why a bisect of the pair would find nothing to flip (its error, in plain words), else None. A
    stored config that no longer reads is left to the bisect, which stores that error with its fix."""
    try:
        cfg = config_from_dict(run.config)
        on_gpu = any(str(s.device).startswith("cuda") for s in run.sides)  # where the run's sides ran
        factors, fixed = differences(cfg, cfg.side(ref), cfg.side(side), run.model, on_gpu)
    except Exception:  # noqa: BLE001 - the bisect itself reports why the run cannot be searched
        return None
    return None if factors else nothing_to_flip(run.id, ref, side, fixed)


def bisect_choice(store: Store, run_id: str) -> BisectChoice:
    """The pairs of run `run_id` a bisect can search (see the module docstring); reads the run's row
    and its comparison flags, no token. An unknown run, a run of another kind, one still running or
    with nothing finished, or one whose sides all agree with the reference gives no pair, and says why."""
    run_id = (run_id or "").strip()
    run = store.get_run(run_id, prompts=[]) if run_id else None
    choice = BisectChoice(run_id)
    if run is None:
        choice.problem = f"no run with id {run_id!r} in this database"
        choice.fix = "open a stored run in the History tab (or pick one from its table)"
        return choice
    if run.kind not in BISECTABLE_KINDS:
        choice.problem = f"run {run.id} is a {run.kind} run: Which setting? searches a comparison or a workload"
        choice.fix = (
            "open the comparison or workload it belongs to"
            if run.kind in (KIND, TRIAL_KIND)
            else "run a comparison of the sides, then ask which setting it is"
        )
        return choice
    done = run.workload.done if run.workload is not None else run.status in ("ok", "diverged")
    if run.status == "running" or not done:
        choice.problem = (
            f"run {run.id} is still running"
            if run.status == "running"
            else f"run {run.id} ended {run.status} before any prompt finished: there is nothing to search"
        )
        choice.fix = (
            "wait until it is stored"
            if run.status == "running"
            else "run the comparison again (its error card says what to fix first)"
        )
        return choice
    if len(run.sides) < 2:
        choice.problem = f"run {run.id} has {len(run.sides)} side: a bisect needs two sides that differ"
        choice.fix = "run a comparison with two sides, e.g. the reference and the setup you suspect"
        return choice
    ref = run.reference
    assert ref is not None, "a run of two sides or more has a reference (its first side)"
    differ = [(ref, s) for s in _differing_sides(store, run)]
    unflippable = {pair: e for pair in differ if (e := _nothing_to_flip(run, *pair)) is not None}
    choice.pairs = [pair for pair in differ if pair not in unflippable]
    if not choice.pairs and unflippable:
        e = next(iter(unflippable.values()))
        choice.problem, choice.fix, choice.nothing_to_flip = e.message, e.fix, True
    elif not choice.pairs:
        what = "within the reference's noise floor" if run.workload is not None else "token-identical"
        choice.problem = (
            f"every side of run {run.id} is {what} against the reference {run.reference}: no pair "
            "differs, so there is no setting to find"
        )
        choice.fix = (
            "nothing to fix; to look for a gap anyway, run `parity bisect` on the command line, whose "
            "oracle also weighs logprobs against the noise floor"
        )
    return choice


def checked_request(
    store: Store, run_id: str, sides: Any = None, prompts: Any = DEFAULT_PROMPTS
) -> tuple[tuple[str, str], int]:
    """The (pair, number of prompts) a bisect of `run_id` starts with: `sides` one of the run's
    differing pairs (None: the default pair), `prompts` a whole number from 1 to 10,000 (None: 8).
    Raises ParityError naming the problem and the fix; nothing is stored then."""
    choice = bisect_choice(store, run_id)
    if not choice.pairs:
        raise choice.error()
    pair = parse_pair(sides) or choice.pairs[0]  # (the default pair)
    if pair not in choice.pairs:
        offered = "; ".join(f"{a} vs {b}" for a, b in choice.pairs)
        raise ParityError(
            f"the pair {pair[0]} vs {pair[1]} is not one of run {run_id}'s pairs that differ",
            f"pick one of: {offered}",
            code="bisect-pair",
        )
    if prompts is None or prompts == "":
        n = DEFAULT_PROMPTS
    else:
        try:
            n = int(prompts)
            whole = float(prompts) == n
        except (TypeError, ValueError):
            whole = False
        if not whole or not 1 <= n <= MAX_PROMPTS:
            raise ParityError(
                f"the number of prompts {prompts!r} is not a whole number from 1 to {MAX_PROMPTS:,}",
                f"give a number of prompts from 1 to {MAX_PROMPTS:,} ({DEFAULT_PROMPTS}: the run's "
                f"{DEFAULT_PROMPTS} worst)",
                code="bisect-prompts",
            )
    return pair, n


def latest_bisect(store: Store, run_id: str) -> Run | None:
    """The newest stored bisect of run `run_id` (its record; its prompts are not read), or None."""
    return store.latest_bisect(run_id)


def bisect_lines(store: Store, ids: list[str]) -> dict[str, str]:
    """Each listed bisect's one line for a runs table: the pair, the run searched and the answer (or
    its error)."""
    return {r.id: bisect_line(r) for r in store.bisect_lines(ids)}
