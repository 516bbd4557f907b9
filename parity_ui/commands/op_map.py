"""The op map of a stored run's divergence (`parity layers ID --ops`): every layer, every op, every token of
a window, the error each op of side b ADDS (fed side a's input there) beside the error piled up by then,
against a measured floor; with `--swap LAYER.OP` the causal check. parity_ui.core.op_map is the
record, parity_ui.engines.op_trace the capture.

The passes (each one teacher-forced forward over the prompt and the common tokens, eager, unchunked):
  1. side a dumps every op's output to a scratch file (memory where it fits, measures.scratch);
  2. side b is traced against it: cumulative and added error per cell;
  3. side a is traced against its own file with rounding-level noise (half its dtype's epsilon) in the
     stream entering every layer and in every op's input: the floor of both kinds of error;
  4. (--swap) side b again, the op's output replaced by a's at every position: before and after;
  5. (an fp32 side in the run, a or b not fp32) three-way: the fp32 side dumps, a and b are traced
     against it: is b's error within a's own rounding error against fp32?
Nothing is stored but statistics (core.op_map.BYTES_PER_CELL a cell); the scratch file is deleted.

Bad input is refused before anything loads: an architecture the capture does not know (named, with
what it supports), a window larger than memory or the stored map can hold (the estimate named), a swap
of an op that is not in the map.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.config import config_from_dict
from ..core.op_map import (
    NOT_SWAPPABLE,
    OP_LABELS,
    OPS_FINAL,
    THREE_WAY_MULTIPLE,
    OpMap,
    OpShape,
    UnknownArchitecture,
    pack,
    parse_cell,
    row_label,
    shape_from_config,
    supported_text,
)
from ..core.requests import OpTraceRequest
from ..core.runlog import EventCallback, RunEvent
from ..core.types import FLOOR_MULTIPLE, Localisation, Run
from ..measures.scratch import available_memory, scratch_dir
from ..run.prepare import plan_sides
from .layers import BEFORE, EPS, LayersError, plan

if TYPE_CHECKING:
    from .service_api import Service

MAX_CELLS = 600_000  # a stored map's cells at most (48 MB of figures): 30 layers x 13 ops x ~1,500 tokens
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


# -- what is asked, checked before anything loads ---------------------------------------------------


def model_shape(path: str) -> OpShape:
    """The model's op shape from its config.json; LayersError naming an architecture the capture does not know."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise LayersError(f"cannot read {path}/config.json for the op map ({e})", "check the model folder") from None
    try:
        return shape_from_config(cfg)
    except UnknownArchitecture as e:
        raise LayersError(
            f"the op map does not know the layers of {e} (it captures {supported_text()})",
            "run `parity layers` without --ops for the block-level localisation of this model",
        ) from None
    except (KeyError, TypeError, ValueError) as e:
        raise LayersError(f"{path}/config.json lacks what the op map needs ({e})", "check the model folder") from None


def parse_window(text: str | None, n: int) -> tuple[list[int] | None, str]:
    """The positions of the map (indices into the n teacher-forced ids): None for "all" / unset (every
    position, or the last ones that fit); "N" the last N positions; "A:B" positions A..B-1 (B may be
    left out). Returns (positions or None, how it was read)."""
    t = (text or "").strip().lower()
    if t in ("", "all"):
        return None, "every position"
    try:
        if ":" in t:
            a, b = t.split(":", 1)
            start, stop = int(a or 0), int(b) if b else n
        else:
            k = int(t)
            if k <= 0:
                raise ValueError
            start, stop = max(0, n - k), n
    except ValueError:
        raise LayersError(
            f"--window {text!r} is not a window", "use N (the last N positions), A:B (positions A..B-1) or all"
        ) from None
    if not 0 <= start < stop <= n:
        raise LayersError(
            f"--window {text!r} is outside the {n} positions mapped (the prompt and the tokens both sides share)",
            f"use positions within 0:{n}",
        )
    return list(range(start, stop)), f"positions {start}..{stop - 1}"


