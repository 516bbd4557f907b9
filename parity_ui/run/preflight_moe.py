"""Preflight for mixture-of-experts models: what the sides cannot compare about routing, named before
anything loads (parity_ui.run.preflight runs these with its other checks).

- sides whose models disagree on the number of experts or on top-k (a side with its own model folder):
  their routes cannot be compared expert for expert.

What routes=true and replay_routes need of the sides (a kind that can record or force routes, a model
with MoE layers) is the routing measure's preflight (parity_ui.measures.routes), asked when a run starts
its measures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.types import Finding
from ..inputs.models import moe_shape_of

if TYPE_CHECKING:
    from .plan import Prepared


def moe_shape(path: str) -> tuple[int, int] | None:
    """(experts, top-k) from a model folder's config.json (the LM's part); None for a dense model
    or an unreadable file."""
    try:
        cfg: dict[str, Any] = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return moe_shape_of(cfg.get("text_config") or cfg)


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
    return out
