"""The op map in the app (parity_ui.core.op_map): a layer x token heatmap with one row per op, the error
each op of side b adds (and, on a button, the cumulative one, and the three-way ratio against an fp32
side) as log10 of its ratio to the floor's threshold: white and blue within the floor, yellow at it, red
over. The first cell over the floor is boxed, the examined (divergent) token's column marked; MoE
layers have a router-margin row under their router. A click on a cell asks the server (the page script
in render/assets writes "LOC|row|col" into the view's hidden box and presses its button) for the
cell's statistics and opens the token panes at that token; from there one click swaps the reference's
output of that op in and runs the rest (commands.op_map)."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from ..core.op_map import NOT_SWAPPABLE, OP_LABELS, THREE_WAY_MULTIPLE, OpMap, op_map_from_dict
from ..core.types import Localisation
from ..render.cards import esc
from ..render.op_map import cell_lines, ratio

COLORSCALE = [
    [0.0, "#eff6ff"],
    [0.45, "#dbeafe"],
    [4 / 7, "#fde047"],  # zmin -4, zmax 3: 0 (the threshold) at 4/7
    [0.75, "#f97316"],
    [1.0, "#7f1d1d"],
]


def _text(m: OpMap, kind: str) -> Any:
    """Per cell hover lines (as an array of strings: plotly takes it as it is)."""
    R, T = len(m.rows), len(m.positions)
    rel, floor = m.stats[f"{kind}_rel"], m.stats[f"floor_{kind}"]
    other = m.stats["cum_rel" if kind == "add" else "add_rel"]
    labels = [m.label(r) for r in range(R)]
    toks = [repr(t)[1:-1][:16] for t in m.token_text]
    out: Any = np.empty((R, T), dtype=object)
    for r in range(R):
        for t in range(T):
            out[r, t] = (
                f"{labels[r]} @ {m.positions[t]} '{toks[t]}'<br>{kind}: {rel[r, t]:.2e} (floor {floor[r, t]:.2e})"
                f"<br>{'cumulative' if kind == 'add' else 'added'}: {other[r, t]:.2e}"
            )
    return out


def op_map_figure(loc: Localisation) -> go.Figure | None:
    """The heatmap of a localisation's op map (None without one)."""
    if not loc.op_map or loc.error:
        return None
    m = op_map_from_dict(loc.op_map)
    labels = [m.label(r) for r in range(len(m.rows))]
    x = m.positions
    traces = []
    for kind, name in (("add", "added"), ("cum", "cumulative")):
        traces.append(
            go.Heatmap(
                z=np.clip(ratio(m, kind), -4, 3),
                x=x,
                y=labels,
                text=_text(m, kind),
                hoverinfo="text",
                colorscale=COLORSCALE,
                zmin=-4,
                zmax=3,
                name=name,
                visible=kind == "add",
                colorbar={"title": {"text": "log10 err/thr"}, "len": 0.6},
            )
        )
    if m.three_way is not None:
        tw = m.three_way
        z = np.log10(
            np.maximum(np.nan_to_num(tw["b_add"]), 1e-30) / np.maximum(THREE_WAY_MULTIPLE * tw["a_add"], 1e-30)
        )
        traces.append(
            go.Heatmap(
                z=np.clip(z, -4, 3),
                x=x,
                y=labels,
                colorscale=COLORSCALE,
                zmin=-4,
                zmax=3,
                name="three-way",
                visible=False,
                hovertemplate="%{y} @ %{x}: side vs fp32 / (2x reference vs fp32) = 10^%{z:.2f}<extra></extra>",
            )
        )
    fig = go.Figure(traces)
    margin_rows = []
    for layer, rt in sorted(m.routers.items()):
        label = f"L{layer} router margin"
        margin_rows.append((m.row_of(layer, "router"), label))
        fig.add_trace(
            go.Heatmap(
                z=[rt["margin_a"]],
                x=x,
                y=[label],
                customdata=[[[b, s] for b, s in zip(rt["margin_b"], rt["same"])]],
                colorscale="Greys",
                reversescale=True,
                showscale=False,
                hovertemplate="%{y} @ %{x}: reference %{z:.3g}, side %{customdata[0]:.3g}, same experts "
                "%{customdata[1]}<extra></extra>",
                name="router margin",
            )
        )
    order = list(labels)
    for r, label in reversed(margin_rows):
        order.insert(r + 1, label)
    n_kinds = len(traces)
    buttons = []
    for i, name in enumerate(t.name for t in traces):
        vis = [j == i for j in range(n_kinds)] + [True] * len(margin_rows)
        buttons.append({"label": name, "method": "update", "args": [{"visible": vis}]})
    first = m.first_over("add")
    shapes = []
    if m.examined in m.positions:
        shapes.append(
            {
                "type": "line",
                "x0": m.examined,
                "x1": m.examined,
                "y0": 0,
                "y1": 1,
                "yref": "paper",
                "line": {"color": "#dc2626", "dash": "dash", "width": 1.5},
                "name": "divergence",
            }
        )
    if 0 < m.prompt_len <= m.positions[-1] and m.prompt_len > m.positions[0]:
        shapes.append(
            {
                "type": "line",
                "x0": m.prompt_len - 0.5,
                "x1": m.prompt_len - 0.5,
                "y0": 0,
                "y1": 1,
                "yref": "paper",
                "line": {"color": "#71717a", "dash": "dot", "width": 1},
                "name": "generated from here",
            }
        )
    annotations = []
    if first is not None:
        r, t = first
        y = order.index(labels[r])
        shapes.append(
            {
                "type": "rect",
                "x0": m.positions[t] - 0.5,
                "x1": m.positions[t] + 0.5,
                "y0": y - 0.5,
                "y1": y + 0.5,
                "line": {"color": "#2563eb", "width": 3},
                "name": "first over the floor",
            }
        )
        annotations.append(
            {
                "x": m.positions[t],
                "y": labels[r],
                "text": "first over the floor",
                "showarrow": True,
                "arrowcolor": "#2563eb",
                "font": {"color": "#1d4ed8", "size": 11},
                "ax": 60,
                "ay": -20,
            }
        )
    height = min(1400, 160 + 14 * len(order))
    fig.update_layout(
        title={
            "text": f"Op map: {loc.b} vs {loc.a} (added error; red dashes: the examined token)",
            "font": {"size": 14},
        },
        height=height,
        margin={"l": 130, "r": 20, "t": 70, "b": 40},
        yaxis={"autorange": "reversed", "categoryorder": "array", "categoryarray": order, "tickfont": {"size": 9}},
        xaxis=_x_axis(m),
        shapes=shapes,
        annotations=annotations,
        updatemenus=[
            {"type": "buttons", "direction": "right", "x": 0, "y": 1.06, "xanchor": "left", "buttons": buttons}
        ],
        meta={"loc": loc.id, "rows": len(labels), "positions": m.positions, "labels": labels},
        clickmode="event",
    )
    return fig


