"""A control model: a copy of a checkpoint with one decoder layer's weights noised, built once into
the cache. A gate whose thresholds pass on it cannot fail.

The weights are rewritten in a subprocess of this environment's Python with torch and
`safetensors.torch` (`python -m parity_ui.commands.gate.perturb SRC DST LAYER SCALE SEED`): the parent process
never imports torch (the project's rule: engines live in workers), and safetensors' numpy API cannot
do it instead, since numpy has no bfloat16 and most checkpoints today are bf16. Only the shards that
hold the layer are rewritten; the other shards are symlinked, the small files copied.

The folder is named by a hash of the source files (path, size, mtime), the layer, the scale and the
seed, so a second check reuses it; it is written under a temporary name and renamed, so a killed
build leaves nothing that looks finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ...core.errors import ParityError
from ...core.paths import cache_dir
from ...run.workers import PROJECT_ROOT

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def perturbed_model(model_path: str, layer: int | None, scale: float, seed: int) -> tuple[str, int]:
    """(folder, layer) of the control copy of `model_path` (a local folder), built if missing.
    Raises ParityError when the folder has no .safetensors weights, the layer does not exist, or
    the build fails (its stderr in the message)."""
    src = Path(model_path)
    weights = sorted(src.glob("*.safetensors"))
    if not weights:
        raise ParityError(
            f"the control cannot perturb {src}: it holds no .safetensors weights",
            "use control: {set: {...}} (e.g. a side in another dtype) for this model",
        )
    h = hashlib.sha256()
    h.update(str(src.resolve()).encode())
    for w in weights:
        st = w.stat()
        h.update(f"{w.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(f"{layer}:{scale!r}:{seed}".encode())
    dst = cache_dir() / "gate-controls" / h.hexdigest()[:20]
    done = dst / "parity-control.json"
    if done.is_file():
        return str(dst), json.loads(done.read_text())["layer"]
    tmp = dst.with_name(dst.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        # Fixed arguments: paths and numbers, no shell. PYTHONPATH: this checkout's parity_ui, from
        # whatever folder the check runs in.
        root = str(PROJECT_ROOT)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "parity_ui.commands.gate.perturb",
                str(src),
                str(tmp),
                "-1" if layer is None else str(layer),
                repr(float(scale)),
                str(seed),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
            env=env,
        )
        if proc.returncode != 0:
            raise ParityError(
                f"building the control model from {src} failed: {proc.stderr.strip()[-600:]}",
                "check the layer number, or use control: {set: {...}}",
            )
        info = json.loads((tmp / "parity-control.json").read_text())
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(dst), info["layer"]


def _build(src: Path, dst: Path, layer: int, scale: float, seed: int) -> None:  # runs in the subprocess
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    shards = sorted(src.glob("*.safetensors"))
    found: dict[Path, list[tuple[str, int]]] = {}  # each shard's layer tensors: (name, layer)
    layers: set[int] = set()
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                m = _LAYER.search(name)
                if m:
                    layers.add(int(m.group(1)))
                    found.setdefault(shard, []).append((name, int(m.group(1))))
    if not layers:
        raise SystemExit(f"no decoder layer found in {src} (no tensor named ...layers.N...)")
    if layer < 0:
        layer = sorted(layers)[len(layers) // 2]
    if layer not in layers:
        raise SystemExit(f"layer {layer} is not in {src}: it has layers {min(layers)}..{max(layers)}")
    gen = torch.Generator().manual_seed(seed)
    touched = []
    for item in src.iterdir():
        if item.suffix == ".safetensors" or item.name.startswith("."):
            continue
        if item.is_file():
            shutil.copy2(item, dst / item.name)
    for shard in shards:
        names = [n for n, k in found.get(shard, []) if k == layer]
        if not names:
            os.symlink(shard.resolve(), dst / shard.name)
            continue
        with safe_open(str(shard), framework="pt") as f:
            meta = f.metadata() or {"format": "pt"}
            tensors = {n: f.get_tensor(n) for n in f.keys()}
        for n in names:
            w = tensors[n]
            if w.ndim >= 2 and w.is_floating_point():
                noise = torch.randn(w.shape, generator=gen, dtype=torch.float32)
                tensors[n] = (w.float() + scale * w.float().std() * noise).to(w.dtype)
                touched.append(n)
        save_file(tensors, str(dst / shard.name), metadata=meta)
    (dst / "parity-control.json").write_text(
        json.dumps({"source": str(src), "layer": layer, "scale": scale, "seed": seed, "tensors": touched})
    )


if __name__ == "__main__":
    _build(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
