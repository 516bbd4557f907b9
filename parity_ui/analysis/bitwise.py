"""Two token streams compared bit for bit: token ids AND logprob bits, tolerance 0.

A logprob is what an engine computed in float32 and handed over as a Python float (exact: every float32
is a float64). Two logprobs are equal only when their bits are (so -0.0 and 0.0 differ, and a NaN equals
the same NaN); the distance between two that differ is given in units in the last place (ulps) of
float32 when both are float32 values, else of float64. Pure.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence

from ..core.audit_record import Break


def _f32(x: float) -> bytes | None:
    """x's float32 bits, or None when x is not a float32 value (then it is compared as float64)."""
    try:
        b = struct.pack("<f", x)
    except OverflowError:
        return None
    if struct.unpack("<f", b)[0] == x or (math.isnan(x) and math.isnan(struct.unpack("<f", b)[0])):
        return b
    return None


def bits(x: float | None) -> bytes:
    """The bits a logprob is compared by: float32 where it is one, else float64; b"" for None."""
    if x is None:
        return b""
    return _f32(x) or struct.pack("<d", x)


def _ordered(b: bytes) -> int:
    """A float's bits as an integer that orders like the floats (negative floats count down from 0)."""
    width = len(b) * 8
    (i,) = struct.unpack("<i" if width == 32 else "<q", b)
    return i if i >= 0 else -(i & ((1 << (width - 1)) - 1))


def ulps_apart(x: float, y: float) -> tuple[int, str]:
    """How many representable floats lie between x and y (1: neighbours), and in which space:
    "float32" when both are float32 values, else "float64"."""
    bx, by = _f32(x), _f32(y)
    if bx is not None and by is not None:
        return abs(_ordered(bx) - _ordered(by)), "float32"
    return abs(_ordered(struct.pack("<d", x)) - _ordered(struct.pack("<d", y))), "float64"


def next_float32(x: float, ulps: int = 1) -> float:
    """The float32 `ulps` steps above x (x a float32 value): a planted control's change."""
    b = _f32(x)
    if b is None:
        raise ValueError(f"{x!r} is not a float32 value")
    i = _ordered(b) + ulps
    raw = i if i >= 0 else (-i) | 0x80000000
    return struct.unpack("<f", struct.pack("<I", raw & 0xFFFFFFFF))[0]


def next_up(x: float) -> tuple[float, str]:
    """The next representable value above x, one ulp away, in x's own space: float32 where x is a
    float32 value (what engines compute), else float64 (a logprob that came as decimal text)."""
    if _f32(x) is not None:
        return next_float32(x), "float32"
    return math.nextafter(x, math.inf), "float64"


def first_break(
    prompt: int,
    a_ids: Sequence[int],
    a_lps: Sequence[float | None],
    b_ids: Sequence[int],
    b_lps: Sequence[float | None],
) -> Break | None:
    """The first position where two streams part (token id, logprob bits, or length), None when every
    id and every logprob's bits agree."""
    n = min(len(a_ids), len(b_ids))
    for i in range(n):
        ta, tb = a_ids[i], b_ids[i]
        la = a_lps[i] if i < len(a_lps) else None
        lb = b_lps[i] if i < len(b_lps) else None
        # A logprob missing on either side (both too) is a break, never a match: bits were promised,
        # and a side that hands over none (a server asked for no logprobs) cannot be certified on ids.
        if ta == tb and la is not None and lb is not None and bits(la) == bits(lb):
            continue
        out = Break(prompt=prompt, token=i, kind="token" if ta != tb else "logprob", a_token=ta, b_token=tb)
        if la is None or lb is None:
            out.a_logprob, out.b_logprob = la, lb
            if ta == tb:
                out.kind = "missing"
            return out
        out.a_logprob, out.b_logprob = la, lb
        out.abs_diff = abs(la - lb) if not (math.isnan(la) or math.isnan(lb)) else math.inf
        out.ulps, out.ulp_space = ulps_apart(la, lb)
        return out
    if len(a_ids) != len(b_ids):
        return Break(
            prompt=prompt,
            token=n,
            kind="length",
            a_token=a_ids[n] if n < len(a_ids) else None,
            b_token=b_ids[n] if n < len(b_ids) else None,
        )
    return None


def stream_digest(streams: Sequence[tuple[Sequence[int], Sequence[float | None]]]) -> str:
    """sha256 over streams' token ids and logprob bits, in order: equal digests, equal streams (the
    evidence an audit names, for anyone who re-runs it)."""
    h = hashlib.sha256()
    for ids, lps in streams:
        h.update(struct.pack("<I", len(ids)))
        for t, lp in zip(ids, lps):
            h.update(struct.pack("<q", int(t)))
            b = bits(lp)
            h.update(struct.pack("<B", len(b)) + b)
    return h.hexdigest()
