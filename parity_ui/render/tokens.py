"""Aligned token panes, one per side, as compact HTML. Pure functions: steps in, a string out.

Built to stay light at 16k tokens per side: one bare <span> per token (no per-token tooltip
markup), grouped in blocks of BLOCK tokens that the browser can skip laying out off screen
(CSS content-visibility), and one JSON blob per view with every position's id, logprob, rank and
top-k for every side, read by the small handler in assets.JS on hover or click.

Chip classes, each side against the reference (the reference against the selected side): `m` same
token, `d` the first divergent position, `a` after it, `n` not compared yet (live, the other side
has not reached it); `r` marks a token whose text cannot show its bytes (a piece of a multi-byte
character), which the byte view shows as hex. Whitespace is made visible: '·' space, '⏎' newline,
'→' tab; other control characters as \\xNN.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.bulk import gc_paused
from ..core.types import StepColumns, TokenStep, step_column

BLOCK = 128  # tokens per content-visibility block: small enough to skip, big enough to be few
LAZY_OVER = 2048  # a pane longer than this ships only the blocks near where the eye goes; the page
#                   script builds the others from the details JSON as they scroll near (16k tokens
#                   per side stay a small DOM)
NEAR = 2  # blocks kept on either side of the divergence (or at the end of a live pane)
_VISIBLE = {" ": "·", "\n": "⏎", "\t": "→", "\r": "␍"}


@dataclass
class Stream:
    """One side's pane: its name, a label for people, its steps, and where it ended (if early)."""

    name: str
    label: str
    steps: Sequence[TokenStep]
    divergence: int | None = None  # this side's first divergence from the reference (None: none)


def visible_text(text: str) -> str:
    """HTML for one token's text: escaped, whitespace and control characters made visible."""
    if text == "":
        return "<i>∅</i>"
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


def hex_bytes(raw: str) -> str:
    return " ".join(raw[i : i + 2] for i in range(0, len(raw), 2))


def first_difference(a: Sequence[int], b: Sequence[int], *, finished: bool) -> int | None:
    """The first index where two id streams differ. A shorter stream counts as differing at its
    end only when both sides are finished (while streaming it may still catch up)."""
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


def _chip(step: TokenStep, cls: str) -> str:
    if step.raw:
        return (
            f'<span class="t {cls} r"><span class="tx">{visible_text(step.text)}</span>'
            f'<b class="x">{hex_bytes(step.raw)}</b></span>'
        )
    return f'<span class="t {cls}">{visible_text(step.text)}</span>'


