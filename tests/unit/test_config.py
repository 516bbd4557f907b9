"""The canonical config: defaults, YAML/JSON parsing, precedence, strict validation, and the sides.

Every rejection must be a ConfigError whose `key` names the offending key (for a side's option,
`SIDE.option`, and a SideError that names the side) and whose message says what is allowed,
because that message is all a user sees in the CLI and the app.
"""
from __future__ import annotations

import dataclasses

import pytest

from parity_ui.core.config import (
    MAX_LOGPROBS,
    PRESET_LABELS,
    PRESETS,
    ROPE_TYPES,
    SIDE_PRESET_LABELS,
    SIDE_PRESETS,
    TOP_KEYS,
    ParityConfig,
    build_config,
    config_from_dict,
    load_config_file,
    parse_config_text,
)
from parity_ui.core.errors import ConfigError, SideError
from parity_ui.core.kinds import KINDS, HfOptions, SideOptions, VllmOptions
from parity_ui.core.sides import DEFAULT_SIDES, MAX_SIDES, SideSpec, parse_side_arg


def reject(data: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    return info.value


def two(*extra: dict) -> dict:
    """A sides config: ref (hf) and b (vllm), then `extra` sides."""
    return {"sides": [{"name": "ref", "kind": "hf"}, {"name": "b", "kind": "vllm"}, *extra]}


def option_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


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
    # Moved up from the old vllm: section: the model's generation_config.json is applied by no side.
    assert cfg.generation_config == "neutral" and cfg.logprobs_mode == "raw_logprobs"
    vllm = cfg.side("vllm").options
    assert isinstance(vllm, VllmOptions)
    assert vllm.enable_prefix_caching is False and vllm.enable_chunked_prefill is False
    assert vllm.enforce_eager is None  # decided per device by the mapping
    assert vllm.gpu_memory_utilization is None  # planned from the run's sides
    assert vllm.batch_invariant is False and vllm.fp32_logits is False
    hf = cfg.side("hf").options
    assert isinstance(hf, HfOptions)
    assert hf.attn_implementation == "auto" and hf.device == "auto" and hf.decode == "eager"
    assert hf.dtype is None and vllm.dtype is None  # unset: the run's dtype


def test_default_sides_are_hf_reference_against_vllm():
    cfg = ParityConfig()
    assert [(s.name, s.kind) for s in cfg.sides] == [("hf", "hf"), ("vllm", "vllm")]
    assert cfg.reference.name == "hf"  # the first side is the reference
    assert [s.to_dict() for s in cfg.sides] == [dict(s) for s in DEFAULT_SIDES]


def test_to_yaml_round_trips():
    cfg = config_from_dict({"temperature": 0.7, "stop_token_ids": [3], "vllm": {"enforce_eager": True}})
    assert cfg.side("vllm").options.enforce_eager is True
    assert config_from_dict(parse_config_text(cfg.to_yaml())) == cfg


def test_to_yaml_round_trips_sides_with_options_model_and_python():
    cfg = config_from_dict({**two({"name": "c", "kind": "vllm", "batch_invariant": True, "model": "/m/other",
                                   "python": "/envs/old/bin/python"}),
                            "b": {"enforce_eager": False, "dtype": "bfloat16"}})
    again = config_from_dict(parse_config_text(cfg.to_yaml()))
    assert again == cfg
    assert again.side("c").model == "/m/other" and again.side("c").python == "/envs/old/bin/python"


def test_to_dict_writes_only_what_a_side_changed():
    cfg = config_from_dict(two({"name": "c", "kind": "vllm", "enforce_eager": True, "max_num_seqs": 4}))
    sides = cfg.to_dict()["sides"]
    assert sides == [{"name": "ref", "kind": "hf"}, {"name": "b", "kind": "vllm"},
                     {"name": "c", "kind": "vllm", "enforce_eager": True, "max_num_seqs": 4}]
    assert cfg.side("c").describe() == "c (vllm, enforce_eager=True, max_num_seqs=4)"
    assert cfg.side("b").describe() == "b (vllm)"


# --- parsing --------------------------------------------------------------------------------


def test_parse_yaml_with_sections():
    data = parse_config_text("max_new_tokens: 8\ntemperature: 0.5\nvllm:\n  enforce_eager: true\n")
    assert data == {"max_new_tokens": 8, "temperature": 0.5, "vllm": {"enforce_eager": True}}


def test_parse_json():
    data = parse_config_text('{"max_new_tokens": 8, "hf": {"device": "cpu"}}')
    assert data == {"max_new_tokens": 8, "hf": {"device": "cpu"}}
    assert config_from_dict(data).side("hf").options.device == "cpu"


def test_parse_yaml_sides_list():
    text = ("dtype: bfloat16\n"
            "sides:\n"
            "  - {name: ref, kind: hf, dtype: float32, attn_implementation: eager}\n"
            "  - name: b\n"
            "    kind: vllm\n"
            "    enforce_eager: false\n"
            "    device: cuda:1\n")
    cfg = config_from_dict(parse_config_text(text))
    assert [s.name for s in cfg.sides] == ["ref", "b"] and cfg.reference.name == "ref"
    ref, b = cfg.side("ref"), cfg.side("b")
    assert (ref.kind, ref.options.dtype, ref.options.attn_implementation) == ("hf", "float32", "eager")
    assert (b.kind, b.options.dtype, b.options.enforce_eager, b.options.device) == ("vllm", None, False, "cuda:1")
    assert cfg.dtype == "bfloat16"  # shared; b has no dtype of its own and so runs in it


def test_parse_json_sides_list():
    cfg = config_from_dict(parse_config_text(
        '{"sides": [{"name": "a", "kind": "vllm"}, {"name": "inv", "kind": "vllm", "batch_invariant": true}]}'))
    assert [(s.name, s.kind) for s in cfg.sides] == [("a", "vllm"), ("inv", "vllm")]
    assert cfg.side("inv").options.batch_invariant is True and cfg.side("a").options.batch_invariant is False


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


# --- precedence: defaults < base (preset) < file < --side < --set ---------------------------


def test_build_config_precedence(tmp_path):
    base = {"max_new_tokens": 10, "top_k": 3, "seed": 1, "vllm": {"max_num_seqs": 8}}
    path = tmp_path / "c.yaml"
    path.write_text("max_new_tokens: 20\nseed: 2\nvllm:\n  tensor_parallel_size: 2\n", encoding="utf-8")
    cfg = build_config(path, ["seed=3", "vllm.enforce_eager=true"], base=base)
    assert cfg.top_k == 3  # only the base sets it
    assert cfg.max_new_tokens == 20  # the file beats the base
    assert cfg.seed == 3  # --set beats the file
    # A side's section merges key by key rather than replacing the other layers' keys.
    vllm = cfg.side("vllm").options
    assert vllm.max_num_seqs == 8
    assert vllm.tensor_parallel_size == 2
    assert vllm.enforce_eager is True
    assert cfg.min_p == 0.0  # untouched keys keep the default


def test_side_args_replace_the_files_sides_and_set_beats_them(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("sides:\n  - {name: x, kind: hf}\n  - {name: y, kind: hf}\n", encoding="utf-8")
    cfg = build_config(path, ["b.enforce_eager=true"], base={"sides": [{"name": "p", "kind": "vllm"}]},
                       sides=["ref=hf,dtype=float32", "b=vllm,enforce_eager=false,max_num_seqs=2"])
    assert [s.name for s in cfg.sides] == ["ref", "b"]  # --side replaces the base's and the file's, in order
    assert cfg.side("ref").options.dtype == "float32"
    assert cfg.side("b").options.enforce_eager is True  # --set beats --side
    assert cfg.side("b").options.max_num_seqs == 2  # the rest of the --side stays


def test_build_config_does_not_mutate_base():
    base = {"vllm": {"max_num_seqs": 8}, "sides": [{"name": "hf", "kind": "hf"}, {"name": "vllm", "kind": "vllm"}]}
    build_config(None, ["vllm.max_num_seqs=16"], base=base)
    assert base == {"vllm": {"max_num_seqs": 8},
                    "sides": [{"name": "hf", "kind": "hf"}, {"name": "vllm", "kind": "vllm"}]}


def test_set_values_are_parsed_as_yaml_scalars():
    cfg = build_config(None, ["temperature=0.7", "stop_token_ids=[5, 6]", "hf.device=cpu",
                              "max_model_len=null", "ignore_eos=false", "vllm.gpu_memory_utilization=0.3"])
    assert cfg.temperature == 0.7 and cfg.stop_token_ids == [5, 6]
    assert cfg.side("hf").options.device == "cpu" and cfg.max_model_len is None and cfg.ignore_eos is False
    assert cfg.side("vllm").options.gpu_memory_utilization == 0.3


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
    with pytest.raises(SideError) as info:
        build_config(None, ["vllm.max_num_seqs=many"])
    assert info.value.key == "vllm.max_num_seqs" and info.value.side == "vllm"


def test_set_addresses_a_side_by_its_name():
    cfg = build_config(None, ["b.enforce_eager=false", "ref.attn_implementation=sdpa"], base=two())
    assert cfg.side("b").options.enforce_eager is False
    assert cfg.side("ref").options.attn_implementation == "sdpa"


def test_set_for_a_side_that_does_not_exist_names_the_sides():
    with pytest.raises(ConfigError) as info:
        build_config(None, ["c.enforce_eager=true"], base=two())
    err = info.value
    assert err.key == "c"
    assert "no side is named 'c'" in err.message and "sides: ref, b" in err.message
    assert "--side NAME=KIND" in err.fix


def test_legacy_vllm_section_needs_a_side_named_vllm():
    # Sides named otherwise: the old engine-named section addresses no side, and says so.
    err = reject({**two(), "vllm": {"enforce_eager": True}})
    assert err.key == "vllm" and "no side is named 'vllm'" in err.message


def test_set_into_an_empty_section_from_the_file(tmp_path):
    # `vllm:` with nothing under it parses to None; a later --set vllm.x must still land in it.
    path = tmp_path / "c.yaml"
    path.write_text("vllm:\n", encoding="utf-8")
    cfg = build_config(path, ["vllm.enforce_eager=true"])
    assert cfg.side("vllm").options.enforce_eager is True


# --- legacy keys: moved up from the vllm: section, or renamed --------------------------------


@pytest.mark.parametrize("section, top", [
    ({"generation_config": "vllm"}, {"generation_config": "neutral"}),
    ({"generation_config": "auto"}, {"generation_config": "model"}),
    ({"logprobs_mode": "processed_logprobs"}, {"logprobs_mode": "processed_logprobs"}),
])
def test_legacy_vllm_section_keys_move_up(section, top):
    cfg = config_from_dict({"vllm": section})
    for key, value in top.items():
        assert getattr(cfg, key) == value
    assert cfg.side("vllm").options == VllmOptions()  # not a side option any more


def test_legacy_set_of_a_moved_key_moves_up_too():
    cfg = build_config(None, ["vllm.generation_config=auto", "vllm.logprobs_mode=processed_logprobs"])
    assert (cfg.generation_config, cfg.logprobs_mode) == ("model", "processed_logprobs")


def test_legacy_set_of_a_moved_key_beats_the_file(tmp_path):
    path = tmp_path / "saved.yaml"
    path.write_text(config_from_dict({}).to_yaml(), encoding="utf-8")  # holds generation_config: neutral
    try:
        cfg = build_config(path, ["vllm.generation_config=auto"])
    except ConfigError as e:  # refusing the old spelling, naming the key, would do too
        assert "generation_config" in e.key
        return
    assert cfg.generation_config == "model"  # --set beats the file


def test_legacy_device_map_is_the_device_option():
    cfg = config_from_dict({"hf": {"device_map": "cpu"}})
    assert cfg.side("hf").options.device == "cpu"
    err = reject({"hf": {"device_map": "tpu"}})
    assert err.key == "hf.device" and "'cuda:N'" in str(err)


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
    ({"batch_size": 0}, "batch_size", "from 1 to 1024"),
    ({"logprobs_mode": "raw_logits"}, "logprobs_mode", "raw_logprobs, processed_logprobs"),
    ({"vllm": {"logprobs_mode": "raw_logits"}}, "logprobs_mode", "raw_logprobs, processed_logprobs"),
    ({"generation_config": "vllm"}, "generation_config", "neutral, model"),
])
def test_out_of_range_names_key_and_range(data, key, allowed):
    err = reject(data)
    assert err.key == key
    assert f"'{key}'" in str(err)
    assert allowed in str(err)


