"""vLLM's model-class inspection cached ahead (parity_ui.engines.vllm_prewarm, issue 44 item 4): the
process a GPU host's head start runs beside the workers writes the file vLLM's own inspection would,
under the side's VLLM_CACHE_ROOT, and says there is nothing left to do once it is there. One vLLM
import (no model load)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from parity_ui.engines.vllm_prewarm import modelinfos_dir, needed

ROOT = Path(__file__).resolve().parents[2]


def test_prewarm_keeps_vllm_s_inspection_of_the_model_class(tiny_llama, tmp_path):
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm")}
    assert needed(str(tiny_llama), env)
    out = subprocess.run([sys.executable, "-m", "parity_ui.engines.vllm_prewarm", str(tiny_llama)], cwd=ROOT,
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    (kept,) = modelinfos_dir(env).glob("*-LlamaForCausalLM.json")
    info = json.loads(kept.read_text())
    assert info["hash"] and info["modelinfo"]["is_text_generation_model"] is True
    assert not needed(str(tiny_llama), env)  # the next head start starts nothing


def test_a_vllm_preload_on_the_cpu_asks_the_vector_instruction_sets_once_for_every_fork():
    """VllmEngine.preload (a fork server's imports) leaves inductor's probe of the CPU's vector
    instruction sets answered in the process, so a worker forked from it does not build and load the five
    test libraries again at its first generate (bench/figures/cpu-2026-11-28-isa)."""
    probe = ("from parity_ui.engines.vllm_engine import VllmEngine\n"
             "from torch._inductor import cpu_vec_isa\n"
             "before = cpu_vec_isa.valid_vec_isa_list.cache_info().currsize\n"
             "VllmEngine().preload()\n"
             "print(before, cpu_vec_isa.valid_vec_isa_list.cache_info().currsize)\n")
    from parity_ui.run.hardware import on_gpu

    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    # on a GPU vLLM's sampler does not go through inductor's CPU code: nothing is asked there
    assert out.stdout.split()[-2:] == (["0", "0"] if on_gpu() else ["0", "1"])
