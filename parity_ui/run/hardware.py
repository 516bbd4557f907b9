"""What this machine has, found without importing torch or vllm (the app process never does) and
without initialising CUDA here."""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path


@lru_cache(maxsize=1)
def gpus() -> list[dict[str, str]]:
    """The NVIDIA GPUs nvidia-smi lists: index, name, total memory (MiB), compute capability."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    rows = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            rows.append({"index": parts[0], "name": parts[1], "memory_mib": parts[2], "compute_cap": parts[3]})
    return rows


def on_gpu() -> bool:
    return bool(gpus())


def compute_capability() -> float | None:
    g = gpus()
    try:
        return float(g[0]["compute_cap"]) if g else None
    except ValueError:
        return None


# Where vLLM keeps its batch-invariant kernels (the module moved between releases).
_BATCH_INVARIANT_MODULES = ("model_executor/determinism/batch_invariant.py", "model_executor/layers/batch_invariant.py")


def batch_invariant_support(gpu: bool) -> tuple[bool, str]:
    """(supported, why) for VLLM_BATCH_INVARIANT=1 with this environment's vLLM, decided without
    importing it. vLLM enables it only in its GPU worker, on CUDA compute capability >= 8.0."""
    spec = find_spec("vllm")  # a top-level find_spec does not import the package
    if spec is None or not spec.submodule_search_locations:
        return False, "vLLM is not installed"
    root = Path(list(spec.submodule_search_locations)[0])
    if not any((root / m).is_file() for m in _BATCH_INVARIANT_MODULES):
        return False, "unsupported on this vLLM (no batch-invariant kernels)"
    if not gpu:
        return False, "unsupported on this vLLM/device: vLLM's CPU worker never enables it"
    cap = compute_capability()
    if cap is not None and cap < 8.0:
        return False, f"unsupported on this device: compute capability {cap} < 8.0"
    return True, "supported"