@pytest.mark.parametrize("data, side, option, allowed", [
    ({"vllm": {"gpu_memory_utilization": 1.0}}, "vllm", "gpu_memory_utilization", "0.05 to 0.98"),
    ({"vllm": {"kv_cache_gib": 0}}, "vllm", "kv_cache_gib", "0.0625 to 1024"),
    ({"vllm": {"max_num_seqs": 0}}, "vllm", "max_num_seqs", "from 1 to 4096"),
    ({"vllm": {"tensor_parallel_size": 0}}, "vllm", "tensor_parallel_size", "from 1 to 64"),
    ({"hf": {"attn_implementation": "fast"}}, "hf", "attn_implementation", "sdpa"),
    ({"hf": {"decode": "turbo"}}, "hf", "decode", "eager, static, compiled, graphed"),
    ({"hf": {"device": "tpu"}}, "hf", "device", "'cuda:N'"),
    ({"hf": {"dtype": "fp8"}}, "hf", "dtype", "auto, float32, bfloat16, float16"),
    ({"sides": [{"name": "ref", "kind": "hf"}, {"name": "b", "kind": "vllm", "device": "gpu0"}]},
     "b", "device", "'cuda:N,M'"),
])
def test_side_option_out_of_range_names_side_option_and_range(data, side, option, allowed):
    err = reject(data)
    assert isinstance(err, SideError) and err.side == side
    assert err.key == f"{side}.{option}"
    assert f"side '{side}'" in str(err) and f"'{option}'" in str(err)
    assert allowed in str(err)
    assert err.fix.startswith(f"set {side}.{option} ")  # the fix addresses the side, as --set does


