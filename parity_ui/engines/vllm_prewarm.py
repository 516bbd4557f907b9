"""vLLM's model-class inspection done ahead, in a process of its own, while the side's worker starts.

Before it loads a model, vLLM inspects the model's class (what it supports: pipeline parallelism,
multimodal inputs, ...) in a subprocess that imports vLLM once more, "to avoid initializing CUDA" in
the engine's process, and keeps the answer under VLLM_CACHE_ROOT/modelinfos/ (one file per class,
keyed by the hash of the class's module). On a machine that has never run the class, that subprocess
took 21-26 s of a cold `parity compare` on an H100 (docs/performance.md), after the worker had
imported vLLM itself and before the weights began to load: one more vLLM import on the critical path.

Here the same answer is computed and cached while the worker imports vLLM (run on a GPU host by
parity_ui.service's head start: `python -m parity_ui.engines.vllm_prewarm MODEL_FOLDER`, with the
side's environment): by the time the worker's LLM(...) asks, the file is there and vLLM reads it.
This process is the throwaway one, so it inspects in process (vLLM's registry helper that runs the
inspection in a subprocess is replaced for this process only). Nothing changes in what vLLM loads or
computes: the file is the one vLLM writes. Anything unexpected (another vLLM's registry, a class vLLM
maps otherwise) ends this process quietly; the worker then inspects as before.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def modelinfos_dir(env: dict[str, str] | None = None) -> Path:
    """Where vLLM keeps its model-class inspections for a process with `env` on top of this one's."""
    e = {**os.environ, **(env or {})}
    root = e.get("VLLM_CACHE_ROOT") or os.path.join(e.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm")
    return Path(root).expanduser() / "modelinfos"


def architectures(model_path: str) -> list[str]:
    try:
        archs = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8")).get("architectures")
    except (OSError, ValueError):
        return []
    return [a for a in archs or [] if isinstance(a, str)]


def needed(model_path: str, env: dict[str, str] | None = None) -> bool:
    """Whether the model's classes have no inspection kept yet (vLLM names the file after the class:
    vllm-model_executor-models-<module>-<Class>.json). Read from the files alone, without vLLM."""
    archs = architectures(model_path)
    folder = modelinfos_dir(env)
    return bool(archs) and not all(any(folder.glob(f"*-{a}.json")) for a in archs)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m parity_ui.engines.vllm_prewarm MODEL_FOLDER", file=sys.stderr)
        return 2
    archs = architectures(args[0])
    if not archs or not needed(args[0]):
        return 0
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        from vllm.model_executor.models import registry

        registry._run_in_subprocess = lambda fn: fn()  # this process is the throwaway one
        for arch in archs:
            registry.ModelRegistry._try_inspect_model_cls(arch)  # inspects, and keeps it under modelinfos/
    except Exception as e:  # noqa: BLE001 - the worker inspects as before
        print(f"vllm_prewarm: nothing done ({type(e).__name__}: {e})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
