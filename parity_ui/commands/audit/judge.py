"""An axis judged from its two sets of streams: per prompt, the first break (parity_ui.analysis.bitwise)
or identical; for the axis, the earliest break, how many prompts broke, the tokens compared and the
digests of both sides' streams. Pure: streams in, an AxisResult out. The control runs through this
same code, so a control that is detected proves this comparison can see one ulp."""

from __future__ import annotations

from ...analysis.bitwise import first_break, stream_digest
from ...core.audit_record import (
    BROKEN,
    CELL_BROKEN,
    CELL_IDENTICAL,
    CELL_SKIPPED,
    CELL_VACUOUS,
    IDENTICAL,
    VACUOUS,
    AxisResult,
    Cell,
)
from .passes import Stream


def judge_axis(
    side: str,
    axis: str,
    a: dict[int, Stream],
    b: dict[int, Stream],
    n_prompts: int,
    *,
    vacuous: set[int] | None = None,
    skipped: dict[int, str] | None = None,
    labels: tuple[str, str] = ("", ""),
) -> AxisResult:
    """Prompts in both `a` and `b` compared; those in `vacuous` (the axis could not have seen a
    difference there: no cache hit) and `skipped` (prompt -> why) are cells without a comparison. An
    axis whose every compared prompt is vacuous is VACUOUS, never identical."""
    vacuous, skipped = vacuous or set(), skipped or {}
    cells, tokens, broken, first = [], 0, 0, None
    compared = 0
    for i in range(n_prompts):
        if i in skipped or i not in a or i not in b:
            cells.append(Cell(i, CELL_SKIPPED, note=skipped.get(i, "not compared on this axis")))
            continue
        sa, sb = a[i], b[i]
        if i in vacuous:
            cells.append(Cell(i, CELL_VACUOUS, slot=sb.slot, cached=sb.cached, note="no cached token: nothing to test"))
            continue
        if not sa.ids and not sb.ids:  # two empty streams agree on nothing: no evidence either way
            cells.append(
                Cell(i, CELL_VACUOUS, slot=sb.slot, cached=sb.cached, note="no token generated: nothing to test")
            )
            continue
        compared += 1
        brk = first_break(i, sa.ids, sa.logprobs, sb.ids, sb.logprobs)
        n = min(len(sa.ids), len(sb.ids)) if brk is None else brk.token + (brk.kind != "length")
        tokens += n
        cell = Cell(i, CELL_IDENTICAL if brk is None else CELL_BROKEN, n, brk, sb.slot, sb.cached)
        cells.append(cell)
        if brk is not None:
            broken += 1
            if first is None:
                first = brk
    status = BROKEN if broken else (IDENTICAL if compared else VACUOUS)
    keys = [i for i in range(n_prompts) if i in a and i in b and i not in skipped]
    return AxisResult(
        axis=axis,
        side=side,
        status=status,
        reason=first.describe() if first is not None else "",
        a=labels[0],
        b=labels[1],
        cells=cells,
        first=first,
        broken=broken,
        prompts=compared,
        tokens=tokens,
        digests={
            "a": stream_digest([(a[i].ids, a[i].logprobs) for i in keys]),
            "b": stream_digest([(b[i].ids, b[i].logprobs) for i in keys]),
        },
    )