@pytest.mark.parametrize("data, side, option, known", [
    ({"vllm": {"gpu_mem": 0.5}}, "vllm", "gpu_mem", "enforce_eager"),
    ({"hf": {"do_sample": False}}, "hf", "do_sample", "attn_implementation"),
    # An option of another kind: HF has no CUDA graphs to turn off.
    ({"sides": [{"name": "ref", "kind": "hf", "enforce_eager": True}, {"name": "b", "kind": "vllm"}]},
     "ref", "enforce_eager", "decode"),
])
def test_unknown_side_option_names_side_and_the_kinds_options(data, side, option, known):
    err = reject(data)
    assert isinstance(err, SideError) and err.side == side
    assert err.key == f"{side}.{option}"
    kind = "vllm" if known == "enforce_eager" else "hf"
    assert f"'{option}' is not an option of kind {kind}" in err.message
    assert err.fix.startswith(f"options of kind {kind}: ")
    listed = set(err.fix.split(": ", 1)[1].split(", "))
    options = VllmOptions if kind == "vllm" else HfOptions
    assert listed == option_names(options) | {"model", "python"}  # exactly what this kind accepts
    assert known in listed and option not in listed


def test_unknown_top_level_key_lists_the_known_keys_not_side_options():
    err = reject({"max_tokens": 5})
    assert err.key == "max_tokens" and "not a known key" in str(err)
    known = err.fix.split(";")[0]
    assert known.startswith("known keys: ")
    # Exactly the top-level keys: a side's options (enforce_eager, attn_implementation...) are not listed
    # as if they were, only where they go is said.
    assert set(known.removeprefix("known keys: ").split(", ")) == set(TOP_KEYS)
    assert "a side's options go under its name" in err.fix


