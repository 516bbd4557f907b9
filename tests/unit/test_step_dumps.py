"""Every framework's step dumps read as the framework writes them (tests/rl_dumps.py writes them from the
sources' layouts): prime-rl's token export with its ranks joined and its STABLE marker, slime's dict
dumps with their new fields joined with the train dump v2 on sample_index, NeMo-RL's one-sample
batches, verl's gen_batch.dp refused (or read where verl imports); a run's directory: its steps, what is
incomplete, mixed or missing, named."""
from __future__ import annotations

import json
import os
import time

import pytest

from parity_ui.inputs import prime_rl, verl_dump
from parity_ui.inputs.rollouts import DumpError, detect_format, open_dump
from parity_ui.inputs.run_steps import parse_steps, readiness, scan_run, step_wanted
from rl_dumps import write_nemo_step, write_parity_step, write_prime_step, write_slime_step


def _rows(n=4, shift=0.0):
    out = []
    for k in range(n):
        r = [20 + k, 21, 22, 23]
        roll = [-0.5, -1.0 - 0.1 * k, -0.25, -2.0]
        out.append({"prompt": [1, 10 + k, 11], "response": r, "rollout": roll,
                    "trainer": [x - shift for x in roll], "mask": [1, 1, 1, 0], "index": 100 + k})
    return out


def test_prime_rl_step_joins_its_ranks_and_cuts_each_sequence_at_its_first_trained_token(tmp_path):
    step = write_prime_step(tmp_path, 3, _rows(5), ranks=2)
    assert detect_format(step) == "prime-rl" and detect_format(step / "rank_1.jsonl") == "prime-rl"
    dump = open_dump(step)
    rows = list(dump.rows())
    assert len(rows) == 5 and [r.facts["rank"] for r in rows] == [0, 0, 0, 1, 1]  # rank by rank
    a = rows[0]
    assert a.prompt_ids == [1, 10, 11] and a.response_ids == [20, 21, 22, 23] and a.loss_mask == [1, 1, 1, 0]
    assert a.rollout_logprobs == pytest.approx([-0.5, -1.0, -0.25, -2.0]) and a.trainer_logprobs is not None
    assert a.facts["step"] == 3 and rows[3].where.startswith("rank 1")
    assert any("ranks 0, 1 joined" in n for n in dump.notes)


def test_prime_rl_refuses_another_schema_and_names_a_missing_rank(tmp_path):
    step = write_prime_step(tmp_path, 1, _rows(3), ranks=3, skip_ranks=(1,))
    dump = open_dump(step)
    assert any("ranks 1 are missing" in n for n in dump.notes)
    assert prime_rl.missing_ranks([0, 2]) == [1] and prime_rl.missing_ranks([0, 1], expected=4) == [2, 3]
    f = step / "rank_0.jsonl"
    rec = json.loads(f.read_text().splitlines()[0])
    f.write_text(json.dumps({**rec, "schema_version": 2}) + "\n")
    with pytest.raises(DumpError) as e:
        list(open_dump(step).rows())
    assert "schema_version 2" in str(e.value) and "schema 1" in str(e.value)


def test_nemo_rl_one_sample_batches_read_as_rows(tmp_path):
    path = write_nemo_step(tmp_path, 2, _rows(2, shift=0.1))
    assert detect_format(path) == "nemo-rl"
    a, b = list(open_dump(path).rows())
    assert a.prompt_ids == [1, 10, 11] and a.response_ids == [20, 21, 22, 23]
    assert a.trainer_logprobs == pytest.approx([-0.6, -1.1, -0.35, -2.1]) and a.loss_mask == [1, 1, 1, 0]


