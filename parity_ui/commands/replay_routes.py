"""Mixture-of-experts routes in a replay (config routes=true): the dump's recorded routes (slime / miles
`rollout_routed_experts`, the parity format's `routed_experts`) become the recorded side's routes,
and every replayed side records its own on the same forced tokens, so each pair of the replay compares
the experts token by token and layer by layer (every token: the sides all routed the same input).

A recorded routes array is [len(prompt) + len(response) - 1, layers, top_k] (row i: the routing at
input position i; slime/utils/types.py and miles/utils/types.py reshape SGLang's return to
(len(tokens) - 1, num_layers, moe_router_topk), vLLM's enable_return_routed_experts has the same
layout). Its layer axis is either every decoder layer (slime's num_layers: dense layers' rows are
zeros) or only the MoE layers; the rows kept for step j are from input position len(prompt) - 1 on,
as the replayed sides' (parity_ui.core.routes).

Routes recorded for another model are refused before any engine loads (`RouteShape.check`): another
number of layers, another top-k, expert ids beyond the model's experts, or a row count that is not
the row's tokens - 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ParityError
from ..core.routes import Routes
from ..core.types import Finding
from ..run.preflight_moe import moe_shape

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
    first = int(cfg.get("first_k_dense_replace") or 0)
    dense = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step") or 1)
    layers = [i for i in range(n) if i >= first and i not in dense and (i + 1) % step == 0]
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