def test_scalar_under_a_side_name_is_an_unknown_key_with_where_side_options_go():
    err = reject({"vllm": 3})
    assert err.key == "vllm" and "not a known key" in err.message
    assert "a side's options go under its name" in err.fix


@pytest.mark.parametrize("data, key, expected", [
    ({"max_new_tokens": "64"}, "max_new_tokens", "must be an integer"),
    ({"max_new_tokens": True}, "max_new_tokens", "must be an integer"),
    ({"max_new_tokens": 1.5}, "max_new_tokens", "must be an integer"),
    ({"ignore_eos": 1.0}, "ignore_eos", "must be true or false"),
    ({"ignore_eos": "yes please"}, "ignore_eos", "must be true or false"),
    ({"temperature": "hot"}, "temperature", "must be a number"),
    ({"temperature": True}, "temperature", "must be a number"),
    ({"temperature": float("nan")}, "temperature", "must be a number"),
    ({"dtype": True}, "dtype", "must be a string"),
    ({"dtype": [16]}, "dtype", "must be a string"),
    ({"dtype": 16}, "dtype", "is '16', must be one of"),  # a number is read as its text, then range-checked
    ({"stop_token_ids": 7}, "stop_token_ids", "must be a list"),
    ({"stop_token_ids": [1, "x"]}, "stop_token_ids[1]", "must be an integer"),
    ({"rope_scaling": "linear"}, "rope_scaling", "must be a mapping"),
    ({"seed": None}, "seed", "must not be null"),
])
def test_wrong_type_names_key_and_type(data, key, expected):
    err = reject(data)
    assert err.key == key
    assert f"'{key}'" in str(err) and expected in str(err)


