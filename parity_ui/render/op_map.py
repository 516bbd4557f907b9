"""The op map (parity_ui.core.op_map) for people and programs: the `--json` form, terminal lines and the
static report's section (a heatmap as an inline PNG in an SVG with its marks: no script, no network).
The app draws the same map with plotly (parity_ui.ui.op_map_view)."""

from __future__ import annotations

import base64
import math
import struct
import zlib
from typing import Any

from ..core.op_map import BYTES_PER_CELL, OP_LABELS, OpMap, op_map_from_dict
from ..core.types import FLOOR_MULTIPLE, Localisation
from .cards import esc


def localisation_json(loc: Localisation) -> dict[str, Any]:
    """A localisation for `--json`: its op map (if any) with every array as lists (OpMap.readable)."""
    d = loc.to_dict()
    if loc.op_map:
        d["op_map"] = op_map_from_dict(loc.op_map).readable()
    return d


def ratio(m: OpMap, kind: str) -> Any:
    """[R, T] log10 of each cell's error over its threshold (0: at the threshold; > 0: over the floor)."""
    import numpy as np

    x = np.nan_to_num(m.stats[f"{kind}_rel"], nan=0.0, posinf=1e30)
    return np.log10(np.maximum(x, 1e-30) / m.threshold(kind))


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def cell_lines(m: OpMap, r: int, t: int) -> list[str]:
    c = m.cell(r, t)
    where = f"generated token {c['position'] - m.prompt_len}" if c["generated"] else "prompt"
    lines = [
        f"{c['label']} ({c['what']}) at position {c['position']} ({where}, {c['token']!r}):",
        f"  added      rel L2 {_fmt(c['add_rel'])}  max|d| {_fmt(c['add_max'])}  cosine {c['add_cos'] or 0:.8f}  "
        f"floor {_fmt(c['floor_add'])}  {'OVER' if c['add_over'] else 'within'} (threshold {_fmt(c['add_threshold'])})",
        f"  cumulative rel L2 {_fmt(c['cum_rel'])}  max|d| {_fmt(c['cum_max'])}  cosine {c['cum_cos'] or 0:.8f}  "
        f"floor {_fmt(c['floor_cum'])}  {'OVER' if c['cum_over'] else 'within'} (threshold {_fmt(c['cum_threshold'])})",
        "  top differing dims, added: "
        + ", ".join(f"{i}: {v:+.2e}" for i, v in c["add_top"] if v is not None)
        + "; cumulative: "
        + ", ".join(f"{i}: {v:+.2e}" for i, v in c["cum_top"] if v is not None),
    ]
    if "fp32_b_add" in c:
        lines.append(
            f"  against fp32: side's added {_fmt(c['fp32_b_add'])}, reference's own {_fmt(c['fp32_a_add'])}; "
            f"cumulative {_fmt(c['fp32_b_cum'])} vs {_fmt(c['fp32_a_cum'])}"
        )
    if "router" in c:
        rt = c["router"]
        lines.append(
            f"  router margin {rt['margin_a']:.3g} (reference), {rt['margin_b']:.3g} (side); "
            f"{'same experts' if rt['same'] else 'OTHER experts'}"
        )
    return lines


