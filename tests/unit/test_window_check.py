"""The sliding-window finding for vLLM's CPU backend says what the run measured past the window, not what
might happen: pure checks on built runs. The real runs of a tiny sliding-window Qwen2 (HF vs vLLM) are
tests/engines/test_window_check_engines.py."""
from __future__ import annotations

from parity_ui.analysis.compare import compare
from parity_ui.core.config import build_config
from parity_ui.analysis.explain import explain
from parity_ui.inputs.models import sliding_window_of
from parity_ui.core.types import Finding, ModelInfo, PromptResult, Run, SideInfo, SideResult, TokenStep, TopLogprob
from parity_ui.analysis.window_check import CODE, FP32_NOISE_NATS, settle_sliding_window

PRE_RUN = Finding(code=CODE, severity="warning", side="vllm", message="side vllm: not measured yet")


def _result(side: str, ids: list[int], lps: list[float]) -> SideResult:
    steps = [TokenStep(position=i, token_id=t, text=str(t), logprob=lp, rank=1) for i, (t, lp) in enumerate(zip(ids, lps))]
    return SideResult(side=side, prompt_index=0, token_ids=ids, steps=steps)


def _run(prompt_len: int, ref: list[float], b: list[float], *, window: int = 16, b_ids: list[int] | None = None,
         dtype: str = "float32", sides: tuple[str, str] = ("hf", "vllm")) -> Run:
    ids = list(range(1, len(ref) + 1))
    a_res, b_res = _result(sides[0], ids, ref), _result(sides[1], b_ids or ids, b)
    c = compare(a_res, b_res)
    c.explanation = explain(c, a_res, b_res, build_config(None, []))
    pr = PromptResult(index=0, prompt_text="", prompt_token_ids=list(range(prompt_len)),
                      results={sides[0]: a_res, sides[1]: b_res}, comparisons=[c])
    return Run(id="r", created_utc="", model=ModelInfo(name="m", path="/m", sliding_window=window), config={},
               status="ok", prompts=[pr], warnings=[Finding("sides-differ", "info", "x"), PRE_RUN],
               sides=[SideInfo(name=sides[0], kind="hf", dtype=dtype), SideInfo(name=sides[1], kind="vllm", dtype=dtype)])


def _settled(run: Run) -> Finding:
    settle_sliding_window(run)
    (f,) = [w for w in run.warnings if w.code == CODE]
    assert [w.code for w in run.warnings] == ["sides-differ", CODE]  # replaced in place, nothing else touched
    return f


def test_a_match_past_the_window_in_float32_is_info_with_the_figures():
    f = _settled(_run(40, [-0.1] * 8, [-0.1 + 2e-6] * 8))
    assert f.severity == "info" and f.side == "vllm"
    assert "8 compared token(s) whose context ran past the model's sliding window (16 tokens)" in f.message
    assert "2e-06 nats" in f.message and "applied as the other side does" in f.message


def test_a_gap_past_the_window_over_the_noise_within_it_is_a_warning():
    """Prompt of 12 tokens, window 16: tokens 0-4 fit in the window (gap 1e-5), 5-9 run past it (gap 0.05)."""
    f = _settled(_run(12, [-0.1] * 10, [-0.1 + 1e-5] * 5 + [-0.15] * 5))
    assert f.severity == "warning" and "5 compared token(s)" in f.message
    assert "0.05 nats" in f.message and "within the window (5 tokens) it was 1e-05" in f.message
    assert "may not apply the window" in f.message and f.fix


def test_a_real_fork_past_the_window_is_a_warning_naming_it():
    run = _run(40, [-0.01, -0.01, -0.01], [-0.01, -0.01, -0.02], b_ids=[1, 2, 99])
    f = _settled(run)
    assert run.prompts[0].comparisons[0].explanation.verdict == "real disagreement"
    assert f.severity == "warning" and "forked past the model's sliding window" in f.message
    assert "prompt 0 token 2" in f.message and "on the 2 token(s) compared past the window before that" in f.message


def test_a_fork_at_the_first_token_past_the_window_is_measured_there():
    """A fork on the first generated token: no gap before it, but its own context was past the window."""
    f = _settled(_run(40, [-0.01], [-0.02], b_ids=[99]))
    assert f.severity == "warning" and "prompt 0 token 0" in f.message
    assert "no token past the window was compared before that" in f.message