@pytest.mark.parametrize("data, side, option, expected", [
    ({"vllm": {"enforce_eager": "true"}}, "vllm", "enforce_eager", "must be true or false"),
    ({"vllm": {"tensor_parallel_size": 1.5}}, "vllm", "tensor_parallel_size", "must be an integer"),
    ({"vllm": {"kv_cache_gib": "2G"}}, "vllm", "kv_cache_gib", "must be a number"),
    ({"hf": {"fp32_logits": "yes"}}, "hf", "fp32_logits", "must be true or false"),
    ({"hf": {"device": None}}, "hf", "device", "must not be null"),
])
def test_side_option_wrong_type_names_side_and_option(data, side, option, expected):
    err = reject(data)
    assert isinstance(err, SideError) and err.key == f"{side}.{option}"
    assert f"side '{side}': option '{option}'" in str(err) and expected in str(err)


def test_lossless_coercions_are_accepted():
    cfg = config_from_dict({"max_new_tokens": 8.0, "temperature": 1,
                            "vllm": {"enforce_eager": None, "kv_cache_gib": 2, "max_num_seqs": 4.0}})
    assert cfg.max_new_tokens == 8 and isinstance(cfg.max_new_tokens, int)
    assert cfg.temperature == 1.0 and isinstance(cfg.temperature, float)
    vllm = cfg.side("vllm").options
    assert vllm.enforce_eager is None
    assert vllm.kv_cache_gib == 2.0 and isinstance(vllm.kv_cache_gib, float)
    assert vllm.max_num_seqs == 4 and isinstance(vllm.max_num_seqs, int)


def test_empty_section_is_the_section_defaults():
    cfg = config_from_dict(parse_config_text("vllm:\nhf: {}\n"))
    assert cfg.side("vllm").options == VllmOptions() and cfg.side("hf").options == HfOptions()
    assert cfg == ParityConfig()


# --- sides: names, kinds, counts ----------------------------------------------------------------


def test_every_kind_accepts_a_bare_side():
    for kind in KINDS:
        extra = {"url": "http://127.0.0.1:8000/v1"} if kind == "openai" else {}
        cfg = config_from_dict({"sides": [{"name": "ref", "kind": "hf"}, {"name": "b", "kind": kind, **extra}]})
        assert cfg.side("b").kind == kind and isinstance(cfg.side("b").options, KINDS[kind].options)


def test_shared_options_are_every_worker_kinds_but_not_a_remote_servers():
    for name in ("vllm", "hf", "vllm-server"):
        assert option_names(SideOptions) <= option_names(KINDS[name].options), name
    err = reject({"sides": [{"name": "ref", "kind": "hf"},
                            {"name": "srv", "kind": "openai", "url": "http://h:1/v1", "dtype": "float32"}]})
    assert err.key == "srv.dtype" and "not an option of kind openai" in err.message


