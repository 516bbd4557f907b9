"""Canonical config -> vLLM / HF native arguments.

First a table test that pins where every canonical key goes (walking the config dataclasses, so a
new key without a mapping and a NOTE fails here), then one test per semantic rule that differs
between the engines.
"""
from __future__ import annotations

import dataclasses
import re

import pytest

from parity_ui import mapping
from parity_ui.config import HfOptions, ParityConfig, VllmOptions, config_from_dict
from parity_ui.mapping import NOTES, format_table, mapping_table, resolve, to_hf, to_vllm
from parity_ui.types import ModelInfo

SECTIONS = {"vllm": VllmOptions, "hf": HfOptions}
# Rows that are not config keys but facts both engines must agree on.
RESOLVED_ROWS = {"eos_token_ids"}
# Keys parity-ui acts on itself: neither engine gets an argument for them.
PARITY_ONLY = {"cross_score"}


def canonical_keys() -> list[str]:
    keys = []
    for f in dataclasses.fields(ParityConfig):
        if f.name in SECTIONS:
            keys += [f"{f.name}.{g.name}" for g in dataclasses.fields(SECTIONS[f.name])]
        else:
            keys.append(f.name)
    return keys


def model_info(**kw) -> ModelInfo:
    base = dict(name="tiny", path="/models/tiny", config_dtype="float32", eos_token_ids=[2],
                bos_token_id=1, pad_token_id=3, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    return ModelInfo(**{**base, **kw})


def args(data: dict | None = None, *, model: ModelInfo | None = None, tokenizer_eos=(2,), on_gpu=False):
    cfg = config_from_dict(data or {})
    r = resolve(cfg, model or model_info(), list(tokenizer_eos), on_gpu)
    return cfg, r, to_vllm(cfg, r), to_hf(cfg, r)


# Every key set to a value that makes its mapping show (max_model_len unset is not passed, ...).
EVERYTHING = {"max_model_len": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
              "vllm": {"max_num_seqs": 4, "batch_invariant": True}, "hf": {"attn_implementation": "sdpa"}}

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
    "stop_token_ids": ({"SamplingParams.stop_token_ids"}, {"generate.eos_token_id"}),
    "ignore_eos": ({"SamplingParams.ignore_eos"}, {"generate.eos_token_id"}),
    "dtype": ({"LLM.dtype"}, {"from_pretrained.dtype"}),
    "max_model_len": ({"LLM.max_model_len"}, set()),
    "rope_scaling": ({"LLM.hf_overrides"}, {"config.rope_parameters"}),
    "logprobs": ({"SamplingParams.logprobs"}, {"generate.output_logits"}),
    "chat": ({"runtime.prompt_token_ids"}, {"runtime.input_ids"}),
    "batch_size": ({"runtime.requests added per engine step loop"},
                   {"runtime.rows per generate call (left padded)"}),
    "cross_score": (set(), set()),
    "eos_token_ids": ({"SamplingParams.stop_token_ids"}, {"generate.eos_token_id"}),
    "vllm.gpu_memory_utilization": ({"LLM.gpu_memory_utilization"}, set()),
    "vllm.enforce_eager": ({"LLM.enforce_eager"}, set()),
    "vllm.enable_prefix_caching": ({"LLM.enable_prefix_caching"}, set()),
    "vllm.enable_chunked_prefill": ({"LLM.enable_chunked_prefill"}, set()),
    "vllm.tensor_parallel_size": ({"LLM.tensor_parallel_size"}, set()),
    "vllm.logprobs_mode": ({"LLM.logprobs_mode"}, {"generate.output_logits"}),
    "vllm.generation_config": ({"LLM.generation_config"}, {"runtime.model.generation_config"}),
    "vllm.kv_cache_gib": ({"LLM.kv_cache_memory_bytes"}, set()),
    "vllm.max_num_seqs": ({"LLM.max_num_seqs"}, set()),
    "vllm.batch_invariant": ({"env.VLLM_BATCH_INVARIANT"}, set()),
    "hf.attn_implementation": (set(), {"from_pretrained.attn_implementation"}),
    "hf.device_map": (set(), {"runtime.model.to"}),
}


