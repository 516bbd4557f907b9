"""Two sides' mixture-of-experts routes, compared step by step and layer by layer.

`compare_routes(a, b, steps)` is pure: per (step, layer) the same set, the same slot order and the
overlap@k (experts shared), per-layer rates, the share of steps where any layer's set differs, and
the first (step, layer) whose routes differ with both routers' margins there. Only the first
`steps` steps are compared: up to and including the first token fork, where both sides still saw
the same input (after it they route different tokens, and a difference says nothing).

`flip_summary` is the sentence the explanation gives a route flip at a router near-tie.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.routes import (
    NOT_COMPARED,
    SAME_ORDER,
    SAME_SET,
    RouteAgreement,
    RouteFlip,
    Routes,
    code_overlap,
    overlap_code,
)

# A router margin at or under this (in the router's own score: a probability or a sigmoid score)
# is a near-tie: two experts this close can swap on rounding alone (bf16 has ~3 significant digits).
ROUTER_NEAR_TIE = 1e-3


def comparable_steps(first_divergence: int | None, len_a: int, len_b: int) -> int:
    """Steps whose routes are comparable: every common step when the tokens agree, else up to and
    including the first fork (the routing that made the forked token saw the same input)."""
    n = min(len_a, len_b)
    return n if first_divergence is None else min(n, first_divergence + 1)


def compare_routes(a: Routes | None, b: Routes | None, steps: int) -> RouteAgreement | None:
    """The agreement of a's and b's routes over their first `steps` rows; None when a side has none.
    Sides routed over different layers or a different k are not compared (a note says why)."""
    if a is None or b is None:
        return None
    if a.layers != b.layers or a.top_k != b.top_k:
        return RouteAgreement(
            layers=a.layers,
            top_k=a.top_k,
            compared=0,
            note=f"not compared: the sides recorded {len(a.layers)} vs {len(b.layers)} MoE "
            f"layers, top-{a.top_k} vs top-{b.top_k}",
        )
    n, n_layers, k = min(steps, a.rows, b.rows), len(a.layers), a.top_k
    grid, flip = [], None
    same_set = [0] * n_layers
    same_order = [0] * n_layers
    overlap = [0] * n_layers
    any_differ = 0
    for s in range(n):
        row, differs = [], False
        for j in range(n_layers):
            ea, eb = a.experts(s, j), b.experts(s, j)
            shared = len(set(ea) & set(eb))
            overlap[j] += shared
            if ea == eb:
                code = SAME_ORDER
            elif set(ea) == set(eb):
                code = SAME_SET
            else:
                code, differs = overlap_code(shared), True
                if flip is None:
                    flip = RouteFlip(
                        step=s,
                        layer=a.layers[j],
                        experts=[ea, eb],
                        margins=[a.margin(s, j), b.margin(s, j)],
                        overlap=shared,
                    )
            same_set[j] += code in (SAME_ORDER, SAME_SET)
            same_order[j] += code == SAME_ORDER
            row.append(code)
        any_differ += differs
        grid.append("".join(row))
    total = max(a.rows, b.rows)
    grid += [NOT_COMPARED * n_layers] * (total - n)
    cells = n * n_layers
    return RouteAgreement(
        layers=list(a.layers),
        top_k=k,
        compared=n,
        grid=grid,
        same_set_by_layer=[x / n for x in same_set] if n else [],
        same_order_by_layer=[x / n for x in same_order] if n else [],
        mean_overlap_by_layer=[x / (n * k) for x in overlap] if n else [],
        same_set=sum(same_set) / cells if cells else None,
        same_order=sum(same_order) / cells if cells else None,
        mean_overlap=sum(overlap) / (cells * k) if cells else None,
        steps_any_differ=any_differ / n if n else None,
        first_flip=flip,
        note=""
        if a.weights is not None and b.weights is not None
        else "routing weights not recorded on a side (its engine's capture gives expert ids only)",
    )


def overlaps(agreement: RouteAgreement) -> list[int]:
    """Every compared cell's overlap@k (experts shared), step by step."""
    out = []
    for row in agreement.grid[: agreement.compared]:
        out += [v for v in (code_overlap(c, agreement.top_k) for c in row) if v is not None]
    return out


def flip_summary(agreement: RouteAgreement | None, fork: int | None) -> str | None:
    """ "experts differ at layer L, token t: router margin m" when the first route difference is at
    or before the token fork; None otherwise."""
    f = agreement.first_flip if agreement else None
    if f is None or (fork is not None and f.step > fork):
        return None
    known = [m for m in f.margins if m is not None]
    margin = f"router margin {min(known):.3g}" if known else "router margin not recorded"
    where = (
        "at the token fork"
        if f.step == fork
        else (f"{fork - f.step} token(s) before the token fork" if fork is not None else "while the tokens still agree")
    )
    return f"experts differ at layer {f.layer}, token {f.step}: {margin} ({where}; {f.experts[0]} vs {f.experts[1]})"


def is_router_near_tie(agreement: RouteAgreement | None) -> bool:
    f = agreement.first_flip if agreement else None
    known = [m for m in (f.margins if f else []) if m is not None]
    return bool(known) and min(known) <= ROUTER_NEAR_TIE


def route_figures(agreements: Iterable[RouteAgreement | None]) -> dict[str, float | None]:
    """The routing family's figures (core.figures FAMILIES["routing"]) pooled over comparisons: every
    compared (token, layer) cell weighs the same, every compared token too."""
    cells = same_set = same_order = shared = tokens = any_differ = 0
    k = 1
    for r in agreements:
        if r is None or not r.compared:
            continue
        k = r.top_k
        n_layers = len(r.layers)
        c = r.compared * n_layers
        cells += c
        same_set += round((r.same_set or 0.0) * c)
        same_order += round((r.same_order or 0.0) * c)
        shared += round((r.mean_overlap or 0.0) * c * r.top_k)
        tokens += r.compared
        any_differ += round((r.steps_any_differ or 0.0) * r.compared)
    if not cells:
        return {
            key: None
            for key in (
                "route_same_set",
                "route_same_order",
                "route_overlap",
                "route_differ",
                "route_tokens_any_differ",
            )
        }
    return {
        "route_same_set": same_set / cells,
        "route_same_order": same_order / cells,
        "route_overlap": shared / (cells * k),
        "route_differ": 1 - same_set / cells,
        "route_tokens_any_differ": any_differ / tokens,
        "cells": cells,
        "tokens": tokens,
    }
