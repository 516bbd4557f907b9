"""The images of an image prompt, beside the streams: thumbnails (data: URIs, so the static report stays
one self-contained file) with each side's image token count and resize, a mismatch marked."""

from __future__ import annotations

import base64
import html
from collections.abc import Callable
from typing import Any

ImageLookup = Callable[[str], "tuple[bytes, str] | None"]  # sha256 -> (bytes, format)
MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}


def images_html(images: list[dict[str, Any]], lookup: ImageLookup | None = None) -> str:
    """One figure per image of a prompt (PromptResult.images); '' for a text prompt."""
    if not images:
        return ""
    figs = []
    for meta in images:
        got = lookup(meta.get("sha256", "")) if lookup else None
        name = html.escape(str(meta.get("name", "")))
        if got is not None:
            data, fmt = got
            src = f"data:{MIME.get(fmt, 'image/png')};base64,{base64.b64encode(data).decode()}"
            pic = f'<img src="{src}" alt="{name}" style="max-width:240px;max-height:240px;display:block">'
        else:
            pic = '<div class="pc-muted">(image bytes not stored)</div>'
        tokens = meta.get("tokens") or {}
        counts = set(tokens.values())
        mark = ' style="color:#b00020;font-weight:600"' if len(counts) > 1 else ""
        per_side = ", ".join(f"{html.escape(str(s))}: {n}" for s, n in tokens.items())
        pixels = meta.get("pixels") or {}
        resize = (
            "; ".join(
                f"{html.escape(str(s))}: max_pixels={p.get('max_pixels')}"
                for s, p in pixels.items()
                if isinstance(p, dict)
            )
            if len({str(p) for p in pixels.values()}) > 1
            else ""
        )
        caption = (
            f"{name} · {meta.get('width')} x {meta.get('height')} {html.escape(str(meta.get('format', '')))}"
            f" · sha256 {html.escape(str(meta.get('sha256', ''))[:12])}"
        )
        if per_side:
            caption += f"<br><span{mark}>image tokens: {per_side}</span>"
        if resize:
            caption += f"<br><span{mark}>sides resize differently: {resize}</span>"
        figs.append(
            f'<figure class="pc-image" style="margin:0 12px 8px 0">{pic}'
            f'<figcaption style="font-size:12px">{caption}</figcaption></figure>'
        )
    return f'<div class="pc-images" style="display:flex;flex-wrap:wrap">{"".join(figs)}</div>'
