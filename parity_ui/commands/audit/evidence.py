"""What an audit's certificate names, so that someone else can check it: the weights' digests (every
weight file of every model a side loaded, sha256), each side's engine versions and resolved settings
(the variants' too: what each axis changed), the config, each prompt's ids by digest, the machine, the
tolerance (0) and the run ids. The certificate itself is the audit's JSON with this evidence in it and
its HTML page with the same JSON inside (parity_ui.render.audit).
"""

from __future__ import annotations

import hashlib
import os
import platform
import struct
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz")
_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256: a file hashed once a process


def file_sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def weights_digests(folder: str) -> dict[str, Any]:
    """{file: sha256} of a model folder's weight files (and config.json, whose shape decides what they
    mean), with their total size. A folder without weight files says so."""
    root = Path(folder)
    files = (
        sorted(p for p in root.iterdir() if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name == "config.json"))
        if root.is_dir()
        else []
    )
    out = {p.name: file_sha256(p) for p in files}
    weights = [p for p in files if p.suffix in WEIGHT_SUFFIXES]
    return {
        "folder": str(root),
        "files": out,
        "weight_files": len(weights),
        "bytes": sum(p.stat().st_size for p in weights),
        **({} if weights else {"note": "no weight file found in the folder"}),
    }


def prompt_digest(ids: list[int]) -> str:
    h = hashlib.sha256()
    for t in ids:
        h.update(struct.pack("<q", int(t)))
    return h.hexdigest()


def machine() -> dict[str, Any]:
    return {"host_arch": platform.machine(), "platform": platform.platform(), "cpus": os.cpu_count()}
