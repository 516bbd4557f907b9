"""Step dumps written the way each RL framework writes them (the layouts and fields of the sources named
in docs/rollouts.md), from rows the tests and benches make: real rollouts (tests/engines) or synthetic
ones (tests/unit, bench/replay_steps.py).

A row is a dict: prompt (ids), response (ids), rollout (the rollout engine's logprob of each response
token), trainer (the trainer's, or None), optionally mask (per response token), version (policy
version), kept (the kept top-p set of each response token), index (slime's sample index).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any


def synthetic_rows(step: int, n: int = 6, tokens: int = 12, fault_from: int = 3, shift: float = 0.4,
                   seed: int = 0) -> list[dict[str, Any]]:
    """Rows made up for tests above the engines: trainer = rollout + float noise; from `fault_from` on
    every other token's trainer logprob is `shift` lower (a fault that moves the mismatch)."""
    import random

    rnd = random.Random(seed * 1000 + step)
    out = []
    for k in range(n):
        roll = [-rnd.uniform(0.05, 3.0) for _ in range(tokens)]
        bad = shift if step >= fault_from else 0.0
        trainer = [min(0.0, x + rnd.gauss(0, 2e-4) - bad * (t % 2)) for t, x in enumerate(roll)]
        out.append({"prompt": [1, 30 + k, 31], "response": [rnd.randrange(40, 400) for _ in range(tokens)],
                    "rollout": roll, "trainer": trainer, "mask": [1] * (tokens - 1) + [0], "version": step})
    return out


def f32(x: float) -> float:
    """x as a float32 holds it (prime-rl and slime write float32 tensors' values)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def write_prime_step(root: Path, step: int, rows: list[dict[str, Any]], *, ranks: int = 2, stable: bool = True,
                     skip_ranks: tuple[int, ...] = (), run_id: str | None = None) -> Path:
    """prime-rl's token export of one step (src/prime_rl/trainer/rl/token_export.py, schema 1): row k
    goes to rank k % ranks; a STABLE marker once every rank's file is written."""
    base = Path(root) / (f"{run_id}/" if run_id else "") / "token_exports" / f"step_{step}"
    base.mkdir(parents=True, exist_ok=True)
    files: dict[int, list[str]] = {r: [] for r in range(ranks)}
    for k, row in enumerate(rows):
        rank = k % ranks
        p, r = row["prompt"], row["response"]
        n = len(p) + len(r)
        mask = row.get("mask") or [1] * len(r)
        trainer = row["trainer"]
        rec = {
            "schema_version": 1, "step": step, "rank": rank, "micro_step": 0,
            "micro_sequence_idx": len(files[rank]), "export_sequence_idx": len(files[rank]), "env_name": "math",
            "token_ids": p + r, "position_ids": list(range(n)),
            "loss_mask": [False] * len(p) + [bool(m) for m in mask],
            "advantages": [0.0] * n, "losses": [{"rl": {"advantage": 0.0, "mask": bool(m)}} for m in [0] * len(p) + mask],
            "rewards": [None] * n,
            "inference_logprobs": [0.0] * len(p) + [f32(x) for x in row["rollout"]],
            "trainer_logprobs": [-6.93] + [0.0] * (len(p) - 1) + [f32(x) for x in trainer],
            "entropy": [1.0] * n,
            "mismatch_kl": [None] * n, "log_importance_ratio": [None] * n, "importance_ratio": [None] * n,
            "prob_delta": [None] * n, "is_masked": [None] * n, "is_masked_high": [None] * n,
            "is_masked_low": [None] * n,
        }
        if run_id:
            rec.update(run_id=run_id, export_step=step)
        files[rank].append(json.dumps(rec, separators=(",", ":")))
    for rank, lines in files.items():
        if rank in skip_ranks:
            continue
        (base / f"rank_{rank}.jsonl").write_text("".join(line + "\n" for line in lines))
    if stable:
        (base / "STABLE").touch()
    return base


def nemo_line(row: dict[str, Any], width: int, idx: int, pad: int = 3) -> str:
    """One line of NeMo-RL's train_data_step{N}.jsonl: every field a one-sample batch, per-token
    columns aligned to token_ids (the logprob of token i at i; 0 on the prompt), padded to the batch."""
    p, r = row["prompt"], row["response"]
    n = len(p) + len(r)
    mask = row.get("mask") or [1] * len(r)
    trainer = row["trainer"] if row["trainer"] is not None else [0.0] * len(r)
    rec = {
        "content": [[{"role": "user", "content": "..."}]], "rewards": [0.0], "input_lengths": [n],
        "token_ids": [p + r + [pad] * (width - n)],
        "token_loss_mask": [[0] * len(p) + list(mask) + [0] * (width - n)],
        "sample_loss_mask": [1.0], "advantages": [[0.0] * width],
        "generation_logprobs": [[0.0] * len(p) + list(row["rollout"]) + [0.0] * (width - n)],
        "prev_logprobs": [[0.0] * len(p) + list(trainer) + [0.0] * (width - n)],
        "idx": idx,
    }
    return json.dumps(rec)