def _native(key: str) -> tuple[set[str], set[str]]:
    v_names: set[str] = set()
    h_names: set[str] = set()
    for on_gpu in (False, True):
        _, _, v, h = args(EVERYTHING, on_gpu=on_gpu)
        v_names |= {f"{a.where}.{a.name}" for a in v.used.get(key, [])}
        h_names |= {f"{a.where}.{a.name}" for a in h.used.get(key, [])}
    return v_names, h_names


# --- the table ------------------------------------------------------------------------------


def test_table_covers_every_canonical_key():
    assert set(TABLE) == set(canonical_keys()) | RESOLVED_ROWS


@pytest.mark.parametrize("key", canonical_keys())
def test_every_canonical_key_has_a_note_and_a_row(key):
    assert NOTES.get(key, "").strip(), f"{key} has no NOTE in parity_ui/mapping.py"
    _, r, _, _ = args(EVERYTHING)
    rows = {row.key: row for row in mapping_table(config_from_dict(EVERYTHING), r)}
    assert key in rows, f"{key} has no mapping_table row"


def test_notes_hold_no_stale_keys():
    assert set(NOTES) <= set(canonical_keys()) | RESOLVED_ROWS


@pytest.mark.parametrize("key", sorted(TABLE))
def test_native_arguments_per_key(key):
    assert _native(key) == TABLE[key]
    if key not in PARITY_ONLY:
        assert TABLE[key] != (set(), set()), f"{key} reaches neither engine"


def test_mapping_table_rows_show_the_values():
    cfg, r, _, _ = args({"temperature": 0.0, "stop_token_ids": [9]}, tokenizer_eos=[2, 7])
    rows = {row.key: row for row in mapping_table(cfg, r)}
    assert rows["eos_token_ids"].value == [2, 7]
    assert rows["stop_token_ids"].value == [9]
    assert "SamplingParams.max_tokens=64" in rows["max_new_tokens"].vllm
    assert "generate.do_sample=False" in rows["temperature"].hf
    assert rows["hf.attn_implementation"].vllm == "(not used)"


# --- semantic rules -------------------------------------------------------------------------


def test_greedy():
    _, _, v, h = args({"temperature": 0.0, "top_p": 0.9, "top_k": 5, "min_p": 0.1})
    assert v.sampling["temperature"] == 0.0
    assert h.generate["do_sample"] is False
    for name in ("temperature", "top_p", "top_k", "min_p"):
        assert name in h.generate and h.generate[name] is None, name  # HF rejects temperature=0


