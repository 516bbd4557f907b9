"""The rollout readers (parity_ui.inputs.rollouts): each framework's dump, written with its own field
names, read into the same rows; the replay traps caught before any engine loads; bad input named."""
from __future__ import annotations

import json


import pytest

from parity_ui.inputs.rollouts import DumpError, detect_format, open_dump, preflight


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


PARITY = [{"prompt_ids": [1, 10, 11], "response_ids": [20, 21, 2], "rollout_logprobs": [-0.5, -1.0, -0.1],
           "trainer_logprobs": [-0.5, -1.1, -0.1], "loss_mask": [1, 1, 0],
           "sampling": {"temperature": 1.0, "top_p": 0.9, "logprobs_mode": "raw_logprobs"}, "policy_version": 3},
          {"prompt_ids": [1, 12], "response_ids": [22, 23], "rollout_logprobs": [-0.2, -0.3], "policy_version": 3}]


def test_parity_jsonl_and_parquet_read_the_same_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    j = _write_jsonl(tmp_path / "r.jsonl", PARITY)
    pq.write_table(pa.Table.from_pylist(PARITY), tmp_path / "r.parquet")
    for path in (j, tmp_path / "r.parquet"):
        assert detect_format(path) == "parity"
        rows = list(open_dump(path).rows())
        assert [r.response_ids for r in rows] == [[20, 21, 2], [22, 23]]
        assert rows[0].loss_mask == [1, 1, 0] and rows[1].loss_mask is None and rows[1].mask() == [1, 1]
        assert rows[0].trainer_logprobs == [-0.5, -1.1, -0.1] and rows[0].policy_version == "3"
        assert rows[0].sampling["top_p"] == 0.9


def test_nemo_rl_rows_are_cut_at_the_first_trained_token(tmp_path):
    # NeMo-RL: token_ids padded to the batch, per-token columns aligned to token_ids (0 at the prompt).
    rec = {"content": ["..."], "rewards": 1.0, "advantages": [0.0] * 7, "input_lengths": 5,
           "token_ids": [1, 10, 11, 20, 21, 3, 3], "token_loss_mask": [0, 0, 0, 1, 1, 0, 0], "sample_loss_mask": 1,
           "generation_logprobs": [0, 0, 0, -0.4, -0.6, 0, 0], "prev_logprobs": [0, 0, 0, -0.41, -0.6, 0, 0]}
    path = _write_jsonl(tmp_path / "train_data_step3.jsonl", [rec, {**rec, "sample_loss_mask": 0}])
    assert detect_format(path) == "nemo-rl"
    a, b = list(open_dump(path).rows())
    assert a.prompt_ids == [1, 10, 11] and a.response_ids == [20, 21]
    assert a.rollout_logprobs == [-0.4, -0.6] and a.trainer_logprobs == [-0.41, -0.6] and a.loss_mask == [1, 1]
    assert b.loss_mask == [0, 0]  # a sample the trainer dropped: every token masked


def test_a_nemo_rl_row_whose_input_lengths_covers_only_the_prompt_names_the_field_and_the_cut(tmp_path):
    """Issue 46 item 7: NeMo-RL's input_lengths is the unpadded prompt + response length; a row where it
    stops at the prompt's end is refused naming input_lengths, where the marked tokens are, and the fix."""
    rec = {"input_lengths": 3, "token_ids": [1, 10, 11, 20, 21, 3, 3], "token_loss_mask": [0, 0, 0, 1, 1, 0, 0],
           "generation_logprobs": [0, 0, 0, -0.4, -0.6, 0, 0]}
    path = _write_jsonl(tmp_path / "train_data_step1.jsonl", [rec])
    with pytest.raises(DumpError) as e:
        list(open_dump(path, "nemo-rl").rows())
    msg = str(e.value)
    assert "input_lengths is 3" in msg and "covers only the prompt" in msg, msg
    assert "first marked token is token 3" in msg and "prompt + response length" in msg, msg
    assert "write input_lengths as the prompt + response length (5 here" in msg, msg
    # A mask that marks nothing at all: said so, and not blamed on input_lengths.
    path = _write_jsonl(tmp_path / "train_data_step2.jsonl", [{**rec, "input_lengths": 7, "token_loss_mask": [0] * 7}])
    with pytest.raises(DumpError, match="marks no token \\(all 7 are 0\\)"):
        list(open_dump(path, "nemo-rl").rows())


def test_truncated_jsonl_line_is_named_or_skipped(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(PARITY[0]) + "\n" + json.dumps(PARITY[1])[:25] + "\n")
    with pytest.raises(DumpError) as e:
        list(open_dump(path).rows())
    assert "line 2" in str(e.value) and "truncated" in str(e.value) and "--on-bad skip" in str(e.value)
    dump = open_dump(path, on_bad="skip")
    assert len(list(dump.rows())) == 1 and dump.bad[0].where == "line 2"


def test_unknown_format_lists_the_supported_ones(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"question": "hi"}])
    with pytest.raises(DumpError) as e:
        detect_format(path)
    msg = str(e.value)
    for fmt in ("--format parity", "--format nemo-rl", "--format verl", "--format slime", "prompt_ids",
                "token_loss_mask", "response_length"):
        assert fmt in msg
    with pytest.raises(DumpError, match="unknown rollout format"):
        open_dump(path, "areal")