@pytest.mark.parametrize("side, key, words", [
    ({"name": "b", "kind": "tgi"}, "b.kind", "unknown kind 'tgi'; available: vllm, hf, vllm-server, openai"),
    ({"name": "b"}, "b.kind", "has no kind"),
    ({"name": "b", "kind": "hf", "model": 3}, "b.model", "model must be a path"),
    ({"name": "b", "kind": "hf", "python": "  "}, "b.python", "python must be a path"),
])
def test_a_bad_side_is_named_with_its_key(side, key, words):
    err = reject({"sides": [{"name": "ref", "kind": "hf"}, side]})
    assert isinstance(err, SideError) and err.side == "b" and err.key == key
    assert "side 'b'" in str(err) and words in err.message and err.fix


@pytest.mark.parametrize("name, words", [
    ("1a", "is not usable"), ("a b", "is not usable"), ("x" * 33, "is not usable"), (None, "is not usable"),
    ("seed", "is also a config key"), ("sides", "is also a config key"),
])
def test_side_names_must_be_usable_and_not_config_keys(name, words):
    err = reject({"sides": [{"name": "ref", "kind": "hf"}, {"name": name, "kind": "vllm"}]})
    assert err.key == "sides[1].name" and words in err.message and err.fix


def test_side_names_may_hold_dashes_and_underscores():
    cfg = config_from_dict({"sides": [{"name": "bf16-inv_2", "kind": "vllm"}, {"name": "x" * 32, "kind": "hf"}]})
    assert cfg.reference.name == "bf16-inv_2"


def test_two_sides_with_one_name_are_rejected():
    err = reject({"sides": [{"name": "a", "kind": "hf"}, {"name": "a", "kind": "vllm"}]})
    assert isinstance(err, SideError) and err.side == "a" and "two sides have this name" in err.message


@pytest.mark.parametrize("count, words", [(0, "has 0 side"), (1, "has 1 side"),
                                          (MAX_SIDES + 1, f"over the limit of {MAX_SIDES}")])
def test_side_counts(count, words):
    err = reject({"sides": [{"name": f"s{i}", "kind": "vllm"} for i in range(count)]})
    assert err.key == "sides" and words in err.message and err.fix


def test_the_most_sides_allowed():
    cfg = config_from_dict({"sides": [{"name": f"s{i}", "kind": "vllm"} for i in range(MAX_SIDES)]})
    assert len(cfg.sides) == MAX_SIDES and cfg.reference.name == "s0"


def test_sides_must_be_a_list():
    err = reject({"sides": "hf"})
    assert err.key == "sides" and "must be a list of sides" in err.message


@pytest.mark.parametrize("item", [3, "hf=vllm", ["b", "vllm"]])
def test_a_side_that_is_not_a_mapping_is_named(item):
    err = reject({"sides": [{"name": "ref", "kind": "hf"}, item]})
    assert err.key == "sides[1]" and "must be a mapping" in err.message


def test_config_side_lookup():
    cfg = config_from_dict(two())
    assert cfg.side("b") is cfg.sides[1] and cfg.reference is cfg.sides[0]
    with pytest.raises(ConfigError) as info:
        cfg.side("nope")
    assert info.value.key == "nope" and "sides: ref, b" in info.value.message


def test_with_sides_keeps_the_shared_options():
    cfg = config_from_dict({**two(), "seed": 7})
    swapped = cfg.with_sides(list(reversed(cfg.sides)))
    assert [s.name for s in swapped.sides] == ["b", "ref"] and swapped.seed == 7
    assert [s.name for s in cfg.sides] == ["ref", "b"]  # the original is untouched


def test_sidespec_replace_is_a_copy():
    side = config_from_dict({}).side("vllm")
    eager = side.replace(enforce_eager=True)
    assert eager.options.enforce_eager is True and side.options.enforce_eager is None
    assert isinstance(eager, SideSpec) and eager.name == side.name


# --- --side NAME=KIND[,key=value...] ----------------------------------------------------------


def test_side_arg_values_are_yaml_scalars():
    assert parse_side_arg("b=vllm,enforce_eager=false,gpu_memory_utilization=0.3,max_num_seqs=null,model=/x") == {
        "name": "b", "kind": "vllm", "enforce_eager": False, "gpu_memory_utilization": 0.3, "max_num_seqs": None,
        "model": "/x"}
    assert parse_side_arg(" ref = hf ") == {"name": "ref", "kind": "hf"}


