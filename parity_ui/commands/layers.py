"""Where inside the model do two sides part? Layer-by-layer localisation of a divergence.

Both sides are teacher-forced with the same ids (the prompt plus the common prefix up to the
divergence, or up to the asked position) and capture, per decoder layer, the attention output, the
MLP output and the residual stream after the layer, plus the final norm and the logits, at the
divergence position and a few before it (parity_ui.engines.capture). Per layer and block: the
relative L2 error and the cosine similarity of side b against side a.

The noise floor is measured, not assumed: side a is captured a second time with rounding-level
noise (half its dtype's epsilon, relative) injected into the residual stream entering every layer.
What that changes at each layer is what "agree up to rounding in this dtype" looks like there; a
block whose error exceeds FLOOR_MULTIPLE times it (and an absolute minimum for exact-zero floors)
has left the noise floor.
"""

from __future__ import annotations

import dataclasses
import math
import time
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..analysis.compare import first_mismatch
from ..core.config import config_from_dict
from ..core.errors import ParityError
from ..core.kinds import VllmOptions, get_kind
from ..core.mapping import option
from ..core.requests import CaptureRequest
from ..core.runlog import EventCallback, RunEvent
from ..core.types import FLOOR_MULTIPLE, MIN_REL, Localisation, Run
from ..run.prepare import plan_sides
from ..run.worker_client import Capture

if TYPE_CHECKING:
    from .service_api import Service

EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
BEFORE = (1, 2, 4, 8, 16)  # positions before the divergence also captured: local jump or slow drift
BLOCK_ORDER = ("attn", "mlp", "residual")


class LayersError(ParityError):
    code = "layers"


@dataclass
class BlockFigure:
    layer: int | None  # None: after the last layer (final norm, logits)
    block: str  # attn | mlp | residual | norm | logits
    rel_l2: list[float]  # per captured position, the divergence position first
    cosine: list[float]
    floor: list[float]  # the measured noise floor's relative L2 at the same place

    def over_floor(self, i: int = 0) -> bool:
        return self.rel_l2[i] > max(FLOOR_MULTIPLE * self.floor[i], MIN_REL)


# -- figures ---------------------------------------------------------------------------------------


def _rows(capture: Capture, name: str) -> list[array]:
    flat = array("f")
    flat.frombytes(capture.data[name])
    dim = capture.dims[name]
    return [flat[i * dim : (i + 1) * dim] for i in range(len(flat) // dim)]


def rel_l2(a: array, b: array) -> float:
    num = math.fsum((x - y) ** 2 for x, y in zip(a, b))
    den = math.fsum(x * x for x in a)
    return math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)


def cosine(a: array, b: array) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b))
    na, nb = math.sqrt(math.fsum(x * x for x in a)), math.sqrt(math.fsum(y * y for y in b))
    return dot / (na * nb) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)


def _block_of(name: str) -> tuple[int | None, str]:
    if name.startswith("L"):
        layer, block = name[1:].split(".", 1)
        return int(layer), block
    return None, {"final_norm": "norm"}.get(name, name)


def figures(cap_a: Capture, cap_b: Capture, floor: Capture) -> list[BlockFigure]:
    """Per captured block, in forward order: b against a, and a's noisy run against a."""
    out = []
    for name in cap_a.names:
        ra, rb, rf = _rows(cap_a, name), _rows(cap_b, name), _rows(floor, name)
        layer, block = _block_of(name)
        out.append(
            BlockFigure(
                layer,
                block,
                [rel_l2(x, y) for x, y in zip(ra, rb)],
                [cosine(x, y) for x, y in zip(ra, rb)],
                [rel_l2(x, y) for x, y in zip(ra, rf)],
            )
        )
    return out


def first_divergent(figs: list[BlockFigure]) -> BlockFigure | None:
    """The first block, in forward order, whose error at the examined position leaves the floor.
    Within a layer: attention, then MLP, then the stream (a stream that leaves the floor while both
    blocks stay within it points at a norm)."""
    for f in figs:
        if f.over_floor(0):
            return f
    return None


