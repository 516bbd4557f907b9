"""A stored run's standalone HTML page (`parity report --html`) in real headless Chromium, no app:
the token view's details at a position where both sides chose the same token and their logprobs
differ by a few ulp. At 4 decimals those logprobs read alike; an audit's break is often exactly
that, so the details must show enough digits to tell them apart, and say why. Seconds, no engines."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from conftest_browser import chromium_available  # noqa: E402

pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

# Two float32 logprobs 3 ulp apart (as an engine returns them, widened to float64): equal to 4 decimals.
NEAR = (-5.905201911926270, -5.905200481414795)


def _run():
    from parity_ui.analysis.compare import compare
    from parity_ui.core.types import ModelInfo, PromptResult, Run, SideInfo, SideResult, TokenStep, TopLogprob

    def side(name, lps):
        steps = [TokenStep(position=i, token_id=10 + i, text=t, logprob=lp, rank=1,
                           top=[TopLogprob(10 + i, lp, t), TopLogprob(99, lp - 1.0, "x")])
                 for i, (t, lp) in enumerate(zip(["The", " cat", " sat"], lps))]
        return SideResult(side=name, prompt_index=0, token_ids=[s.token_id for s in steps], steps=steps,
                          text="".join(s.text for s in steps), finish_reason="length")

    ref, b = side("alone", [-0.25, NEAR[0], -1.5]), side("batched", [-0.25, NEAR[1], -1.5])
    prompt = PromptResult(index=0, prompt_text="hi", prompt_token_ids=[1, 2], results={"alone": ref, "batched": b},
                          comparisons=[compare(ref, b)])
    return Run(id="01NEARRUN", created_utc="2026-11-28T00:00:00.000+00:00", model=ModelInfo(name="m", path="/m"),
               config={"dtype": "bfloat16"}, status="ok", prompts=[prompt],
               sides=[SideInfo(name=n, kind="vllm", reference=i == 0, dtype="bfloat16")
                      for i, n in enumerate(["alone", "batched"])], versions={"parity_ui": "0.2.0"})


def test_logprobs_a_few_ulp_apart_show_their_digits_where_4_decimals_read_alike(tmp_path, new_page):
    from parity_ui.render.report import html_report

    page_file = tmp_path / "run.html"
    page_file.write_text(html_report(_run()))
    with new_page(1200, 900) as page:
        page.goto(page_file.as_uri())
        info = page.locator(".pt-root .pt-info").first
        chips = page.locator(".pt-root .pt-pane[data-side='batched'] .pt-body .t")
        chips.nth(1).click()  # pinned: the same token on both sides, the bits apart
        text = info.inner_text()
        assert "Position 1" in text and "not in their bits" in text, text
        assert f"{NEAR[0]:.9g}" in text and f"{NEAR[1]:.9g}" in text, text
        chips.nth(1).click()  # unpinned
        chips.nth(2).click()  # equal logprobs: 4 decimals, no note
        text = info.inner_text()
        assert "Position 2" in text and "-1.5000" in text and "not in their bits" not in text, text