def parse_swap(text: str | None, shape: OpShape) -> tuple[int, str] | None:
    if not text:
        return None
    try:
        layer, op = parse_cell(text, shape.layers, shape.ops())
    except ValueError as e:
        raise LayersError(f"--swap: {e}", "name an op of the map, e.g. --swap 0.q or --swap final.norm") from None
    if op in NOT_SWAPPABLE:
        raise LayersError(
            f"--swap {text}: {OP_LABELS[op]} is a sum with no module of its own, nothing to swap in",
            f"swap the op before it (e.g. --swap {layer}.o_proj) or the layer output ({layer}.out)",
        )
    if op == "logits":
        raise LayersError("--swap final.logits: nothing runs after the logits", "swap final.norm or an earlier op")
    return layer, op


def budget(shape: OpShape, n: int, dtype: str, swap: tuple[int, str] | None, sides: int) -> tuple[int, int, int]:
    """(bytes a map of the whole window needs in memory per position, the fixed part, what is free):
    each dumping side's file and its copy while written (2x), k and v at every position."""
    item = ITEMSIZE.get(dtype, 4)
    full = (swap[1],) if swap else ()
    per_pos = 2 * sides * shape.dump_bytes(1, 0, item)
    fixed = 2 * sides * shape.dump_bytes(0, n, item, full)
    free = available_memory() or 0
    return per_pos, fixed, free