def _growth(figs: list[BlockFigure], start: BlockFigure) -> str:
    stream = [f for f in figs if f.block == "residual"]
    if not stream or start.layer is None:
        return ""
    at = next((f for f in stream if f.layer == start.layer), stream[0])
    last = stream[-1]
    if at.rel_l2[0] <= 0 or at.layer == last.layer:
        return ""
    ratio = last.rel_l2[0] / at.rel_l2[0]
    per = ratio ** (1 / max(1, (last.layer or 0) - (at.layer or 0))) if ratio > 0 else 0
    return (
        f"the stream's error grows from {at.rel_l2[0]:.2e} after layer {at.layer} to {last.rel_l2[0]:.2e} after "
        f"layer {last.layer} ({ratio:.1f}x, about {per:.2f}x per layer)"
    )


def _drift(figs: list[BlockFigure], start: BlockFigure) -> str:
    if len(start.rel_l2) < 2:
        return ""
    earlier = [start.rel_l2[i] > max(FLOOR_MULTIPLE * start.floor[i], MIN_REL) for i in range(1, len(start.rel_l2))]
    if all(earlier):
        return "it is already over the floor at every earlier position captured: a systematic difference, not a jump"
    if not any(earlier):
        return "the earlier positions captured stay within the floor: a local jump at this position"
    return "some earlier positions are over the floor too: drift building up before the divergence"


def _logits(cap_a: Capture, cap_b: Capture, tokens: tuple[int | None, int | None]) -> dict[str, Any]:
    la, lb = _rows(cap_a, "logits")[0], _rows(cap_b, "logits")[0]
    ta, tb = max(range(len(la)), key=la.__getitem__), max(range(len(lb)), key=lb.__getitem__)
    out: dict[str, Any] = {"argmax_a": ta, "argmax_b": tb, "rel_l2": rel_l2(la, lb)}
    x, y = tokens
    if x is not None and y is not None and x != y:
        out.update(
            margin_a=la[x] - la[y], margin_b=lb[x] - lb[y], reproduces=(ta == x and tb == y), token_a=x, token_b=y
        )
    return out


def summarise(
    figs: list[BlockFigure], loc_logits: dict[str, Any], a: str, b: str, diverged: bool
) -> tuple[int | None, str | None, str]:
    first = first_divergent(figs)
    if first is None:
        head = (
            f"every layer of {b} stays within the noise floor of {a} at this position: the sides compute the "
            "same function up to rounding"
        )
        layer, block = None, None
    else:
        layer, block = first.layer, first.block
        block = "norm" if block == "residual" else block
        where = (
            f"layer {layer}'s {block}"
            if layer is not None
            else ("the final norm" if block == "norm" else "the logits (lm_head)")
        )
        head = (
            f"{b} leaves {a}'s noise floor first at {where}: relative error {first.rel_l2[0]:.2e} against a "
            f"floor of {first.floor[0]:.2e}"
        )
        extra = [x for x in (_growth(figs, first), _drift(figs, first)) if x]
        if extra:
            head += "; " + "; ".join(extra)
    if diverged and "reproduces" in loc_logits:
        m = loc_logits
        if m["reproduces"]:
            head += (
                f". The teacher-forced logits reproduce the fork ({a}'s margin {m['margin_a']:+.3g}, {b}'s "
                f"{m['margin_b']:+.3g} for {a}'s token over {b}'s)"
            )
            if first is None:
                head += ": a near-tie that rounding alone can flip"
        elif min(abs(m["margin_a"]), abs(m["margin_b"])) < 1e-6:
            tied = a if abs(m["margin_a"]) < 1e-6 else b
            head += (
                f". The two tokens are tied exactly in {tied}'s teacher-forced logits (margin "
                f"{m['margin_a']:+.3g} / {m['margin_b']:+.3g}): which one wins is decided by rounding in the "
                "kernels the run used and by argmax taking the lower id, so the fork is a tie, not drift"
            )
        elif m["argmax_a"] != m["argmax_b"]:
            # They part here too, at other tokens: the engines differ under one eager prefill at batch 1,
            # so batching or scheduling is not needed to explain it.
            head += (
                f". The teacher-forced logits part here too, at other tokens ({a} picks {m['argmax_a']}, {b} "
                f"{m['argmax_b']}; the run had {a} {m.get('token_a')} and {b} {m.get('token_b')}): the engines "
                "differ under one eager prefill at batch 1"
            )
        else:
            head += (
                ". The teacher-forced logits do not reproduce the fork (both pick the same token here): it "
                "came from how the run was batched, scheduled or compiled (this capture runs eagerly at batch "
                "1), not from the weights"
            )
    return layer, block, head + "."