@pytest.mark.parametrize("text, words", [("b", "NAME=KIND"), ("b=vllm,eager", "'eager' is not of the form key=value")])
def test_malformed_side_arg_names_the_flag(text, words):
    with pytest.raises(ConfigError) as info:
        parse_side_arg(text)
    assert info.value.key == f"--side {text}" and words in info.value.message and "--side" in info.value.fix


def test_side_args_validate_like_a_file():
    with pytest.raises(SideError) as info:
        build_config(sides=["ref=hf", "b=vllm,enforce_eagr=true"])
    assert info.value.key == "b.enforce_eagr" and "options of kind vllm" in info.value.fix
    with pytest.raises(ConfigError) as info:
        build_config(sides=["only=hf"])
    assert info.value.key == "sides" and "two or more" in info.value.message


def test_side_arg_with_a_multi_gpu_device():
    cfg = build_config(sides=["ref=hf,device=cuda:0,1", "b=vllm,tensor_parallel_size=2"])
    assert cfg.side("ref").options.device == "cuda:0,1"
    assert cfg.side("b").options.tensor_parallel_size == 2


def test_multi_gpu_device_through_set_and_yaml():
    cfg = build_config(None, ["hf.device=cuda:0,1"])
    assert cfg.side("hf").options.device == "cuda:0,1"
    cfg = config_from_dict(parse_config_text("hf: {device: 'cuda:2,3'}\n"))
    assert cfg.side("hf").options.device == "cuda:2,3"


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
        assert getattr(cfg, key) == value, key


def test_presets_are_not_mutated_by_building():
    before = repr(PRESETS)
    build_config(None, ["vllm.enforce_eager=false", "rope_scaling={type: linear, factor: 3}"],
                 base=PRESETS["long-context-9k"])
    assert repr(PRESETS) == before


def test_every_preset_has_a_label():
    assert set(PRESET_LABELS) == set(PRESETS) and all(PRESET_LABELS.values())
    assert set(SIDE_PRESET_LABELS) == set(SIDE_PRESETS) and all(SIDE_PRESET_LABELS.values())


@pytest.mark.parametrize("name", sorted(SIDE_PRESETS))
def test_side_presets_validate(name):
    preset = SIDE_PRESETS[name]
    cfg = build_config(base={"sides": preset})
    assert [(s.name, s.kind) for s in cfg.sides] == [(s["name"], s["kind"]) for s in preset]
    for spec, raw in zip(cfg.sides, preset):
        for key, value in raw.items():
            if key not in ("name", "kind"):
                assert getattr(spec.options, key) == value, (name, spec.name, key)
    # What the preset sets is what the side writes back.
    assert [s.to_dict() for s in cfg.sides] == [dict(s) for s in preset]


def test_side_presets_compare_what_their_names_say():
    def opts(name: str) -> dict:
        return {s.name: s.options for s in build_config(base={"sides": SIDE_PRESETS[name]}).sides}

    eager = opts("eager-vs-graphs")
    assert (eager["eager"].enforce_eager, eager["graphs"].enforce_eager) == (True, False)
    rl = opts("rl-rollout")
    assert all(o.fp32_logits for o in rl.values())
    assert (rl["trainer"].dtype, rl["rollout"].dtype) == ("float32", "bfloat16")
    inv = opts("batch-invariant")
    assert (inv["default"].batch_invariant, inv["invariant"].batch_invariant) == (False, True)
    assert len(opts("three-way")) == 3
    assert build_config(base={"sides": SIDE_PRESETS["vllm-vs-hf"]}) == ParityConfig()  # the default pair


def test_side_presets_are_not_mutated_by_building():
    before = repr(SIDE_PRESETS)
    cfg = build_config(None, ["eager.enforce_eager=false", "graphs.max_num_seqs=2"],
                       base={"sides": SIDE_PRESETS["eager-vs-graphs"]})
    assert cfg.side("eager").options.enforce_eager is False and cfg.side("graphs").options.max_num_seqs == 2
    assert repr(SIDE_PRESETS) == before