def _eager_blocks(n: int, focus: int | None, live: bool) -> set[int] | None:
    """Which blocks a long pane renders on the server (None: all of them)."""
    if n <= LAZY_OVER:
        return None
    last = (n - 1) // BLOCK
    centre = last if live else min((focus or 0) // BLOCK, last)
    return {b for b in range(centre - NEAR, centre + NEAR + 1) if 0 <= b <= last}


def _pane(
    s: Stream,
    other_ids: Sequence[int],
    div: int | None,
    ended: str | None,
    reference: bool,
    eager: set[int] | None = None,
    focus: int | None = None,
) -> str:
    ids = step_column(s.steps, "token_id")
    tag = '<span class="pt-ref">reference</span>' if reference else ""
    parts = [
        f'<div class="pt-pane" data-side="{html.escape(s.name)}"><div class="pt-head">'
        f'<span>{html.escape(s.label)} {tag}</span><span class="pt-count">{len(s.steps)} tokens</span></div>'
        '<div class="pt-body">'
    ]
    for start in range(0, len(s.steps), BLOCK):
        count = min(BLOCK, len(s.steps) - start)
        if eager is not None and start // BLOCK not in eager:
            # Built by the page script when scrolled near; its height is a guess until then.
            parts.append(
                f'<div class="b" data-o="{start}" data-n="{count}" data-lazy="1" '
                f'style="min-height:{max(1, count // 9) * 24}px"></div>'
            )
            continue
        parts.append(f'<div class="b" data-o="{start}">')
        for i in range(start, min(start + BLOCK, len(s.steps))):
            parts.append(_chip(s.steps[i], _chip_class(i, ids, other_ids, div) + (" f" if i == focus else "")))
            if s.steps[i].text.endswith("\n"):
                parts.append("<br>")
        parts.append("</div>")
    if ended:
        parts.append(f'<div class="pt-end">{html.escape(ended)}</div>')
    parts.append("</div></div>")
    return "".join(parts)


def _optional(c: StepColumns, name: str) -> list[Any] | None:
    """A measure's optional step column (core.measures STEP_COLUMNS), None where the side recorded none.
    StepColumns declares these per measure at run time, so they are read by name."""
    return getattr(c, name)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def _bits(x: float | None) -> float | None:
    """The chosen token's logprob to 9 significant digits: enough to tell any two float32 values apart,
    so a pair a few ulp apart (an audit's break, an equal token with other bits) still differs in the
    details; five decimals would read them alike."""
    return None if x is None else float(f"{x:.9g}")


def _sig(x: float | None) -> float | None:
    """A KL near the floor is 1e-12, not 0: four significant digits, not five decimals."""
    return None if x is None else float(f"{x:.4g}")


def details_json(streams: Sequence[Stream], window: tuple[int, int] | None = None) -> str:
    """Per-position details for the hover handler, compact: token texts (and bytes where the text
    cannot show them) once in a vocabulary, each step as [id, logprob (9 digits), rank, [top id, logprob
    (5 decimals), ...]]
    and, where the chosen token ties others exactly, a fifth item: their ranks; a sampled token's draw
    is a sixth, [sampling margin, kept set size, kept mass S] (the fifth then [] when nothing ties); the whole
    distribution against the reference a seventh, [KL(ref‖side), KL(side‖ref), TV] (full_distribution).
    `window` (lo, hi) keeps only those positions (`off` says where they start, `len` each side's
    length): a long view ships the part around the divergence and fetches the rest after it shows."""
    vocab: dict[int, str] = {}
    raw: dict[int, str] = {}
    lo, hi = window if window is not None else (0, None)

    def enc(steps: Sequence[TokenStep]) -> list[list]:
        # From the columns (a stored run's steps are columns already): no TokenStep per position.
        c = StepColumns.from_steps(steps)
        starts, top_id, top_lp, top_text = c.top_starts(), c.top_token_id, c.top_logprob, c.top_text
        kept, margin, mass = _optional(c, "kept"), _optional(c, "margin"), _optional(c, "kept_mass")  # None: no draws
        kl, kl_rev, tv = _optional(c, "kl"), _optional(c, "kl_rev"), _optional(c, "tv")  # None: no full rows met here
        rows = []
        for i in range(lo, len(c) if hi is None else min(hi, len(c))):
            tid = c.token_id[i]
            vocab.setdefault(tid, c.text[i])
            if i in c.raw:
                raw.setdefault(tid, c.raw[i])
            flat: list = []
            lp = c.logprob[i]
            # Exact ties: the other ranks whose logprob equals the chosen token's, bit for bit (an
            # engine orders them arbitrarily: "rank 2" of a tie is no worse than rank 1).
            ties = [
                k - starts[i] + 1
                for k in range(starts[i], starts[i + 1])
                if lp is not None and top_lp[k] == lp and top_id[k] != tid
            ]
            for k in range(starts[i], starts[i + 1]):
                vocab.setdefault(top_id[k], top_text[k])
                if k in c.top_raw:
                    raw.setdefault(top_id[k], c.top_raw[k])
                flat += [top_id[k], _round(top_lp[k])]
            row = [tid, _bits(lp), c.rank[i], flat, ties] if ties else [tid, _bits(lp), c.rank[i], flat]
            if kept is not None and kept[i] is not None:
                # A sampled token's draw (shared-seed sampling): [sampling margin, kept set size, kept mass S].
                row += [[]] * (5 - len(row)) + [
                    [_round(margin[i]) if margin else None, kept[i], _round(mass[i]) if mass else None]
                ]
            if kl is not None and kl[i] is not None:
                # The whole distribution against the reference here (full_distribution): [KL(ref‖side), KL(side‖ref), TV].
                row += [[]] * (6 - len(row)) + [
                    [_sig(kl[i]), _sig(kl_rev[i]) if kl_rev else None, _sig(tv[i]) if tv else None]
                ]
            rows.append(row)
        return rows

    data: dict[str, Any] = {
        "sides": [s.name for s in streams],
        "labels": [s.label for s in streams],
        "steps": {s.name: enc(s.steps) for s in streams},
        "divs": {s.name: s.divergence for s in streams},
    }
    if window is not None:
        data["off"] = lo
        data["len"] = {s.name: len(s.steps) for s in streams}
    data["vocab"] = {str(k): v for k, v in vocab.items()}
    data["raw"] = {str(k): v for k, v in raw.items()}
    return json.dumps(data, ensure_ascii=True, separators=(",", ":"))


def panes_html(
    streams: Sequence[Stream],
    *,
    selected: str | None = None,
    live: bool = False,
    note: str = "",
    details_src: str | None = None,
    focus: int | None = None,
) -> str:
    """Every side's pane, the reference first, plus the details box. Each side's divergence is the
    one the core reported (or computed live); the reference pane is marked against `selected`
    (default: the side that diverged first). With `details_src` (the app's id of a stored view), a
    long view carries only the details of the blocks it builds; the page script fetches the rest
    from the app's `pane_details` endpoint once the panes show (a 16k-token pair's details are
    ~2.5 MB, which used to travel before anything was shown). Without it (a static report, a
    live view) every position's details are inline. `focus` marks one position in every pane (a
    replay's worst token, opened from its table): the view opens there, its details shown, instead of
    at the divergence."""
    if not streams:
        return ""
    with gc_paused():
        return _panes_html(streams, selected, live, note, details_src, focus)


def _window(streams: Sequence[Stream], eager: Sequence[set[int] | None]) -> tuple[int, int] | None:
    """The positions whose chips the server builds, over every pane given each pane's eager blocks
    (None: all of them, nothing is left to fetch). A short pane next to a long one is built whole,
    so its range counts whole."""
    if all(e is None for e in eager):
        return None
    ranges = [
        (0, len(s.steps)) if e is None else (min(e) * BLOCK, (max(e) + 1) * BLOCK)
        for s, e in zip(streams, eager)
        if e is None or e
    ]
    return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)


