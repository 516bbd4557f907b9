"""Image prompts without engines: reading and checking images, prompt files with images, the CLI's
--image, preflight (the resize trap, token counts, downscaling), bad inputs stored as failed runs, and
images stored with their run. A tiny random Qwen2-VL (tests/tiny_vlm.py) gives the real processor."""
from __future__ import annotations

import io
import json
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from parity_ui.core.config import build_config
from parity_ui.core.errors import ParityError, PromptError
from parity_ui.inputs.images import (MAX_IMAGE_BYTES, image_from_bytes, image_tokens, read_image, smart_resize)
from parity_ui.core.mapping import map_side, resolve
from parity_ui.run.prepare import RunRequest, prepare
from parity_ui.inputs.prompts import PromptSpec, collapse_image_runs, parse_prompt_bytes, read_prompt_file
from parity_ui.service import ParityService
from parity_ui.store.runs import get_run, image_bytes, list_runs


def gradient(w: int = 112, h: int = 84) -> Image.Image:
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None].repeat(w, 1)
    return Image.fromarray(np.stack([x, y, 255 - (x + y) / 2], -1).astype(np.uint8), "RGB")


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def png_header_only(w: int, h: int) -> bytes:
    """A PNG that claims w x h pixels (header only: no memory spent building it)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from tiny_vlm import build_vlm

    return build_vlm(tmp_path_factory.mktemp("vlm") / "qwen2_vl")


@pytest.fixture()
def pic(tmp_path):
    path = tmp_path / "grad.png"
    gradient().save(path)
    return path


# -- reading and checking images ---------------------------------------------------------------

def test_a_good_image_is_described_and_hashed(pic):
    img = read_image(pic)
    assert (img.width, img.height, img.format, img.mime) == (112, 84, "PNG", "image/png")
    assert len(img.sha256) == 64 and img.data == pic.read_bytes()
    assert "bytes" not in repr(img) or str(len(img.data)) in repr(img)  # never the raw bytes


def test_a_non_image_renamed_png_names_the_file_and_the_fix(tmp_path):
    p = tmp_path / "notes.png"
    p.write_text("this is a text file, not a picture\n")
    with pytest.raises(PromptError) as e:
        read_image(p)
    assert "notes.png" in e.value.message and "not an image" in e.value.message
    assert "PNG" in e.value.fix


def test_a_corrupt_image_is_refused_before_any_engine(tmp_path):
    data = png_bytes(gradient(300, 200))
    p = tmp_path / "broken.png"
    p.write_bytes(data[: len(data) // 2])  # truncated download
    with pytest.raises(PromptError) as e:
        read_image(p)
    assert "broken.png" in e.value.message and "corrupt or truncated" in e.value.message


def test_an_image_of_20000_by_20000_pixels_is_refused_by_its_header(tmp_path):
    p = tmp_path / "huge.png"
    p.write_bytes(png_header_only(20_000, 20_000))
    with pytest.raises(PromptError) as e:
        read_image(p)
    assert "huge.png" in e.value.message
    assert "20000 x 20000" in e.value.message or "decode safely" in e.value.message
    assert "downscale" in e.value.fix


def test_a_60_mb_file_is_refused_without_reading_it(tmp_path):
    p = tmp_path / "big.png"
    with open(p, "wb") as f:
        f.truncate(60 * 2**20)  # sparse: nothing is written
    with pytest.raises(PromptError) as e:
        read_image(p)
    assert "big.png" in e.value.message and "60.0 MiB" in e.value.message
    with pytest.raises(PromptError):
        image_from_bytes(b"\0" * (MAX_IMAGE_BYTES + 1), "mem.png")


def test_a_missing_image_file_names_the_path(tmp_path):
    with pytest.raises(PromptError) as e:
        read_image("nowhere.png", tmp_path)
    assert "nowhere.png" in e.value.message and str(tmp_path) in e.value.message


def test_smart_resize_matches_the_qwen_rule():
    img = image_from_bytes(png_bytes(gradient()), "g.png")
    assert image_tokens(img, 14, 2, 56 * 56, 112 * 112) == (12, 112, 84)
    assert image_tokens(img, 14, 2, 56 * 56, 84 * 84) == (6, 84, 56)
    h, w = smart_resize(3000, 4000, 28, 56 * 56, 1280 * 28 * 28)
    assert h % 28 == 0 and w % 28 == 0 and h * w <= 1280 * 28 * 28


def test_collapse_image_runs_keeps_one_placeholder_per_image():
    assert collapse_image_runs([1, 6, 6, 6, 2, 6, 6, 3], 6) == [1, 6, 2, 6, 3]


# -- prompt files ------------------------------------------------------------------------------

def test_jsonl_prompts_name_their_images_relative_to_the_file(tmp_path, pic):
    lines = [{"prompt": "What is this?", "images": ["grad.png"]},
             {"messages": [{"role": "user", "content": [{"type": "image", "path": "grad.png"},
                                                        {"type": "text", "text": "and this?"}]}]},
             {"prompt": "text only"}]
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines))
    a, b, c = read_prompt_file(f)
    assert [len(s.images) for s in (a, b, c)] == [1, 1, 0]
    assert a.images[0].sha256 == b.images[0].sha256
    assert b.messages[0]["content"][0] == {"type": "image", "name": "grad.png", "sha256": b.images[0].sha256}
    assert b.chat_messages() == [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and this?"}]}]
    assert a.chat_messages()[0]["content"][0] == {"type": "image"}
    assert a.excerpt().startswith("[1 image]")


@pytest.mark.parametrize("line, needle", [
    ({"prompt": "x", "images": ["missing.png"]}, "missing.png"),
    ({"prompt": "x", "images": "grad.png"}, "list of file paths"),
    ({"messages": [{"role": "user", "content": [{"type": "audio", "path": "a.wav"}]}]}, "text or an image part"),
    ({"prompt": "x", "images": ["grad.png"] * 9}, "at most"),
])
def test_bad_image_lines_name_the_line(tmp_path, pic, line, needle):
    with pytest.raises(PromptError) as e:
        parse_prompt_bytes(json.dumps(line).encode(), "p.jsonl", base=tmp_path)
    assert needle in str(e.value)


# -- preparation: one processor, the resize trap, refusals ------------------------------------------

def _prepare(model, prompts, *overrides, sides=None):
    cfg = build_config(None, ["dtype=float32", *overrides], sides=sides)
    return prepare(RunRequest(model=str(model), prompts=prompts, config=cfg, trust_remote_code=True), False)


def test_one_processor_expands_the_image_for_every_side(vlm, pic):
    prep = _prepare(vlm, [PromptSpec(text="Describe the picture.", images=[read_image(pic)])],
                    "image_min_pixels=3136", "image_max_pixels=12544")
    (e,) = prep.prompts
    assert e.image_tokens == [12] and e.image_grids == [[1, 6, 8]]
    assert e.token_ids.count(prep.image_token_id) == 12 and prep.side_prompts == {}
    assert "<|vision_start|>" in e.text and e.pixels == {"min_pixels": 3136, "max_pixels": 12544}
    vllm = prep.side("vllm").args
    assert vllm.llm["mm_processor_kwargs"] == {"min_pixels": 3136, "max_pixels": 12544}
    assert vllm.llm["limit_mm_per_prompt"] == {"image": 4, "video": 0}
    assert prep.side("hf").args.image_pixels == {"min_pixels": 3136, "max_pixels": 12544}
    codes = [w.code for w in prep.warnings]
    assert "image-tokens" in codes and "image-resize-differs" not in codes


def test_processor_defaults_are_resolved_once_for_every_side(vlm, pic):
    prep = _prepare(vlm, [PromptSpec(text="x", images=[read_image(pic)])])
    px = prep.side("vllm").args.llm["mm_processor_kwargs"]
    assert px == prep.side("hf").args.image_pixels == {"min_pixels": 56 * 56, "max_pixels": 224 * 224}


def test_the_resize_trap_is_a_preflight_warning_with_each_sides_token_count(vlm, pic):
    prep = _prepare(vlm, [PromptSpec(text="x", images=[read_image(pic)])], "image_max_pixels=12544",
                    sides=["ref=hf", "b=vllm,image_max_pixels=7056"])
    assert prep.prompts_of("b")[0].image_tokens == [6] and prep.prompts[0].image_tokens == [12]
    (trap,) = [w for w in prep.warnings if w.code == "image-resize-differs"]
    assert trap.side == "b" and trap.severity == "warning"
    assert "max_pixels=7056 (reference 12544)" in trap.message and "6 image tokens on b, 12 on ref" in trap.message
    assert trap.setting == {"key": "b.image_max_pixels", "value": None}
    assert prep.side("b").args.llm["mm_processor_kwargs"]["max_pixels"] == 7056


def test_the_context_counts_each_sides_expanded_image_tokens(vlm, pic):
    """The need a vLLM side is sized to counts the image tokens of the ids IT receives."""
    prep = _prepare(vlm, [PromptSpec(text="x", images=[read_image(pic)])], "image_max_pixels=12544",
                    "max_new_tokens=8", sides=["ref=hf", "b=vllm,image_max_pixels=7056", "c=vllm"])
    need = {name: len(prep.prompts_of(name)[0].token_ids) + 8 for name in ("ref", "b", "c")}
    assert prep.resolved.context_need == need and need["b"] == need["c"] - 6  # 6 image tokens fewer on b
    assert all(prep.side(name).args.llm["max_model_len"] >= need[name] for name in ("b", "c"))


def test_a_heavily_downscaled_image_says_by_how_much(vlm, tmp_path):
    p = tmp_path / "wide.png"
    gradient(1120, 840).save(p)
    prep = _prepare(vlm, [PromptSpec(text="x", images=[read_image(p)])], "image_max_pixels=12544")
    (w,) = [w for w in prep.warnings if w.code == "image-downscaled"]
    assert "1120 x 840" in w.message and "112 x 84" in w.message and "100x fewer pixels" in w.message


def test_an_image_to_a_text_only_model_is_refused(tiny_llama, pic):
    with pytest.raises(PromptError) as e:
        _prepare(tiny_llama, [PromptSpec(text="x", images=[read_image(pic)])])
    assert "grad.png" in e.value.message and "text-only" in e.value.message and "vision-language" in e.value.fix


def test_more_images_than_the_limit_is_refused(vlm, pic):
    img = read_image(pic)
    with pytest.raises(PromptError) as e:
        _prepare(vlm, [PromptSpec(text="x", images=[img, img, img])], "max_images_per_prompt=2")
    assert "3 images" in e.value.message and "max_images_per_prompt=2" in e.value.message
    assert "max_images_per_prompt=3" in e.value.fix


def test_a_server_side_refuses_images_before_anything_starts(vlm, pic):
    with pytest.raises(ParityError) as e:
        _prepare(vlm, [PromptSpec(text="x", images=[read_image(pic)])],
                 sides=["ref=hf", "s=openai,url=http://127.0.0.1:9/v1"])
    assert "side 's'" in str(e.value) and "image" in str(e.value)


def test_text_prompts_on_a_vision_model_map_no_pixels(vlm):
    cfg = build_config(None, [])
    from parity_ui.inputs.models import describe_model

    model = describe_model(str(vlm), trust_remote_code=True)
    assert model.vision and model.image_token_id is not None
    args = map_side(cfg, cfg.side("vllm"), resolve(model, [2], False))
    assert args.llm["limit_mm_per_prompt"]["video"] == 0 and "mm_processor_kwargs" not in args.llm


# -- bad input through the service and the CLI: stored as failed runs, the service still usable --------

def test_bad_image_runs_are_refused_storing_nothing_and_the_service_goes_on(tmp_path, tiny_llama, vlm, pic):
    """Refused before any side starts (issue 46 item 5): the error names the problem, nothing is stored,
    not even the image's bytes, and the service takes the next run."""
    from parity_ui.core.errors import PromptError

    svc = ParityService(db_path=str(tmp_path / "runs.db"))
    try:
        img = read_image(pic)
        cfg = build_config(None, ["max_images_per_prompt=1"])
        with pytest.raises(PromptError, match="text-only"):
            svc.run(RunRequest(model=str(tiny_llama), prompts=[PromptSpec(text="x", images=[img])], config=cfg))
        with pytest.raises(PromptError, match="max_images_per_prompt=1"):
            svc.run(RunRequest(model=str(vlm), prompts=[PromptSpec(text="x", images=[img, img])], config=cfg,
                               trust_remote_code=True))
        assert list_runs(svc.db) == [] and image_bytes(svc.db, img.sha256) is None
    finally:
        svc.close()