def test_sampling_passes_every_knob():
    _, _, v, h = args({"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7})
    assert (v.sampling["temperature"], v.sampling["top_p"], v.sampling["top_k"], v.sampling["min_p"]) \
        == (0.7, 0.9, 40, 0.05)
    assert h.generate["do_sample"] is True
    assert (h.generate["temperature"], h.generate["top_p"], h.generate["top_k"], h.generate["min_p"]) \
        == (0.7, 0.9, 40, 0.05)
    assert v.sampling["seed"] == 7 and h.seed == 7


def test_sampling_top_k_off_is_explicit_zero_for_hf():
    _, _, v, h = args({"temperature": 0.7, "top_k": 0})
    assert v.sampling["top_k"] == 0
    # HF's GenerationConfig default is top_k=50: None would silently turn top-k ON.
    assert h.generate["top_k"] == 0 and h.generate["top_k"] is not None


def test_eos_same_explicit_list_for_both():
    model = model_info(eos_token_ids=[2, 5])
    _, r, v, h = args({"stop_token_ids": [9]}, model=model, tokenizer_eos=[5, 7, 2])
    assert r.eos_token_ids == [2, 5, 7]  # generation_config first, tokenizer after, no duplicates
    assert v.sampling["stop_token_ids"] == [2, 5, 7, 9]
    assert h.generate["eos_token_id"] == [2, 5, 7, 9]
    assert v.sampling["ignore_eos"] is False


def test_ignore_eos():
    model = model_info(eos_token_ids=[2, 5])
    _, _, v, h = args({"ignore_eos": True, "stop_token_ids": [9]}, model=model, tokenizer_eos=[7])
    assert v.sampling["ignore_eos"] is True
    assert v.sampling["stop_token_ids"] == [9]
    assert h.generate["eos_token_id"] == [9]
    assert h.generate["min_new_tokens"] is None  # never used: it masks EOS, changing the distribution


def test_ignore_eos_without_stop_ids_leaves_hf_no_eos():
    _, _, v, h = args({"ignore_eos": True}, tokenizer_eos=[2])
    assert v.sampling["stop_token_ids"] == []
    assert h.generate["eos_token_id"] is None
    assert h.generate["min_new_tokens"] is None


def test_model_generation_config_ignored_by_default():
    _, _, v, h = args()
    assert v.llm["generation_config"] == "vllm"
    assert h.keep_model_generation_config is False


def test_model_generation_config_auto_applies_to_both():
    _, _, v, h = args({"vllm": {"generation_config": "auto"}})
    assert v.llm["generation_config"] == "auto"
    assert h.keep_model_generation_config is True


@pytest.mark.parametrize("config_dtype, expected", [
    ("bfloat16", "bfloat16"), ("torch.float16", "float16"), ("float32", "float32"), ("", "float32"),
    ("float64", "float32"),
])
def test_dtype_auto_resolves_from_model_config(config_dtype, expected):
    _, r, v, h = args(model=model_info(config_dtype=config_dtype), on_gpu=True)
    assert r.dtype == expected
    assert v.llm["dtype"] == expected and h.load["dtype"] == expected


def test_explicit_dtype_wins_over_model_config():
    _, r, v, h = args({"dtype": "float16"}, model=model_info(config_dtype="bfloat16"))
    assert v.llm["dtype"] == h.load["dtype"] == "float16"


def test_rope_scaling_same_merged_dict_for_both():
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
    _, _, v_proc, h_proc = args({"vllm": {"logprobs_mode": "processed_logprobs"}})
    assert (v_raw.llm["logprobs_mode"], h_raw.logprobs_source) == ("raw_logprobs", "logits")
    assert (v_proc.llm["logprobs_mode"], h_proc.logprobs_source) == ("processed_logprobs", "scores")


def test_logprobs_zero_still_asks_for_the_chosen_token():
    _, _, v, _ = args({"logprobs": 0})
    assert v.sampling["logprobs"] == 1 and v.llm["max_logprobs"] == 1


def test_cpu_defaults():
    _, _, v, h = args({"vllm": {"kv_cache_gib": 2.0}}, on_gpu=False)
    assert v.llm["kv_cache_memory_bytes"] == 2 * 2**30
    assert "gpu_memory_utilization" not in v.llm
    assert v.llm["enforce_eager"] is True
    assert h.device == "cpu"


def test_gpu_defaults():
    _, _, v, h = args(on_gpu=True)
    assert v.llm["gpu_memory_utilization"] == 0.5
    assert "kv_cache_memory_bytes" not in v.llm
    assert v.llm["enforce_eager"] is False
    assert h.device == "cuda"


@pytest.mark.parametrize("on_gpu", [False, True])
def test_explicit_enforce_eager_wins(on_gpu):
    for eager in (True, False):
        _, _, v, _ = args({"vllm": {"enforce_eager": eager}}, on_gpu=on_gpu)
        assert v.llm["enforce_eager"] is eager


def test_batch_invariant_is_an_env_var():
    _, _, off, _ = args()
    _, _, on, _ = args({"vllm": {"batch_invariant": True}})
    assert off.env == {} and on.env == {"VLLM_BATCH_INVARIANT": "1"}


def test_pad_falls_back_to_first_eos():
    _, _, _, h = args(model=model_info(pad_token_id=None, eos_token_ids=[4]), tokenizer_eos=[])
    assert h.generate["pad_token_id"] == 4


# --- format_table ---------------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    return re.split(r"(?<!\\)\|", line.strip())[1:-1]


def test_format_table_is_markdown_with_one_row_per_note():
    cfg, r, _, _ = args(EVERYTHING)
    lines = format_table(mapping_table(cfg, r)).splitlines()
    assert _cells(lines[0])[0].strip() == "canonical key"
    assert set(lines[1].replace("|", "")) == {"-"}
    body = lines[2:]
    assert [_cells(line)[0].strip() for line in body] == list(NOTES)
    assert all(len(_cells(line)) == 5 for line in lines), "a cell's '|' was not escaped"


def test_format_table_escapes_pipes():
    row = mapping.MappingRow(key="k", value="a|b", vllm="x|y", hf="", note="n")
    line = format_table([row]).splitlines()[2]
    assert "a\\|b" in line and len(_cells(line)) == 5
