"""An hf side's `deterministic` option above the engines: what it maps to (cuBLAS's workspace in the
worker's environment, torch's switches at load), that it is a load-time setting (another worker), that a
vLLM side given it is refused with vLLM's own switch named, and the audit's hint when an hf side's
replay or second instance breaks without it (the exact option the CLI takes, checked by parsing it).
The worker applying it is tests/engines/test_hf_deterministic_engines.py."""
from __future__ import annotations

import dataclasses

import pytest

from parity_ui.commands.audit.axes import axis_hint
from parity_ui.core.config import build_config
from parity_ui.core.errors import SideError
from parity_ui.core.kinds import KINDS
from parity_ui.core.mapping import CUBLAS_WORKSPACE, deterministic_off, map_side, resolve
from parity_ui.core.sides import parse_side_arg, side_arg
from parity_ui.core.types import ModelInfo


def _model() -> ModelInfo:
    return ModelInfo(name="tiny", path="/models/tiny", config_dtype="float32", eos_token_ids=[2], bos_token_id=1,
                     pad_token_id=3)


def _args(sides: list[str], on_gpu: bool = True) -> dict:
    cfg = build_config(None, [], sides=sides)
    r = resolve(_model(), [2], on_gpu)
    return {s.name: map_side(cfg, s, r) for s in cfg.sides}


