"""Canonical config + a side -> that side's native vLLM / HF arguments.

First a table test that pins where every canonical key goes for the default pair of sides (walking
the config and the side kinds' option dataclasses, so a new key or option without a mapping and a
NOTE fails here), then one test per semantic rule that differs between the engines, then the
per-side options: overrides, fp32 logits, devices, a side's own model folder.
"""
from __future__ import annotations

import dataclasses
import re

import pytest

from parity_ui.core import mapping
from parity_ui.core.config import SIDE_PRESETS, ParityConfig, build_config, config_from_dict
from parity_ui.core.errors import ConfigError, SideError
from parity_ui.core.kinds import KINDS, HfOptions, VllmOptions
from parity_ui.core.mapping import (
    NOTES,
    HfArgs,
    VllmArgs,
    format_table,
    map_side,
    mapping_table,
    resolve,
    side_dtype,
)
from parity_ui.core.types import ModelInfo

# The default sides: each named after its kind.
SIDES = {"hf": HfOptions, "vllm": VllmOptions}
# Rows that are not config keys but facts every side must agree on.
RESOLVED_ROWS = {"eos_token_ids"}
# Shared sampling keys: every side's engine must get each of them explicitly.
SAMPLING = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed",
            "stop_token_ids", "ignore_eos", "logprobs", "eos_token_ids")


def shared_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(ParityConfig) if f.name != "sides"]


def side_keys() -> list[str]:
    # A side's dtype is not a row of its own: the shared dtype row shows what each side loads.
    return [f"{side}.{f.name}" for side, cls in SIDES.items() for f in dataclasses.fields(cls) if f.name != "dtype"]


def canonical_keys() -> list[str]:
    return shared_keys() + side_keys()