def test_preflight_names_each_trap(tmp_path):
    rows = [
        {"prompt_ids": [1, 5], "response_ids": [6, 7, 9999], "rollout_logprobs": [-1, -1, -1]},  # another vocabulary
        {"prompt_ids": [1, 5], "response_ids": [6, 7], "loss_mask": [1, 1, 1], "rollout_logprobs": [-1, -1]},
        {"prompt_ids": [1, 5], "response_ids": [6, 7, 8], "rollout_logprobs": [-1, -1]},  # shifted by one
        {"prompt_ids": [1, 5], "response_ids": [6, 2, 8], "rollout_logprobs": [-1, -1, -1], "policy_version": 1},
        {"prompt_ids": [1, 5], "response_ids": [6, 8], "rollout_logprobs": [-1, -1], "policy_version": 2,
         "sampling": {"temperature": 0.7, "logprobs_mode": "processed_logprobs"}},
    ]
    dump = open_dump(_write_jsonl(tmp_path / "r.jsonl", rows))
    pf = preflight(dump.rows(), vocab_size=1000, eos_ids=[2])
    codes = {f.code: f for f in pf.findings}
    assert {"replay-vocab", "replay-mask-length", "replay-shift"} <= {f.code for f in pf.errors}
    assert "line 1" in codes["replay-vocab"].message and "another model" in codes["replay-vocab"].message
    assert "line 2" in codes["replay-mask-length"].message and "one loss_mask entry" in codes["replay-mask-length"].fix
    assert "line 3" in codes["replay-shift"].message and "the token it scores" in codes["replay-shift"].message
    assert "line 4" in codes["replay-after-eos"].message
    assert "2 policy versions" in codes["replay-versions"].message
    assert "T=0.7" in codes["replay-temperature"].message
    assert "processed_logprobs" in codes["replay-processed"].message


def test_nan_and_infinite_recorded_logprobs_are_named_with_their_rows_tokens_and_count(tmp_path):
    """Issue 46 item 9: a row [-0.5, NaN, -0.2] was counted as 2 tokens without a word."""
    nan, inf = float("nan"), float("inf")
    rows = [{"prompt_ids": [1, 5], "response_ids": [6, 7, 8], "rollout_logprobs": [-0.5, nan, -0.2]},
            {"prompt_ids": [1, 5], "response_ids": [6, 7, 8], "rollout_logprobs": [-0.5, -0.1, -0.2],
             "trainer_logprobs": [-inf, -0.1, -0.2]},
            {"prompt_ids": [1, 5], "response_ids": [6, 7, 8], "rollout_logprobs": [-0.5, -0.1, nan],
             "loss_mask": [1, 1, 0]},  # a masked token's NaN is never scored: not counted
            {"prompt_ids": [1, 5], "response_ids": [6, 7], "rollout_logprobs": [-0.5, -0.1]}]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # NaN and -Infinity, as Python writes them
    pf = preflight(open_dump(path).rows(), vocab_size=100)
    codes = {f.code: f for f in pf.findings}
    f = codes["replay-nonfinite"]
    assert f.severity == "warning"
    assert "2 recorded logprobs of kept tokens are NaN or infinite, in 2 rows" in f.message, f.message
    assert "line 1 (rollout: token 1 NaN)" in f.message and "line 2 (trainer: token 0 -inf)" in f.message
    assert "line 3" not in f.message and "left out of every figure" in f.message
    assert "-inf a token the rollout engine's sampler had masked" in f.fix


class _Sample:  # stands for slime's Sample class, which a safe load may not build
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _slime_sample(**over):
    s = {"group_index": 0, "index": 0, "prompt": "p", "tokens": [1, 10, 11, 20, 21], "response": "r",
         "response_length": 2, "label": None, "reward": 1.0, "loss_mask": [1, 1], "weight_versions": ["7"],
         "rollout_log_probs": [-0.3, -0.2], "rollout_routed_experts": None, "status": "completed",
         "metadata": {}, "spec_info": {}, "prefix_cache_info": {}}
    s.update(over)
    return s


def test_slime_to_dict_dump_loads_safely(tmp_path):
    import torch

    path = tmp_path / "rollout_0.pt"
    torch.save(dict(rollout_id=0, samples=[_slime_sample(), _slime_sample(weight_versions=["7", "8"])]), path)
    assert detect_format(path) == "slime"
    a, b = list(open_dump(path).rows())  # weights_only: no flag needed
    assert a.prompt_ids == [1, 10, 11] and a.response_ids == [20, 21] and a.rollout_logprobs == [-0.3, -0.2]
    assert a.policy_version == "7" and b.policy_version == "7,8"


def test_a_pickle_that_needs_code_is_refused_without_the_flag(tmp_path):
    import torch

    path = tmp_path / "rollout_1.pt"
    torch.save(dict(rollout_id=1, samples=[_Sample(**_slime_sample())]), path)
    with pytest.raises(DumpError) as e:
        open_dump(path)
    assert "--trust-pickle" in str(e.value) and "runs whatever code" in str(e.value)
    rows = list(open_dump(path, trust_pickle=True).rows())
    assert rows[0].response_ids == [20, 21]