def test_cli_image_errors_name_the_file_and_store_nothing(tmp_path, capsys):
    from parity_ui.cli import main

    bad = tmp_path / "notes.png"
    bad.write_text("not a picture")
    db = tmp_path / "runs.db"
    code = main(["--db", str(db), "compare", "--model", "demo", "--prompt", "hi", "--image", str(bad), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "notes.png" in err and "not an image" in err and "Fix:" in err
    from parity_ui.store.runs import open_db

    assert list_runs(open_db(db)) == []


def test_cli_image_goes_with_prompt_not_prompt_file(tmp_path, pic, capsys):
    from parity_ui.cli import main

    f = tmp_path / "p.txt"
    f.write_text("hello")
    code = main(["--db", str(tmp_path / "runs.db"), "compare", "--prompt-file", str(f), "--image", str(pic), "--quiet"])
    assert code != 0 and "--image goes with --prompt" in capsys.readouterr().err


# -- shown with the run: the report, the app's view, the upload check ----------------------------------

def _stored_image_run(tmp_path, pic):
    from parity_ui.core.runlog import new_run
    from parity_ui.service import attach_images
    from parity_ui.store.runs import open_db, save_images, save_run

    db = open_db(tmp_path / "runs.db")
    spec = PromptSpec(text="Describe the picture.", images=[read_image(pic)])
    run = new_run("01IMAGERUN", "tiny-vlm", {}, [spec])
    attach_images(run, [spec])
    run.prompts[0].images[0]["tokens"] = {"ref": 12, "b": 6}
    run.status = "diverged"
    save_run(db, run)
    save_images(db, run.id, [spec])
    return db, get_run(db, run.id), spec.images[0]


def test_the_static_report_and_summary_show_the_images(tmp_path, pic):
    import base64

    from parity_ui.render.report import format_summary, html_report, run_json

    db, run, img = _stored_image_run(tmp_path, pic)
    page = html_report(run, [], lambda sha: image_bytes(db, sha))
    assert base64.b64encode(pic.read_bytes()).decode() in page and "image tokens: ref: 12, b: 6" in page
    assert "112 x 84" in format_summary(run) and run_json(run)["prompts"][0]["images"][0]["sha256"] == img.sha256
    assert "(image bytes not stored)" in html_report(run)  # without the store: the record, no pixels


def test_the_app_checks_uploads_and_shows_the_images_beside_the_streams(tmp_path, pic, monkeypatch):
    pytest.importorskip("gradio")
    from parity_ui.ui.compare_tab import _specs, read_images
    from parity_ui.ui.result_view import ResultView

    bad = tmp_path / "fake.png"
    bad.write_text("no")
    with pytest.raises(PromptError) as e:
        read_images([str(bad)])
    assert "fake.png" in e.value.message
    (spec,) = _specs("hi", None, [str(pic)])
    assert spec.images[0].name == "grad.png"
    with pytest.raises(PromptError):
        _specs("hi", [{"text": "x"}], [str(pic)])
    db, run, img = _stored_image_run(tmp_path, pic)
    import gradio as gr

    view = ResultView("t", images=lambda sha: image_bytes(db, sha))
    with gr.Blocks():
        view.create_ui()
    values = view.values(run)
    assert "data:image/png;base64," in values[view.panes] and "grad.png" in values[view.panes]


def test_the_app_builds_with_the_image_upload(tmp_path):
    pytest.importorskip("gradio")
    from parity_ui.ui.app import create_app
    from parity_ui.ui.runner import AppService

    demo = create_app(AppService(db_path=str(tmp_path / "runs.db")))
    assert "prompt-images" in str(demo.config)


def test_layer_localisation_refuses_image_prompts(tmp_path, pic):
    from parity_ui.commands.layers import LayersError, plan

    _, run, _ = _stored_image_run(tmp_path, pic)
    with pytest.raises(LayersError) as e:
        plan(run, 0, None, None)
    assert "has images" in e.value.message


def test_min_pixels_over_max_pixels_names_the_side(vlm, pic):
    with pytest.raises(ParityError) as e:
        _prepare(vlm, [PromptSpec(text="x", images=[read_image(pic)])], "image_max_pixels=12544",
                 sides=["ref=hf", "b=vllm,image_min_pixels=50000"])
    assert "side 'b'" in str(e.value) and "min_pixels=50000 over max_pixels=12544" in str(e.value)


def test_history_lists_image_prompts_with_their_images(tmp_path, pic):
    db, run, _ = _stored_image_run(tmp_path, pic)
    (row,) = list_runs(db)
    assert row.prompt_excerpt.startswith("[1 image] Describe the picture.")
    from parity_ui.core.runlog import new_run
    from parity_ui.store.runs import save_run

    spec = PromptSpec(messages=[{"role": "user", "content": [{"type": "image", "name": "grad.png"},
                                                            {"type": "text", "text": "and this?"}]}])
    save_run(db, new_run("01IMAGEMSGS", "m", {}, [spec]))
    assert next(r for r in list_runs(db) if r.id == "01IMAGEMSGS").prompt_excerpt == "[image grad.png] and this?"
