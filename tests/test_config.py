"""The canonical config: defaults, YAML/JSON parsing, precedence, and strict validation.

Every rejection must be a ConfigError whose `key` names the offending key and whose message says
what is allowed, because that message is all a user sees in the CLI and the app.
"""
from __future__ import annotations

import pytest

from parity_ui.config import (
    MAX_LOGPROBS,
    PRESETS,
    ROPE_TYPES,
    ParityConfig,
    build_config,
    config_from_dict,
    load_config_file,
    parse_config_text,
)
from parity_ui.errors import ConfigError


def reject(data: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    return info.value


# --- defaults -------------------------------------------------------------------------------


def test_empty_config_is_the_defaults():
    cfg = config_from_dict({})
    assert cfg == ParityConfig()
    assert config_from_dict(None) == ParityConfig()


def test_defaults_favour_parity():
    cfg = ParityConfig()
    assert cfg.greedy and cfg.temperature == 0.0
    assert (cfg.top_p, cfg.top_k, cfg.min_p, cfg.repetition_penalty) == (1.0, 0, 0.0, 1.0)
    assert cfg.dtype == "auto" and cfg.ignore_eos is False and cfg.stop_token_ids == []
    assert cfg.vllm.enable_prefix_caching is False and cfg.vllm.enable_chunked_prefill is False
    assert cfg.vllm.enforce_eager is None  # decided per device by the mapping
    assert cfg.vllm.generation_config == "vllm" and cfg.vllm.logprobs_mode == "raw_logprobs"
    assert cfg.hf.attn_implementation == "auto" and cfg.hf.device_map == "auto"


def test_to_yaml_round_trips():
    cfg = config_from_dict({"temperature": 0.7, "stop_token_ids": [3], "vllm": {"enforce_eager": True}})
    assert config_from_dict(parse_config_text(cfg.to_yaml())) == cfg


# --- parsing --------------------------------------------------------------------------------


def test_parse_yaml_with_sections():
    data = parse_config_text("max_new_tokens: 8\ntemperature: 0.5\nvllm:\n  enforce_eager: true\n")
    assert data == {"max_new_tokens": 8, "temperature": 0.5, "vllm": {"enforce_eager": True}}


def test_parse_json():
    data = parse_config_text('{"max_new_tokens": 8, "hf": {"device_map": "cpu"}}')
    assert data == {"max_new_tokens": 8, "hf": {"device_map": "cpu"}}


@pytest.mark.parametrize("text", ["", "   \n", "# only a comment\n"])
def test_parse_empty_text_is_empty_config(text):
    assert parse_config_text(text) == {}


def test_parse_syntax_error_names_the_source():
    with pytest.raises(ConfigError) as info:
        parse_config_text("max_new_tokens: [1, 2\n", source="my.yaml")
    assert info.value.key == "my.yaml"
    assert "not valid YAML/JSON" in str(info.value)


@pytest.mark.parametrize("text", ["- 1\n- 2\n", "42", '"just a string"'])
def test_parse_non_mapping_is_rejected(text):
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_config_text(text)


def test_load_config_file_yaml_and_json(tmp_path):
    (tmp_path / "c.yaml").write_text("top_k: 5\n", encoding="utf-8")
    (tmp_path / "c.json").write_text('{"top_k": 6}', encoding="utf-8")
    assert load_config_file(tmp_path / "c.yaml") == {"top_k": 5}
    assert load_config_file(str(tmp_path / "c.json")) == {"top_k": 6}


def test_load_config_file_missing(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert info.value.key == str(path)
    assert "file not found" in str(info.value) and "--config" in str(info.value)


def test_load_config_file_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("seed: 1  # café\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert info.value.key == str(path)
    assert "not UTF-8" in str(info.value)


# --- precedence: defaults < base (preset) < file < --set ------------------------------------


def test_build_config_precedence(tmp_path):
    base = {"max_new_tokens": 10, "top_k": 3, "seed": 1, "vllm": {"max_num_seqs": 8}}
    path = tmp_path / "c.yaml"
    path.write_text("max_new_tokens: 20\nseed: 2\nvllm:\n  tensor_parallel_size: 2\n", encoding="utf-8")
    cfg = build_config(path, ["seed=3", "vllm.enforce_eager=true"], base=base)
    assert cfg.top_k == 3  # only the base sets it
    assert cfg.max_new_tokens == 20  # the file beats the base
    assert cfg.seed == 3  # --set beats the file
    # Sections merge key by key rather than replacing each other.
    assert cfg.vllm.max_num_seqs == 8
    assert cfg.vllm.tensor_parallel_size == 2
    assert cfg.vllm.enforce_eager is True
    assert cfg.min_p == 0.0  # untouched keys keep the default


def test_build_config_does_not_mutate_base():
    base = {"vllm": {"max_num_seqs": 8}}
    build_config(None, ["vllm.max_num_seqs=16"], base=base)
    assert base == {"vllm": {"max_num_seqs": 8}}


def test_set_values_are_parsed_as_yaml_scalars():
    cfg = build_config(None, ["temperature=0.7", "stop_token_ids=[5, 6]", "hf.device_map=cpu",
                              "max_model_len=null", "ignore_eos=false"])
    assert cfg.temperature == 0.7 and cfg.stop_token_ids == [5, 6]
    assert cfg.hf.device_map == "cpu" and cfg.max_model_len is None and cfg.ignore_eos is False


def test_set_without_equals_is_rejected():
    with pytest.raises(ConfigError) as info:
        build_config(None, ["temperature"])
    assert info.value.key == "temperature" and "key=value" in str(info.value)


def test_set_into_a_scalar_is_rejected():
    with pytest.raises(ConfigError) as info:
        build_config(None, ["temperature.x=1"], base={"temperature": 0.5})
    assert info.value.key == "temperature.x" and "not a section" in str(info.value)
    with pytest.raises(ConfigError) as info:  # no value to descend into: the dict fails the type check
        build_config(None, ["temperature.x=1"])
    assert info.value.key == "temperature" and "must be a number" in str(info.value)


def test_set_wrong_type_is_rejected_like_a_file():
    with pytest.raises(ConfigError) as info:
        build_config(None, ["max_new_tokens=ten"])
    assert info.value.key == "max_new_tokens"


# --- rejections: each names the key and what is allowed -------------------------------------


@pytest.mark.parametrize("data, key, allowed", [
    ({"top_p": 1.5}, "top_p", "(0, 1]"),
    ({"top_p": 0}, "top_p", "(0, 1]"),
    ({"max_new_tokens": 0}, "max_new_tokens", "from 1 to 131072"),
    ({"temperature": -1}, "temperature", "from 0 (greedy) to 10"),
    ({"logprobs": MAX_LOGPROBS + 1}, "logprobs", f"from 0 to {MAX_LOGPROBS}"),
    ({"top_k": -1}, "top_k", ">= 0"),
    ({"min_p": 1.5}, "min_p", "[0, 1]"),
    ({"dtype": "float8"}, "dtype", "auto, float32, bfloat16, float16"),
    ({"stop_token_ids": [1, -2]}, "stop_token_ids", "token ids >= 0"),
    ({"max_model_len": 8}, "max_model_len", ">= 16"),
    ({"vllm": {"gpu_memory_utilization": 1.0}}, "vllm.gpu_memory_utilization", "0.05 to 0.98"),
    ({"vllm": {"logprobs_mode": "raw_logits"}}, "vllm.logprobs_mode", "raw_logprobs, processed_logprobs"),
    ({"vllm": {"generation_config": "model"}}, "vllm.generation_config", "'vllm'"),
    ({"hf": {"attn_implementation": "fast"}}, "hf.attn_implementation", "sdpa"),
    ({"hf": {"device_map": "tpu"}}, "hf.device_map", "'cuda[:N]'"),
])
def test_out_of_range_names_key_and_range(data, key, allowed):
    err = reject(data)
    assert err.key == key
    assert f"'{key}'" in str(err)
    assert allowed in str(err)


@pytest.mark.parametrize("data, key", [
    ({"max_tokens": 5}, "max_tokens"),
    ({"vllm": {"gpu_mem": 0.5}}, "vllm.gpu_mem"),
    ({"hf": {"do_sample": False}}, "hf.do_sample"),
])
def test_unknown_key_names_key_and_the_known_ones(data, key):
    err = reject(data)
    assert err.key == key
    assert "not a known key" in str(err)
    section = key.split(".")[0] if "." in key else None
    known = {"vllm": "enforce_eager", "hf": "attn_implementation", None: "max_new_tokens"}[section]
    assert known in err.fix


def test_unknown_top_level_key_does_not_list_section_keys():
    err = reject({"bogus": 1})
    assert "max_new_tokens" in err.fix and "enforce_eager" not in err.fix


@pytest.mark.parametrize("data, key, expected", [
    ({"max_new_tokens": "64"}, "max_new_tokens", "must be an integer"),
    ({"max_new_tokens": True}, "max_new_tokens", "must be an integer"),
    ({"max_new_tokens": 1.5}, "max_new_tokens", "must be an integer"),
    ({"ignore_eos": 1.0}, "ignore_eos", "must be true or false"),
    ({"ignore_eos": "yes please"}, "ignore_eos", "must be true or false"),
    ({"temperature": "hot"}, "temperature", "must be a number"),
    ({"temperature": True}, "temperature", "must be a number"),
    ({"temperature": float("nan")}, "temperature", "must be a number"),
    ({"dtype": 16}, "dtype", "must be a string"),
    ({"stop_token_ids": 7}, "stop_token_ids", "must be a list"),
    ({"stop_token_ids": [1, "x"]}, "stop_token_ids[1]", "must be an integer"),
    ({"rope_scaling": "linear"}, "rope_scaling", "must be a mapping"),
    ({"seed": None}, "seed", "must not be null"),
    ({"vllm": {"enforce_eager": "true"}}, "vllm.enforce_eager", "must be true or false"),
    ({"vllm": {"tensor_parallel_size": 1.5}}, "vllm.tensor_parallel_size", "must be an integer"),
    ({"vllm": 3}, "vllm", "must be a mapping"),
])
def test_wrong_type_names_key_and_type(data, key, expected):
    err = reject(data)
    assert err.key == key
    assert f"'{key}'" in str(err) and expected in str(err)


def test_lossless_coercions_are_accepted():
    cfg = config_from_dict({"max_new_tokens": 8.0, "temperature": 1, "vllm": {"enforce_eager": None}})
    assert cfg.max_new_tokens == 8 and isinstance(cfg.max_new_tokens, int)
    assert cfg.temperature == 1.0 and isinstance(cfg.temperature, float)
    assert cfg.vllm.enforce_eager is None


def test_empty_section_is_the_section_defaults():
    cfg = config_from_dict(parse_config_text("vllm:\nhf: {}\n"))
    assert cfg.vllm == ParityConfig().vllm and cfg.hf == ParityConfig().hf


# --- rope_scaling ---------------------------------------------------------------------------


def test_rope_scaling_accepted():
    cfg = config_from_dict({"rope_scaling": {"rope_type": "yarn", "factor": 4,
                                             "original_max_position_embeddings": 4096}})
    assert cfg.rope_scaling == {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096}


def test_rope_scaling_type_spelling_is_normalised():
    cfg = config_from_dict({"rope_scaling": {"type": "linear", "factor": 2.0}})
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_rope_scaling_unknown_type():
    err = reject({"rope_scaling": {"rope_type": "wobbly", "factor": 2.0}})
    assert err.key == "rope_scaling.rope_type"
    assert "'wobbly'" in str(err) and all(t in str(err) for t in ROPE_TYPES)


def test_rope_scaling_missing_type():
    assert reject({"rope_scaling": {"factor": 2.0}}).key == "rope_scaling.rope_type"


@pytest.mark.parametrize("factor", [0.5, 200, "2", True, None])
def test_rope_scaling_bad_factor(factor):
    rope = {"rope_type": "linear"} if factor is None else {"rope_type": "linear", "factor": factor}
    err = reject({"rope_scaling": rope})
    assert err.key == "rope_scaling.factor"
    assert "from 1 to 128" in str(err)


# --- presets --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_validate(name):
    cfg = build_config(base=PRESETS[name])
    for key, value in PRESETS[name].items():
        if isinstance(value, dict) and key in ("vllm", "hf"):
            for sub, v in value.items():
                assert getattr(getattr(cfg, key), sub) == v
        else:
            assert getattr(cfg, key) == value


def test_presets_are_not_mutated_by_building():
    before = repr(PRESETS)
    build_config(None, ["vllm.enforce_eager=false", "rope_scaling={type: linear, factor: 3}"],
                 base=PRESETS["long-context-9k"])
    assert repr(PRESETS) == before


def test_set_into_an_empty_section_from_the_file(tmp_path):
    # `vllm:` with nothing under it parses to None; a later --set vllm.x must still land in it.
    path = tmp_path / "c.yaml"
    path.write_text("vllm:\n", encoding="utf-8")
    cfg = build_config(path, ["vllm.enforce_eager=true"])
    assert cfg.vllm.enforce_eager is True
