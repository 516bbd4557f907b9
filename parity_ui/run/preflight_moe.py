"""Preflight for mixture-of-experts models: what the sides cannot compare about routing, named before
anything loads (parity_ui.run.preflight runs these with its other checks).

- sides whose models disagree on the number of experts or on top-k (a side with its own model folder):
  their routes cannot be compared expert for expert;
- routes=true with a side whose kind cannot record routes (a server: its routers are in another
  process), or with a model that has no MoE layers;
- replay_routes on a side while routes=false (nothing is recorded to replay).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.mapping import route_replay_mode
from ..core.types import Finding

if TYPE_CHECKING:
    from .plan import Prepared

# config.json keys naming the expert count and top-k, by model family
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "top_k_experts")


def moe_shape(path: str) -> tuple[int, int] | None:
    """(experts, top-k) from a model folder's config.json (the LM's part); None for a dense model
    or an unreadable file."""
    try:
        cfg: dict[str, Any] = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config") or cfg
    experts = next((cfg[k] for k in EXPERT_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 1), None)
    top_k = next((cfg[k] for k in TOPK_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 0), None)
    return (experts, top_k) if experts and top_k else None


def check_moe(prepared: Prepared) -> list[Finding]:
    out: list[Finding] = []
    shapes = {p.name: moe_shape(p.model.path) for p in prepared.sides}
    ref = prepared.sides[0].name
    for p in prepared.sides[1:]:
        a, b = shapes[ref], shapes[p.name]
        if a and b and a != b:
            out.append(
                Finding(
                    code="moe-shape-mismatch",
                    severity="warning",
                    side=p.name,
                    message=f"the sides' models route differently: {ref} picks {a[1]} of {a[0]} experts, {p.name} "
                    f"{b[1]} of {b[0]}; their routes cannot be compared expert for expert",
                    fix=f"give {p.name} a checkpoint of the same MoE model (model=)",
                )
            )
    routes = prepared.config.routes
    if routes and not any(shapes.values()):
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
    for p in prepared.sides:
        if routes and not p.kind.can_record_routes:
            out.append(
                Finding(
                    code="routes-unsupported",
                    severity="warning",
                    side=p.name,
                    message=f"{p.name} ({p.kind.label}) cannot record expert routes (its routers run in another "
                    "process); the run goes on without its routes",
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
        if mode != "off" and p is prepared.sides[0]:
            out.append(
                Finding(
                    code="replay-on-reference",
                    severity="warning",
                    side=p.name,
                    message=f"{p.name} is the reference: it replays no one's routes",
                    fix="set replay_routes on another hf side",
                )
            )
    return out
