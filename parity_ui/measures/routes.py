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
  `DumpRoutesCheck` below; its rollout routing replay, R3, is a pair of the replay's own).
A side that cannot record routes, or a model without MoE layers, is named; the run goes on without
them. Its engine half: parity_ui.engines.routes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..analysis.compare import compare
from ..analysis.routes import comparable_steps, compare_routes, route_figures
from ..core.config import ParityConfig
from ..core.errors import ParityError
from ..core.mapping import route_replay_mode
from ..core.measures import ROUTE_REPLAY, ROUTES, ROUTING
from ..core.pooled import PairSample, routing_against_floor
from ..core.replay_record import RECORDED
from ..core.requests import GenerateRequest, RouteReplayRequest, RoutesRequest
from ..core.routes import RouteReplay, Routes, agreement_from_json, moe_layer_indices
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
        return bool(cfg.routes)  # resolved by then (core.config.routes_for): unset follows the model

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
        self.shape: RouteShape | None | Literal[False] = None  # a replay: the model's MoE layers (False: dense)

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
        else:  # a replay: every forced side's routes on the dump's tokens, the recorded side's from the dump
            names = list(made.results)
            can = {p.name: p.kind.can_record_routes for p in made.plans}
            found = forced_side_routes(self.run, sides, [n for n in names if n in can], made.sequences, can)
            if self.shape is None:
                self.shape = route_shape(self.prep.model.path) or False
            if isinstance(self.shape, RouteShape):
                shape = self.shape
                found[RECORDED] = {
                    j: shape.routes(row).rows_between(len(made.sequences[j][0]) - 1)
                    for j, row in made.rows.items()
                    if row.routed_experts is not None
                }
            for name, by_j in found.items():
                for j, r in by_j.items():
                    res = made.results.get(name, {}).get(j)
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
                _unsupported(
                    p.name,
                    f"{p.name} ({p.kind.label}) cannot record expert routes: its routers are out of reach",
                    "record routes on vllm or hf sides; the run goes on without routes for this side",
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
            run.warnings.append(_not_recorded(p.name, e))
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
            _warn_once(run, _unsupported(p.name, f"{p.name} ({p.kind.label}) cannot record expert routes"))
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
            _warn_once(run, _not_recorded(p.name, e))


def forced_routes(
    run: Run, sides: SideSet, plan: SidePlan, sequences: dict[int, tuple[list[int], list[int]]]
) -> dict[int, Routes]:
    """A scored workload: `plan`'s routes (the reference or the floor) on sequences it did not make,
    {j: (prompt ids, another side's tokens)}, from input position 0 (what a route replay forces; the
    caller keeps rows from len(prompt) - 1 on for the comparison). {} where the side cannot record
    them (named once in the run's warnings)."""
    if not plan.kind.can_record_routes:
        _warn_once(run, _unsupported(plan.name, f"{plan.name} ({plan.kind.label}) cannot record expert routes"))
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
        _warn_once(run, _not_recorded(plan.name, e))
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
            _warn_once(run, _unsupported(name, f"{name} cannot record expert routes"))
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
            _warn_once(run, _not_recorded(name, e))
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


def _unsupported(side: str, message: str, fix: str = "record routes on vllm or hf sides") -> Finding:
    """A side whose kind cannot record routes (its routers run in another process): named."""
    return Finding(code="routes-unsupported", severity="warning", side=side, message=message, fix=fix)


def _not_recorded(side: str, e: Exception) -> Finding:
    """A side's routes that failed to record: the run goes on without them."""
    return Finding(
        code="routes-failed",
        severity="warning",
        side=side,
        message=f"{side}: expert routes not recorded: {_why(e)}",
        fix=getattr(e, "fix", "") or "set routes=false",
    )


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


# -- a replay: the dump's recorded routes ------------------------------------------------------------
# A dump's recorded routes (slime / miles `rollout_routed_experts`, the parity format's `routed_experts`)
# become the recorded side's routes, and every replayed side records its own on the same forced tokens,
# so each pair of the replay compares the experts token by token and layer by layer (every token: the
# sides all routed the same input).
#
# A recorded routes array is [len(prompt) + len(response) - 1, layers, top_k] (row i: the routing at
# input position i; slime/utils/types.py and miles/utils/types.py reshape SGLang's return to
# (len(tokens) - 1, num_layers, moe_router_topk), vLLM's enable_return_routed_experts has the same
# layout). Its layer axis is either every decoder layer (slime's num_layers: dense layers' rows are
# zeros) or only the MoE layers; the rows kept for step j are from input position len(prompt) - 1 on,
# as the replayed sides' (parity_ui.core.routes). Routes recorded for another model are refused before
# any engine loads (`RouteShape.check`): another number of layers, another top-k, expert ids beyond the
# model's experts, or a row count that is not the row's tokens - 1.

RECORDED_SOURCE = "rollout dump"


@dataclass
class RouteShape:
    """What the model's config.json says its routes look like."""

    layers: list[int]  # decoder layer index of each MoE layer
    hidden_layers: int
    top_k: int
    experts: int

    def check(self, row: Any) -> str | None:
        """Why the row's recorded routes cannot be this model's; None when they can (or are absent)."""
        a = row.routed_experts
        if a is None:
            return None
        n, layers, k = a.shape
        want = len(row.prompt_ids) + len(row.response_ids) - 1
        if layers not in (len(self.layers), self.hidden_layers):
            return (
                f"routes for {layers} layers, and the model has {self.hidden_layers} layers "
                f"({len(self.layers)} of them MoE)"
            )
        if k != self.top_k:
            return f"routes choose {k} experts a token, and the model {self.top_k}"
        if n != want:
            return (
                f"routes for {n} positions, and the row has {want} (prompt + response - 1: the last "
                "token routes nothing that is scored)"
            )
        top = int(a.max()) if a.size else 0
        if top >= self.experts or (a.size and int(a.min()) < 0):
            return (
                f"expert id {top if top >= self.experts else int(a.min())} outside the model's {self.experts} experts"
            )
        return None

    def routes(self, row: Any) -> Routes:
        """The row's recorded routes as Routes from input position 0 (ids only: a dump records no
        weights or margins)."""
        a = row.routed_experts
        if a.shape[1] != len(self.layers):  # every decoder layer recorded: keep the MoE ones
            a = a[:, self.layers, :]
        return Routes(
            layers=list(self.layers),
            top_k=self.top_k,
            num_experts=self.experts,
            ids=[int(x) for x in a.reshape(-1).tolist()],
            source=RECORDED_SOURCE,
        )


def route_shape(model_path: str) -> RouteShape | None:
    """The model's MoE layers, top-k and expert count from its config.json; None for a dense model.
    MoE layers: all but the first `first_k_dense_replace` (DeepSeek, GLM-4-MoE), the `mlp_only_layers`
    and those off the `decoder_sparse_step` (Qwen-MoE)."""
    shape = moe_shape(model_path)
    if shape is None:
        return None
    try:
        cfg: dict[str, Any] = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config") or cfg
    n = int(cfg.get("num_hidden_layers") or 0)
    layers = moe_layer_indices(
        n, cfg.get("first_k_dense_replace") or 0, cfg.get("mlp_only_layers") or [], cfg.get("decoder_sparse_step") or 1
    )
    return RouteShape(layers=layers, hidden_layers=n, top_k=shape[1], experts=shape[0])


class DumpRoutesCheck:
    """The dump's recorded routes checked against the model row by row, in the preflight's pass."""

    def __init__(self, model_path: str, routes: bool):
        self.shape = route_shape(model_path) if routes else None
        self.on = routes
        self.bad: list[str] = []
        self.rows = 0

    def see(self, row: Any) -> None:
        if row.routed_experts is None:
            return
        self.rows += 1
        if self.shape is not None:
            why = self.shape.check(row)
            if why:
                self.bad.append(f"{row.where}: {why}")

    def raise_if_bad(self) -> None:
        if self.on and self.rows and self.shape is None:
            raise ParityError(
                "the dump records routed experts, and the model has no mixture-of-experts layers in "
                "its config.json: they were recorded for another model",
                "replay the dump with the model the run trained (--model), or drop routes=true",
            )
        if self.bad:
            more = f"; and {len(self.bad) - 3} more" if len(self.bad) > 3 else ""
            raise ParityError(
                f"the dump's recorded routes are not this model's ({len(self.bad)} rows): "
                + "; ".join(self.bad[:3])
                + more,
                "replay the dump with the model the run trained (--model), or drop routes=true to "
                "replay without comparing routes",
                code="replay-routes-shape",
            )

    def findings(self) -> list[Finding]:
        if self.rows and not self.on:
            return [
                Finding(
                    "replay-routes-off",
                    "info",
                    f"{self.rows} rows of the dump record the rollout engine's routed experts; they are not compared",
                    "set routes=true to compare them with the replayed sides' routes",
                    setting={"key": "routes", "value": True},
                )
            ]
        return []
