"""Mixture-of-experts routes in a comparison (config routes=true): each side's routes recorded,
compared with the reference's, and, for an hf side with replay_routes, the side run again routing
with the reference's experts (attribution by replay: how much of the gap is left).

Routes are recorded by a teacher-forced pass over the prompt and each side's own tokens
(parity_ui.engines.routes); the route of step j is the routing at the position that predicted
token j. A side that cannot record them, or a model without MoE layers, is named in a warning and
the run goes on without them.
"""

from __future__ import annotations

from typing import Any

from ..analysis.compare import compare
from ..analysis.routes import comparable_steps, compare_routes
from ..core.mapping import route_replay_mode
from ..core.requests import GenerateRequest, RouteReplayRequest, RoutesRequest
from ..core.routes import RouteReplay, Routes
from ..core.runlog import EventCallback, RunEvent
from ..core.types import Finding, Run
from ..run.plan import Prepared
from ..run.sideset import SideSet


def record_routes(prep: Prepared, run: Run, sides: SideSet, emit: EventCallback) -> None:
    """Every side's routes on every prompt, each comparison's route agreement, and the replays asked
    for. Failures become warnings: the comparison stands without routes."""
    full: dict[tuple[str, int], Routes] = {}  # (side, prompt) -> routes from input position 0 (for replay)
    for p in prep.sides:
        if not p.kind.can_record_routes:
            run.warnings.append(
                Finding(
                    code="routes-unsupported",
                    severity="warning",
                    side=p.name,
                    message=f"{p.name} ({p.kind.label}) cannot record expert routes: its routers are out of reach",
                    fix="record routes on vllm or hf sides; the run goes on without routes for this side",
                )
            )
            continue
        emit(RunEvent("status", f"{p.name}: recording expert routes", side=p.name))
        try:
            for pr in run.prompts:
                res = pr.results.get(p.name)
                if res is None or not res.token_ids or pr.images:
                    continue
                base, n = len(pr.prompt_token_ids), len(res.token_ids)
                ids = list(pr.prompt_token_ids) + list(res.token_ids)
                routes = sides.routes(p.name, RoutesRequest(ids=ids, positions=list(range(base - 1 + n))))
                full[(p.name, pr.index)] = routes
                res.routes = routes.rows_between(base - 1)
        except Exception as e:  # noqa: BLE001 - the comparison stands without routes
            run.warnings.append(
                Finding(
                    code="routes-failed",
                    severity="warning",
                    side=p.name,
                    message=f"{p.name}: expert routes not recorded: {_why(e)}",
                    fix=getattr(e, "fix", "") or "set routes=false",
                )
            )
    for pr in run.prompts:
        for c in pr.comparisons:
            a, b = pr.results.get(c.a), pr.results.get(c.b)
            if a is not None and b is not None:
                c.routes = compare_routes(
                    a.routes, b.routes, comparable_steps(c.first_divergence, len(a.token_ids), len(b.token_ids))
                )
    _replays(prep, run, sides, full, emit)


def chunk_routes(
    prep: Prepared, run: Run, sides: SideSet, plans: list[Any], results: dict[str, dict[int, Any]], chunk: list[int]
) -> None:
    """A workload chunk's routes: every side that can records its routes on each of the chunk's prompts
    (results[side][j] gets .routes); a side that cannot is named once in the run's warnings."""
    for p in plans:
        if p.name not in results:
            continue
        if not p.kind.can_record_routes:
            _warn_once(
                run,
                Finding(
                    code="routes-unsupported",
                    severity="warning",
                    side=p.name,
                    message=f"{p.name} ({p.kind.label}) cannot record expert routes",
                    fix="record routes on vllm or hf sides",
                ),
            )
            continue
        try:
            for j in chunk:
                res = results[p.name].get(j)
                if res is None or not res.token_ids:
                    continue
                base = len(prep.prompts_of(p.name)[j].token_ids)
                ids = list(prep.prompts_of(p.name)[j].token_ids) + list(res.token_ids)
                res.routes = sides.routes(
                    p.name, RoutesRequest(ids=ids, positions=list(range(base - 1, base - 1 + len(res.token_ids))))
                )
        except Exception as e:  # noqa: BLE001 - the workload goes on without this side's routes
            _warn_once(
                run,
                Finding(
                    code="routes-failed",
                    severity="warning",
                    side=p.name,
                    message=f"{p.name}: expert routes not recorded: {_why(e)}",
                    fix=getattr(e, "fix", "") or "set routes=false",
                ),
            )


