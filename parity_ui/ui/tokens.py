"""Two aligned token panes (vLLM | HF) as compact HTML. Pure functions: steps in, a string out.

Built to stay light at 16k tokens per engine: one bare <span> per token (no per-token tooltip
markup), grouped in blocks of BLOCK tokens that the browser can skip laying out off screen
(CSS content-visibility), and one JSON blob per view with every position's id, logprob, rank and
top-k for both engines, read by the small handler in assets.JS on hover or click.

Chip classes: `m` same token in both engines, `d` the first divergent position, `a` after it,
`n` not compared yet (live, the other engine has not reached it). Whitespace is made visible:
'·' space, '⏎' newline, '→' tab; other control characters as \\xNN.
"""
from __future__ import annotations

import html
import json
from typing import Sequence

from ..types import TokenStep

BLOCK = 128  # tokens per content-visibility block: small enough to skip, big enough to be few
_VISIBLE = {" ": "·", "\n": "⏎", "\t": "→", "\r": "␍"}


def visible_text(text: str) -> str:
    """HTML for one token's text: escaped, whitespace and control characters made visible."""
    if text == "":
        return '<i>∅</i>'
    out = []
    for ch in text:
        mark = _VISIBLE.get(ch)
        if mark is not None:
            out.append(f"<i>{mark}</i>")
        elif ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"<i>\\x{ord(ch):02x}</i>")
        else:
            out.append(html.escape(ch, quote=False))
    return "".join(out)


def first_difference(a: Sequence[int], b: Sequence[int], *, finished: bool) -> int | None:
    """The first index where the two id streams differ. A shorter stream counts as differing at
    its end only when both engines are finished (while streaming it may still catch up)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    if finished and len(a) != len(b):
        return n
    return None


def _chip_class(i: int, this: Sequence[int], other: Sequence[int], div: int | None) -> str:
    if div is not None:
        if i == div:
            return "d"
        if i > div:
            return "a"
    return "m" if i < len(other) and other[i] == this[i] else "n"


def _pane(name: str, label: str, steps: Sequence[TokenStep], other_ids: Sequence[int],
          div: int | None, ended: str | None) -> str:
    ids = [s.token_id for s in steps]
    parts = [f'<div class="pt-pane" data-engine="{name}"><div class="pt-head">{label}'
             f'<span class="pt-count">{len(steps)} tokens</span></div><div class="pt-body">']
    for start in range(0, len(steps), BLOCK):
        parts.append(f'<div class="b" data-o="{start}">')
        for i in range(start, min(start + BLOCK, len(steps))):
            text = steps[i].text
            parts.append(f'<span class="t {_chip_class(i, ids, other_ids, div)}">{visible_text(text)}</span>')
            if text.endswith("\n"):
                parts.append("<br>")
        parts.append("</div>")
    if ended:
        parts.append(f'<div class="pt-end">{html.escape(ended)}</div>')
    parts.append("</div></div>")
    return "".join(parts)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def details_json(vllm: Sequence[TokenStep], hf: Sequence[TokenStep]) -> str:
    """Per-position details for the hover handler, compact: token texts once in a vocabulary,
    each step as [id, logprob, rank, [top id, top logprob, ...]]."""
    vocab: dict[int, str] = {}

    def enc(steps: Sequence[TokenStep]) -> list[list]:
        rows = []
        for s in steps:
            vocab.setdefault(s.token_id, s.text)
            flat: list = []
            for t in s.top:
                vocab.setdefault(t.token_id, t.text)
                flat += [t.token_id, _round(t.logprob)]
            rows.append([s.token_id, _round(s.logprob), s.rank, flat])
        return rows

    data = {"vllm": enc(vllm), "hf": enc(hf)}
    data["vocab"] = {str(k): v for k, v in vocab.items()}
    return json.dumps(data, ensure_ascii=True, separators=(",", ":"))


def panes_html(vllm: Sequence[TokenStep], hf: Sequence[TokenStep], *, divergence: int | None,
               live: bool = False, note: str = "") -> str:
    """The two panes side by side plus the details box. `divergence` is the first divergent index
    as the core reported it (or as computed live); None when the streams agree so far."""
    v_ids, h_ids = [s.token_id for s in vllm], [s.token_id for s in hf]
    v_end = "stream ended here" if divergence is not None and divergence >= len(vllm) and not live else None
    h_end = "stream ended here" if divergence is not None and divergence >= len(hf) and not live else None
    attrs = f' data-div="{divergence}"' if divergence is not None else ""
    attrs += ' data-live="1"' if live else ""
    hint = ("Hover a token to see its id, logprob, rank and both engines' top-k alternatives at that "
            "position; click to pin.")
    return "".join([
        f'<div class="pt-root"{attrs}>',
        f'<div class="pt-note">{html.escape(note)}</div>' if note else "",
        '<div class="pt-legend"><span class="pt-key m">same token</span><span class="pt-key d">first divergence'
        '</span><span class="pt-key a">after it</span><span class="pt-ws">· space ⏎ newline → tab</span></div>',
        '<div class="pt-panes">',
        _pane("vllm", "vLLM", vllm, h_ids, divergence, v_end),
        _pane("hf", "HF transformers", hf, v_ids, divergence, h_end),
        "</div>",
        f'<div class="pt-info">{hint}</div>',
        f'<div class="pt-json" hidden>{html.escape(details_json(vllm, hf), quote=False)}</div>',
        "</div>",
    ])