def test_a_slime_pickle_of_classes_absent_here_is_read_as_records_with_the_flag_only(tmp_path):
    """Issue 46 item 8: a slime .pt of Sample objects, on a machine without slime, with --trust-pickle:
    the classes' module does not exist here, so their fields are read as plain records; without the
    flag it is still refused."""
    import dataclasses
    import enum
    import sys
    import types

    import torch

    name = "slime_not_installed_here.utils.types"
    mod = types.ModuleType(name)

    @dataclasses.dataclass
    class Sample:
        class Status(enum.Enum):
            COMPLETED = "completed"
            TRUNCATED = "truncated"

        tokens: list
        response_length: int
        rollout_log_probs: list
        loss_mask: list
        status: "Sample.Status"
        weight_versions: list

    Sample.__module__ = Sample.Status.__module__ = name
    Sample.__qualname__, Sample.Status.__qualname__ = "Sample", "Sample.Status"
    mod.Sample = Sample
    parts = name.split(".")
    packages = {".".join(parts[:i]): types.ModuleType(".".join(parts[:i])) for i in range(1, len(parts))}
    sys.modules.update({**packages, name: mod})  # as if slime were installed, only while it is saved
    path = tmp_path / "rollout_3.pt"
    try:
        torch.save(dict(rollout_id=3, samples=[Sample([1, 10, 11, 20, 21], 2, [-0.3, -0.2], [1, 1],
                                                      Sample.Status.TRUNCATED, ["7"])]), path)
    finally:
        for m in (*packages, name):
            del sys.modules[m]  # the framework is not installed here
    with pytest.raises(ModuleNotFoundError):
        __import__(name)
    with pytest.raises(DumpError) as e:
        open_dump(path)  # no flag: refused, nothing of it runs
    assert "--trust-pickle" in str(e.value)
    (row,) = list(open_dump(path, trust_pickle=True).rows())
    assert row.prompt_ids == [1, 10, 11] and row.response_ids == [20, 21]
    assert row.rollout_logprobs == [-0.3, -0.2] and row.loss_mask == [1, 1] and row.policy_version == "7"
    assert name not in sys.modules  # read without importing (or faking) the framework


def test_truncated_pickle_is_named(tmp_path):
    import torch

    path = tmp_path / "rollout_2.pt"
    torch.save(dict(rollout_id=2, samples=[_slime_sample()]), path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DumpError, match="rollout_2.pt"):
        open_dump(path)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tiny_models import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def test_verl_text_rows_are_retokenised_and_a_row_that_does_not_round_trip_is_named(tmp_path, tok):
    rows = [{"input": "def f(x):", "output": " return x", "gts": None, "score": 1.0, "step": 4},
            {"input": "<|user|>\ndef g():", "output": " pass", "gts": None, "score": 0.0, "step": 4}]
    path = _write_jsonl(tmp_path / "4.jsonl", rows)
    assert detect_format(path) == "verl"
    with pytest.raises(DumpError, match="tokenizer"):
        open_dump(path)
    dump = open_dump(path, tokenizer=tok)
    pf = preflight(dump.rows(), vocab_size=len(tok), eos_ids=[tok.eos_token_id])
    assert pf.reconstructed == 2 and [w for w, _ in pf.text_rows] == ["line 2"]
    f = next(f for f in pf.findings if f.code == "replay-text-roundtrip")
    assert "line 2" in f.message and "line 1" not in f.message
    first = next(iter(open_dump(path, tokenizer=tok).rows()))
    assert tok.decode(first.prompt_ids + first.response_ids, skip_special_tokens=True) == "def f(x): return x"


def test_trace_replay_refusal_is_told_apart_from_other_load_errors():
    from parity_ui.engines.vllm_support import forced_tokens_label, trace_refusal

    refused = ValueError("1 validation error for VllmConfig\n  Value error, trace replay requires Model Runner V2 "
                         "[type=value_error, input_value=ArgsKwargs((), {})]")
    why = trace_refusal(refused)
    assert why is not None and why.startswith("trace replay requires Model Runner V2") and "[type=" not in why
    assert trace_refusal(ValueError("max_model_len 99999 is too large")) is None  # never hidden by the fallback
    assert forced_tokens_label("trace", None).startswith("trace (decode steps")
    assert forced_tokens_label("prompt", why) == f"prompt logprobs over prompt + response ({why})"


def test_a_replay_makes_unset_forced_tokens_auto_and_keeps_a_chosen_one():
    from parity_ui.commands.replay import replay_sides
    from parity_ui.core.config import build_config

    cfg = build_config(None, [], sides=["a=hf", "b=vllm", "c=vllm,forced_tokens=prompt"])
    sides = replay_sides(cfg)
    assert [getattr(s.options, "forced_tokens", "-") for s in sides] == ["-", "auto", "prompt"]
    assert cfg.sides[1].options.forced_tokens is None  # the caller's config is left as it was