# -- running it ------------------------------------------------------------------------------------


def positions_for(prompt_len: int, position: int) -> list[int]:
    """The id index whose output predicts generated token `position`, then a few before it."""
    target = prompt_len + position - 1
    return [target, *(target - k for k in BEFORE if target - k >= 0)]


@dataclass
class LayerPlan:
    """What one localisation captures: sides `a` and `b` teacher-forced with `ids` (the prompt and the
    common prefix) up to generated token `position`, where a chose tokens[0] and b tokens[1]."""

    a: str
    b: str
    position: int
    ids: list[int]
    tokens: tuple[int | None, int | None]
    diverged: bool  # `position` is the sides' first divergence


def parse_pair(text: str) -> tuple[str, str]:
    """ "ref,b" (the CLI's --sides) -> ("ref", "b"). Raises LayersError."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(names) != 2:
        raise LayersError(f"--sides needs two side names, got {text!r}", "e.g. --sides ref,b")
    return names[0], names[1]


def plan(run: Run, prompt_index: int, position: int | None, sides: tuple[str, str] | str | None) -> LayerPlan:
    """The capture for a stored run's comparison, with every bad input refused (LayersError).
    `sides`: the two sides, as a pair or as "a,b"; None: the reference and the first that diverged."""
    if isinstance(sides, str):
        sides = parse_pair(sides) if sides.strip() else None
    if not 0 <= prompt_index < len(run.prompts):
        raise LayersError(
            f"run {run.id} has {len(run.prompts)} prompt(s); there is no prompt {prompt_index}",
            f"use --prompt 0..{len(run.prompts) - 1}",
        )
    pr = run.prompts[prompt_index]
    if pr.images:
        raise LayersError(
            f"prompt {prompt_index} of run {run.id} has images: layer capture replays token ids only "
            "and cannot pass the images to the engines yet",
            "localise a text prompt; for image prompts compare the streams and the image findings",
        )
    names = [s.name for s in run.sides]
    a, b = sides or (
        run.reference,
        next((c.b for c in pr.comparisons if not c.identical), names[1] if len(names) > 1 else None),
    )
    if a is None or b is None:
        raise LayersError(
            f"run {run.id} has no two sides to localise between (sides: {', '.join(names)})",
            "name two sides of this run with --sides a,b",
        )
    for n in (a, b):
        if n not in pr.results:
            raise LayersError(
                f"run {run.id} has no result for side {n!r} (sides: {', '.join(names)})",
                "name two sides of this run with --sides a,b",
            )
    if a == b:
        raise LayersError("the two sides are the same", "name two different sides with --sides a,b")
    for n in (a, b):
        info = run.side(n)
        assert info is not None, f"side {n} has a result, so the run lists it"
        if info.kind == "recorded":  # a replay's recorded rollout: logprobs from a dump, no model behind them
            raise LayersError(
                f"side {n} is the dump's recorded rollout: there is no model to capture",
                "localise between the trainer and an engine re-run of the replay: --sides "
                f"{run.reference},{next((x for x in names[1:] if x != n), 'b')}",
            )
        kind = get_kind(info.kind)
        if not kind.can_capture_layers:
            raise LayersError(
                f"side {n} is a {kind.label}: layer capture needs in-process access to the model",
                "localise between in-process sides (kinds vllm, hf); add such a side with the same "
                "setup as the server to the run",
            )
    ra, rb = pr.results[a], pr.results[b]
    comp = next((c for c in pr.comparisons if {c.a, c.b} == {a, b}), None)
    # A run compares each side with its reference only: a pair of two other sides is compared here.
    d = comp.first_divergence if comp is not None else first_mismatch(ra.token_ids, rb.token_ids)
    diverged = d is not None
    if position is None and run.kind == "replay":
        position = _worst_position(run, prompt_index)
    if position is None:
        if d is None:
            raise LayersError(
                f"sides {a} and {b} never diverged on prompt {prompt_index}: there is nothing to localise",
                "localise at a chosen generated-token position with --position N",
            )
        position = d
    if d is not None and position > d:
        raise LayersError(
            f"position {position} is after the divergence at {d}: the sides no longer see the same ids",
            f"choose --position from 0 to {d}",
        )
    last = d if d is not None else min(len(ra.token_ids), len(rb.token_ids)) - 1
    if not 0 <= position <= last:
        raise LayersError(
            f"position {position} is past what both sides share (0..{last})", f"choose --position from 0 to {last}"
        )
    ids = list(pr.prompt_token_ids) + list(ra.token_ids[:position])
    tok = (
        ra.token_ids[position] if position < len(ra.token_ids) else None,
        rb.token_ids[position] if position < len(rb.token_ids) else None,
    )
    return LayerPlan(a, b, position, ids, tok, diverged and position == d)


def _worst_position(run: Run, prompt_index: int) -> int:
    """A replayed row's token to localise when none is asked: its worst token (the largest |Δ| of the
    run's own pair, parity_ui.commands.replay), the one the replay view opens."""
    record = run.workload.replay if run.workload is not None else None
    worst = [w for w in (record.worst_tokens if record is not None else []) if w.prompt_index == prompt_index]
    if not worst:
        raise LayersError(
            f"row {prompt_index} of replay {run.id} has none of the replay's worst tokens",
            "choose the token to localise with --position N",
        )
    return max(worst, key=lambda w: abs(w.dlogp)).position