def write_nemo_step(root: Path, step: int, rows: list[dict[str, Any]]) -> Path:
    """NeMo-RL's Logger.log_batched_dict_as_jsonl of one step (nemo_rl/utils/logger.py)."""
    path = Path(root) / f"train_data_step{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    width = max(len(r["prompt"]) + len(r["response"]) for r in rows) + 2
    path.write_text("".join(nemo_line(row, width, i) + "\n" for i, row in enumerate(rows)))
    return path


def slime_sample(row: dict[str, Any], index: int) -> dict[str, Any]:
    """A slime Sample.to_dict() (slime/utils/types.py): plain values, the kept sets as CSR."""
    p, r = row["prompt"], row["response"]
    kept = row.get("kept")
    d = {
        "group_index": index // 2, "index": row.get("index", index), "rollout_id": None, "prompt": "...",
        "tokens": p + r, "multimodal_inputs": None, "multimodal_train_inputs": None,
        "multimodal_train_input_id": None, "apply_chat_template_kwargs": {}, "response": "...",
        "response_length": len(r), "label": None, "reward": 0.0, "loss_mask": list(row.get("mask") or [1] * len(r)),
        "weight_versions": [str(row.get("version", 0))], "rollout_log_probs": [f32(x) for x in row["rollout"]],
        "rollout_top_p_token_ids": None, "rollout_top_p_token_offsets": None, "rollout_routed_experts": None,
        "remove_sample": False, "teacher_log_probs": None, "status": "completed", "metadata": {},
        "generate_function_path": None, "custom_rm_path": None, "train_metadata": None, "session_id": None,
        "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 6, "spec_draft_token_num": 8, "spec_verify_ct": 2,
                      "completion_token_num": len(r)},
        "prefix_cache_info": {"cached_tokens": len(p) // 2, "total_prompt_tokens": len(p)},
    }
    if kept is not None:
        offsets = [0]
        for s in kept:
            offsets.append(offsets[-1] + len(s))
        d["rollout_top_p_token_ids"] = [t for s in kept for t in s]
        d["rollout_top_p_token_offsets"] = offsets
    return d


def write_slime_step(root: Path, step: int, rows: list[dict[str, Any]], *, train: bool = True) -> Path:
    """slime's --dump-details layout: rollout_data/{id}.pt (rollout_data_utils.save_debug_rollout_data)
    and, with `train`, train_data/{id}.pt, the train dump v2 (train_data_utils._build_dump_payload),
    its samples in sample_index order with the trainer's log_probs as float32 tensors."""
    import torch

    root = Path(root)
    (root / "rollout_data").mkdir(parents=True, exist_ok=True)
    samples = [slime_sample(row, k) for k, row in enumerate(rows)]
    path = root / "rollout_data" / f"{step}.pt"
    torch.save({"rollout_id": step, "samples": samples}, path)
    if train:
        (root / "train_data").mkdir(parents=True, exist_ok=True)
        train = []
        for k, (row, s) in enumerate(zip(rows, samples)):
            n = len(row["response"])
            train.append({
                "data_parallel_rank": k % 2, "sample_index": s["index"], "rollout_position": k,
                "tokens": torch.tensor(s["tokens"]), "response_lengths": n, "total_lengths": len(s["tokens"]),
                "loss_masks": torch.tensor(s["loss_mask"]),
                "rollout_log_probs": torch.tensor(row["rollout"], dtype=torch.float32),
                "log_probs": torch.tensor(row["trainer"], dtype=torch.float32),
                "ref_log_probs": torch.tensor(row["trainer"], dtype=torch.float32),
                "advantages": torch.zeros(n), "returns": torch.zeros(n), "kl": torch.zeros(n),
                "entropy": torch.ones(n),
            })
        train.sort(key=lambda t: t["sample_index"])
        shards = [{"rank": r, "data_parallel_rank": r, "sample_indices": [t["sample_index"] for t in train
                                                                          if t["data_parallel_rank"] == r],
                   "micro_batch_indices": [[0]], "num_microbatches": [1], "global_batch_sizes": [len(rows)]}
                  for r in range(2)]
        torch.save({"format_version": 2, "rollout_id": step, "rank": 0, "samples": train, "dp_shards": shards,
                    "raw_reward": [0.0] * len(rows)}, root / "train_data" / f"{step}.pt")
    return path


def write_parity_step(root: Path, step: int, rows: list[dict[str, Any]]) -> Path:
    path = Path(root) / f"step_{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            rec = {"prompt_ids": row["prompt"], "response_ids": row["response"], "rollout_logprobs": row["rollout"]}
            if row.get("trainer") is not None:
                rec["trainer_logprobs"] = row["trainer"]
            if row.get("mask") is not None:
                rec["loss_mask"] = row["mask"]
            if row.get("version") is not None:
                rec["policy_version"] = row["version"]
            f.write(json.dumps(rec) + "\n")
    return path


WRITERS = {"prime-rl": write_prime_step, "nemo-rl": write_nemo_step, "slime": write_slime_step,
           "parity": write_parity_step}
