"""Sweeps: one prompt across a small grid of settings; which settings move the divergence point?

Each grid point is a normal stored run (kind "sweep") sharing one group_id. `summarize_sweep` is a
pure function of the points' runs: for each grid key, whether changing only that key moved the first
divergence.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from ..core.config import build_config
from ..core.errors import ConfigError, ParityError
from ..core.runlog import EventCallback
from ..core.types import Run
from ..inputs.prompts import PromptSpec
from ..run.prepare import RunRequest
from ..store.runs import new_run_id

if TYPE_CHECKING:
    from .service_api import Service

MAX_POINTS = 32  # each point may reload vLLM (tens of seconds on CPU): keep grids small
# Keys that change no side's load: varied innermost, so warm workers are reused. Side options
# (SIDE.key) and the rest change what a side loads.
RUNTIME_KEYS = {
    "batch_size",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "stop_token_ids",
    "ignore_eos",
    "logprobs",
    "chat",
    "cross_score",
    "seed",
}


@dataclass
class SweepPoint:
    settings: dict[str, Any]  # grid key -> value at this point
    run: Run


@dataclass
class Sweep:
    group_id: str
    grid: dict[str, list[Any]]
    points: list[SweepPoint] = field(default_factory=list)


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """`["dtype=float32,bfloat16", "b.enforce_eager=true,false"]` -> {key: [values]} (YAML scalars); a
    dotted key addresses a side's option by the side's name.
    Raises ConfigError for a malformed item, an empty value list, a repeated key or too many points."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(item, "is not of the form key=v1,v2", "e.g. --grid dtype=float32,bfloat16")
        key, raw = (s.strip() for s in item.split("=", 1))
        values = [yaml.safe_load(v) for v in raw.split(",") if v.strip()]
        if not values:
            raise ConfigError(key, "has no values in --grid", f"e.g. --grid {key}=a,b")
        if key in grid:
            raise ConfigError(key, "is given twice in --grid", "put all its values in one --grid item")
        grid[key] = values
    if not grid:
        raise ConfigError("grid", "is empty", "give at least one --grid key=v1,v2")
    n = 1
    for v in grid.values():
        n *= len(v)
    if n > MAX_POINTS:
        raise ConfigError("grid", f"has {n} points, over the limit of {MAX_POINTS}", "drop a key or some values")
    return grid


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination, load-time keys outermost so consecutive points share loaded sides."""
    keys = sorted(grid, key=lambda k: k in RUNTIME_KEYS)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def _override(key: str, value: Any) -> str:
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def run_sweep(
    service: Service,
    model: str,
    prompt: PromptSpec,
    grid: dict[str, list[Any]],
    *,
    config_path: str | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
    sides: list[str] | None = None,
    trust_remote_code: bool = False,
    emit: EventCallback | None = None,
) -> Sweep:
    """Run every grid point as a stored run of kind "sweep" sharing one group_id.

    A point with batch_size=B runs the prompt B times in one batch (copies), so the batch size is
    real; the point's divergence is the earliest over the copies and sides. An invalid point (a bad
    value) is stored as an error run and the sweep goes on."""
    sweep = Sweep(group_id=new_run_id(), grid=grid)
    for settings in grid_points(grid):
        ovr = [*(overrides or []), *(_override(k, v) for k, v in settings.items())]
        try:
            cfg = build_config(config_path, ovr, base=base, sides=sides)
        except ParityError as e:
            run = service.record_failure(model, [prompt], {"overrides": ovr}, e, kind="sweep", group_id=sweep.group_id)
            sweep.points.append(SweepPoint(settings, run))
            continue
        prompts = [prompt] * cfg.batch_size
        run = service.run(
            RunRequest(
                model=model,
                prompts=prompts,
                config=cfg,
                trust_remote_code=trust_remote_code,
                group_id=sweep.group_id,
                kind="sweep",
            ),
            on_event=emit,
        )
        sweep.points.append(SweepPoint(settings, run))
    return sweep


def _div(run: Run) -> float:
    """The first divergence as a number; identical runs sort after every divergence."""
    fd = run.first_divergence
    return float("inf") if fd is None else float(fd)


def _span(run: Run) -> int:
    """How many tokens every comparison of an identical run agreed over: a fork past it was not looked at."""
    return min((c.compared for pr in run.prompts for c in pr.comparisons), default=0)


def _moved(a: Run, b: Run) -> bool:
    """Whether two runs' first divergences differ as far as both looked: an identical run says "no fork
    within its span", so a fork in the other past that span (a longer max_new_tokens) is no move."""
    da, db = _div(a), _div(b)
    if da == db:
        return False
    if da == float("inf"):
        return db < _span(a)
    if db == float("inf"):
        return da < _span(b)
    return True


def _earliest(run: Run) -> Any:
    """The comparison that parts first (over every prompt, batch copy and side): the one whose verdict
    and gap a point shows beside the run's first divergence; the first comparison where none parts."""
    comps = [c for pr in run.prompts for c in pr.comparisons]
    return min(comps, key=lambda c: (c.first_divergence is None, c.first_divergence or 0), default=None)


def summarize_sweep(sweep: Sweep) -> dict[str, Any]:
    """Per point: settings, run id, status, first divergence, verdict. Per grid key: whether changing
    that key alone (every other key fixed) moved the first divergence, and the divergence by value.
    Pure; error points are left out of the effects."""
    points = []
    for p in sweep.points:
        r = p.run
        comp = _earliest(r)
        expl = comp.explanation if comp else None
        stats = comp.cross_scores.get(f"{comp.b}_by_{comp.a}") if comp and comp.cross_scores else None
        rms = stats.rms_gap if stats is not None else None
        points.append(
            {
                "settings": p.settings,
                "run_id": r.id,
                "status": r.status,
                "first_divergence": r.first_divergence,
                "verdict": expl.verdict if expl else None,
                "cross_rms_gap": rms,
                "error": r.error,
            }
        )
    ok = [p for p in sweep.points if p.run.status in ("ok", "diverged")]
    effects = []
    for key, values in sweep.grid.items():
        by_value = {str(v): [p.run.first_divergence for p in ok if p.settings[key] == v] for v in values}
        moved = False
        for a, b in itertools.combinations(ok, 2):
            same_rest = all(a.settings[k] == b.settings[k] for k in sweep.grid if k != key)
            if same_rest and a.settings[key] != b.settings[key] and _moved(a.run, b.run):
                moved = True
        effects.append({"key": key, "moves_divergence": moved, "first_divergence_by_value": by_value})
    return {
        "group_id": sweep.group_id,
        "grid": {k: [str(v) for v in vs] for k, vs in sweep.grid.items()},
        "points": points,
        "effects": effects,
    }