def test_slime_dict_dump_reads_its_kept_sets_and_joins_the_train_dump_v2_on_sample_index(tmp_path):
    rows = _rows(3, shift=0.2)
    rows[1]["kept"] = [[21, 5], [21], [22, 7, 9], []]
    rows = rows[::-1]  # the rollout dump's order is not the train dump's (sorted by sample_index)
    path = write_slime_step(tmp_path, 7, rows)
    assert detect_format(path) == "slime"
    dump = open_dump(path)
    got = list(dump.rows())
    assert any("train dump v2) joined on sample_index" in n for n in dump.notes)
    for row, want in zip(got, rows):
        assert row.response_ids == want["response"]
        assert row.trainer_logprobs == pytest.approx([x for x in want["trainer"]], abs=1e-6)
        assert row.facts["index"] == want["index"] and row.facts["prefix_cache_info"]["total_prompt_tokens"] == 3
        assert row.facts["spec_info"]["spec_accept_token_num"] == 6
    assert got[1].kept_ids == [[21, 5], [21], [22, 7, 9], []] and got[0].kept_ids is None


def test_slime_samples_sharing_an_index_are_joined_by_their_rollout_position(tmp_path):
    """Two samples of one index (a custom generate returning several samples of one prompt): a join on
    sample_index gave both the last one's trainer logprobs; the rollout position tells them apart."""
    rows = _rows(3, shift=0.2)
    rows[1]["trainer"] = [x - 0.7 for x in rows[1]["rollout"]]
    rows[1]["index"] = rows[0]["index"]
    dump = open_dump(write_slime_step(tmp_path, 3, rows))
    got = list(dump.rows())
    assert any("joined on rollout_position" in n for n in dump.notes), dump.notes
    for row, want in zip(got, rows):
        assert row.trainer_logprobs == pytest.approx(want["trainer"], abs=1e-6)


def test_a_run_directory_names_each_file_step_by_the_number_after_step():
    from parity_ui.inputs.run_steps import step_of

    assert [step_of(s) for s in ("step_7_bf16", "step1_qwen3", "rollout_12", "gen-0005", "run2_step_40")] == \
        [7, 1, 12, 5, 40]


def test_a_train_dump_before_v2_is_named_and_not_joined(tmp_path):
    import torch

    path = write_slime_step(tmp_path, 1, _rows(2))
    torch.save({"rollout_id": 1, "samples": [{"log_probs": torch.zeros(4)}]}, tmp_path / "train_data" / "1.pt")
    dump = open_dump(path)
    rows = list(dump.rows())
    assert all(r.trainer_logprobs is None for r in rows)
    assert any("not a slime train dump v2" in n and "not joined" in n for n in dump.notes)


def test_slime_bad_kept_set_offsets_are_named(tmp_path):
    rows = _rows(1)
    rows[0]["kept"] = [[21], [21]]  # 2 spans for 4 response tokens
    path = write_slime_step(tmp_path, 1, rows, train=False)
    with pytest.raises(DumpError) as e:
        list(open_dump(path).rows())
    assert "rollout_top_p_token_offsets has 3 entries" in str(e.value) and "sample 0" in str(e.value)


def test_verl_gen_batch_is_refused_without_trust_pickle_and_where_verl_cannot_be_imported(tmp_path):
    step = tmp_path / "exp_proj" / "GBS4_N1_in8_out8" / "12"
    step.mkdir(parents=True)
    (step / "gen_batch.dp").write_bytes(b"\x80\x04not really")
    (step / "meta.json").write_text(json.dumps({"global_steps": 12}))
    assert detect_format(step) == "verl-dp" and verl_dump.step_number(step) == 12
    with pytest.raises(DumpError) as e:
        open_dump(step)
    assert "--trust-pickle" in e.value.fix and "DataProto.load_from_disk" in e.value.fix
    if not verl_dump.verl_importable():
        with pytest.raises(DumpError) as e:
            open_dump(step, trust_pickle=True)
        assert "verl / tensordict cannot be imported" in str(e.value) and "rollouts.jsonl" in e.value.fix


def test_verl_batch_rows_undo_the_padding():
    import torch

    class DataProto:  # the shape of verl's: a batch of [B, ...] tensors and the step's meta_info
        batch = {
            "prompts": torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]]),
            "responses": torch.tensor([[11, 12, 0], [13, 14, 15]]),
            "response_mask": torch.tensor([[1, 1, 0], [1, 0, 1]]),
            "attention_mask": torch.tensor([[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]]),
            "rollout_log_probs": torch.tensor([[-0.5, -0.25, 0.0], [-1.0, -2.0, -0.125]]),
        }
        meta_info = {"global_steps": 4}

    a, b = [verl_dump.row(rec, i, w) for i, w, rec in verl_dump.records(DataProto())]
    assert a.prompt_ids == [5, 6] and a.response_ids == [11, 12] and a.rollout_logprobs == [-0.5, -0.25]
    assert b.prompt_ids == [7, 8, 9, 10] and b.loss_mask == [1, 0, 1] and b.policy_version == "4"


