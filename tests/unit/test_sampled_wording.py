"""A sampled run never reads as greedy (issue 46 item 11): the config line names shared-seed (or native)
sampling and its cuts; the card drops the argmax and vLLM's greedy top-k rule, which mean nothing for
drawn tokens; the low-precision finding speaks of samples; History says the run was sampled. Pure."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from parity_ui.analysis.compare import compare
from parity_ui.core.config import build_config
from parity_ui.core.findings import CrossScores, GapStats
from parity_ui.core.types import ModelInfo, PromptResult, Run, SideInfo, SideResult, TokenStep, TopLogprob

SHARED = build_config(None, ["sampling=shared-seed", "temperature=1", "top_p=0.8"])


def _run(config: dict) -> Run:
    def side(name, ids):
        steps = [TokenStep(i, t, f" t{t}", -0.5, 1, top=[TopLogprob(t, -0.5, f" t{t}")]) for i, t in enumerate(ids)]
        return SideResult(side=name, prompt_index=0, token_ids=list(ids), steps=steps)

    a, b = side("hf", [1, 2, 3]), side("vllm", [1, 2, 4])
    c = compare(a, b)
    c.cross_scores = CrossScores(directions={
        "vllm_by_hf": GapStats(generator="vllm", scorer="hf", positions=3, skipped=0, rms_gap=0.01, max_abs_gap=0.02,
                             share_outside_band=0.0, other_disagrees=16)})
    return Run(id="r", created_utc="", status="diverged", model=ModelInfo(name="m", path="/m"), config=config,
               sides=[SideInfo(name="hf", kind="hf", reference=True), SideInfo(name="vllm", kind="vllm")],
               prompts=[PromptResult(index=0, prompt_text="p", prompt_token_ids=[1], results={"hf": a, "vllm": b},
                                     comparisons=[c])])


def test_the_config_line_names_the_decoding():
    from parity_ui.ui.config_tab import config_summary_html

    line = config_summary_html(SHARED)
    assert "shared-seed sampling (seed 0), T=1, top_p 0.8" in line and "sampling, temperature" not in line
    assert "native sampling (each side its own random stream), T=0.7" in config_summary_html(
        build_config(None, ["temperature=0.7"]))
    assert "greedy" in config_summary_html(build_config())


def test_the_card_drops_greedy_wording_for_a_sampled_run():
    from parity_ui.render.cards import run_summary_html

    sampled = run_summary_html(_run(SHARED.to_dict()))
    assert "shared-seed sampling (seed 0), T=1, top_p 0.8" in sampled
    assert "would pick another token" not in sampled and "top-k" not in sampled
    greedy = run_summary_html(_run(build_config().to_dict()))  # the same wording stays where it means something
    assert "16 positions where hf would pick another token" in greedy and "top-k" in greedy


def test_the_low_precision_finding_speaks_of_samples_when_sampled():
    from parity_ui.run.preflight import check_dtype

    def prepared(cfg):
        sides = [SimpleNamespace(name=n, dtype="bfloat16", spec=SimpleNamespace(options=SimpleNamespace(dtype="bfloat16")))
                 for n in ("hf", "vllm")]
        return SimpleNamespace(config=cfg, model=SimpleNamespace(config_dtype="bfloat16", weights_dtype=""), sides=sides)

    (low,) = [f for f in check_dtype(prepared(SHARED)) if f.code == "low-precision"]
    assert "shared-seed samples usually fork" in low.message and "greedy" not in low.message
    (low,) = [f for f in check_dtype(prepared(build_config())) if f.code == "low-precision"]
    assert "greedy streams usually fork" in low.message


@pytest.mark.parametrize("config, said", [(SHARED.to_dict(), "diverged at token 2 (shared-seed sampling (seed 0), T=1, top_p 0.8)"),
                                          ({"dtype": "bfloat16"}, "diverged at token 2")])
def test_history_says_a_run_was_sampled(tmp_path, config, said):
    from parity_ui.store import Store
    from parity_ui.store.runs import save_run
    from parity_ui.ui.history_tab import RESULT, history_rows

    store = Store.open(tmp_path / "runs.db")
    save_run(store.db, _run(config))
    (row,) = history_rows(store)
    assert row[RESULT] == said


def test_identical_tokens_say_whether_their_logprobs_are_equal_too():
    """Equal token ids with logprobs apart (an audit's usual break) must not read as plain "identical"."""
    from parity_ui.analysis.compare import compare
    from parity_ui.core.types import SideResult, TokenStep
    from parity_ui.render.cards import divergence_line

    def side(name, lps):
        steps = [TokenStep(position=i, token_id=7 + i, text="x", logprob=lp, rank=1) for i, lp in enumerate(lps)]
        return SideResult(side=name, prompt_index=0, token_ids=[7 + i for i in range(len(lps))], steps=steps)

    same = divergence_line(compare(side("ref", [-0.5, -1.0]), side("b", [-0.5, -1.0])))
    assert "2 generated tokens identical" in same and "logprobs equal too" in same
    apart = divergence_line(compare(side("ref", [-0.5, -1.0]), side("b", [-0.5, -1.0000001])))
    assert "2 generated tokens identical" in apart and "logprobs are not" in apart and "equal too" not in apart
