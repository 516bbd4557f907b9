"""Plotly figures for a stored run. Pure functions: a comparison and its two sides' results in, a
Figure out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from ..core.types import Comparison, Localisation, Run, SideResult, StepColumns, TokenStep, step_column

REF_COLOR, SIDE_COLOR, DIV_COLOR = "#ea580c", "#2563eb", "#dc2626"

# Every figure here is plotly_white. As the default it is set once, unvalidated; named in each
# figure's layout it was deep-copied and validated per figure (~15-25 ms each, two per opened run).
pio.templates.default = "plotly_white"


def _steps(r: SideResult | None) -> Sequence[TokenStep]:
    return r.steps if r is not None else []


def _mark_divergence(fig: go.Figure, div: int | None) -> None:
    if div is None:
        return
    fig.add_vline(x=div, line_color=DIV_COLOR, line_dash="dash", line_width=1.5)
    fig.add_annotation(
        x=div,
        y=1.0,
        yref="paper",
        text=f"first divergence ({div})",
        showarrow=False,
        font={"color": DIV_COLOR, "size": 11},
        xanchor="left",
        yanchor="bottom",
    )


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=height,
        margin={"l": 50, "r": 20, "t": 50, "b": 40},
        hovermode="x unified",
        legend={"orientation": "h", "y": -0.18},
    )
    return fig


MANY = 300  # points above which a trace drops its markers (and bars become a filled line)
MAX_POINTS = 4096  # a longer trace keeps one point per bucket: the one a reader must not miss


def _arrays(x: list, y: list) -> tuple[np.ndarray, np.ndarray]:
    # Plotly validates a list element by element (about 1 s for a 16k-token pair) but takes a numpy
    # array as it is; None (no logprob) becomes NaN, a gap in the line.
    return np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.float64)


def thin(x: np.ndarray, y: np.ndarray, keep: str) -> tuple[np.ndarray, np.ndarray]:
    """At most about MAX_POINTS points, each a real (position, value) pair: per bucket of
    consecutive positions the lowest value (keep="min": a logprob dip, a near-tie margin) or the
    largest magnitude (keep="absmax": a logprob gap spike). A 16k-token pair otherwise sends ~2 MB
    of figure JSON to the browser, more points than the plot has pixels."""
    n = len(y)
    if n <= MAX_POINTS:
        return x, np.round(y, 6)
    k = -(-n // MAX_POINTS)
    pad = (-n) % k
    score = -np.abs(y) if keep == "absmax" else y.copy()
    score = np.concatenate([np.where(np.isnan(score), np.inf, score), np.full(pad, np.inf)]).reshape(-1, k)
    idx = np.arange(0, n + pad, k) + score.argmin(axis=1)
    idx = idx[idx < n]
    return x[idx], np.round(y[idx], 6)


def _line(x: list, y: list, name: str, color: str, **kw) -> go.Scatter:
    # SVG, not WebGL: thinned to MAX_POINTS a trace is one <path>, which a page without a GPU (a
    # headless or remote browser) draws in ~0.1 s where WebGL took 0.4-0.7 s per figure.
    xs, ys = thin(*_arrays(x, y), "min")
    return go.Scatter(
        x=xs,
        y=ys,
        name=name,
        mode="lines+markers" if len(xs) <= MANY else "lines",
        line={"color": color, "width": 1.5},
        marker={"size": 4},
        **kw,
    )


def _bars(y: list, name: str, color: str) -> go.Bar | go.Scatter:
    """Bars per position; past MANY positions a filled line, as thousands of SVG bars make the
    browser lay out one element per bar."""
    xs, ys = thin(*_arrays(list(range(len(y))), y), "absmax")
    if len(ys) <= MANY:
        return go.Bar(x=xs, y=ys, name=name, marker_color=color)
    return go.Scatter(x=xs, y=ys, name=name, mode="lines", fill="tozeroy", line={"color": color, "width": 1})


def logprob_figure(c: Comparison, a: SideResult | None, b: SideResult | None) -> go.Figure:
    """Chosen-token logprob of both sides per position (top) and their gap b - a (bottom, only where
    both chose the same token: after the divergence the contexts differ)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.6, 0.4])
    for r, name, color in ((a, c.a, REF_COLOR), (b, c.b, SIDE_COLOR)):
        steps = _steps(r)
        fig.add_trace(
            _line(step_column(steps, "position"), step_column(steps, "logprob"), f"{name} logprob", color), row=1, col=1
        )
    gaps = c.logprob_gaps
    fig.add_trace(_bars(gaps, f"gap {c.b} − {c.a}", "#64748b"), row=2, col=1)
    _mark_divergence(fig, c.first_divergence)
    fig.update_yaxes(title_text="logprob", row=1, col=1)
    fig.update_yaxes(title_text="gap", row=2, col=1)
    fig.update_xaxes(title_text="generated token position", row=2, col=1)
    return _layout(fig, f"Chosen-token logprob per position: {c.b} vs {c.a}", 420)