def test_a_run_directory_lists_its_steps_and_names_the_incomplete_ones(tmp_path):
    for n in (1, 2, 3):
        write_prime_step(tmp_path / "out", n, _rows(4), ranks=2, stable=n != 3)
    write_prime_step(tmp_path / "out", 4, _rows(4), ranks=2, skip_ranks=(1,))
    layout = scan_run(tmp_path / "out")
    assert layout.format == "prime-rl" and [s.step for s in layout.steps] == [1, 2, 3, 4]
    assert layout.steps[3].missing_ranks == [1] and layout.steps[0].missing_ranks == []
    assert readiness(layout.steps[0]).ready and not readiness(layout.steps[2]).ready
    assert "no STABLE marker" in readiness(layout.steps[2]).why


def test_a_file_step_is_complete_once_it_stopped_growing_and_ends_with_a_whole_line(tmp_path):
    path = write_nemo_step(tmp_path, 1, _rows(2))
    (src,) = scan_run(tmp_path).steps
    assert not readiness(src, settle_s=5.0).ready  # just written
    old = time.time() - 60
    os.utime(path, (old, old))
    assert readiness(src, settle_s=5.0).ready
    with path.open("a") as f:
        f.write('{"token_ids": [[1, 2')  # a line being written
    os.utime(path, (old, old))
    assert "inside a line" in readiness(src, settle_s=5.0).why


def test_a_directory_mixing_formats_or_runs_is_refused_naming_each(tmp_path):
    write_nemo_step(tmp_path / "mixed", 1, _rows(2))
    write_parity_step(tmp_path / "mixed", 2, _rows(2))
    with pytest.raises(DumpError) as e:
        scan_run(tmp_path / "mixed")
    assert "nemo-rl: 1 step(s)" in str(e.value) and "parity: 1 step(s)" in str(e.value) and "--format" in e.value.fix
    assert scan_run(tmp_path / "mixed", "nemo-rl").format == "nemo-rl"
    write_prime_step(tmp_path / "runs", 1, _rows(2), run_id="a")
    write_prime_step(tmp_path / "runs", 1, _rows(2), run_id="b")
    with pytest.raises(DumpError) as e:
        scan_run(tmp_path / "runs")
    assert "token exports of 2 runs" in str(e.value)


def test_an_empty_directory_says_where_nemo_rl_dumps_go_missing(tmp_path):
    (tmp_path / "logs").mkdir()
    with pytest.raises(DumpError) as e:
        scan_run(tmp_path / "logs")
    assert "should_log_nemo_gym_responses" in e.value.fix


def test_slime_eval_dumps_are_left_out_and_a_missing_train_dump_is_waited_for(tmp_path):
    import torch

    write_slime_step(tmp_path, 1, _rows(2))
    write_slime_step(tmp_path, 2, _rows(2), train=False)
    torch.save({"rollout_id": 0, "samples": []}, tmp_path / "rollout_data" / "eval_0.pt")
    layout = scan_run(tmp_path)
    assert [s.step for s in layout.steps] == [1, 2] and any("evaluation" in x for x in layout.ignored)
    old = time.time() - 60
    for p in (tmp_path / "rollout_data").iterdir():
        os.utime(p, (old, old))
    for p in (tmp_path / "train_data").iterdir():
        os.utime(p, (old, old))
    assert readiness(layout.steps[0]).ready
    assert "train dump is not there yet" in readiness(layout.steps[1]).why


def test_steps_are_picked_by_list_and_range():
    wanted = parse_steps("1-3,7,10-")
    assert [s for s in range(1, 13) if step_wanted(s, wanted)] == [1, 2, 3, 7, 10, 11, 12]
    with pytest.raises(ValueError):
        parse_steps("a-b")