def model_info(**kw) -> ModelInfo:
    base = dict(name="tiny", path="/models/tiny", config_dtype="float32", eos_token_ids=[2],
                bos_token_id=1, pad_token_id=3, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    return ModelInfo(**{**base, **kw})


def args(data: dict | None = None, *, model: ModelInfo | None = None, tokenizer_eos=(2,), on_gpu=False):
    """(config, resolved, vLLM side's args, HF side's args) for the default pair."""
    cfg = config_from_dict(data or {})
    r = resolve(model or model_info(), list(tokenizer_eos), on_gpu)
    return cfg, r, map_side(cfg, cfg.side("vllm"), r), map_side(cfg, cfg.side("hf"), r)


def _own(env: dict) -> dict:
    """A side's env without the CPU OpenMP setting every CPU side gets (tested on its own)."""
    return {k: v for k, v in env.items() if k != "GOMP_SPINCOUNT"}


def side_args(data: dict, on_gpu: bool = False, model: ModelInfo | None = None) -> tuple[ParityConfig, dict]:
    """Every side's args, by side name."""
    cfg = config_from_dict(data)
    r = resolve(model or model_info(), [2], on_gpu)
    return cfg, {s.name: map_side(cfg, s, r) for s in cfg.sides}


# Every key set to a value that makes its mapping show (max_model_len unset is not passed, ...).
EVERYTHING = {
    "max_model_len": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    "vllm": {"max_num_seqs": 4, "max_num_batched_tokens": 256, "batch_invariant": True, "attention_backend": "FLASH_ATTN",
             "async_scheduling": True, "pipeline_parallel_size": 2, "device": "cuda:1", "fp32_logits": True,
             "max_cudagraph_capture_size": 8, "image_min_pixels": 3136, "image_max_pixels": 12544,
             "generation_config": "model", "model_impl": "transformers", "forced_tokens": "auto", "cpu_threads": 3},
    "hf": {"attn_implementation": "sdpa", "decode": "compiled", "device": "cuda:0,1", "fp32_logits": True,
           "image_min_pixels": 3136, "image_max_pixels": 12544, "generation_config": "neutral",
           "replay_routes": "ids", "logprobs_mode": "processed_logprobs", "deterministic": True, "cpu_threads": 3},
    "routes": True, "full_distribution": True, "full_distribution_budget_mb": 512,
    "image_min_pixels": 3136, "image_max_pixels": 50176, "max_images_per_prompt": 2,
}

# canonical key -> (vLLM native arguments, HF native arguments), as "where.name". Greedy config;
# device-dependent keys take the union of a CPU and a GPU run.
TABLE: dict[str, tuple[set[str], set[str]]] = {
    "max_new_tokens": ({"SamplingParams.max_tokens"}, {"generate.max_new_tokens"}),
    "temperature": ({"SamplingParams.temperature"}, {"generate.do_sample"}),
    "top_p": ({"SamplingParams.top_p"}, {"generate.top_p"}),
    "top_k": ({"SamplingParams.top_k"}, {"generate.top_k"}),
    "min_p": ({"SamplingParams.min_p"}, {"generate.min_p"}),
    "repetition_penalty": ({"SamplingParams.repetition_penalty"}, {"generate.repetition_penalty"}),
    "seed": ({"LLM.seed", "SamplingParams.seed"}, {"runtime.torch.manual_seed"}),
    "sampling": ({"runtime.sampler"}, {"generate.do_sample"}),
    "stop_token_ids": ({"SamplingParams.stop_token_ids"}, {"generate.eos_token_id"}),
    "ignore_eos": ({"SamplingParams.ignore_eos"}, {"generate.eos_token_id"}),
    "dtype": ({"LLM.dtype"}, {"from_pretrained.dtype"}),
    "max_model_len": ({"LLM.max_model_len"}, set()),
    "rope_scaling": ({"LLM.hf_overrides"}, {"config.rope_parameters"}),
    # EVERYTHING's hf side reports processed logprobs of its own (hf.logprobs_mode): output_scores.
    "logprobs": ({"SamplingParams.logprobs"}, {"generate.output_scores"}),
    "logprobs_mode": ({"LLM.logprobs_mode"}, {"generate.output_scores"}),
    "generation_config": ({"LLM.generation_config"}, {"runtime.model.generation_config"}),
    "chat": ({"runtime.prompt_token_ids"}, {"runtime.input_ids"}),
    "batch_size": ({"runtime.requests added per engine step loop"},
                   {"runtime.rows per generate call (left padded)"}),
    "cross_score": ({"SamplingParams.prompt_logprobs"}, {"runtime.one forward pass over prompt + tokens"}),
    # on the CPU hooks on the routers; on a GPU vLLM's own capture
    "routes": ({"runtime.hooks on the routers (select_experts), in process", "LLM.enable_return_routed_experts"},
               {"runtime.forward hooks on the MoE gates"}),
    "hf.replay_routes": (set(), {"runtime.the gates' top-k replaced by recorded experts"}),
    # full_distribution: vLLM's rows processor (on a GPU with the V1 runner; EVERYTHING sets async_scheduling itself)
    "full_distribution": ({"LLM.logits_processors", "env.VLLM_USE_V2_MODEL_RUNNER"},
                          {"runtime.full rows from generate's logits and the scoring forward pass"}),
    "full_distribution_budget_mb": ({"runtime.one sequence's full rows at most (MiB)"},
                                    {"runtime.one sequence's full rows at most (MiB)"}),
    "generate_while_loading": ({"runtime.generates once loaded, while others load"},
                               {"runtime.generates once loaded, while others load"}),
    "eos_token_ids": ({"SamplingParams.stop_token_ids"}, {"generate.eos_token_id"}),
    "vllm.device": ({"env.CUDA_VISIBLE_DEVICES", "env.GOMP_SPINCOUNT"}, set()),
    "vllm.fp32_logits": ({"LLM.hf_overrides"}, set()),
    "vllm.cpu_threads": ({"env.OMP_NUM_THREADS", "runtime.(not used on a GPU)"}, set()),
    "vllm.enforce_eager": ({"LLM.enforce_eager"}, set()),
    "vllm.attention_backend": ({"LLM.attention_backend"}, set()),
    "vllm.enable_prefix_caching": ({"LLM.enable_prefix_caching"}, set()),
    "vllm.enable_chunked_prefill": ({"LLM.enable_chunked_prefill"}, set()),
    "vllm.async_scheduling": ({"LLM.async_scheduling"}, set()),
    "vllm.model_impl": ({"LLM.model_impl"}, set()),
    "vllm.batch_invariant": ({"env.VLLM_BATCH_INVARIANT"}, set()),
    "vllm.max_num_seqs": ({"LLM.max_num_seqs"}, set()),
    "vllm.max_num_batched_tokens": ({"LLM.max_num_batched_tokens"}, set()),
    "vllm.batch_size": ({"runtime.requests added per engine step loop (this side)"}, set()),
    "vllm.gpu_memory_utilization": ({"LLM.gpu_memory_utilization", "runtime.(not used on the CPU)"}, set()),
    "vllm.kv_cache_gib": ({"LLM.kv_cache_memory_bytes", "runtime.(not used on a GPU)"}, set()),
    "vllm.tensor_parallel_size": ({"LLM.tensor_parallel_size"}, set()),
    "vllm.pipeline_parallel_size": ({"LLM.pipeline_parallel_size"}, set()),
    "vllm.max_cudagraph_capture_size": ({"LLM.max_cudagraph_capture_size", "runtime.(not used on the CPU)"}, set()),
    "vllm.forced_tokens": ({"LLM.enable_trace_replay"}, set()),
    "hf.device": (set(), {"runtime.device_map", "env.CUDA_VISIBLE_DEVICES"}),
    "hf.fp32_logits": (set(), {"runtime.lm_head in float32, input upcast"}),
    "hf.cpu_threads": (set(), {"runtime.(not used on a GPU)"}),  # EVERYTHING's HF side is on GPUs; the CPU: below
    "hf.batch_size": (set(), {"runtime.rows per generate call (this side; left padded)"}),
    "hf.attn_implementation": (set(), {"from_pretrained.attn_implementation"}),
    "hf.decode": (set(), {"generate.cache_implementation", "runtime.torch.compile"}),
    "hf.sdpa_kernels": (set(), {"runtime.scaled_dot_product_attention"}),
    "hf.score_batch": (set(), {"runtime.teacher-forced rows a forward (hf_score)"}),
    "hf.score_tokens": (set(), {"runtime.tokens a scoring forward holds"}),
    "hf.deterministic": (set(), {"runtime.torch.use_deterministic_algorithms", "runtime.torch.backends.cudnn",
                                 "runtime.torch.backends.cuda.enable_cudnn_sdp", "env.CUBLAS_WORKSPACE_CONFIG"}),
    # image prompts (the keys show for a vision model)
    "image_min_pixels": ({"LLM.mm_processor_kwargs.min_pixels"}, {"processor.images_kwargs.min_pixels"}),
    "image_max_pixels": ({"LLM.mm_processor_kwargs.max_pixels"}, {"processor.images_kwargs.max_pixels"}),
    "max_images_per_prompt": ({"LLM.limit_mm_per_prompt"}, {"runtime.(no limit in HF; parity-ui checks it)"}),
    "vllm.image_min_pixels": ({"LLM.mm_processor_kwargs.min_pixels"}, set()),
    "vllm.image_max_pixels": ({"LLM.mm_processor_kwargs.max_pixels"}, set()),
    "hf.image_min_pixels": (set(), {"processor.images_kwargs.min_pixels"}),
    "hf.image_max_pixels": (set(), {"processor.images_kwargs.max_pixels"}),
    "vllm.generation_config": ({"LLM.generation_config"}, set()),
    "hf.generation_config": (set(), {"runtime.model.generation_config"}),
    # A side's own logprobs_mode (under `vllm:` it is 0.1's run-wide key: see test_a_sides_own_logprobs_mode).
    "vllm.logprobs_mode": ({"LLM.logprobs_mode"}, set()),
    "hf.logprobs_mode": (set(), {"generate.output_scores"}),
}


def _native(key: str) -> tuple[set[str], set[str]]:
    v_names: set[str] = set()
    h_names: set[str] = set()
    data = EVERYTHING
    if key == "vllm.logprobs_mode":  # under `vllm:` it is 0.1's run-wide key: set it in a sides: list
        data = {**EVERYTHING, "vllm": {k: v for k, v in EVERYTHING["vllm"].items() if k != "pipeline_parallel_size"},
                "sides": [{"name": "hf", "kind": "hf"}, {"name": "vllm", "kind": "vllm", "logprobs_mode": "raw_logprobs"}]}
    for on_gpu in (False, True):
        _, _, v, h = args(data, on_gpu=on_gpu, model=model_info(vision=True, image_token_id=6))
        v_names |= {f"{a.where}.{a.name}" for a in v.used.get(key, [])}
        h_names |= {f"{a.where}.{a.name}" for a in h.used.get(key, [])}
    return v_names, h_names


# --- the table ------------------------------------------------------------------------------


def test_default_sides_are_the_pair_the_table_walks():
    assert [(s.name, s.kind) for s in ParityConfig().sides] == [(n, n) for n in SIDES]
    assert {n: KINDS[n].options for n in SIDES} == SIDES


def test_table_covers_every_canonical_key():
    assert set(TABLE) == set(canonical_keys()) | RESOLVED_ROWS


@pytest.mark.parametrize("key", shared_keys())
def test_every_shared_key_has_a_note(key):
    assert NOTES.get(key, "").strip(), f"{key} has no NOTE in parity_ui/core/mapping.py"


@pytest.mark.parametrize("key", canonical_keys())
def test_every_canonical_key_has_a_row(key):
    _, r, _, _ = args(EVERYTHING)
    rows = {row.key: row for row in mapping_table(config_from_dict(EVERYTHING), r)}
    assert key in rows, f"{key} has no mapping_table row"
    assert rows[key].note.strip()


def test_notes_hold_no_stale_keys():
    assert set(NOTES) <= set(shared_keys()) | RESOLVED_ROWS


@pytest.mark.parametrize("key", sorted(TABLE))
def test_native_arguments_per_key(key):
    assert _native(key) == TABLE[key]
    assert TABLE[key] != (set(), set()), f"{key} reaches neither engine"


def test_mapping_table_rows_show_the_values():
    cfg, r, _, _ = args({"temperature": 0.0, "stop_token_ids": [9], "vllm": {"max_num_seqs": 4}},
                        tokenizer_eos=[2, 7])
    rows = {row.key: row for row in mapping_table(cfg, r)}
    assert rows["eos_token_ids"].value == [2, 7]
    assert rows["stop_token_ids"].value == [9]
    assert list(rows["max_new_tokens"].sides) == ["hf", "vllm"]  # one cell per side, the reference first
    assert "SamplingParams.max_tokens=64" in rows["max_new_tokens"].sides["vllm"]
    assert "generate.max_new_tokens=64" in rows["max_new_tokens"].sides["hf"]
    assert "generate.do_sample=False" in rows["temperature"].sides["hf"]
    assert rows["hf.attn_implementation"].sides["vllm"] == "(not used)"
    # A side option's row: that side's value, and a note naming the kind and what the option does.
    assert rows["vllm.max_num_seqs"].value == 4 and rows["vllm.max_num_seqs"].sides["vllm"] == "LLM.max_num_seqs=4"
    assert rows["vllm.max_num_seqs"].note.startswith(KINDS["vllm"].label + " option: ")
    assert "sequences scheduled together" in rows["vllm.max_num_seqs"].note


def test_every_sampling_key_reaches_every_kind():
    cfg = config_from_dict({"sides": [{"name": "ref", "kind": "hf"}, {"name": "b", "kind": "vllm"},
                                      {"name": "srv", "kind": "vllm-server"},
                                      {"name": "remote", "kind": "openai", "url": "http://127.0.0.1:8000/v1"}]})
    rows = {row.key: row for row in mapping_table(cfg, resolve(model_info(), [2], False))}
    for key in SAMPLING:
        assert set(rows[key].sides) == {"ref", "b", "srv", "remote"}
        missing = [name for name, cell in rows[key].sides.items() if cell == "(not used)"]
        assert not missing, f"{key} does not reach {missing}"


# --- semantic rules -------------------------------------------------------------------------


def test_greedy():
    _, _, v, h = args({"temperature": 0.0, "top_p": 0.9, "top_k": 5, "min_p": 0.1})
    assert v.sampling["temperature"] == 0.0
    assert h.sampling["do_sample"] is False
    for name in ("temperature", "top_p", "top_k", "min_p"):
        assert name in h.sampling and h.sampling[name] is None, name  # HF rejects temperature=0


def test_sampling_passes_every_knob():
    _, _, v, h = args({"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7})
    assert (v.sampling["temperature"], v.sampling["top_p"], v.sampling["top_k"], v.sampling["min_p"]) \
        == (0.7, 0.9, 40, 0.05)
    assert h.sampling["do_sample"] is True
    assert (h.sampling["temperature"], h.sampling["top_p"], h.sampling["top_k"], h.sampling["min_p"]) \
        == (0.7, 0.9, 40, 0.05)
    assert v.sampling["seed"] == 7 and v.llm["seed"] == 7 and h.seed == 7


def test_shared_seed_sampling_is_parity_uis_sampler_in_every_side():
    """vLLM and HF both decode greedily over the logits parity-ui's one sampler masked; the settings
    travel to it unchanged (top_k 0 = off there too), and the table says so."""
    data = {"sampling": "shared-seed", "temperature": 1.0, "top_p": 0.8, "top_k": 0, "min_p": 0.0, "seed": 7}
    cfg, r, v, h = args(data)
    want = {"seed": 7, "temperature": 1.0, "top_p": 0.8, "top_k": 0, "min_p": 0.0}
    assert v.llm["logits_processors"] == ["parity_ui.engines.vllm_shared_seed:SharedSeedLogitsProcessor"]
    assert (v.sampling["temperature"], v.sampling["top_p"], v.sampling["top_k"], v.sampling["min_p"]) == (0, 1, 0, 0)
    assert v.sampling["extra_args"] == {"parity_shared_seed": want}
    assert "async_scheduling" not in v.llm  # CPU: no async scheduling to turn off
    assert h.sampling["do_sample"] is False and h.shared_seed == want
    assert all(h.sampling[k] is None for k in ("temperature", "top_p", "top_k", "min_p"))
    _, _, v_gpu, _ = args(data, on_gpu=True)
    assert v_gpu.llm["async_scheduling"] is False  # the processor reads positions from the output lists
    assert v_gpu.env["VLLM_USE_V2_MODEL_RUNNER"] == "0" and "VLLM_USE_V2_MODEL_RUNNER" not in v.env
    rows = {row.key: row for row in mapping_table(cfg, r)}
    assert "logits_processors" in rows["sampling"].sides["vllm"] and "logits_processor" in rows["sampling"].sides["hf"]
    assert rows["top_p"].sides["vllm"] == "SamplingParams.top_p='1.0 (the shared-seed processor applies 0.8)'"
    # Greedy in shared-seed mode draws nothing: no processor at all.
    _, _, v0, h0 = args({**data, "temperature": 0.0})
    assert "logits_processors" not in v0.llm and h0.shared_seed is None
    # A server samples on its own: refused by name.
    for side in ({"name": "srv", "kind": "vllm-server"}, {"name": "remote", "kind": "openai", "url": "http://x/v1"}):
        cfg = config_from_dict({**data, "sides": [{"name": "ref", "kind": "hf"}, side]})
        with pytest.raises(SideError, match="shared-seed"):
            map_side(cfg, cfg.side(side["name"]), r)


def test_a_sides_own_logprobs_mode():
    cfg, by = side_args({"sides": [{"name": "trainer", "kind": "hf"},
                                   {"name": "rollout", "kind": "vllm", "logprobs_mode": "processed_logprobs"}]})
    assert by["rollout"].llm["logprobs_mode"] == "processed_logprobs"
    assert by["trainer"].logprobs_source == "logits"
    assert [str(a) for a in by["rollout"].used["rollout.logprobs_mode"]] == ["LLM.logprobs_mode='processed_logprobs'"]
    cfg, by = side_args({"sides": [{"name": "ref", "kind": "hf", "logprobs_mode": "processed_logprobs"},
                                   {"name": "b", "kind": "vllm"}]})
    assert by["ref"].logprobs_source == "scores" and by["b"].llm["logprobs_mode"] == "raw_logprobs"
    # shared-seed records processed logprobs itself: an engine's own would carry the noise.
    cfg = config_from_dict({"sampling": "shared-seed", "temperature": 1,
                            "sides": [{"name": "ref", "kind": "hf"},
                                      {"name": "b", "kind": "vllm", "logprobs_mode": "processed_logprobs"}]})
    with pytest.raises(SideError, match="logprobs_mode"):
        map_side(cfg, cfg.side("b"), resolve(model_info(), [2], False))


def test_sampling_top_k_off_is_explicit_zero_for_hf():
    _, _, v, h = args({"temperature": 0.7, "top_k": 0})
    assert v.sampling["top_k"] == 0
    # HF's GenerationConfig default is top_k=50: None would silently turn top-k ON.
    assert h.sampling["top_k"] == 0 and h.sampling["top_k"] is not None


def test_eos_same_explicit_list_for_every_side():
    model = model_info(eos_token_ids=[2, 5])
    _, r, v, h = args({"stop_token_ids": [9]}, model=model, tokenizer_eos=[5, 7, 2])
    assert r.eos_token_ids == [2, 5, 7]  # generation_config first, tokenizer after, no duplicates
    assert v.sampling["stop_token_ids"] == [2, 5, 7, 9]
    assert h.sampling["eos_token_id"] == [2, 5, 7, 9]
    assert v.sampling["ignore_eos"] is False


def test_ignore_eos():
    model = model_info(eos_token_ids=[2, 5])
    _, _, v, h = args({"ignore_eos": True, "stop_token_ids": [9]}, model=model, tokenizer_eos=[7])
    assert v.sampling["ignore_eos"] is True
    assert v.sampling["stop_token_ids"] == [9]
    assert h.sampling["eos_token_id"] == [9]
    assert h.sampling["min_new_tokens"] is None  # never used: it masks EOS, changing the distribution


def test_ignore_eos_without_stop_ids_leaves_hf_no_eos():
    _, _, v, h = args({"ignore_eos": True}, tokenizer_eos=[2])
    assert v.sampling["stop_token_ids"] == []
    assert h.sampling["eos_token_id"] is None
    assert h.sampling["min_new_tokens"] is None


def test_model_generation_config_ignored_by_default():
    _, _, v, h = args()
    assert v.llm["generation_config"] == "vllm"
    assert h.keep_model_generation_config is False


def test_model_generation_config_applies_to_every_side():
    for data in ({"generation_config": "model"}, {"vllm": {"generation_config": "auto"}}):  # new and legacy
        _, _, v, h = args(data)
        assert v.llm["generation_config"] == "auto"
        assert h.keep_model_generation_config is True


def test_a_side_may_take_the_models_generation_config_on_its_own():
    """The trap of one engine silently applying generation_config.json while the other does not, as
    a side's own option (parity bisect flips it like any other): the side's value wins over the
    run's, `--set b.generation_config=model` addresses the side, 0.1's `vllm.generation_config=auto`
    still means the whole run."""
    cfg, sides = side_args({"sides": [{"name": "ref", "kind": "hf"},
                                      {"name": "b", "kind": "hf", "generation_config": "model"},
                                      {"name": "v", "kind": "vllm", "generation_config": "model"}]})
    assert sides["ref"].keep_model_generation_config is False and sides["b"].keep_model_generation_config is True
    assert sides["v"].llm["generation_config"] == "auto" and cfg.generation_config == "neutral"
    cfg = build_config(None, ["b.generation_config=model"], sides=["ref=hf", "b=hf"])
    assert (cfg.generation_config, cfg.side("b").options.generation_config) == ("neutral", "model")
    cfg, sides = side_args({"generation_config": "model", "sides": [{"name": "ref", "kind": "hf"},
                                                                    {"name": "b", "kind": "hf",
                                                                     "generation_config": "neutral"}]})
    assert sides["ref"].keep_model_generation_config is True and sides["b"].keep_model_generation_config is False
    assert build_config(None, ["vllm.generation_config=auto"]).generation_config == "model"
    with pytest.raises(ConfigError, match="generation_config"):
        build_config(None, sides=["ref=hf", "b=hf,generation_config=yes"])


@pytest.mark.parametrize("config_dtype, expected", [
    ("bfloat16", "bfloat16"), ("torch.float16", "float16"), ("float32", "float32"), ("", "float32"),
    ("float64", "float32"),
])
def test_dtype_auto_resolves_from_model_config(config_dtype, expected):
    model = model_info(config_dtype=config_dtype)
    cfg, _, v, h = args(model=model, on_gpu=True)
    assert {side_dtype(cfg, s, model) for s in cfg.sides} == {expected}
    assert v.llm["dtype"] == expected and h.load["dtype"] == expected


@pytest.mark.parametrize("config_dtype, weights_dtype, expected", [
    ("", "bfloat16", "bfloat16"), ("", "float16", "float16"), ("", "", "float32"), ("float32", "bfloat16", "float32"),
])
def test_dtype_auto_without_a_config_dtype_reads_the_weights(config_dtype, weights_dtype, expected):
    """Both engines load a dtype-less checkpoint in its weights' dtype (transformers 5's dtype="auto",
    vLLM's safetensors metadata); the config's dtype, where it names one, wins."""
    model = model_info(config_dtype=config_dtype, weights_dtype=weights_dtype)
    cfg, _, v, h = args(model=model, on_gpu=True)
    assert {side_dtype(cfg, s, model) for s in cfg.sides} == {expected}
    assert v.llm["dtype"] == expected and h.load["dtype"] == expected


def test_explicit_dtype_wins_over_model_config():
    _, _, v, h = args({"dtype": "float16"}, model=model_info(config_dtype="bfloat16"))
    assert v.llm["dtype"] == h.load["dtype"] == "float16"


def test_a_sides_dtype_wins_over_the_runs_for_that_side_only():
    cfg, a = side_args({"dtype": "float16", "sides": [{"name": "ref", "kind": "hf", "dtype": "float32"},
                                                      {"name": "b", "kind": "vllm"},
                                                      {"name": "c", "kind": "vllm", "dtype": "auto"}]},
                       model=model_info(config_dtype="bfloat16"))
    assert a["ref"].load["dtype"] == "float32"
    assert a["b"].llm["dtype"] == "float16"  # no dtype of its own: the run's
    assert a["c"].llm["dtype"] == "bfloat16"  # its own 'auto': the model's config
    rows = {row.key: row for row in mapping_table(cfg, resolve(model_info(config_dtype="bfloat16"), [2], False))}
    assert rows["dtype"].sides == {"ref": "from_pretrained.dtype='float32'", "b": "LLM.dtype='float16'",
                                   "c": "LLM.dtype='bfloat16'"}


def test_rope_scaling_same_merged_dict_for_every_side():
    model = model_info(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    _, _, v, h = args({"rope_scaling": {"type": "linear", "factor": 2.0}}, model=model)
    merged = {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0}
    assert v.llm["hf_overrides"] == {"rope_scaling": merged, "rope_parameters": merged}
    assert h.config_overrides == {"rope_parameters": merged}


def test_no_rope_scaling_no_overrides():
    _, _, v, h = args()
    assert "hf_overrides" not in v.llm
    assert h.config_overrides == {}


def test_logprobs_mode_switches_hf_source():
    _, _, v_raw, h_raw = args()
    _, _, v_proc, h_proc = args({"logprobs_mode": "processed_logprobs"})
    assert (v_raw.llm["logprobs_mode"], h_raw.logprobs_source) == ("raw_logprobs", "logits")
    assert (v_proc.llm["logprobs_mode"], h_proc.logprobs_source) == ("processed_logprobs", "scores")


def test_logprobs_zero_still_asks_for_the_chosen_token():
    _, _, v, _ = args({"logprobs": 0})
    assert v.sampling["logprobs"] == 1 and v.llm["max_logprobs"] == 1


def test_cpu_defaults():
    _, _, v, h = args({"vllm": {"kv_cache_gib": 2.0}}, on_gpu=False)
    assert v.llm["kv_cache_memory_bytes"] == 2 * 2**30
    assert "gpu_memory_utilization" not in v.llm and "max_cudagraph_capture_size" not in v.llm
    assert v.llm["enforce_eager"] is True
    assert h.device == "cpu"
    # Short OpenMP spinning on a CPU (mapping.CPU_SPINCOUNT), recorded like any other native argument.
    assert v.env == h.env == {"GOMP_SPINCOUNT": mapping.CPU_SPINCOUNT}
    assert [a.name for a in h.used["hf.device"] if a.where == "env"] == ["GOMP_SPINCOUNT"]


def test_cpu_threads_reach_each_sides_worker_on_the_cpu_only():
    sides = {"sides": [{"name": "hf", "kind": "hf", "cpu_threads": 1}, {"name": "vllm", "kind": "vllm", "cpu_threads": 2}]}
    _, _, v, h = args(sides, on_gpu=False)
    assert h.env["OMP_NUM_THREADS"] == "1" and v.env["OMP_NUM_THREADS"] == "2"
    assert [(a.where, a.name, a.value) for a in v.used["vllm.cpu_threads"]] == [("env", "OMP_NUM_THREADS", "2")]
    _, _, v, h = args(sides, on_gpu=True)
    assert "OMP_NUM_THREADS" not in v.env and "OMP_NUM_THREADS" not in h.env
    assert [a.name for a in h.used["hf.cpu_threads"]] == ["(not used on a GPU)"]


@pytest.mark.parametrize("user_choice", ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT"])
def test_a_users_openmp_choice_is_left_alone(monkeypatch, user_choice):
    monkeypatch.setenv(user_choice, "PASSIVE" if user_choice == "OMP_WAIT_POLICY" else "0")
    _, _, v, h = args(on_gpu=False)
    assert v.env == {} and h.env == {}


def test_no_openmp_setting_on_a_gpu():
    _, _, v, h = args(on_gpu=True)
    assert "GOMP_SPINCOUNT" not in v.env and "GOMP_SPINCOUNT" not in h.env


def test_gpu_defaults():
    _, _, v, h = args(on_gpu=True)
    # Unset: parity_ui.run.memory_plan fills each vLLM side's share from the run's sides before loading.
    assert "gpu_memory_utilization" in v.llm and v.llm["gpu_memory_utilization"] is None
    assert "kv_cache_memory_bytes" not in v.llm
    assert v.llm["enforce_eager"] is False
    assert h.device == "cuda"
    assert v.env == {} and h.env == {}  # auto: no CUDA_VISIBLE_DEVICES of its own


def test_explicit_gpu_share_and_capture_size_pass_through():
    _, _, v, _ = args({"vllm": {"gpu_memory_utilization": 0.3, "max_cudagraph_capture_size": 64}}, on_gpu=True)
    assert v.llm["gpu_memory_utilization"] == 0.3 and v.llm["max_cudagraph_capture_size"] == 64
    _, _, eager, _ = args({"vllm": {"enforce_eager": True, "max_cudagraph_capture_size": 64}}, on_gpu=True)
    assert "max_cudagraph_capture_size" not in eager.llm  # no graphs to capture


@pytest.mark.parametrize("batch_size", [1, 24, 100])
def test_captured_cuda_graphs_cover_the_runs_batch(batch_size):
    _, _, v, _ = args({"batch_size": batch_size}, on_gpu=True)
    # vLLM's own default (512) or a smaller size chosen for the run: never below the batch it runs.
    assert v.llm.get("max_cudagraph_capture_size", 512) >= batch_size


@pytest.mark.parametrize("on_gpu", [False, True])
def test_explicit_enforce_eager_wins(on_gpu):
    for eager in (True, False):
        _, _, v, _ = args({"vllm": {"enforce_eager": eager}}, on_gpu=on_gpu)
        assert v.llm["enforce_eager"] is eager


def test_batch_invariant_is_an_env_var():
    _, _, off, _ = args()
    _, _, on, _ = args({"vllm": {"batch_invariant": True}})
    assert _own(off.env) == {} and _own(on.env) == {"VLLM_BATCH_INVARIANT": "1"}


def test_pad_falls_back_to_first_eos():
    _, _, _, h = args(model=model_info(pad_token_id=None, eos_token_ids=[4]), tokenizer_eos=[])
    assert h.sampling["pad_token_id"] == 4


# --- per-side options -------------------------------------------------------------------------


def test_each_side_gets_its_own_options():
    cfg, a = side_args({"sides": SIDE_PRESETS["eager-vs-graphs"]}, on_gpu=True)
    assert isinstance(a["eager"], VllmArgs) and isinstance(a["graphs"], VllmArgs)
    assert (a["eager"].llm["enforce_eager"], a["graphs"].llm["enforce_eager"]) == (True, False)
    assert "max_cudagraph_capture_size" in a["graphs"].llm and "max_cudagraph_capture_size" not in a["eager"].llm
    # What the sides share is the same for both.
    assert a["eager"].sampling == a["graphs"].sampling
    assert a["eager"].llm["dtype"] == a["graphs"].llm["dtype"]


def test_an_override_for_one_side_leaves_the_others_alone():
    cfg = build_config(None, ["invariant.max_num_seqs=2"], base={"sides": SIDE_PRESETS["batch-invariant"]})
    r = resolve(model_info(), [2], True)
    default, inv = (map_side(cfg, s, r) for s in cfg.sides)
    assert inv.env == {"VLLM_BATCH_INVARIANT": "1"} and default.env == {}
    assert inv.llm["max_num_seqs"] == 2 and "max_num_seqs" not in default.llm
    rows = {row.key: row for row in mapping_table(cfg, r)}
    assert rows["invariant.batch_invariant"].sides == {"default": "(not used)",
                                                       "invariant": "VLLM_BATCH_INVARIANT=1"}
    assert rows["default.batch_invariant"].value is False and rows["invariant.batch_invariant"].value is True


def test_three_sides_map_and_table_one_column_each():
    cfg, a = side_args({"sides": SIDE_PRESETS["three-way"]})
    assert isinstance(a["ref"], HfArgs) and a["ref"].load["dtype"] == "float32"
    assert a["bf16"].llm["dtype"] == a["bf16-inv"].llm["dtype"] == "bfloat16"
    assert _own(a["bf16-inv"].env) == {"VLLM_BATCH_INVARIANT": "1"} and _own(a["bf16"].env) == {}
    rows = mapping_table(cfg, resolve(model_info(), [2], False))
    assert all(list(row.sides) == ["ref", "bf16", "bf16-inv"] for row in rows)
    lines = format_table(rows).splitlines()
    assert all(len(_cells(line)) == 6 for line in lines)  # key, value, three sides, note


def test_fp32_logits_vllm_is_a_float32_head():
    _, _, off, _ = args()
    _, _, on, _ = args({"vllm": {"fp32_logits": True}})
    assert off.fp32_logits is False and "hf_overrides" not in off.llm
    assert on.fp32_logits is True and on.llm["hf_overrides"] == {"head_dtype": "float32"}
    assert on.llm["dtype"] == off.llm["dtype"]  # the weights keep their dtype


def test_fp32_logits_vllm_keeps_the_rope_override():
    _, _, v, _ = args({"vllm": {"fp32_logits": True}, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    merged = {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0}
    assert v.llm["hf_overrides"] == {"rope_scaling": merged, "rope_parameters": merged, "head_dtype": "float32"}


def test_fp32_logits_hf_and_the_rl_preset():
    _, _, _, off = args()
    assert off.fp32_logits is False
    _, a = side_args({"dtype": "bfloat16", "sides": SIDE_PRESETS["rl-rollout"]})
    assert a["trainer"].fp32_logits is True and a["trainer"].load["dtype"] == "float32"
    assert a["rollout"].fp32_logits is True and a["rollout"].llm["hf_overrides"] == {"head_dtype": "float32"}
    assert a["rollout"].llm["dtype"] == "bfloat16"


@pytest.mark.parametrize("device, visible", [("auto", None), ("cuda", None), ("cuda:1", "1"), ("cuda:0,1", "0,1"),
                                             ("cuda:2,3", "2,3")])
def test_vllm_device_becomes_cuda_visible_devices(device, visible):
    _, _, v, _ = args({"vllm": {"device": device}}, on_gpu=True)
    assert v.env.get("CUDA_VISIBLE_DEVICES") == visible
    recorded = [a.value for a in v.used.get("vllm.device", [])]
    assert recorded == ([] if visible is None else [visible])


@pytest.mark.parametrize("device, on_gpu, where, env", [
    ("auto", False, "cpu", {"GOMP_SPINCOUNT": "10000"}), ("auto", True, "cuda", {}),
    ("cpu", True, "cpu", {"GOMP_SPINCOUNT": "10000"}),  # HF on the CPU of a GPU machine
    ("cuda:1", True, "cuda:1", {}),  # one GPU: the model goes there, every GPU stays visible
    ("cuda:0,1", True, "balanced", {"CUDA_VISIBLE_DEVICES": "0,1"}),  # spread over the side's GPUs only
])
def test_hf_device(device, on_gpu, where, env):
    _, _, _, h = args({"hf": {"device": device}}, on_gpu=on_gpu)
    assert h.device == where and h.env == env


def test_worker_env_of_two_sides_on_different_gpus():
    _, a = side_args({"sides": [{"name": "ref", "kind": "hf", "device": "cuda:0,1"},
                                {"name": "b", "kind": "vllm", "device": "cuda:2", "batch_invariant": True}]},
                     on_gpu=True)
    assert a["ref"].env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert a["b"].env == {"VLLM_BATCH_INVARIANT": "1", "CUDA_VISIBLE_DEVICES": "2"}


def test_vllm_side_told_to_use_the_cpu_is_not_put_on_the_gpu():
    try:
        cfg = config_from_dict({"vllm": {"device": "cpu"}})
        v = map_side(cfg, cfg.side("vllm"), resolve(model_info(), [2], True))
    except ConfigError as e:  # refusing device=cpu for vLLM on a GPU machine would do too
        assert e.key == "vllm.device"
        return
    assert "gpu_memory_utilization" not in v.llm
    assert v.used.get("vllm.device"), "device=cpu reaches vLLM nowhere"


def test_parallel_sizes_use_the_multiprocessing_executor():
    _, _, one, _ = args(on_gpu=True)
    assert one.llm["tensor_parallel_size"] == 1
    assert "pipeline_parallel_size" not in one.llm and "distributed_executor_backend" not in one.llm
    _, _, tp, _ = args({"vllm": {"tensor_parallel_size": 2}}, on_gpu=True)
    assert tp.llm["tensor_parallel_size"] == 2 and tp.llm["distributed_executor_backend"] == "mp"
    _, _, pp, _ = args({"vllm": {"pipeline_parallel_size": 2}}, on_gpu=True)
    assert pp.llm["pipeline_parallel_size"] == 2 and pp.llm["distributed_executor_backend"] == "mp"


def test_optional_vllm_options_are_passed_only_when_set():
    _, _, unset, _ = args()
    for name in ("attention_backend", "async_scheduling", "max_num_seqs", "max_model_len"):
        assert name not in unset.llm, name  # vLLM decides
    _, _, v, _ = args({"vllm": {"attention_backend": "TRITON_ATTN", "async_scheduling": False,
                                "enable_prefix_caching": True, "enable_chunked_prefill": True}})
    assert v.llm["attention_backend"] == "TRITON_ATTN"
    assert v.llm["async_scheduling"] is False  # an explicit false is passed, not dropped
    assert v.llm["enable_prefix_caching"] is True and v.llm["enable_chunked_prefill"] is True


@pytest.mark.parametrize("decode, cache", [("eager", None), ("static", "static"), ("compiled", "static")])
def test_hf_decode_paths(decode, cache):
    _, _, _, h = args({"hf": {"decode": decode}})
    assert h.decode == decode
    assert h.sampling.get("cache_implementation") == cache
    compiles = any(a.name == "torch.compile" for a in h.used["hf.decode"])
    assert compiles is (decode == "compiled")


def test_hf_graphed_decode_is_parity_uis_loop_and_the_table_says_generate_is_not_called():
    _, _, _, h = args({"hf": {"decode": "graphed"}, "batch_size": 8})
    assert h.decode == "graphed" and "cache_implementation" not in h.sampling
    assert {a.name for a in h.used["hf.decode"]} == {"StaticCache + model.forward", "torch.cuda.CUDAGraph"}
    assert not any(a.where == "generate" for used in h.used.values() for a in used)
    assert [a.where for a in h.used["max_new_tokens"]] == ["greedy loop"]
    assert "one prompt at a time" in h.used["batch_size"][0].name


@pytest.mark.parametrize("data, names, fix", [
    ({"temperature": 0.7}, "temperature=0.7", "temperature=0"),
    ({"repetition_penalty": 1.2}, "repetition_penalty=1.2", "repetition_penalty=1"),
    ({"logprobs_mode": "processed_logprobs"}, "logprobs_mode=processed_logprobs", "raw logprobs_mode"),
    ({"generation_config": "model"}, "generation_config=model", "generation_config=neutral"),
    ({"hf": {"attn_implementation": "flash_attention_2"}}, "attn_implementation=flash_attention_2",
     "attn_implementation=sdpa"),
])
def test_hf_graphed_decode_refuses_what_it_would_silently_drop(data, names, fix):
    """The graphed loop is a plain argmax: a sampler or a logits processor generate() would apply
    must not vanish quietly."""
    with pytest.raises(SideError) as e:
        args({**data, "hf": {**data.get("hf", {}), "decode": "graphed"}})
    assert e.value.key == "hf.decode" and names in e.value.message
    assert fix in e.value.fix and "decode=static" in e.value.fix


@pytest.mark.parametrize("choice, enabled", [("auto", None), ("no-cudnn", ["flash", "efficient", "math"]),
                                             ("math", ["math"]), ("cudnn", ["cudnn"])])
def test_hf_sdpa_kernels_name_the_kernels_the_worker_leaves_enabled(choice, enabled):
    _, _, _, h = args({"hf": {"sdpa_kernels": choice}})
    assert h.sdpa_kernels == enabled
    (used,) = h.used["hf.sdpa_kernels"]
    assert used.value == ("torch's choice" if enabled is None else "only " + ", ".join(enabled))


def test_hf_sdpa_kernels_apply_to_sdpa_attention_only():
    with pytest.raises(SideError) as e:
        args({"hf": {"sdpa_kernels": "math", "attn_implementation": "eager"}})
    assert e.value.key == "hf.sdpa_kernels" and "attn_implementation=eager" in e.value.message
    assert "attn_implementation=sdpa" in e.value.fix
    assert args({"hf": {"sdpa_kernels": "math", "attn_implementation": "sdpa"}})[3].sdpa_kernels == ["math"]


def test_hf_attn_implementation_auto_is_transformers_choice():
    _, _, _, auto = args()
    _, _, _, sdpa = args({"hf": {"attn_implementation": "sdpa"}})
    assert "attn_implementation" not in auto.load
    assert sdpa.load["attn_implementation"] == "sdpa"


def test_a_side_with_its_own_model_folder():
    cfg = config_from_dict({"sides": [{"name": "ref", "kind": "hf"},
                                      {"name": "b", "kind": "vllm", "model": "/models/tiny-ft"}]})
    run_model = model_info(config_dtype="float32")
    own = model_info(path="/models/tiny-ft", config_dtype="bfloat16", eos_token_ids=[9])
    r = resolve(run_model, [2], False)
    b = map_side(cfg, cfg.side("b"), r, own)
    assert b.llm["model"] == b.llm["tokenizer"] == "/models/tiny-ft"
    assert b.llm["dtype"] == "bfloat16"  # 'auto' read from the side's own config
    assert b.sampling["stop_token_ids"] == [2]  # the run's EOS list: the same for every side
    assert map_side(cfg, cfg.side("b"), r).llm["model"] == "/models/tiny"  # without it: the run's model
    rows = {row.key: row for row in mapping_table(cfg, r, models={"b": own})}
    assert rows["dtype"].sides == {"ref": "from_pretrained.dtype='float32'", "b": "LLM.dtype='bfloat16'"}


# --- format_table ---------------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    return re.split(r"(?<!\\)\|", line.strip())[1:-1]


def test_format_table_is_markdown_with_one_row_per_note_then_per_side_option():
    cfg, r, _, _ = args(EVERYTHING)
    lines = format_table(mapping_table(cfg, r)).splitlines()
    head = [c.strip() for c in _cells(lines[0])]
    assert head == ["canonical key", "value", "hf", "vllm", "note"]
    assert set(lines[1].replace("|", "")) == {"-"}
    keys = [_cells(line)[0].strip() for line in lines[2:]]
    assert keys == list(NOTES) + side_keys()
    assert all(len(_cells(line)) == 5 for line in lines), "a cell's '|' was not escaped"


def test_format_table_labels_name_the_columns():
    cfg, r, _, _ = args()
    head = _cells(format_table(mapping_table(cfg, r), labels={"hf": "HF (reference)"}).splitlines()[0])
    assert [c.strip() for c in head] == ["canonical key", "value", "HF (reference)", "vllm", "note"]


def test_format_table_escapes_pipes():
    row = mapping.MappingRow(key="k", value="a|b", sides={"a": "x|y", "b": ""}, note="n")
    line = format_table([row]).splitlines()[2]
    assert "a\\|b" in line and "x\\|y" in line and len(_cells(line)) == 5


def test_forced_tokens_reach_the_vllm_engine_and_a_server_refuses_trace():
    _, _, v, _ = args({"vllm": {"forced_tokens": "auto"}})
    assert v.forced_tokens == "auto" and v.used["vllm.forced_tokens"][0].name == "enable_trace_replay"
    _, _, v, _ = args()
    assert v.forced_tokens == "prompt" and v.used["vllm.forced_tokens"][0].name == "prompt_logprobs"
    cfg = build_config(None, [], sides=["a=hf", "b=vllm-server,forced_tokens=trace"])
    r = resolve(model_info(), [2], on_gpu=False)
    with pytest.raises(SideError, match="forced_tokens"):
        map_side(cfg, cfg.sides[1], r, model_info())


def test_full_distribution_lists_the_rows_processor_before_the_shared_seed_one():
    """The rows processor must see the raw row; the shared-seed one masks the row it draws from."""
    _, _, v, _ = args({"full_distribution": True, "sampling": "shared-seed", "temperature": 1.0})
    assert v.llm["logits_processors"] == [mapping.FULL_ROWS_PROCESSOR, mapping.SHARED_SEED_PROCESSOR]
    _, _, v, _ = args({"full_distribution": True})
    assert v.llm["logits_processors"] == [mapping.FULL_ROWS_PROCESSOR]
    _, _, v, _ = args({"full_distribution": True}, on_gpu=True)
    assert v.llm["async_scheduling"] is False and v.env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    _, _, v, _ = args({})
    assert "logits_processors" not in v.llm


def test_graph_capture_sizes_fall_in_buckets_that_share_a_compile():
    """The capture size is part of vLLM's compile-cache key: runs of nearby batch sizes get one size."""
    from parity_ui.core.mapping import default_capture_size

    assert [default_capture_size(b) for b in (1, 16, 17, 24, 32, 33, 100, 128, 200, 512)] == \
        [16, 16, 32, 32, 32, 64, 128, 128, 256, 512]
    assert default_capture_size(600) == 600 and default_capture_size(601) == 608  # past vLLM's own 512
