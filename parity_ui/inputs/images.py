"""Images of image + text prompts: read and check them ONCE in the parent, carry them as plain bytes.

An `ImageInput` is plain data (name, bytes, content hash, size): it crosses into a side's worker, where
the engine decodes the bytes itself (no PIL object crosses a pipe). Every check that can fail on a bad
file happens here, before any engine starts, with an error that names the file and the fix:
a missing file, a file too large, a file that is not an image (or not one PIL can decode), a corrupt or
truncated image, an image with too many pixels.

The resize rule of the Qwen-VL family (`smart_resize`) is here too, so preflight can say how many image
tokens a side will make and how much an image is downscaled without running a processor.
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import PromptError
from ..core.mapping import option

MAX_IMAGE_BYTES = 20 * 2**20  # a file over this is refused (and would not be stored)
MAX_IMAGE_PIXELS = 40_000_000  # width x height: ~6300 x 6300; more is refused before decoding
MAX_IMAGES_PER_PROMPT = 8  # what a prompt file or the app may attach; vLLM's own limit is a config key
IMAGE_TYPES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}


@dataclass
class ImageInput:
    """One image as the user gave it. Plain data: bytes, never a PIL object."""

    name: str  # the file name (or path) as given, for messages
    data: bytes
    sha256: str
    width: int
    height: int
    format: str  # "PNG", "JPEG", ...

    @property
    def mime(self) -> str:
        return FORMATS.get(self.format, "application/octet-stream")

    def meta(self) -> dict[str, Any]:
        """What a run records about the image (the bytes are stored apart, by hash)."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "width": self.width,
            "height": self.height,
            "format": self.format,
            "bytes": len(self.data),
        }

    def __repr__(self) -> str:  # never print the bytes
        return f"ImageInput({self.name!r}, {self.width}x{self.height} {self.format}, {len(self.data)} bytes)"


def image_from_bytes(data: bytes, name: str) -> ImageInput:
    """Check and describe an image's bytes. PromptError naming `name` and the fix when it is unusable."""
    if len(data) > MAX_IMAGE_BYTES:
        raise PromptError(
            f"image {name!r} is {len(data) / 2**20:.1f} MiB, over the {MAX_IMAGE_BYTES // 2**20} MiB limit",
            "downscale or re-encode it (e.g. as a JPEG under "
            f"{MAX_IMAGE_BYTES // 2**20} MiB); the model resizes it anyway",
        )
    if not data:
        raise PromptError(f"image {name!r} is an empty file", "give a PNG, JPEG, WebP, GIF or BMP image")
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:  # reads the header only
            fmt, (w, h) = str(img.format or ""), img.size
    except UnidentifiedImageError:
        raise PromptError(
            f"image {name!r} is not an image PIL can read (its first bytes: {data[:8]!r})",
            "give a PNG, JPEG, WebP, GIF or BMP image; a file renamed .png is not converted",
        ) from None
    except Image.DecompressionBombError as e:
        raise PromptError(
            f"image {name!r} is too large to decode safely ({e})",
            f"downscale it to at most {MAX_IMAGE_PIXELS // 1_000_000} megapixels",
        ) from None
    except Exception as e:  # noqa: BLE001 - a broken header
        raise PromptError(
            f"image {name!r} cannot be read: {type(e).__name__}: {e}", "re-export the image as PNG or JPEG"
        ) from None
    if w * h > MAX_IMAGE_PIXELS:
        raise PromptError(
            f"image {name!r} is {w} x {h} pixels ({w * h / 1e6:.0f} megapixels), over the "
            f"{MAX_IMAGE_PIXELS // 1_000_000} megapixel limit",
            f"downscale it first (e.g. to {_fit(w, h)}); the model resizes it to far fewer pixels anyway",
        )
    if w < 1 or h < 1:
        raise PromptError(f"image {name!r} has no pixels ({w} x {h})", "give a real image")
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()  # decodes every pixel: a truncated or corrupt file fails here, not in a worker
    except Exception as e:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError...
        raise PromptError(
            f"image {name!r} is corrupt or truncated ({type(e).__name__}: {str(e)[:120]})",
            "re-export or re-download the image; check it opens in an image viewer",
        ) from None
    return ImageInput(
        name=name, data=bytes(data), sha256=hashlib.sha256(data).hexdigest(), width=w, height=h, format=fmt
    )


def _fit(w: int, h: int) -> str:
    s = math.sqrt(MAX_IMAGE_PIXELS / 4 / (w * h))
    return f"{max(1, int(w * s))} x {max(1, int(h * s))}"