def choose_window(
    asked: list[int] | None, n: int, shape: OpShape, dtype: str, swap: tuple[int, str] | None, sides: int
) -> tuple[list[int], list[str]]:
    """The map's positions: as asked, refused with the estimate when too large; unasked, every position
    or the last ones that fit (said in a note)."""
    rows = len(shape.rows())
    per_pos, fixed, free = budget(shape, n, dtype, swap, sides)
    room = int(free * 0.5) - fixed
    fit_mem = room // per_pos if per_pos else n
    fit = max(0, min(n, fit_mem, MAX_CELLS // rows))
    need = fixed + per_pos * (len(asked) if asked else n)
    if asked is not None:
        if len(asked) > fit:
            why = (
                f"about {need / 2**30:.2f} GiB of the reference's tensors ({per_pos / 2**20:.2f} MiB a position, "
                f"{fixed / 2**20:.0f} MiB for k and v at every position) against {free / 2**30:.1f} GiB free "
                "(half of it may be used)"
                if len(asked) > fit_mem
                else f"{len(asked) * rows:,} cells against the {MAX_CELLS:,} a stored map holds"
            )
            raise LayersError(
                f"the op map over {len(asked)} positions needs {why}",
                f"choose a smaller --window (at most {fit} positions fit)"
                if fit
                else "free memory, or map a shorter prompt",
            )
        return asked, []
    if fit >= n:
        return list(range(n)), []
    if fit <= 0:
        raise LayersError(
            f"the op map needs about {fixed / 2**30:.2f} GiB for k and v at the {n} positions alone, against "
            f"{free / 2**30:.1f} GiB free",
            "free memory, or map a shorter prompt",
        )
    return list(range(n - fit, n)), [
        f"the window is the last {fit} of the {n} positions (every position would need about "
        f"{(fixed + per_pos * n) / 2**30:.2f} GiB or {n * rows:,} cells); pick another with --window"
    ]


# -- running it ---------------------------------------------------------------------------------


@dataclass
class Pair:
    a: str
    b: str
    fp32: str | None  # a float32 side of the run, for the three-way view


def _prepared_specs(cfg: Any, names: list[str], service: Service, notes: list[str]) -> list[Any]:
    """The sides as the op map runs them: vLLM eager and unchunked (hooks do not fire inside CUDA graphs,
    a decode dump under graphs is worthless, and the added attention needs the whole prefill in one
    forward), said where that is not how the side ran."""
    from ..core.kinds import VllmOptions

    specs = {s.name: s for s in cfg.sides}
    out = []
    for name in names:
        s = specs[name]
        if isinstance(s.options, VllmOptions):
            eager = s.options.enforce_eager
            if eager is False or (eager is None and service.on_gpu):
                notes.append(
                    f"side {name} ran with CUDA graphs; the op map re-ran it eager (hooks do not fire inside "
                    "graphs, and a decode step's dump under graphs is worthless): a divergence that only graphs "
                    "or compilation cause does not show here"
                )
            if s.options.enable_chunked_prefill:
                notes.append(f"side {name} prefills in chunks; the op map prefilled it in one piece")
            s = s.replace(enforce_eager=True, enable_chunked_prefill=False)
        out.append(s)
    return out


def _fp32_side(run: Run, a: str, b: str, dtypes: dict[str, str]) -> str | None:
    from ..core.kinds import get_kind

    if dtypes.get(a) == "float32" and dtypes.get(b) == "float32":
        return None
    for s in run.sides:
        if s.name not in (a, b) and (s.dtype or "") == "float32" and get_kind(s.kind).can_capture_layers:
            return s.name
    return None


def _arr(raw: dict[str, Any], name: str, shape: tuple[int, ...], dtype: str = "<f4") -> Any:
    import numpy as np

    return np.frombuffer(raw[name], dtype=dtype).reshape(shape).copy()


def op_localise(
    service: Service,
    run: Run,
    prompt_index: int = 0,
    position: int | None = None,
    sides: tuple[str, str] | str | None = None,
    window: str | None = None,
    swap: str | None = None,
    emit: EventCallback | None = None,
) -> Localisation:
    """The op map (and the swap) of one comparison, as a Localisation carrying `op_map`. Raises ParityError."""
    from ..inputs.prompts import tokenizer_for

    t0 = time.perf_counter()
    emit = emit or (lambda e: None)
    lp = plan(run, prompt_index, position, sides)
    shape = model_shape(run.model.path)
    swap_cell = parse_swap(swap, shape)
    n = len(lp.ids)
    asked, _ = parse_window(window, n)
    cfg = config_from_dict(run.config)
    dtypes = {s.name: s.dtype for s in run.sides}
    pair = Pair(lp.a, lp.b, _fp32_side(run, lp.a, lp.b, dtypes))
    names = [pair.a, pair.b] + ([pair.fp32] if pair.fp32 else [])
    notes: list[str] = []
    chosen = _prepared_specs(cfg, names, service, notes)
    plans = plan_sides(run.model.path, dataclasses.replace(cfg, sides=chosen), service.on_gpu, context_need=n + 1)
    dtype = plans[0].dtype
    positions, said = choose_window(asked, n, shape, dtype, swap_cell, 2 if pair.fp32 else 1)
    notes += said
    examined = n - 1  # the position whose logits predict the examined token
    if examined not in positions:
        notes.append(f"the examined token's position ({examined}) is outside the window")
    eps = EPS.get(dtype, EPS["float32"]) / 2
    full_ops = [swap_cell[1]] if swap_cell else []
    if swap_cell and swap_cell[1] == "router":
        full_ops.append("router")
    need = 2 * shape.dump_bytes(len(positions), n, ITEMSIZE.get(dtype, 4), tuple(full_ops))
    scratch = scratch_dir(need)
    try:
        with service.sides(plans, emit=emit) as running:

            def ask(side: str, req: OpTraceRequest, what: str) -> dict[str, Any]:
                emit(RunEvent("status", f"{side}: {what}", side=side))
                return running.op_trace(side, req)

            ref = str(Path(scratch.path) / "reference.safetensors")
            ids = lp.ids
            dumped = ask(
                pair.a,
                OpTraceRequest(ids, positions, dump_to=ref, full_ops=full_ops),
                f"dumping every op of every layer at {len(positions)} position(s)",
            )
            traced = ask(pair.b, OpTraceRequest(ids, positions, reference=ref), f"every op against {pair.a}'s")
            floor = ask(
                pair.a,
                OpTraceRequest(ids, positions, reference=ref, noise_eps=eps, seed=1),
                f"the noise floor (rounding noise {eps:.1e} in every op's input)",
            )
            after = None
            if swap_cell is not None:
                after = ask(
                    pair.b,
                    OpTraceRequest(ids, positions, reference=ref, swap=list(swap_cell), added=False),
                    f"again with {pair.a}'s {row_label(*swap_cell, shape.layers)} swapped in",
                )
            three = None
            if pair.fp32:
                f32 = str(Path(scratch.path) / "fp32.safetensors")
                ask(pair.fp32, OpTraceRequest(ids, positions, dump_to=f32), "dumping every op (the fp32 reference)")
                three = (
                    ask(pair.a, OpTraceRequest(ids, positions, reference=f32), "every op against fp32"),
                    ask(pair.b, OpTraceRequest(ids, positions, reference=f32), "every op against fp32"),
                )
    finally:
        shutil.rmtree(scratch.path, ignore_errors=True)
    rows = [(int(a), str(b)) for a, b in traced["rows"]]
    if rows != shape.rows():
        raise LayersError(
            f"side {pair.b}'s layers ({len(rows)} map rows) are not those of the run's model ({len(shape.rows())})",
            "map two sides of the same architecture",
        )
    R, T = len(rows), len(positions)
    stats = {k: _arr(traced["stats"], k, (R, T)) for k in traced["stats"]}
    stats["floor_cum"] = _arr(floor["stats"], "cum_rel", (R, T))
    stats["floor_add"] = _arr(floor["stats"], "add_rel", (R, T))
    tops = {k: _arr(traced["tops"], k, (R, T, 3), "<i4" if k.endswith("idx") else "<f4") for k in traced["tops"]}
    tok = tokenizer_for(run.model.path, run.model.trust_remote_code)
    texts = tok.texts([lp.ids[p] for p in positions])
    routers = {
        int(layer): {
            "margin_a": v["margin_ref"],
            "margin_b": v["margin_side"],
            "same": v["same"],
        }
        for layer, v in (traced.get("routers") or {}).items()
    }
    m = OpMap(
        arch=shape.arch,
        layers=shape.layers,
        rows=rows,
        positions=positions,
        prompt_len=len(run.prompts[prompt_index].prompt_token_ids),
        examined=examined,
        token_text=texts,
        stats=stats,
        tops=tops,
        routers=routers,
        notes=[],
    )
    if three is not None:
        m.three_way = {
            "side": pair.fp32,
            "a_add": _arr(three[0]["stats"], "add_rel", (R, T)),
            "a_cum": _arr(three[0]["stats"], "cum_rel", (R, T)),
            "b_add": _arr(three[1]["stats"], "add_rel", (R, T)),
            "b_cum": _arr(three[1]["stats"], "cum_rel", (R, T)),
        }
    argmax = {"a": traced["ref_argmax"], "b": traced["argmax"]}
    if after is not None and swap_cell is not None:
        m.swap = swap_record(m, swap_cell, _arr(after["stats"], "cum_rel", (R, T)), argmax, after["argmax"], pair)
    layer, block, summary = summarise(m, pair, argmax, lp.tokens, lp.diverged)
    m.notes = notes
    seconds = round(time.perf_counter() - t0, 3)
    timing = {k: v.get("seconds") for k, v in (("dump", dumped), ("trace", traced), ("floor", floor))}
    noise = {
        "method": f"measured: side {pair.a} against its own dump with rounding-level noise (relative {eps:.2e}, half "
        f"of {dtype}'s epsilon) in the stream entering every layer (the cumulative floor) and in every op's input "
        f"(the added floor); a cell leaves the floor above {FLOOR_MULTIPLE:g}x the larger of its own floor and its "
        "row's median",
        "dtype": dtype,
        "passes_s": timing,
    }
    per_layer, token_positions = _blocks(m)
    return Localisation(
        run_id=run.id,
        prompt_index=prompt_index,
        a=pair.a,
        b=pair.b,
        position=lp.position,
        token_positions=token_positions,
        first_divergent_layer=layer,
        first_divergent_block=block,
        noise_floor=noise,
        per_layer=per_layer,
        summary=summary,
        logits=_logits(m, argmax, lp.tokens),
        notes=notes,
        seconds=seconds,
        op_map=m.to_dict(),
    )


# -- what the figures say -----------------------------------------------------------------------


def _at(m: OpMap, r: int, t: int) -> str:
    p = m.positions[t]
    where = f"generated token {p - m.prompt_len}" if p >= m.prompt_len else f"prompt token {p}"
    return f"position {p} ({where}, {m.token_text[t]!r})"


def summarise(
    m: OpMap, pair: Pair, argmax: dict[str, list[int]], tokens: tuple[int | None, int | None], diverged: bool
) -> tuple[int | None, str | None, str]:
    """(first layer, first op, the sentence) of a map: where b's own ops first add error beyond the floor."""
    first = m.first_over("add")
    cum = m.first_over("cum")
    a, b = pair.a, pair.b
    if first is None:
        layer, op = None, None
        head = f"every op of {b}, fed {a}'s input, stays within {a}'s noise floor at every position of the window"
        if cum is not None:
            head += (
                f"; the error piled up through the layers still leaves the floor first at {m.label(cum[0])}, "
                f"{_at(m, *cum)}: small differences of many ops, each within the floor, add up"
            )
    else:
        r, t = first
        layer_i, op = m.rows[r]
        layer = None if layer_i < 0 or layer_i >= m.layers else layer_i
        add, thr = float(m.stats["add_rel"][r, t]), float(m.threshold("add")[r, t])
        head = (
            f"{b}'s own ops first add error at {m.label(r)} ({OP_LABELS.get(op, op)}), {_at(m, r, t)}: fed {a}'s "
            f"input there, its output is {add:.2e} (relative L2) from {a}'s, over the floor's {thr / FLOOR_MULTIPLE:.2e} "
            f"(x{FLOOR_MULTIPLE:g}: {thr:.2e})"
        )
        over_tokens = int(m.over("add")[r].sum())
        head += f"; the op adds error beyond the floor at {over_tokens} of {len(m.positions)} position(s)"
        later = [m.label(i) for i in range(r + 1, len(m.rows)) if m.over("add")[i].any()]
        if later:
            head += f", and {len(later)} later op(s) add their own too (first {later[0]})"
        if cum is not None and cum[0] < r:
            head += f"; the cumulative error leaves the floor earlier, at {m.label(cum[0])} (added errors within the floor piling up)"
        if op == "router" and layer_i in m.routers:
            rt = m.routers[layer_i]
            flips = [i for i, s in enumerate(rt["same"]) if s < 1]
            margin = rt["margin_a"][t]
            head += f"; the router's margin there is {margin:.3g}" + (
                f", and its experts differ from {a}'s at {len(flips)} position(s)"
                if flips
                else ", the same experts chosen"
            )
        if m.three_way is not None:
            tw = m.three_way
            ratio = float(tw["b_add"][r, t]) / max(float(tw["a_add"][r, t]), 1e-30)
            head += f"; against the fp32 side {tw['side']}, {b}'s added error there is {ratio:.2g}x {a}'s own " + (
                "(within its own rounding)" if ratio <= THREE_WAY_MULTIPLE else "(beyond its own rounding)"
            )
    beyond = m.beyond_fp32("add")
    if beyond is not None and m.three_way is not None:
        rows = [r for r in range(len(m.rows)) if beyond[r].any()]
        head += f". Three-way against the fp32 side {m.three_way['side']}: " + (
            f"{b}'s added error is beyond {THREE_WAY_MULTIPLE:g}x {a}'s own rounding error at {int(beyond.sum())} "
            f"cell(s) of {len(rows)} op(s), first {m.label(rows[0])}"
            if rows
            else f"every op of {b} is within {THREE_WAY_MULTIPLE:g}x {a}'s own rounding error against fp32"
        )
    t_ex = m.positions.index(m.examined) if m.examined in m.positions else None
    if t_ex is not None:
        x, y = tokens
        ra, rb = argmax["a"][t_ex], argmax["b"][t_ex]
        if diverged and x is not None and y is not None and x != y:
            if ra == x and rb == y:
                head += f". The teacher-forced logits reproduce the divergence ({a} picks {x}, {b} picks {y})"
                if first is None:
                    head += ": with every op within the floor, a near-tie that rounding alone can flip"
            elif ra != rb:
                head += (
                    f". The teacher-forced logits part here too, at other tokens ({a} picks {ra}, {b} {rb}; the run "
                    f"had {x} and {y}): the engines differ under one eager prefill at batch 1"
                )
            else:
                head += (
                    ". The teacher-forced logits do not reproduce the divergence here (one prefill at batch 1, eager): "
                    "it came from how the run was batched, scheduled or compiled"
                )
    if m.swap is not None:
        head += ". " + m.swap["sentence"]
    return layer, op, head + "."


def swap_record(
    m: OpMap, cell: tuple[int, str], after_cum: Any, argmax: dict[str, list[int]], after_argmax: list[int], pair: Pair
) -> dict[str, Any]:
    """Before and after swapping a's output of `cell` into b's forward: the cumulative error downstream of
    the op and at the logits, and whether b's argmax at the examined token is a's. The divergence is gone
    when, after the swap, no cell downstream of the op leaves the cumulative floor."""
    import numpy as np

    r = m.row_of(*cell)
    thr = m.threshold("cum")
    before_over = np.nan_to_num(m.stats["cum_rel"]) > thr
    after_over = np.nan_to_num(after_cum) > thr
    down = slice(r + 1, len(m.rows))
    lg = m.row_of(m.layers, "logits")
    t_ex = m.positions.index(m.examined) if m.examined in m.positions else len(m.positions) - 1

    def side(over: Any, cum: Any, am: list[int]) -> dict[str, Any]:
        return {
            "cells_over_downstream": int(over[down].sum()),
            "logits_over": int(over[lg].sum()),
            "logits_rel_examined": float(cum[lg, t_ex]),
            "logits_rel_max": float(np.nanmax(cum[lg])),
            "argmax_b_examined": int(am[t_ex]),
            "argmax_agrees": int(sum(x == y for x, y in zip(am, argmax["a"]))),
        }

    before = side(before_over, m.stats["cum_rel"], argmax["b"])
    after = side(after_over, after_cum, after_argmax)
    had = before["cells_over_downstream"] > 0
    removes = had and after["cells_over_downstream"] == 0
    label = m.label(r)
    if not had:
        sentence = (
            f"Swapping {pair.a}'s {label} into {pair.b}: nothing downstream of it was over the floor to begin with"
        )
    elif removes:
        sentence = (
            f"Swapping {pair.a}'s {label} into {pair.b} removes the divergence: downstream cells over the floor "
            f"{before['cells_over_downstream']} -> 0, the logits' error at the examined token "
            f"{before['logits_rel_examined']:.2e} -> {after['logits_rel_examined']:.2e}"
        )
    else:
        sentence = (
            f"Swapping {pair.a}'s {label} into {pair.b} does not remove the divergence: downstream cells over the "
            f"floor {before['cells_over_downstream']} -> {after['cells_over_downstream']}, the logits' error at the "
            f"examined token {before['logits_rel_examined']:.2e} -> {after['logits_rel_examined']:.2e} (another op "
            "adds error too)"
        )
    n = len(m.positions)
    sentence += f"; {pair.b}'s argmax agrees with {pair.a}'s at {before['argmax_agrees']} -> {after['argmax_agrees']} of {n} positions"
    return {
        "layer": cell[0],
        "op": cell[1],
        "label": label,
        "before": before,
        "after": after,
        "removes": removes,
        "sentence": sentence,
        "after_cum_rel": pack(after_cum),
    }


def _blocks(m: OpMap) -> tuple[list[dict[str, Any]], list[int]]:
    """The block-level figures `parity layers` shows (attention, MLP and stream per layer; final norm and
    logits), from the map's cumulative error at the examined position and a few before it."""
    want = [m.examined, *(m.examined - k for k in BEFORE)]
    cols = [m.positions.index(p) for p in want if p in m.positions]
    if not cols:
        cols = [len(m.positions) - 1]
    mlp = "experts" if "experts" in {op for _, op in m.rows} else "down"
    out = []
    for r, (layer, op) in enumerate(m.rows):
        block = {"o_proj": "attn", mlp: "mlp", "out": "residual", "norm": "norm", "logits": "logits"}.get(op)
        if block is None or (op in OPS_FINAL and layer < m.layers):
            continue
        out.append(
            {
                "layer": None if layer >= m.layers else layer,
                "block": block,
                "rel_l2": [float(m.stats["cum_rel"][r, c]) for c in cols],
                "cosine": [float(m.stats["cum_cos"][r, c]) for c in cols],
                "floor": [float(m.stats["floor_cum"][r, c]) for c in cols],
            }
        )
    return out, [m.positions[c] for c in cols]


def _logits(m: OpMap, argmax: dict[str, list[int]], tokens: tuple[int | None, int | None]) -> dict[str, Any]:
    t = m.positions.index(m.examined) if m.examined in m.positions else len(m.positions) - 1
    lg = m.row_of(m.layers, "logits")
    out: dict[str, Any] = {
        "argmax_a": argmax["a"][t],
        "argmax_b": argmax["b"][t],
        "rel_l2": float(m.stats["cum_rel"][lg, t]),
    }
    x, y = tokens
    if x is not None and y is not None and x != y:
        out["reproduces"] = argmax["a"][t] == x and argmax["b"][t] == y
    return out