def test_deterministic_sets_cublas_workspace_in_the_workers_env_and_is_a_load_time_setting(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    a = _args(["plain=hf", "det=hf,deterministic=true"])
    plain, det = a["plain"], a["det"]
    assert CUBLAS_WORKSPACE == ":4096:8"
    assert det.deterministic is True and det.env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert plain.deterministic is False and "CUBLAS_WORKSPACE_CONFIG" not in plain.env
    used = {f"{x.where}.{x.name}": x.value for x in det.used["det.deterministic"]}
    assert used == {"runtime.torch.use_deterministic_algorithms": "True, warn_only=True",
                    "runtime.torch.backends.cudnn": "deterministic=True, benchmark=False",
                    "runtime.torch.backends.cuda.enable_cudnn_sdp": False,
                    "env.CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    # What a warm worker must have loaded (run.plan.SidePlan.load_key: the args but sampling, and the env):
    # the two sides differ in it, so they never share a worker.
    load = [{k: v for k, v in dataclasses.asdict(x).items() if k not in ("used", "sampling")} for x in (plain, det)]
    assert load[0] != load[1]
    assert {k for k in load[0] if load[0][k] != load[1][k]} == {"env", "deterministic"}


def test_a_cublas_workspace_of_the_users_own_that_torch_takes_is_kept(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert _args(["det=hf,deterministic=true", "b=vllm"])["det"].env["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":2:2")  # not one torch's deterministic mode accepts
    assert _args(["det=hf,deterministic=true", "b=vllm"])["det"].env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


@pytest.mark.parametrize("kind", ["vllm", "vllm-server", "vllm-updated"])
def test_a_vllm_side_given_deterministic_is_refused_naming_batch_invariant(kind):
    with pytest.raises(SideError) as e:
        build_config(None, [], sides=["ref=hf", f"b={kind},deterministic=true"])
    err = e.value
    assert err.side == "b" and err.key == "b.deterministic"
    assert f"'deterministic' is not an option of kind {kind} (it is an option of kind hf)" in err.message
    assert err.fix.startswith("vLLM's own switch for bitwise-reproducible batches is batch_invariant=true")
    assert f"options of kind {kind}: " in err.fix and "batch_invariant" in err.fix.split("options of kind", 1)[1]


def test_the_same_refusal_through_a_section_and_without_advice_for_a_kind_that_has_none():
    with pytest.raises(SideError, match="not an option of kind vllm"):
        build_config(None, ["vllm.deterministic=true"])  # the default pair's vllm side, through --set
    with pytest.raises(SideError) as e:
        build_config(None, [], sides=["ref=hf", "srv=openai,url=http://127.0.0.1:8000/v1,deterministic=true"])
    assert "(it is an option of kind hf)" in e.value.message and e.value.fix.startswith("options of kind openai: ")


def test_only_a_kind_that_can_is_asked_for_determinism():
    assert [k for k, v in KINDS.items() if v.can_deterministic] == ["hf"]
    cfg = build_config(None, [], sides=["ref=hf", "det=hf,deterministic=true", "b=vllm"])
    assert [deterministic_off(s) for s in cfg.sides] == [True, False, False]


@pytest.mark.parametrize("text", ["ref=hf,dtype=bfloat16,device=cuda:0,1,sdpa_kernels=math,score_tokens=4096",
                                  "b=vllm,kv_cache_gib=0.5,enforce_eager=false,attention_backend=FLEX_ATTENTION",
                                  "t=hf,model=/ckpt/step-1200,python=/opt/tf/bin/python"])
def test_a_side_written_back_as_its_side_arg_parses_to_the_same_side(text):
    (side,) = build_config(None, [], sides=[text], min_sides=1).sides
    again = side_arg(side)
    assert parse_side_arg(again) == parse_side_arg(text)
    assert build_config(None, [], sides=[again], min_sides=1).sides == [side]


def test_the_hint_of_a_broken_replay_or_second_instance_is_the_option_the_cli_takes():
    (side,) = build_config(None, ["dtype=bfloat16"], sides=["ref=hf,sdpa_kernels=no-cudnn"], min_sides=1).sides
    for axis in ("replay", "instance"):
        h = axis_hint(axis, side, {"deterministic": "off"})
        assert "without torch's deterministic algorithms" in h
        assert "--set ref.deterministic=true" in h and "--side ref=hf,sdpa_kernels=no-cudnn,deterministic=true" in h
    # Both spellings it names are accepted by the config the CLI builds, and give the side deterministic on.
    on_set = build_config(None, ["ref.deterministic=true"], sides=["ref=hf,sdpa_kernels=no-cudnn"], min_sides=1)
    on_side = build_config(None, [], sides=["ref=hf,sdpa_kernels=no-cudnn,deterministic=true"], min_sides=1)
    assert on_set.sides == on_side.sides and on_set.sides[0].options.deterministic is True
    # Not an axis determinism is about (left padding moves a batch's numbers by itself); not a vLLM side.
    assert axis_hint("batch", side, {}) == "" and axis_hint("attention", side, {}) == ""
    (vllm,) = build_config(None, [], sides=["b=vllm"], min_sides=1).sides
    assert axis_hint("replay", vllm, {}) == ""


def test_with_deterministic_on_the_hint_names_the_ops_torch_has_no_deterministic_kernel_for():
    (side,) = build_config(None, [], sides=["ref=hf,deterministic=true"], min_sides=1).sides
    ops = ["index_add_cuda_", "scatter_add_cuda_kernel"]
    h = axis_hint("replay", side, {"deterministic": "on (warn_only)", "nondeterministic_ops": ops})
    assert "ran with deterministic algorithms" in h and "index_add_cuda_, scatter_add_cuda_kernel" in h
    assert "--set" not in h
    assert axis_hint("replay", side, {"deterministic": "on (warn_only)", "nondeterministic_ops": []}) == ""


TORCH_ALERT = ("{op} does not have a deterministic implementation, but you set "
               "'torch.use_deterministic_algorithms(True, warn_only=True)'. You can file an issue at ...")


def test_the_worker_names_each_op_torch_warns_has_no_deterministic_kernel_and_lets_other_warnings_through():
    """The HF worker's recorder (torch warns through Python's warnings with warn_only; on the CPU no op
    this engine runs warns, so torch's wording is planted here)."""
    import warnings

    from parity_ui.engines.hf_engine import _NondeterministicOps

    with pytest.warns(UserWarning, match="something else"):
        with _NondeterministicOps(True) as met:
            for op in ("index_add_cuda_", "scatter_add_cuda_kernel", "index_add_cuda_"):
                warnings.warn(TORCH_ALERT.format(op=op))
            warnings.warn("something else")  # not torch's alert: shown as before
    assert met.ops == ["index_add_cuda_", "scatter_add_cuda_kernel"]
    with pytest.warns(UserWarning, match="does not have a deterministic"):
        with _NondeterministicOps(False) as off:  # the side did not ask: nothing watched, nothing swallowed
            warnings.warn(TORCH_ALERT.format(op="index_add_cuda_"))
    assert off.ops == []