def _eager(spec: Any) -> Any:
    """Hooks do not fire inside CUDA graphs or compiled graphs: vLLM captures on an eager model."""
    return spec.replace(enforce_eager=True) if isinstance(spec.options, VllmOptions) else spec


def localise(
    service: Service,
    run: Run,
    prompt_index: int = 0,
    position: int | None = None,
    sides: tuple[str, str] | str | None = None,
    emit: EventCallback | None = None,
) -> Localisation:
    """Capture both sides and name where they part. Raises ParityError (LayersError, EngineError)."""
    t0 = time.perf_counter()
    emit = emit or (lambda e: None)
    lp = plan(run, prompt_index, position, sides)
    a, b = lp.a, lp.b
    cfg = config_from_dict(run.config)
    specs = {s.name: s for s in cfg.sides}
    chosen = [_eager(specs[a]), _eager(specs[b])]
    notes = []
    for s, orig in zip(chosen, (specs[a], specs[b])):
        eager = option(orig, "enforce_eager", True)
        would_graph = eager is False or (eager is None and service.on_gpu)
        if s is not orig and would_graph:
            notes.append(
                f"side {s.name} was captured with enforce_eager=true (hooks do not fire inside CUDA graphs); "
                "a divergence that only CUDA graphs or compilation cause does not show here"
            )
    # The capture feeds the stored ids and predicts one token: that is the context each side needs.
    plans = plan_sides(
        run.model.path, dataclasses.replace(cfg, sides=chosen), service.on_gpu, context_need=len(lp.ids) + 1
    )
    positions = positions_for(len(run.prompts[prompt_index].prompt_token_ids), lp.position)
    dtype = plans[0].dtype
    eps = EPS.get(dtype, EPS["float32"]) / 2
    asked = [
        (a, CaptureRequest(lp.ids, positions)),
        (b, CaptureRequest(lp.ids, positions)),
        (a, CaptureRequest(lp.ids, positions, noise_eps=eps, seed=1)),
    ]
    with service.sides(plans, emit=emit) as running:
        caps = []
        for side, req in asked:
            emit(
                RunEvent(
                    "status",
                    f"{side}: capturing {len(req.positions)} position(s) of every layer"
                    + (" (noise-floor run)" if req.noise_eps else ""),
                    side=side,
                )
            )
            caps.append(running.capture(side, req))
        routes, said = _routers(run, plans, running, lp, positions, notes, emit)
    figs = figures(caps[0], caps[1], caps[2])
    logits = _logits(caps[0], caps[1], lp.tokens)
    layer, block, summary = summarise(figs, logits, a, b, lp.diverged)
    summary = f"{summary} {said}" if said else summary
    stream = [f for f in figs if f.block == "residual"]
    return Localisation(
        run_id=run.id,
        prompt_index=prompt_index,
        a=a,
        b=b,
        position=lp.position,
        token_positions=positions,
        first_divergent_layer=layer,
        first_divergent_block=block,
        noise_floor={
            "method": f"measured: side {a} against itself with rounding-level noise (relative {eps:.2e}, half "
            f"of {dtype}'s epsilon) injected into the residual stream entering every layer; a block "
            f"leaves the floor above {FLOOR_MULTIPLE:g}x it",
            "dtype": dtype,
            "residual": [f.floor[0] for f in stream],
        },
        per_layer=[dataclasses.asdict(f) for f in figs],
        summary=summary,
        logits=logits,
        notes=notes,
        seconds=round(time.perf_counter() - t0, 3),
        routes=routes,
    )