def forced_routes(
    run: Run, sides: SideSet, plan: Any, sequences: dict[int, tuple[list[int], list[int]]]
) -> dict[int, Routes]:
    """A scored workload: `plan`'s routes (the reference or the floor) on sequences it did not make,
    {j: (prompt ids, another side's tokens)}, from input position 0 (what a route replay forces; the
    caller keeps rows from len(prompt) - 1 on for the comparison). {} where the side cannot record
    them (named once in the run's warnings)."""
    if not plan.kind.can_record_routes:
        _warn_once(
            run,
            Finding(
                code="routes-unsupported",
                severity="warning",
                side=plan.name,
                message=f"{plan.name} ({plan.kind.label}) cannot record expert routes",
                fix="record routes on vllm or hf sides",
            ),
        )
        return {}
    out = {}
    try:
        for j, (prompt, tokens) in sequences.items():
            if tokens:
                out[j] = sides.routes(
                    plan.name,
                    RoutesRequest(
                        ids=list(prompt) + list(tokens), positions=list(range(len(prompt) - 1 + len(tokens)))
                    ),
                )
    except Exception as e:  # noqa: BLE001 - the workload goes on without this side's routes
        _warn_once(
            run,
            Finding(
                code="routes-failed",
                severity="warning",
                side=plan.name,
                message=f"{plan.name}: expert routes not recorded: {_why(e)}",
                fix=getattr(e, "fix", "") or "set routes=false",
            ),
        )
        return {}
    return out


def replayed_pair(side: str, source: str) -> str:
    """The pooled pair of a scored workload's route replay: `side` scoring its own tokens while routing
    with `source`'s experts, against `source`."""
    return f"{side}+{source} routes"


def score_with_routes(
    run: Run, sides: SideSet, plan: Any, mode: str, items: dict[int, Any], routes: dict[int, Routes]
) -> dict[int, Any]:
    """A scored workload's route replay: `plan` teacher-forces each item (its own tokens) once more,
    routing with routes[j] (another side's, from input position 0): {j: SideResult}. {} on a failure
    (named once in the run's warnings: the workload goes on without the replay)."""
    js = [j for j in items if j in routes]
    if not js:
        return {}
    try:
        got = sides.replay_routes(
            plan.name, RouteReplayRequest(None, [routes[j] for j in js], mode, score=[items[j] for j in js])
        )
    except Exception as e:  # noqa: BLE001
        _warn_once(
            run,
            Finding(
                code="route-replay-failed",
                severity="warning",
                side=plan.name,
                message=f"{plan.name}: replay_routes={mode} failed: {_why(e)}",
                fix=getattr(e, "fix", "") or "drop replay_routes",
            ),
        )
        return {}
    return dict(zip(js, got))


def _warn_once(run: Run, f: Finding) -> None:
    if not any((w.code, w.side) == (f.code, f.side) for w in run.warnings):
        run.warnings.append(f)


def _replays(
    prep: Prepared, run: Run, sides: SideSet, full: dict[tuple[str, int], Routes], emit: EventCallback
) -> None:
    ref = prep.reference.name
    for p in prep.sides[1:]:
        mode = route_replay_mode(p.spec)
        if mode == "off":
            continue
        prompts = [pr for pr in run.prompts if (ref, pr.index) in full and pr.comparison(p.name)]
        if not prompts:
            run.warnings.append(
                Finding(
                    code="route-replay-skipped",
                    severity="warning",
                    side=p.name,
                    message=f"{p.name}: replay_routes={mode} asked for, but the reference "
                    f"{ref} recorded no routes to replay",
                    fix="record routes on the reference (routes=true, a vllm or hf side)",
                )
            )
            continue
        emit(RunEvent("status", f"{p.name}: generating again with {ref}'s expert routes ({mode})", side=p.name))
        greq = GenerateRequest(
            prompts=[pr.prompt_token_ids for pr in prompts],
            sampling=p.args.sampling,
            batch_size=1,
            logprobs=max(prep.config.logprobs, 1),
            stream=False,
        )
        try:
            again = sides.replay_routes(
                p.name, RouteReplayRequest(greq, [full[(ref, pr.index)] for pr in prompts], mode)
            )
        except Exception as e:  # noqa: BLE001
            for pr in prompts:
                c = pr.comparison(p.name)
                c.route_replay = _failed(mode, ref, c, _why(e))
            continue
        for pr, res in zip(prompts, again):
            c = pr.comparison(p.name)
            after = compare(pr.results[ref], res)
            c.route_replay = RouteReplay(
                mode=mode,
                source=ref,
                before_first_divergence=c.first_divergence,
                after_first_divergence=after.first_divergence,
                before_identical=c.identical,
                after_identical=after.identical,
                before_max_abs_gap=c.max_abs_gap,
                after_max_abs_gap=after.max_abs_gap,
                compared=after.compared,
            )


def _failed(mode: str, ref: str, c: Any, why: str) -> RouteReplay:
    return RouteReplay(
        mode=mode,
        source=ref,
        before_first_divergence=c.first_divergence,
        after_first_divergence=None,
        before_identical=c.identical,
        after_identical=False,
        before_max_abs_gap=c.max_abs_gap,
        after_max_abs_gap=None,
        compared=0,
        error=why,
    )


def _why(e: Exception) -> str:
    return getattr(e, "message", None) or str(e) or type(e).__name__