def format_op_map(loc: Localisation) -> str:
    """The op map for a terminal: the first cell over the floor, every op that adds error beyond it, per
    layer the ops whose cumulative error is over, the MoE routers, the swap."""
    import numpy as np

    assert loc.op_map is not None
    m = op_map_from_dict(loc.op_map)
    R, T = len(m.rows), len(m.positions)
    over_add, over_cum = m.over("add"), m.over("cum")
    lines = [
        f"op map: {m.arch}, {m.layers} layers x {R} op rows x {T} positions ({m.positions[0]}..{m.positions[-1]}; "
        f"the examined token's is {m.examined}); added = {loc.b}'s op fed {loc.a}'s input",
    ]
    first = m.first_over("add")
    if first is not None:
        lines += ["first cell over the floor (added):", *cell_lines(m, *first)]
    adders = [r for r in range(R) if over_add[r].any()]
    if adders:
        lines.append(f"{'op':22} {'added max':>10} {'floor':>10} {'over at':>8}  first position over")
        for r in adders:
            t = int(np.flatnonzero(over_add[r])[0])
            lines.append(
                f"{m.label(r):22} {np.nanmax(m.stats['add_rel'][r]):10.2e} {np.nanmax(m.stats['floor_add'][r]):10.2e} "
                f"{int(over_add[r].sum()):>4}/{T:<4} {m.positions[t]} ({m.token_text[t]!r})"
            )
    else:
        lines.append(f"no op of {loc.b} adds error beyond the floor in the window")
    cum_rows: dict[str, list[str]] = {}
    for r in range(R):
        if over_cum[r].any():
            layer, op = m.rows[r]
            name = "embeddings" if layer < 0 else ("final" if layer >= m.layers else f"L{layer}")
            cum_rows.setdefault(name, []).append(op)
    if cum_rows:
        lines.append(
            "cumulative error over the floor: " + "; ".join(f"{k}: {' '.join(v)}" for k, v in cum_rows.items())
        )
    beyond = m.beyond_fp32("add")
    if beyond is not None and m.three_way is not None:
        rows = [m.label(r) for r in range(R) if beyond[r].any()]
        lines.append(
            f"three-way against fp32 side {m.three_way['side']}: {loc.b}'s added error beyond 2x {loc.a}'s own at "
            f"{int(beyond.sum())} of {R * T} cells" + (f" ({', '.join(rows[:8])})" if rows else "")
        )
    for layer, rt in sorted(m.routers.items()):
        flips = sum(1 for s in rt["same"] if s < 1)
        lines.append(
            f"router L{layer}: smallest margin {min(rt['margin_a']):.3g} ({loc.a}), experts differ at {flips} of {T} "
            "position(s)"
        )
    if m.swap:
        s = m.swap
        lines.append(
            f"swap {s['label']}: downstream cells over the floor {s['before']['cells_over_downstream']} -> "
            f"{s['after']['cells_over_downstream']}; logits at the examined token {s['before']['logits_rel_examined']:.2e}"
            f" -> {s['after']['logits_rel_examined']:.2e}; "
            + ("REMOVES the divergence" if s["removes"] else "does not remove the divergence")
        )
    lines.append(f"(over = above {FLOOR_MULTIPLE:g}x the floor; {BYTES_PER_CELL} bytes a cell stored)")
    return "\n".join(lines)


# -- the static report --------------------------------------------------------------------------------


def _color(v: float) -> tuple[int, int, int]:
    """log10(error / threshold) -> a color: white-blue within the floor, yellow at it, dark red far over."""
    if not math.isfinite(v):
        return (228, 228, 231)
    if v <= 0:
        k = max(0.0, min(1.0, (v + 4) / 4))  # -4..0 -> 0..1
        return (int(239 - 20 * k), int(246 - 10 * k), int(255 - 60 * k))
    k = max(0.0, min(1.0, v / 3))  # 0..3 -> 0..1
    return (int(250 - 130 * k), int(204 - 200 * k), int(21 + 10 * k))


def png(pixels: list[list[tuple[int, int, int]]]) -> bytes:
    """An RGB PNG of `pixels` (rows of (r, g, b)), written with zlib: no imaging library needed."""
    h, w = len(pixels), len(pixels[0]) if pixels else 0
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def heatmap_svg(m: OpMap, kind: str, width: int = 900, height: int = 520) -> str:
    """One kind's map as an inline SVG: the cells a PNG (one pixel a cell, scaled without smoothing),
    layers labelled, the first cell over the floor boxed, the examined token's column marked."""
    r = ratio(m, kind)
    R, T = r.shape
    pixels = [[_color(float(r[i, j])) for j in range(T)] for i in range(R)]
    data = base64.b64encode(png(pixels)).decode("ascii")
    left, top = 70, 16
    w, h = width - left - 10, height - top - 30
    cw, ch = w / T, h / R
    parts = [
        f'<svg class="om-svg" width="{width}" height="{height}" role="img" aria-label="op map, {kind} error">',
        f'<image x="{left}" y="{top}" width="{w}" height="{h}" preserveAspectRatio="none" '
        f'style="image-rendering:pixelated" href="data:image/png;base64,{data}"/>',
    ]
    last = None
    for i, (layer, _) in enumerate(m.rows):
        if layer != last:
            name = "emb" if layer < 0 else ("final" if layer >= m.layers else f"L{layer}")
            every = max(1, int(12 / max(ch * len(m.rows) / max(1, m.layers + 2), 0.1)))
            if layer < 0 or layer >= m.layers or layer % every == 0:
                parts.append(
                    f'<text x="{left - 4}" y="{top + (i + 0.9) * ch:.1f}" font-size="10" text-anchor="end">{name}</text>'
                )
            parts.append(
                f'<line x1="{left}" x2="{left + w}" y1="{top + i * ch:.1f}" y2="{top + i * ch:.1f}" stroke="#fff" stroke-width="0.3"/>'
            )
            last = layer
    if m.examined in m.positions:
        x = left + (m.positions.index(m.examined) + 0.5) * cw
        parts.append(
            f'<line class="om-div" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + h}" stroke="#dc2626" stroke-dasharray="3 2"/>'
        )
    first = m.first_over(kind)
    if first is not None:
        i, j = first
        parts.append(
            f'<rect class="om-first" x="{left + j * cw - 2:.1f}" y="{top + i * ch - 2:.1f}" width="{cw + 4:.1f}" '
            f'height="{ch + 4:.1f}" fill="none" stroke="#2563eb" stroke-width="2"/>'
        )
    parts.append(
        f'<text x="{left}" y="{height - 10}" font-size="10">position {m.positions[0]}</text>'
        f'<text x="{left + w}" y="{height - 10}" font-size="10" text-anchor="end">position {m.positions[-1]}</text></svg>'
    )
    return "".join(parts)