def test_a_near_tie_fork_before_anything_past_the_window_is_not_measured():
    run = _run(40, [-0.70], [-0.69], b_ids=[99])
    run.prompts[0].results["hf"].steps[0].top = [TopLogprob(1, -0.70, "1"), TopLogprob(99, -0.71, "99")]
    run.prompts[0].results["vllm"].steps[0].top = [TopLogprob(99, -0.69, "99"), TopLogprob(1, -0.70, "1")]
    c = run.prompts[0].comparisons[0] = compare(run.prompts[0].results["hf"], run.prompts[0].results["vllm"])
    c.explanation = explain(c, run.prompts[0].results["hf"], run.prompts[0].results["vllm"], build_config(None, []))
    assert c.explanation.verdict == "numerical near-tie"
    f = _settled(run)
    assert f.severity == "warning" and "not measured" in f.message and "numerical near-tie" in f.message


def test_a_window_never_reached_is_info():
    f = _settled(_run(5, [-0.1] * 4, [-0.3] * 4))
    assert f.severity == "info" and "never reached" in f.message and "was 8 tokens" in f.message


def test_half_precision_noise_is_not_taken_for_a_window_problem():
    f = _settled(_run(40, [-0.1] * 6, [-0.2] * 6, dtype="bfloat16"))
    assert f.severity == "info" and "bf16/fp16 noise" in f.message
    f = _settled(_run(40, [-0.1] * 6, [-0.2] * 6))  # the same gap in float32 is far over its noise
    assert f.severity == "warning" and f"{FP32_NOISE_NATS:.2g}" in f.message


def test_without_another_kind_of_side_it_says_it_could_not_measure():
    run = _run(40, [-0.1] * 4, [-0.1] * 4, sides=("a", "vllm"))
    run.warnings.append(Finding(code=CODE, severity="warning", side="a", message="side a: not measured yet"))
    settle_sliding_window(run)
    settled = [w for w in run.warnings if w.code == CODE]
    assert {w.side for w in settled} == {"a", "vllm"}
    assert all(w.severity == "warning" and "not measured" in w.message for w in settled)


def test_a_run_without_comparisons_keeps_the_finding_made_before_loading():
    run = _run(40, [-0.1] * 4, [-0.1] * 4)
    run.prompts[0].comparisons = []
    settle_sliding_window(run)
    assert PRE_RUN in run.warnings


def test_a_warm_cpu_vllm_side_not_checked_again_still_gets_the_measured_finding():
    run = _run(40, [-0.1] * 4, [-0.1] * 4)
    run.warnings = [w for w in run.warnings if w.code != CODE]  # the worker was warm: no check, no finding
    run.sides[1].device = "cpu (x86_64)"
    settle_sliding_window(run)
    (f,) = [w for w in run.warnings if w.code == CODE]
    assert f.side == "vllm" and f.severity == "info" and "4 compared token(s)" in f.message
    run = _run(40, [-0.1] * 4, [-0.1] * 4)
    run.warnings = [w for w in run.warnings if w.code != CODE]
    run.sides[1].device = "cuda:0 (NVIDIA H100 80GB HBM3)"  # the GPU kernels are not what the finding is about
    settle_sliding_window(run)
    assert not [w for w in run.warnings if w.code == CODE]


def test_a_side_with_its_own_model_keeps_the_finding_made_before_loading():
    """Its window is its own model's, which the run does not describe: nothing to measure it against."""
    run = _run(40, [-0.1] * 4, [-0.1] * 4)
    run.sides[1].model_path = "/another/model"
    settle_sliding_window(run)
    assert PRE_RUN in run.warnings


def test_a_sliding_window_no_layer_uses_is_no_window():
    assert sliding_window_of({"sliding_window": 512}) == 512
    assert sliding_window_of({"sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"]}) == 512
    assert sliding_window_of({"sliding_window": 512, "layer_types": ["full_attention", "full_attention"]}) is None
    assert sliding_window_of({"sliding_window": 4096, "use_sliding_window": False}) is None
    assert sliding_window_of({"sliding_window": None}) is None