def read_image(path: str | Path, base: Path | None = None) -> ImageInput:
    """An image file, checked (size before reading). `base`: the folder relative paths start from."""
    p = Path(path).expanduser()
    if base is not None and not p.is_absolute():
        p = base / p
    if not p.is_file():
        raise PromptError(
            f"image file {str(path)!r} not found" + (f" (looked in {base})" if base else ""),
            "check the path; in a .jsonl prompt file, paths are relative to the file's folder",
        )
    size = p.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise PromptError(
            f"image {str(path)!r} is {size / 2**20:.1f} MiB, over the {MAX_IMAGE_BYTES // 2**20} MiB limit",
            f"downscale or re-encode it (e.g. as a JPEG under {MAX_IMAGE_BYTES // 2**20} MiB); "
            "the model resizes it anyway",
        )
    return image_from_bytes(p.read_bytes(), str(path))


def decode_image(data: bytes) -> Any:
    """Bytes -> an RGB PIL image (in a side's worker)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize rule (transformers' image_processing_qwen2_vl.smart_resize, also vLLM's): both
    sides multiples of `factor` (patch x merge), the area within [min_pixels, max_pixels], the aspect
    ratio kept as closely as that allows."""
    if max(height, width) / max(min(height, width), 1) > 200:
        raise PromptError(
            f"an image of {width} x {height} has an aspect ratio over 200", "crop it to a less extreme shape"
        )
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def image_tokens(image: ImageInput, patch: int, merge: int, min_pixels: int, max_pixels: int) -> tuple[int, int, int]:
    """(tokens, resized width, resized height) the Qwen-VL rule gives this image."""
    h, w = smart_resize(image.height, image.width, patch * merge, min_pixels, max_pixels)
    return (h // patch) * (w // patch) // (merge * merge), w, h


def image_findings(prep: Any, vision: Any) -> list[Any]:
    """Preflight for image prompts (a Prepared and the run's VisionProcessor): what each side's
    resize makes of each image, the resize trap (sides that resize differently), heavy downscaling."""
    from ..core.mapping import side_image_pixels
    from ..core.types import Finding

    out: list[Finding] = []
    ref = prep.reference
    ref_px = side_image_pixels(prep.config, ref.spec, prep.resolved) or {}
    for plan in prep.sides[1:]:
        px = side_image_pixels(prep.config, plan.spec, prep.resolved) or {}
        if px == ref_px:
            continue
        diffs = ", ".join(
            f"{k}={px.get(k)} (reference {ref_px.get(k)})"
            for k in ("min_pixels", "max_pixels")
            if px.get(k) != ref_px.get(k)
        )
        counts = []
        for i, (a, b) in enumerate(zip(prep.prompts, prep.prompts_of(plan.name))):
            for k, img in enumerate(a.images):
                if a.image_tokens[k] != b.image_tokens[k]:
                    counts.append(
                        f"prompt {i} image {img.name!r}: {b.image_tokens[k]} image tokens on {plan.name}, "
                        f"{a.image_tokens[k]} on {ref.name}"
                    )
        key = next(
            (k for k in ("image_max_pixels", "image_min_pixels") if option(plan.spec, k) is not None),
            "image_max_pixels",
        )
        out.append(
            Finding(
                code="image-resize-differs",
                severity="warning",
                side=plan.name,
                message=f"side {plan.name} resizes images with {diffs}: the sides do not see the same image"
                + (
                    f" ({'; '.join(counts)}) and their streams will part from the first token"
                    if counts
                    else " (the same token count for these images, but other pixels)"
                ),
                fix="give every side the same image_min_pixels / image_max_pixels (set them once at the top level)",
                setting={"key": f"{plan.name}.{key}", "value": None},
            )
        )
    factor = vision.patch_size * vision.merge_size
    for i, e in enumerate(prep.prompts):
        for k, img in enumerate(e.images):
            px = e.pixels or ref_px
            h, w = smart_resize(img.height, img.width, factor, px.get("min_pixels", 1), px.get("max_pixels", 1 << 40))
            shrink = (img.width * img.height) / max(w * h, 1)
            tokens = e.image_tokens[k] if k < len(e.image_tokens) else None
            out.append(
                Finding(
                    code="image-tokens",
                    severity="info",
                    message=f"prompt {i} image {img.name!r} ({img.width} x {img.height}) is resized to "
                    f"{w} x {h}: {tokens} image tokens (min_pixels={px.get('min_pixels')}, "
                    f"max_pixels={px.get('max_pixels')})",
                )
            )
            if shrink >= 4:
                out.append(
                    Finding(
                        code="image-downscaled",
                        severity="warning",
                        message=f"prompt {i} image {img.name!r} ({img.width} x {img.height}) is downscaled to {w} x {h} "
                        f"before the model sees it: {shrink:.0f}x fewer pixels ({math.sqrt(shrink):.1f}x per side); "
                        "fine detail (small text) is lost on every side alike",
                        fix="raise image_max_pixels (more image tokens, more memory) or crop the image to what matters",
                        setting={"key": "image_max_pixels", "value": min(img.width * img.height, 16384 * 28 * 28)},
                    )
                )
    return out


__all__ = [
    "image_findings",
    "ImageInput",
    "image_from_bytes",
    "read_image",
    "decode_image",
    "smart_resize",
    "image_tokens",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGES_PER_PROMPT",
    "IMAGE_TYPES",
]
