"""Router scores in `parity layers` on mixture-of-experts models: at the positions the layer capture
examines, each side's router per MoE layer (the experts in slot order, their weights, the router
margin at the top-k boundary), recorded by the same teacher-forced ids as the hidden states
(parity_ui.engines.routes through the worker's routes verb), and where the two sides' routers part.

A route flip is named beside the hidden-state verdict: a router that chose other experts at layer L
changes that layer's MLP output while its input still agrees, so "layer L's mlp leaves the floor"
and "the routers differ at layer L" together say the router made it; a flip at a margin within
ROUTER_NEAR_TIE is a near-tie that rounding alone can flip.
"""

from __future__ import annotations

from typing import Any, TypedDict

from ..analysis.routes import ROUTER_NEAR_TIE
from ..core.routes import Routes


class RouterLayer(TypedDict):
    """Both routers at one MoE layer of the examined position (side a first, then side b)."""

    layer: int
    experts: list[list[int]]
    weights: list[list[float] | None]
    margins: list[float | None]
    same_set: bool
    same_order: bool


def router_view(ra: Routes, rb: Routes, positions: list[int], a: str, b: str) -> tuple[dict[str, Any], str]:
    """Both routers at the captured positions (the examined one first): per MoE layer at the examined
    position, and every (position, layer) whose experts differ; and the sentence for the summary."""
    layers: list[RouterLayer] = []
    for j, layer in enumerate(ra.layers):
        ea, eb = ra.experts(0, j), rb.experts(0, j)
        layers.append(
            {
                "layer": layer,
                "experts": [ea, eb],
                "weights": [ra.weights_at(0, j), rb.weights_at(0, j)],
                "margins": [ra.margin(0, j), rb.margin(0, j)],
                "same_set": set(ea) == set(eb),
                "same_order": ea == eb,
            }
        )
    differ = [
        {"position": positions[i], "layer": layer}
        for i in range(min(ra.rows, rb.rows, len(positions)))
        for j, layer in enumerate(ra.layers)
        if set(ra.experts(i, j)) != set(rb.experts(i, j))
    ]
    out = {"position": positions[0], "layers": layers, "differ": differ, "top_k": ra.top_k}
    flips = [x for x in layers if not x["same_set"]]
    if flips:
        f = flips[0]
        known = [m for m in f["margins"] if m is not None]
        margin = min(known) if known else None
        m = f"router margin {margin:.3g}" if margin is not None else "router margin not recorded"
        tie = (
            "; a router near-tie that rounding alone can flip"
            if margin is not None and margin <= ROUTER_NEAR_TIE
            else ""
        )
        sentence = (
            f"The routers choose differently at this position first at layer {f['layer']} ({a}: "
            f"{f['experts'][0]}, {b}: {f['experts'][1]}; {m}{tie})"
        )
        if len(flips) > 1:
            sentence += f", and at {len(flips) - 1} later MoE layer(s)"
    else:
        smallest = [
            (min(mm for mm in x["margins"] if mm is not None), x["layer"])
            for x in layers
            if any(mm is not None for mm in x["margins"])
        ]
        sentence = "Every MoE layer's router chose the same experts on both sides at this position"
        if smallest:
            least, layer = min(smallest)
            sentence += f" (the smallest router margin {least:.3g}, at layer {layer})"
        earlier = [d for d in differ if d["position"] != positions[0]]
        if earlier:
            sentence += f"; they differ at {len(earlier)} (position, layer) route(s) of the earlier positions captured"
    return out, sentence + "."