def cell_html(loc: Localisation, r: int, t: int) -> str:
    """One cell's statistics (what a click shows), with what a swap there would do."""
    assert loc.op_map is not None
    m = op_map_from_dict(loc.op_map)
    layer, op = m.rows[r]
    lines = cell_lines(m, r, t)
    body = "".join(f"<div>{esc(x)}</div>" for x in lines)
    can = op not in NOT_SWAPPABLE and op != "logits"
    swap = (
        f"<p class=pc-muted>Swap in {esc(loc.a)}'s {esc(OP_LABELS.get(op, op))} at every position and run the rest "
        f"of {esc(loc.b)}: does the divergence disappear?</p>"
        if can
        else f"<p class=pc-muted>{esc(OP_LABELS.get(op, op))} has no module of its own: nothing to swap here.</p>"
    )
    return f'<div class="pc-card om-cell" data-row="{r}" data-col="{t}">{body}{swap}</div>'


def swap_target(loc: Localisation, r: int) -> str | None:
    """ "LAYER.OP" to swap for a cell of row r, or None where nothing can be swapped."""
    assert loc.op_map is not None
    m = op_map_from_dict(loc.op_map)
    layer, op = m.rows[r]
    if op in NOT_SWAPPABLE or op == "logits":
        return None
    return f"{'final' if layer >= m.layers else layer}.{op}"


def _x_axis(m: OpMap) -> dict[str, Any]:
    """Positions, with each token's text under it where they fit (a short window)."""
    axis: dict[str, Any] = {"title": "position (prompt | generated tokens, dotted line between)"}
    if len(m.positions) <= 48:
        axis.update(
            tickmode="array",
            tickvals=m.positions,
            ticktext=[f"{p}<br>{esc(repr(t)[1:-1][:8])}" for p, t in zip(m.positions, m.token_text)],
            tickfont={"size": 9},
        )
    return axis
