"""The routing measure's section (MoE, routes=true): the layer x token grid of route agreement (HTML,
shown with the token panes), the terminal lines of a comparison's routes and its route replay, and a
workload's routing family on the CLI screen (its rows and its verdict).

Pure: a Comparison in, HTML or text out. The grid has one row per MoE layer and one column per
token (the route of token t is the routing that predicted it); a cell reads "=" the same experts in
the same slots, "~" the same experts in another slot order, a digit the experts the sides share
(overlap@k), "." not compared (after the token fork, where the sides' inputs differ). The first
token fork and the first route difference are marked.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...core.figures import FAMILIES, FIGURES
from ...core.measures import ROUTE_REPLAY, ROUTES, ROUTING
from ...core.pooled import WorkloadStats
from ...core.routes import NOT_COMPARED, SAME_ORDER, SAME_SET, RouteAgreement, RouteReplay
from ...core.types import Comparison
from ..markup import esc
from .base import Section

_CLASS = {SAME_ORDER: "rt-same", SAME_SET: "rt-order", NOT_COMPARED: "rt-na"}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def grid_html(c: Comparison) -> str:
    """The layer x token grid of `c`'s route agreement, with the per-layer rates; "" without routes."""
    r = ROUTES.of(c)
    if r is None:
        return ""
    if not r.grid:
        return f'<div class="pc-muted">expert routes: {esc(r.note or "not compared")}</div>'
    flip = r.first_flip
    n_tokens = len(r.grid)
    head = "".join(f"<th>{t}</th>" if t % 5 == 0 else "<th></th>" for t in range(n_tokens))
    rows = []
    for j, layer in enumerate(r.layers):
        cells = []
        for t in range(n_tokens):
            code = r.grid[t][j]
            cls = [_CLASS.get(code, "rt-diff")]
            if c.first_divergence is not None and t == c.first_divergence:
                cls.append("rt-fork")
            if flip is not None and (flip.step, flip.layer) == (t, layer):
                cls.append("rt-flip")
            title = f"layer {layer}, token {t}: " + {
                SAME_ORDER: "same experts, same slots",
                SAME_SET: "same experts, other slot order",
                NOT_COMPARED: "not compared (after the token fork)",
            }.get(code, f"{code} of {r.top_k} experts shared")
            cells.append(f'<td class="{" ".join(cls)}" title="{esc(title)}">{esc(code)}</td>')
        rate = f"<th>{_pct(r.same_set_by_layer[j])} same set</th>" if j < len(r.same_set_by_layer) else "<th></th>"
        rows.append(f"<tr><th>layer {layer}</th>{''.join(cells)}{rate}</tr>")
    return (
        f'<details class="pc-routes" open><summary>expert routes, {esc(c.b)} vs {esc(c.a)}: {esc(headline(r))}'
        f'</summary><table class="rt-grid" data-testid="route-grid"><tr><th>token</th>{head}<th></th></tr>'
        f"{''.join(rows)}</table>{_replay_html(ROUTE_REPLAY.of(c))}</details>"
    )


def headline(r: RouteAgreement) -> str:
    """One line: the shares over the compared (token, layer) cells and the first difference."""
    if not r.compared:
        return r.note or "not compared"
    parts = [
        f"{FIGURES['route_same_set'].name} {_pct(r.same_set)}",
        f"{FIGURES['route_same_order'].name} {_pct(r.same_order)}",
        f"{FIGURES['route_overlap'].name} {_pct(r.mean_overlap)}",
        f"{FIGURES['route_tokens_any_differ'].name} {_pct(r.steps_any_differ)}",
        f"over {r.compared} token(s) x {len(r.layers)} layer(s)",
    ]
    f = r.first_flip
    if f is not None:
        known = [m for m in f.margins if m is not None]
        parts.append(
            f"first difference at token {f.step}, layer {f.layer}"
            + (f" (router margin {min(known):.3g})" if known else "")
        )
    return "; ".join(parts)


def _replay_html(rp: RouteReplay | None) -> str:
    line = replay_line(rp)
    return f'<div class="pc-verdict" data-testid="route-replay">{esc(line)}</div>' if line else ""


def replay_line(rp: RouteReplay | None) -> str:
    if rp is None:
        return ""
    if rp.error:
        return f"route replay ({rp.mode}) failed: {rp.error}"

    def state(identical: bool, fork: int | None, gap: float | None) -> str:
        g = "–" if gap is None else f"{gap:.3g}"
        return ("identical" if identical else f"fork at token {fork}") + f", max |Δlogprob| {g}"

    return (
        f"route replay with {rp.source}'s experts ({rp.mode}): before {state(rp.before_identical, rp.before_first_divergence, rp.before_max_abs_gap)}; "
        f"after {state(rp.after_identical, rp.after_first_divergence, rp.after_max_abs_gap)}"
    )


def route_lines(c: Comparison) -> list[str]:
    """The terminal lines of a comparison's routes (indented as the run screen's)."""
    r = ROUTES.of(c)
    if r is None:
        return []
    out = [f"    expert routes: {headline(r)}"]
    if r.compared and r.same_set_by_layer:
        out.append(
            "    same set by layer: "
            + "  ".join(f"L{layer} {_pct(x)}" for layer, x in zip(r.layers, r.same_set_by_layer))
        )
    line = replay_line(ROUTE_REPLAY.of(c))
    if line:
        out.append(f"    {line}")
    return out


class RoutingSection(Section):
    key = ROUTING.key
    title = ROUTING.title

    def comparison_lines(self, c: Comparison) -> list[str]:
        return route_lines(c)

    def comparison_html(self, c: Comparison) -> str:
        return grid_html(c)

    def text_rows(self, stats: Sequence[WorkloadStats]) -> list[tuple[str, list[str]]]:
        got = [x.family(self.key) for x in stats]
        if not any(got):
            return []
        return [(FIGURES[k].name, [FIGURES[k].format((g or {}).get(k), "-") for g in got]) for k in FAMILIES["routing"]]

    def html_verdicts(self) -> bool:
        return False  # the app shows a pair's routes in its comparison's grid; the figures table not yet