SWAP_ROWS = {
    "cells_over_downstream": "cells over the floor downstream of the op",
    "logits_over": "positions whose logits are over the floor",
    "logits_rel_examined": "the logits' error at the examined token",
    "logits_rel_max": "the logits' largest error",
    "argmax_b_examined": "the side's argmax at the examined token",
    "argmax_agrees": "positions where the two argmaxes agree",
}


def _v(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def op_map_html(loc: Localisation, heatmaps: bool = True) -> str:
    """The static report's op map: both maps, the first cell, the swap, the cells furthest over. Without
    `heatmaps` (the app, which draws the map with plotly) the rest only."""
    import numpy as np

    assert loc.op_map is not None
    m = op_map_from_dict(loc.op_map)
    first = m.first_over("add")
    cell = (
        "".join(f"<div>{esc(x)}</div>" for x in cell_lines(m, *first))
        if first
        else f"<div>no op of {esc(loc.b)} adds error beyond the floor in the window</div>"
    )
    r = ratio(m, "add")
    flat = np.argsort(-np.nan_to_num(r, nan=-99).ravel())[:15]
    top = "".join(
        f"<tr{' class=pc-over' if r.flat[k] > 0 else ''}><td>{esc(m.label(k // r.shape[1]))}</td>"
        f"<td>{m.positions[k % r.shape[1]]}</td><td>{esc(repr(m.token_text[k % r.shape[1]]))}</td>"
        f"<td>{m.stats['add_rel'].flat[k]:.2e}</td><td>{m.stats['floor_add'].flat[k]:.2e}</td>"
        f"<td>{m.stats['cum_rel'].flat[k]:.2e}</td></tr>"
        for k in flat
    )
    swap = ""
    if m.swap:
        s = m.swap
        rows = "".join(
            f"<tr><th>{esc(SWAP_ROWS.get(k, k))}</th><td>{esc(_v(s['before'][k]))}</td>"
            f"<td>{esc(_v(s['after'][k]))}</td></tr>"
            for k in s["before"]
        )
        swap = (
            f"<p class=om-swap><b>Swap {esc(s['label'])}</b>: {esc(s['sentence'])}</p>"
            f'<table class="pc-setting-table"><tr><th></th><th>before</th><th>after</th></tr>{rows}</table>'
        )
    routers = "".join(
        f"<li>L{layer}: smallest router margin {min(rt['margin_a']):.3g}; experts differ at "
        f"{sum(1 for s in rt['same'] if s < 1)} position(s)</li>"
        for layer, rt in sorted(m.routers.items())
    )
    return (
        f'<div class="pc-card om-map"><b>Op map: {esc(loc.b)} vs {esc(loc.a)}</b> <span class=pc-muted>{esc(m.arch)}, '
        f"{m.layers} layers, positions {m.positions[0]}..{m.positions[-1]} (red dashes: the examined token; blue box: "
        f"the first cell over the floor; pale blue to pale green: within the floor, yellow at its threshold, orange "
        f"to dark red up to 1,000x over it)</span>"
        + (
            f"<p>Added error (each op of {esc(loc.b)} fed {esc(loc.a)}'s input), over the floor's threshold:</p>"
            f"{heatmap_svg(m, 'add')}<p>Cumulative error:</p>{heatmap_svg(m, 'cum')}"
            if heatmaps
            else ""
        )
        + f"<div class=om-cell>{cell}</div>{swap}{f'<ul>{routers}</ul>' if routers else ''}"
        "<details><summary>the 15 cells furthest over the floor (added)</summary>"
        '<table class="pc-setting-table"><tr><th>op</th><th>position</th><th>token</th><th>added</th><th>floor</th>'
        f"<th>cumulative</th></tr>{top}</table></details>"
        f"<p class=pc-muted>Ops: {esc(', '.join(f'{k} = {v}' for k, v in OP_LABELS.items()))}. "
        f"{BYTES_PER_CELL} bytes a cell stored.</p></div>"
    )