def _panes_html(
    streams: Sequence[Stream],
    selected: str | None,
    live: bool,
    note: str,
    details_src: str | None,
    focus: int | None = None,
) -> str:
    ref, others = streams[0], list(streams[1:])
    ref_ids = step_column(ref.steps, "token_id")
    diverged = [(s.divergence, k) for k, s in enumerate(others) if s.divergence is not None]
    sel = next((s for s in others if s.name == selected), None) or (
        others[min(diverged)[1]] if diverged else (others[0] if others else None)
    )
    sel_div = sel.divergence if sel else None
    eager = [_eager_blocks(len(s.steps), sel_div if focus is None else focus, live) for s in streams]
    panes = [
        _pane(
            ref,
            step_column(sel.steps, "token_id") if sel else ref_ids,
            sel_div,
            "stream ended here" if sel_div is not None and sel_div >= len(ref.steps) and not live else None,
            True,
            eager[0],
            focus,
        )
    ]
    for s, e in zip(others, eager[1:]):
        ended = "stream ended here" if s.divergence is not None and s.divergence >= len(s.steps) and not live else None
        panes.append(_pane(s, ref_ids, s.divergence, ended, False, e, focus))
    attrs = f' data-div="{sel_div}"' if sel_div is not None else ""
    attrs += f' data-focus="{focus}"' if focus is not None else ""
    attrs += f' data-sel="{html.escape(sel.name)}"' if sel else ""
    attrs += ' data-live="1"' if live else ""
    window = _window(streams, eager) if details_src and not live else None
    if window is not None and details_src:  # (a window is only made with a details source)
        attrs += f' data-src="{html.escape(details_src)}"'
    hint = (
        "Hover a token to see its id, bytes, logprob, rank and every side's top-k alternatives at that "
        "position; click to pin."
    )
    has_raw = any(
        s.steps.has_raw if isinstance(s.steps, StepColumns) else any(st.raw for st in s.steps) for s in streams
    )
    toggle = (
        ('<label class="pt-bytes-toggle"><input type="checkbox" class="pt-bytes-cb"> show byte tokens as bytes</label>')
        if has_raw
        else ""
    )
    return "".join(
        [
            f'<div class="pt-root"{attrs} style="--n:{len(streams)}">',
            f'<div class="pt-note">{html.escape(note)}</div>' if note else "",
            '<div class="pt-legend"><span class="pt-key m">same token as the reference</span>'
            '<span class="pt-key d">first divergence</span><span class="pt-key a">after it</span>'
            + ('<span class="pt-key f">opened token</span>' if focus is not None else "")
            + f'<span class="pt-ws">· space ⏎ newline → tab</span>{toggle}</div>',
            '<div class="pt-panes">',
            *panes,
            "</div>",
            f'<div class="pt-info">{hint}</div>',
            f'<div class="pt-json" hidden>{html.escape(details_json(streams, window), quote=False)}</div>',
            "</div>",
        ]
    )