def _routers(
    run: Run, plans: list[Any], running: Any, lp: LayerPlan, positions: list[int], notes: list[str], emit: EventCallback
) -> tuple[dict[str, Any] | None, str]:
    """MoE models: both sides' routers at the captured positions (parity_ui.commands.layer_routes), with
    the same ids as the hidden states; (None, "") for a dense model. A side that cannot record them
    leaves a note, and the localisation stands without them."""
    from ..core.requests import RoutesRequest
    from ..run.preflight_moe import moe_shape
    from .layer_routes import router_view

    if moe_shape(run.model.path) is None:
        return None, ""
    got = []
    for p in plans[:2]:
        emit(RunEvent("status", f"{p.name}: recording the routers at the captured positions", side=p.name))
        try:
            got.append(running.routes(p.name, RoutesRequest(lp.ids, positions)))
        except Exception as e:  # noqa: BLE001 - the hidden-state localisation stands without the routers
            notes.append(f"the routers of side {p.name} were not recorded: {getattr(e, 'message', None) or e}")
            return None, ""
    return router_view(got[0], got[1], positions, lp.a, lp.b)


def failed(
    run: Run, prompt_index: int, position: int | None, sides: tuple[str, str] | str | None, error: ParityError
) -> Localisation:
    """A localisation that could not run, to be stored with its run (nothing the user asked is lost)."""
    a, b = sides if isinstance(sides, tuple) else (run.reference or "", "")
    return Localisation(
        run_id=run.id,
        prompt_index=prompt_index,
        a=a,
        b=b,
        position=-1 if position is None else position,
        token_positions=[],
        first_divergent_layer=None,
        first_divergent_block=None,
        noise_floor={},
        per_layer=[],
        summary=str(error),
        error=str(error),
    )
