"""Plotly figures for a stored run. Pure functions: a PromptResult or Run in, a Figure out."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..types import EngineResult, PromptResult, Run

VLLM_COLOR, HF_COLOR, DIV_COLOR = "#2563eb", "#ea580c", "#dc2626"


def _steps(r: EngineResult | None) -> list:
    return r.steps if r is not None else []


def _mark_divergence(fig: go.Figure, div: int | None) -> None:
    if div is None:
        return
    fig.add_vline(x=div, line_color=DIV_COLOR, line_dash="dash", line_width=1.5)
    fig.add_annotation(x=div, y=1.0, yref="paper", text=f"first divergence ({div})", showarrow=False,
                       font={"color": DIV_COLOR, "size": 11}, xanchor="left", yanchor="bottom")


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(title={"text": title, "font": {"size": 14}}, height=height, template="plotly_white",
                      margin={"l": 50, "r": 20, "t": 50, "b": 40}, hovermode="x unified",
                      legend={"orientation": "h", "y": -0.18})
    return fig


def _line(x: list, y: list, name: str, color: str, **kw) -> go.Scattergl:
    # WebGL keeps 16k-point traces smooth.
    return go.Scattergl(x=x, y=y, name=name, mode="lines+markers" if len(x) <= 300 else "lines",
                        line={"color": color, "width": 1.5}, marker={"size": 4}, **kw)


def logprob_figure(p: PromptResult) -> go.Figure:
    """Chosen-token logprob of both engines per position (top) and their gap vLLM - HF (bottom,
    only where both chose the same token: after the divergence the contexts differ)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.6, 0.4])
    for r, name, color in ((p.vllm, "vLLM", VLLM_COLOR), (p.hf, "HF", HF_COLOR)):
        steps = _steps(r)
        fig.add_trace(_line([s.position for s in steps], [s.logprob for s in steps], f"{name} logprob", color),
                      row=1, col=1)
    gaps = p.comparison.logprob_gaps if p.comparison else []
    fig.add_trace(go.Bar(x=list(range(len(gaps))), y=gaps, name="gap vLLM − HF", marker_color="#64748b"),
                  row=2, col=1)
    div = p.comparison.first_divergence if p.comparison else None
    _mark_divergence(fig, div)
    fig.update_yaxes(title_text="logprob", row=1, col=1)
    fig.update_yaxes(title_text="gap", row=2, col=1)
    fig.update_xaxes(title_text="generated token position", row=2, col=1)
    return _layout(fig, "Chosen-token logprob per position", 420)


def _margins(r: EngineResult | None) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for s in _steps(r):
        if len(s.top) >= 2:
            xs.append(s.position)
            ys.append(s.top[0].logprob - s.top[1].logprob)
    return xs, ys


def margin_figure(p: PromptResult) -> go.Figure:
    """Top-1 minus top-2 logprob per position: near zero is a near-tie, where a tiny numeric
    difference can flip the greedy choice."""
    fig = go.Figure()
    for r, name, color in ((p.vllm, "vLLM", VLLM_COLOR), (p.hf, "HF", HF_COLOR)):
        x, y = _margins(r)
        fig.add_trace(_line(x, y, f"{name} top-1 − top-2", color))
    _mark_divergence(fig, p.comparison.first_divergence if p.comparison else None)
    fig.update_yaxes(title_text="margin (nats)", rangemode="tozero")
    fig.update_xaxes(title_text="generated token position")
    return _layout(fig, "Top-1 / top-2 margin per position (small = near-tie)", 320)


def batch_figure(run: Run) -> go.Figure:
    """First-divergence position per prompt; identical prompts drawn at their compared length."""
    xs, ys, colors, texts = [], [], [], []
    for p in run.prompts:
        c = p.comparison
        if c is None:
            continue
        xs.append(f"prompt {p.index}")
        if c.identical:
            ys.append(c.compared)
            colors.append("#16a34a")
            texts.append("identical")
        else:
            ys.append(c.first_divergence)
            colors.append(DIV_COLOR)
            texts.append(f"diverged at {c.first_divergence}")
    fig = go.Figure(go.Bar(x=xs, y=ys, marker_color=colors, text=texts, textposition="outside"))
    fig.update_yaxes(title_text="first divergence (token position)", rangemode="tozero")
    return _layout(fig, "First divergence per prompt (green: identical for all tokens)", 320)