def _margins(r: SideResult | None) -> tuple[list[int], list[float]]:
    c = StepColumns.from_steps(_steps(r))
    pairs = [
        (x, first - second)
        for x, first, second in zip(c.position, c.top_logprobs(0), c.top_logprobs(1))
        if first is not None and second is not None
    ]
    return [x for x, _ in pairs], [y for _, y in pairs]


def margin_figure(c: Comparison, a: SideResult | None, b: SideResult | None) -> go.Figure:
    """Top-1 minus top-2 logprob per position: near zero is a near-tie, where a tiny numeric
    difference can flip the greedy choice."""
    fig = go.Figure()
    for r, name, color in ((a, c.a, REF_COLOR), (b, c.b, SIDE_COLOR)):
        x, y = _margins(r)
        fig.add_trace(_line(x, y, f"{name} top-1 − top-2", color))
    _mark_divergence(fig, c.first_divergence)
    fig.update_yaxes(title_text="margin (nats)", rangemode="tozero")
    fig.update_xaxes(title_text="generated token position")
    return _layout(fig, "Top-1 / top-2 margin per position (small = near-tie)", 320)


def batch_figure(run: Run) -> go.Figure:
    """First divergence per prompt and side; identical ones drawn at their compared length."""
    fig = go.Figure()
    sides = [s.name for s in run.sides[1:]]
    for side in sides:
        xs, ys, texts = [], [], []
        for p in run.prompts:
            c = p.comparison(side)
            if c is None:
                continue
            xs.append(f"prompt {p.index}")
            ys.append(c.compared if c.identical else c.first_divergence)
            texts.append("identical" if c.identical else f"diverged at {c.first_divergence}")
        fig.add_trace(go.Bar(x=xs, y=ys, name=side, text=texts, textposition="outside"))
    fig.update_yaxes(title_text="first divergence (token position)", rangemode="tozero")
    return _layout(fig, "First divergence per prompt and side (identical: drawn at the compared length)", 320)


def layers_figure(loc: Localisation) -> go.Figure | None:
    """Relative error of side b against side a per decoder layer (log scale): the residual stream
    at every captured position (the examined one bold), the attention and MLP outputs there, and
    the threshold (10x the measured noise floor)."""
    if loc.error or not loc.per_layer:
        return None
    fig = go.Figure()
    stream = [f for f in loc.per_layer if f["block"] == "residual"]
    xs = [f["layer"] for f in stream]
    n = len(stream[0]["rel_l2"]) if stream else 0
    for i in reversed(range(n)):
        pos = loc.position - (loc.token_positions[0] - loc.token_positions[i])
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[max(f["rel_l2"][i], 1e-12) for f in stream],
                mode="lines+markers",
                name=f"stream, token {pos}" + (" (examined)" if i == 0 else ""),
                line={"color": DIV_COLOR if i == 0 else "#94a3b8", "width": 2.5 if i == 0 else 1},
                opacity=1.0 if i == 0 else 0.6,
            )
        )
    for block, color in (("attn", SIDE_COLOR), ("mlp", REF_COLOR)):
        figs = [f for f in loc.per_layer if f["block"] == block]
        fig.add_trace(
            go.Scatter(
                x=[f["layer"] for f in figs],
                y=[max(f["rel_l2"][0], 1e-12) for f in figs],
                mode="markers",
                name=f"{block} output",
                marker={"color": color, "size": 7},
            )
        )
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=[max(10 * f["floor"][0], 1e-12) for f in stream],
            mode="lines",
            name="10x noise floor",
            line={"color": "#52525b", "dash": "dash"},
        )
    )
    if loc.first_divergent_layer is not None:
        fig.add_vline(x=loc.first_divergent_layer, line_color=DIV_COLOR, line_dash="dot")
    fig.update_yaxes(type="log", title="relative L2 error")
    fig.update_xaxes(title="decoder layer")
    return _layout(fig, f"{loc.b} vs {loc.a}: error per layer at generated token {loc.position}", 340)


def tiny_figure() -> go.Figure:
    """Two points: what the page draws off screen on load so plotly.js is loaded before it is needed."""
    return go.Figure(go.Scatter(x=[0, 1], y=[0, 0], mode="lines"), layout={"height": 40, "width": 80})


def warm_up() -> None:
    """Build and serialise one small figure, so plotly loads its templates and validators (~0.25 s
    the first time) when the app starts rather than when someone opens the first run."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True)
    fig.add_trace(_line([0, 1], [0.0, 1.0], "warm-up", REF_COLOR), row=1, col=1)
    _layout(fig, "", 100).to_json()
