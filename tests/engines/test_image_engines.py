"""Image + text prompts through real vLLM (CPU build) and real transformers, with a tiny random Qwen2-VL
built here (tests/tiny_vlm.py; no hub): float32 identical, the resize trap reported and seen.

This CPU environment has no torchvision: vLLM's Qwen-VL modules need the shim from tests/tiny_vlm.py on
the workers' PYTHONPATH (a test-environment workaround; a normal install does not need it).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from parity_ui.core.config import build_config
from parity_ui.inputs.images import read_image
from parity_ui.run.prepare import RunRequest
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.store.runs import get_run, image_bytes


PIXELS = ("image_min_pixels=3136", "image_max_pixels=12544")  # a 112x84 image: 12 image tokens


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    from tiny_vlm import write_vllm_cpu_shim

    folder = str(write_vllm_cpu_shim(tmp_path_factory.mktemp("shim")))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, old]))  # the workers inherit it
    yield folder
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="module")
def vlms(tmp_path_factory, shim):
    from tiny_vlm import build_vlm

    built: dict = {}

    def get(arch: str = "qwen2_vl"):
        if arch not in built:
            built[arch] = build_vlm(tmp_path_factory.mktemp("vlm") / arch, arch=arch)
        return built[arch]
    return get


@pytest.fixture(scope="module")
def vlm(vlms):
    return vlms("qwen2_vl")


@pytest.fixture(scope="module")
def pic(tmp_path_factory):
    w, h = 112, 84
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None].repeat(w, 1)
    path = tmp_path_factory.mktemp("img") / "gradient.png"
    Image.fromarray(np.stack([x, y, 255 - (x + y) / 2], -1).astype(np.uint8), "RGB").save(path)
    return path


def _run(service, model, prompts, *overrides, sides=None):
    cfg = build_config(None, ["dtype=float32", "max_new_tokens=16", "ignore_eos=true", "max_model_len=1024",
                              *overrides], sides=sides)
    return service.run(RunRequest(model=str(model), prompts=prompts, config=cfg, trust_remote_code=True))


def test_an_image_prompt_is_identical_across_vllm_and_hf_in_float32(service, vlm, pic):
    img = read_image(pic)
    run = _run(service, vlm, [PromptSpec(text="Describe the picture.", images=[img])], *PIXELS)
    assert run.status == "ok", run.error
    p = run.prompts[0]
    hf, vllm = p.results["hf"], p.results["vllm"]
    assert len(hf.token_ids) == len(vllm.token_ids) == 16 and hf.token_ids == vllm.token_ids
    (c,) = p.comparisons
    assert c.identical and c.max_abs_gap < 1e-3
    assert p.images[0]["tokens"] == {"hf": 12, "vllm": 12} and p.prompt_token_ids.count(6) == 12
    stored = get_run(service.db, run.id)
    assert stored.prompts[0].images[0]["sha256"] == img.sha256 and stored.status == "ok"
    assert image_bytes(service.db, img.sha256)[0] == pic.read_bytes()


def test_the_image_changes_the_answer(service, vlm, pic, tmp_path):
    """The pixels reach the model on both sides: an inverted image gives another (still identical) stream."""
    inv = tmp_path / "inverted.png"
    Image.eval(Image.open(pic).convert("RGB"), lambda v: 255 - v).save(inv)
    a = _run(service, vlm, [PromptSpec(text="Describe the picture.", images=[read_image(pic)])], *PIXELS)
    b = _run(service, vlm, [PromptSpec(text="Describe the picture.", images=[read_image(inv)])], *PIXELS)
    assert a.status == b.status == "ok", (a.error, b.error)
    assert a.prompts[0].results["hf"].token_ids != b.prompts[0].results["hf"].token_ids


def test_the_resize_trap_is_reported_before_and_seen_after(service, vlm, pic):
    run = _run(service, vlm, [PromptSpec(text="Describe the picture.", images=[read_image(pic)])], *PIXELS,
               sides=["hf=hf", "vllm=vllm,image_max_pixels=7056"])
    trap = [w for w in run.warnings if w.code == "image-resize-differs"]
    assert trap and trap[0].side == "vllm" and "6 image tokens on vllm, 12 on hf" in trap[0].message
    assert run.status == "diverged", run.error
    p = run.prompts[0]
    assert p.images[0]["tokens"] == {"hf": 12, "vllm": 6}
    (c,) = p.comparisons
    assert not c.identical and c.first_divergence is not None and c.first_divergence <= 2


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_the_other_qwen_vl_families_are_identical_in_float32(service, vlms, pic, arch):
    """Qwen2.5-VL (windowed vision attention) and Qwen3-VL (patch 16, deepstack): two images in one prompt."""
    img = read_image(pic)
    run = _run(service, vlms(arch), [PromptSpec(messages=[{"role": "user", "content": [
        {"type": "image", "name": "a"}, {"type": "text", "text": "and"}, {"type": "image", "name": "b"},
        {"type": "text", "text": "compare them."}]}], images=[img, img])], *PIXELS)
    assert run.status == "ok", run.error
    p = run.prompts[0]
    assert p.results["hf"].token_ids == p.results["vllm"].token_ids and len(p.results["hf"].token_ids) == 16
    assert p.comparisons[0].max_abs_gap < 1e-3
    assert len(p.images) == 2 and p.images[0]["tokens"]["hf"] == p.images[0]["tokens"]["vllm"] > 0


def test_a_side_that_expands_the_image_differently_is_an_error_naming_it(service, vlm, pic, monkeypatch):
    """The engine checks the prompt ids it actually used against the processor's: told to resize one way
    while its expected ids were made another, vLLM refuses instead of comparing different inputs."""
    from parity_ui.commands import compare as service_mod  # where a comparison builds its generate requests

    real = service_mod.image_inputs

    def lying(prep, side):
        out = real(prep, side)
        if side == "vllm":
            out["image_pixels"] = {"min_pixels": 3136, "max_pixels": 7056}  # 6 tokens; the ids hold 12
        return out

    monkeypatch.setattr(service_mod, "image_inputs", lying)
    run = _run(service, vlm, [PromptSpec(text="Describe the picture.", images=[read_image(pic)])], *PIXELS)
    assert run.status == "error"
    assert "side vllm" in run.error and "the sides did not see the same prompt" in run.error, run.error
    stored = get_run(service.db, run.id)
    assert stored.status == "error" and stored.prompts[0].images


def test_the_app_runs_an_uploaded_image_and_shows_it_beside_the_streams(service, vlm, pic):
    """The Compare tab's handler, as Gradio calls it (no browser): uploaded image path -> run -> the
    final view holds the image thumbnail with each side's token count, and the streams."""
    pytest.importorskip("gradio")
    from parity_ui.ui.compare_tab import CompareTab, RunGate

    import gradio as gr

    tab = CompareTab(service, RunGate(service))
    with gr.Blocks():
        tab.create_ui()
    cfg = build_config(None, ["dtype=float32", "max_new_tokens=8", "ignore_eos=true", "max_model_len=1024", *PIXELS])
    outputs = list(tab.run(str(vlm), True, "Describe the picture.", None, cfg.to_yaml(), [str(pic)], None))
    final = outputs[-1]
    run = get_run(service.db, final[tab.run_id])
    assert run.status == "ok", run.error
    panes = final[tab.view.panes]
    assert "data:image/png;base64," in panes and "gradient.png" in panes and "hf: 12, vllm: 12" in panes
