"""The routing measure (config routes=true): mixture-of-experts routes recorded on every side that
can, each pair's routes compared token by token and layer by layer (analysis.routes), pooled into the
routing family and judged against the floor's (core.pooled.routing_against_floor); and, for a side
with replay_routes (a kind that can force routes), attribution by replay: the side run again routing
with the reference's experts, how much of the gap is left.

Routes are recorded by a teacher-forced pass over a prompt and a sequence (parity_ui.engines.routes);
the route of step j is the routing at the position that predicted token j. By mode:
- a comparison: every side's routes on its own tokens, each comparison's agreement up to and
  including its first fork; a replay generates again with the reference's routes;
- a free-running workload: the same, per chunk, the floor too;
- a scored workload: the generating sides' routes on their own tokens, the reference's (and the
  floor's) on each side's tokens, so every token compares; a replay is one more forced pass of the
  side's own tokens routing with the reference's experts, pooled as a pair of its own
  (`replayed_pair`);
- a replay: every side's routes on the dump's forced tokens (the recorded side's come from the dump:
  parity_ui.commands.replay_routes; its rollout routing replay, R3, is a pair of the replay's own).
A side that cannot record routes, or a model without MoE layers, is named; the run goes on without
them. Its engine half: parity_ui.engines.routes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..analysis.compare import compare
from ..analysis.routes import comparable_steps, compare_routes, route_figures
from ..core.config import ParityConfig
from ..core.mapping import route_replay_mode
from ..core.measures import ROUTE_REPLAY, ROUTES, ROUTING
from ..core.pooled import PairSample, routing_against_floor
from ..core.requests import GenerateRequest, RouteReplayRequest, RoutesRequest
from ..core.routes import RouteReplay, Routes, agreement_from_json
from ..core.runlog import EventCallback, RunEvent
from ..core.types import Comparison, Finding, Run, SideResult, TokenStep
from ..core.workload_record import put_family
from ..run.plan import Prepared, SidePlan
from ..run.preflight_moe import moe_shape
from ..run.sideset import SideSet
from .base import Made, MeasureRun, Mode, PairSeen, Plan
from .tokens import as_result, max_gap, reference_view, scored_sample

if TYPE_CHECKING:
    from ..core.workload_record import WorkloadReport
    from ..store import Store


class Routing:
    spec = ROUTING

    def wanted(self, cfg: ParityConfig, mode: Mode) -> bool:
        return cfg.routes

    def preflight(self, plan: Plan) -> list[Finding]:
        """routes=true with a side whose kind cannot record routes (a server: its routers are in another
        process), or with a model that has no MoE layers; replay_routes while routes=false (nothing is
        recorded to replay), on the reference (it replays no one's), or in a free-running workload."""
        prep, routes = plan.prep, plan.config.routes
        out: list[Finding] = []
        if routes and not any(moe_shape(p.model.path) for p in prep.sides):
            out.append(
                Finding(
                    code="routes-no-moe",
                    severity="warning",
                    message="routes=true, but the model has no mixture-of-experts layers (no expert count "
                    "in its config.json): no routes will be recorded",
                    fix="use an MoE model, or drop routes=true",
                    setting={"key": "routes", "value": False},
                )
            )
        for p in prep.sides:
            if routes and not p.kind.can_record_routes:
                out.append(
                    Finding(
                        code="routes-unsupported",
                        severity="warning",
                        side=p.name,
                        message=f"{p.name} ({p.kind.label}) cannot record expert routes (its routers run in "
                        "another process); the run goes on without its routes",
                        fix="record routes on vllm or hf sides",
                    )
                )
            mode = route_replay_mode(p.spec)
            if mode != "off" and not routes:
                out.append(
                    Finding(
                        code="replay-without-routes",
                        severity="warning",
                        side=p.name,
                        message=f"{p.name}.replay_routes={mode} needs the reference's routes, and routes=false",
                        fix="set routes=true",
                        setting={"key": "routes", "value": True},
                    )
                )
            # In a replay the trainer (the reference) may replay the dump's recorded routes (R3).
            if mode != "off" and p is prep.sides[0] and plan.mode != "replay":
                out.append(
                    Finding(
                        code="replay-on-reference",
                        severity="warning",
                        side=p.name,
                        message=f"{p.name} is the reference: it replays no one's routes",
                        fix="set replay_routes on another hf side",
                    )
                )
        if routes and plan.mode == "free":
            for p in prep.sides[1:]:
                if route_replay_mode(p.spec) != "off":
                    out.append(
                        Finding(
                            code="route-replay-free",
                            severity="warning",
                            side=p.name,
                            message=f"{p.name}.replay_routes is not run in a free-running workload (it would "
                            "generate every prompt again, alone); the routes are still recorded and compared",
                            fix="use --mode scored, where the replay is one forced pass per sequence",
                        )
                    )
        return out

    def start(self, plan: Plan) -> MeasureRun:
        return RoutesRun(plan)


class RoutesRun(MeasureRun):
    compare_phase = "routes"
    calls_engines = True

    def __init__(self, plan: Plan):
        self.plan, self.prep, self.run = plan, plan.prep, plan.run
        # Scored mode: the reference's and the floor's routes on a side's sequence j (from input position
        # 0), by (scorer, side, j), and the side's route replay, by (side, j). Keyed by sequence, not held
        # per call: on a Ray cluster several blocks' chunks are under way at once.
        self.scored: dict[tuple[str, str, int], Routes] = {}
        self.replayed: dict[tuple[str, int], SideResult] = {}

    # -- a comparison -------------------------------------------------------------------------------

    def after_compare(self, sides: SideSet, run: Run, emit: EventCallback) -> list[SideResult]:
        """Every side's routes on every prompt, each comparison's agreement, and the replays asked for.
        Failures become warnings: the comparison stands without routes."""
        full = record_routes(self.prep, run, sides, emit)
        for pr in run.prompts:
            for c in pr.comparisons:
                a, b = pr.results.get(c.a), pr.results.get(c.b)
                if a is not None and b is not None:
                    agree(c, a, b, forced=False)
        _replays(self.prep, run, sides, full, emit)
        return [res for pr in run.prompts for res in pr.results.values() if res.routes is not None]

    # -- a workload's chunk, a replay's ---------------------------------------------------------------

    def collect(self, sides: SideSet, made: Made) -> None:
        if made.kind == "generated":  # each side's routes on its own tokens
            chunk_routes(self.prep, self.run, sides, made.plans, made.results, made.chunk)
        elif made.kind == "scored":  # the reference's and the floor's routes on the side's tokens, its replay
            assert made.side is not None
            p, ref = made.side, self.prep.reference
            ref_routes = forced_routes(self.run, sides, ref, made.sequences)
            floor_routes = forced_routes(self.run, sides, made.floor, made.sequences) if made.floor else {}
            for j, r in ref_routes.items():
                self.scored[ref.name, p.name, j] = r
            if made.floor is not None:
                for j, r in floor_routes.items():
                    self.scored[made.floor.name, p.name, j] = r
            mode = route_replay_mode(p.spec)
            if mode != "off" and ref_routes:
                if made.progress is not None:
                    made.progress.call(p.name, f"scoring its tokens with {ref.name}'s expert routes")
                got = score_with_routes(self.run, sides, p, mode, made.items, ref_routes)
                self.replayed.update({(p.name, j): res for j, res in got.items()})
                if made.progress is not None:
                    made.progress.call_done()
        else:  # a replay: every forced side's routes on the dump's tokens
            names = list(made.results)
            can = {p.name: p.kind.can_record_routes for p in made.plans}
            recorded = forced_side_routes(self.run, sides, [n for n in names if n in can], made.sequences, can)
            for name, by_j in recorded.items():
                for j, r in by_j.items():
                    res = made.results[name].get(j)
                    if res is not None:
                        res.routes = r

    def harvest(self, pair: PairSeen) -> None:
        if pair.generated is not None:  # scored mode: the scorers' routes onto their views of the side's tokens
            for res in (pair.a, pair.b):
                r = self.scored.get((res.side, pair.generated.side, pair.j))
                if res.routes is None and r is not None:
                    res.routes = r.rows_between(pair.base - 1)
        agree(pair.c, pair.a, pair.b, forced=pair.forced)

    def sample(self, pair: PairSeen) -> None:
        """Scored mode: the side's own tokens scored again with the reference's routes, pooled as its
        own pair; the comparison's before/after."""
        if pair.generated is None or pair.b is not pair.generated or pair.ref_steps is None:
            return  # not a side's own pair in scored mode (the floor's, a free or replayed one)
        replayed = self.replayed.get((pair.b.side, pair.j))
        if replayed is None:
            return
        p = self.prep.side(pair.b.side)
        pair.samples[replayed_pair(p.name, self.prep.reference.name)] = route_replay(
            self.prep, pair.c, pair.a, pair.b, replayed.steps, pair.ref_steps, pair.samples[pair.name]
        )

    def pairs(self) -> list[str]:
        """The pooled pairs of a scored workload's route replays (sides with replay_routes), by name."""
        if self.plan.mode != "scored":
            return []
        ref = self.prep.reference.name
        return [replayed_pair(p.name, ref) for p in self.prep.sides[1:] if route_replay_mode(p.spec) != "off"]

    def end_chunk(self, chunk: Sequence[int]) -> None:
        done = set(chunk)
        self.scored = {k: v for k, v in self.scored.items() if k[2] not in done}
        self.replayed = {k: v for k, v in self.replayed.items() if k[1] not in done}

    def pool(self, store: Store, run_id: str, report: WorkloadReport) -> None:
        pool_routing(store, run_id, report)


def agree(c: Comparison, a: SideResult, b: SideResult, forced: bool) -> None:
    """A pair's route agreement, when both sides recorded routes: every token where both routed the same
    input (`forced`: scored, replayed), else up to and including the first fork."""
    if a.routes is None or b.routes is None:
        return
    la, lb = len(a.token_ids), len(b.token_ids)
    ROUTES.put(
        c, compare_routes(a.routes, b.routes, min(la, lb) if forced else comparable_steps(c.first_divergence, la, lb))
    )


def pool_routing(store: Store, run_id: str, report: WorkloadReport) -> None:
    """Each side's routing family (and the floor's) from every stored route agreement of the run, so a
    resumed run pools its earlier chunks too, and each side's share of routes differing judged against
    the floor. Sides with no stored agreement keep none ("not recorded")."""

    def figures(side: str) -> dict[str, Any] | None:
        got = route_figures(agreement_from_json(a) for a in store.route_agreements(run_id, side))
        return got if got.get("cells") else None

    put_family(report, ROUTING.key, figures, routing_against_floor)


def route_replay(
    prep: Prepared,
    c: Comparison,
    view: SideResult,
    side: SideResult,
    replayed: Sequence[TokenStep],
    scored: Sequence[TokenStep],
    before: PairSample,
) -> PairSample:
    """The side's own tokens scored again with the reference's routes: the comparison's before/after
    (route_replay: the first token where the two would choose differently, and the largest |Δlogprob|
    over the whole sequence, as scored mode measures it) and the replayed pair's sample (pooled as
    its own row)."""
    after = compare(view, reference_view(side.side, side, replayed, prep))
    sample = scored_sample(after, as_result(side, replayed), scored)
    ROUTE_REPLAY.put(
        c,
        RouteReplay(
            mode=route_replay_mode(prep.side(side.side).spec),
            source=view.side,
            before_first_divergence=c.first_divergence,
            after_first_divergence=after.first_divergence,
            before_identical=c.identical,
            after_identical=after.identical,
            before_max_abs_gap=max_gap(before),
            after_max_abs_gap=max_gap(sample),
            compared=len(sample.positions),
        ),
    )
    return sample


# -- the engine calls ---------------------------------------------------------------------------------


def record_routes(prep: Prepared, run: Run, sides: SideSet, emit: EventCallback) -> dict[tuple[str, int], Routes]:
    """A comparison: every side's routes on every prompt (res.routes: from the prompt's last position on);
    {(side, prompt): routes from input position 0} for a replay. Failures become warnings."""
    full: dict[tuple[str, int], Routes] = {}
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
    return full


def chunk_routes(
    prep: Prepared,
    run: Run,
    sides: SideSet,
    plans: list[SidePlan],
    results: dict[str, dict[int, SideResult]],
    chunk: list[int],
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
    run: Run, sides: SideSet, plan: SidePlan, sequences: dict[int, tuple[list[int], list[int]]]
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


def forced_side_routes(
    run: Run, sides: SideSet, names: list[str], seqs: dict[int, tuple[list[int], list[int]]], can: dict[str, bool]
) -> dict[str, dict[int, Routes]]:
    """A replay: each replayed side's routes on each row's forced tokens, rows from len(prompt) - 1 on:
    {side: {j: Routes}}. A side that cannot record them is named once in the run's warnings and left out."""
    out: dict[str, dict[int, Routes]] = {}
    for name in names:
        if not can.get(name):
            _warn_once(
                run,
                Finding(
                    "routes-unsupported",
                    "warning",
                    f"{name} cannot record expert routes",
                    "record routes on vllm or hf sides",
                    side=name,
                ),
            )
            continue
        try:
            out[name] = {
                j: sides.routes(
                    name, RoutesRequest(ids=list(p) + list(r), positions=list(range(len(p) - 1, len(p) - 1 + len(r))))
                )
                for j, (p, r) in seqs.items()
                if r
            }
        except Exception as e:  # noqa: BLE001 - the replay goes on without this side's routes
            _warn_once(
                run,
                Finding(
                    "routes-failed",
                    "warning",
                    f"{name}: expert routes not recorded: {getattr(e, 'message', None) or e}",
                    getattr(e, "fix", "") or "set routes=false",
                    side=name,
                ),
            )
    return out


def replayed_pair(side: str, source: str) -> str:
    """The pooled pair of a route replay: `side` scoring its own tokens while routing with `source`'s
    experts, against `source`."""
    return f"{side}+{source} routes"


def score_with_routes(
    run: Run, sides: SideSet, plan: SidePlan, mode: str, items: dict[int, Any], routes: dict[int, Routes]
) -> dict[int, SideResult]:
    """`plan` teacher-forces each item (its own tokens) once more, routing with routes[j] (another
    side's, from input position 0): {j: SideResult}. {} on a failure (named once in the run's warnings:
    the run goes on without the replay)."""
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
    """A comparison's replays: each side with replay_routes generates again routing with the reference's
    recorded experts; its comparison gets the figures before and after."""
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
                assert c is not None
                ROUTE_REPLAY.put(c, _failed(mode, ref, c, _why(e)))
            continue
        for pr, res in zip(prompts, again):
            c = pr.comparison(p.name)
            assert c is not None
            after = compare(pr.results[ref], res)
            ROUTE_REPLAY.put(
                c,
                RouteReplay(
                    mode=mode,
                    source=ref,
                    before_first_divergence=c.first_divergence,
                    after_first_divergence=after.first_divergence,
                    before_identical=c.identical,
                    after_identical=after.identical,
                    before_max_abs_gap=c.max_abs_gap,
                    after_max_abs_gap=after.max_abs_gap,
                    compared=after.compared,
                ),
            )


def _failed(mode: str, ref: str, c: Comparison, why: str) -> RouteReplay:
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
