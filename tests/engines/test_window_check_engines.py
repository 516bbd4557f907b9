"""The sliding-window finding for vLLM's CPU backend, measured: real runs of a tiny sliding-window Qwen2
(HF vs vLLM). The pure checks on built runs are tests/unit/test_window_check.py."""
from __future__ import annotations

import json
import shutil

import pytest

from parity_ui.core.config import build_config
from parity_ui.inputs.models import describe_model
from parity_ui.run.prepare import RunRequest
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.analysis.window_check import CODE, FP32_NOISE_NATS


PROMPT = ("def parse_args(self, args=None, namespace=None):\n    if args is None:\n        args = sys.argv[1:]\n"
          "    return self.parse_known_args(args, namespace)")  # 53 tokens: past a 16-token window


def _set_attention(folder, kind: str) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(use_sliding_window=True, sliding_window=16, max_window_layers=0,
               layer_types=[kind] * cfg["num_hidden_layers"])
    path.write_text(json.dumps(cfg, indent=2))


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """A tiny Qwen2 whose every layer attends over the last 16 tokens, and the same weights with full
    attention (the control: HF's answer changes, so the window is in effect on this prompt)."""
    from tiny_models import build_model

    root = tmp_path_factory.mktemp("window")
    sliding = build_model(root / "sliding", "qwen2", seed=1)
    _set_attention(sliding, "sliding_attention")
    full = shutil.copytree(sliding, root / "full")
    _set_attention(full, "full_attention")
    assert describe_model(str(sliding)).sliding_window == 16 and describe_model(str(full)).sliding_window is None
    return sliding, full


def _compare(service, model, sides):
    cfg = build_config(None, ["dtype=float32", "max_new_tokens=16", "ignore_eos=true", "chat=false"], sides=sides)
    run = service.run(RunRequest(model=str(model), prompts=[PromptSpec(text=PROMPT)], config=cfg))
    assert run.status in ("ok", "diverged"), run.error
    (f,) = [w for w in run.warnings if w.code == CODE]
    return run, f


def test_vllm_cpu_applies_the_window_like_hf_and_the_finding_says_so_measured(service, windowed):
    sliding, full = windowed
    run, f = _compare(service, sliding, ["hf=hf", "vllm=vllm"])
    (c,) = run.prompts[0].comparisons
    assert c.identical and c.max_abs_gap < FP32_NOISE_NATS
    assert f.severity == "info" and f.side == "vllm" and f"gap to hf was {c.max_abs_gap:.2g} nats" in f.message
    assert "16 compared token(s) whose context ran past" in f.message
    # The control: HF without the window answers otherwise here, so the match above is the window's.
    other, _ = _compare(service, sliding, [f"hf=hf,model={full}", "vllm=vllm"])
    assert other.prompts[0].results["hf"].token_ids != run.prompts[0].results["hf"].token_ids


def test_a_side_that_attends_differently_past_the_window_is_a_measured_warning(service, windowed):
    """The reference with full attention against vLLM with the window: what a CPU kernel that ignored
    the window would look like. The finding must say so, with the fork."""
    sliding, full = windowed
    run, f = _compare(service, sliding, [f"hf=hf,model={full}", "vllm=vllm"])
    (c,) = run.prompts[0].comparisons
    assert not c.identical
    assert f.severity == "warning" and f.side == "vllm", f.message
    assert "forked past the model's sliding window (16 tokens) on a real disagreement" in f.message, f.message
