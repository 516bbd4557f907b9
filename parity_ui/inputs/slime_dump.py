"""slime's dumps of one rollout step, read as slime writes them (the versions checked are named in
docs/rollouts.md):

- the rollout dump (`--save-debug-rollout-data`, or `--dump-details DIR`: `DIR/rollout_data/{id}.pt`):
  `torch.save({"rollout_id", "samples": [Sample.to_dict()]})` (slime/observability/rollout_data_utils.py),
  plain dicts. Besides what parity_ui.inputs.rollouts reads of a sample, this module reads its newer
  fields (slime/utils/types.py): `rollout_top_p_token_ids` / `rollout_top_p_token_offsets`, the kept
  top-p set of each response token as ragged CSR (token i kept ids[offsets[i]:offsets[i + 1]]; a tool's
  tokens an empty span), which becomes the row's kept set; `prefix_cache_info` (`cached_tokens`,
  `total_prompt_tokens`) and `spec_info` (speculative decoding's accept/draft counts), kept as the row's
  facts; `routed_experts_start_len` (SGLang's meta key, kept where a custom rollout stored it);
- the train dump v2 (`--save-debug-train-data`, `DIR/train_data/{id}.pt`; slime #2266,
  slime/observability/train_data_utils.py `_build_dump_payload`): `{"format_version": 2, "rollout_id",
  "rank", "samples": [...], "dp_shards": [...]}`, one dict per training sample with `sample_index` (the
  rollout sample's `index`), `rollout_position` (its position in the rollout dump), `data_parallel_rank`
  and its per-sample fields: `log_probs` (the trainer's, one per response token, re-assembled across
  context-parallel ranks), `ref_log_probs`, `advantages`, `returns`, `kl`, `entropy`, ...

The train dump found beside a rollout dump is joined to it on `sample_index` <-> `index` (on the
rollout position where the samples carry no index), so a row gets the trainer's logprobs of the run
itself. Rows without a train sample, and train samples without a rollout row, are named in the dump's
notes. Pickles: loaded with torch.load(weights_only=True); anything needing code is refused without
trust_pickle.

May import: core (the package's rule).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .rollout_rows import DumpError, RolloutRow, floats, ints, routes_array, sample_field

TRAIN_FORMAT_VERSION = 2
_ID = re.compile(r"^(?:rollout_)?(\d+)\.pt$")


def rollout_id(path: Path) -> int | None:
    """The rollout id a rollout dump's name carries (`{id}.pt`, `rollout_{id}.pt`); None for an eval dump."""
    m = _ID.match(path.name)
    return int(m.group(1)) if m else None


def train_dump_for(path: Path) -> Path | None:
    """The train dump of the same rollout step, where slime puts it: `--dump-details DIR` writes
    `DIR/rollout_data/{id}.pt` and `DIR/train_data/{id}.pt`; the separate flags are free-form, commonly
    `rollout_{id}.pt` beside `train_{id}.pt` (or `train_{id}_{rank}.pt`)."""
    rid = rollout_id(path)
    if rid is None:
        return None
    candidates = [path.parent.parent / "train_data" / f"{rid}.pt"] if path.parent.name == "rollout_data" else []
    candidates += [path.parent / f"train_{rid}.pt", *sorted(path.parent.glob(f"train_{rid}_*.pt"))]
    return next((c for c in candidates if c.is_file()), None)


def _safe_load(path: Path, trust_pickle: bool) -> Any:
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError) as e:
        if not trust_pickle:
            raise DumpError(
                f"{path.name} is a pickle that a safe load refuses ({str(e).strip()[:160] or type(e).__name__}): "
                "loading it runs whatever code the file names, so parity-ui will not load it unasked",
                "if you trust the file (your run wrote it), pass --trust-pickle",
            ) from None
        return torch.load(path, map_location="cpu", weights_only=False)
    except EOFError:
        raise DumpError(f"{path.name} ends early (a truncated pickle)", "wait for slime to finish writing it") from None


def load_train_dump(path: Path, trust_pickle: bool) -> list[dict[str, Any]]:
    """The train dump's samples. Raises DumpError for a file that is not a v2 train dump."""
    data = _safe_load(path, trust_pickle)
    version = sample_field(data, "format_version")
    if version != TRAIN_FORMAT_VERSION:
        raise DumpError(
            f"{path.name} is not a slime train dump v2 (format_version {version!r}): the per-rank dumps "
            "before slime #2266 carry no sample_index to join on",
            "dump with a slime that has --save-debug-train-data v2 (#2266), or leave the train dump out",
        )
    samples = sample_field(data, "samples")
    if not isinstance(samples, (list, tuple)):
        raise DumpError(f"{path.name} holds no list of samples", "a train dump v2 holds samples=[...]")
    return list(samples)


def join_train_dump(path: Path, samples: list[Any], trust_pickle: bool, notes: list[str]) -> list[tuple[Any, Any]]:
    """Each rollout sample with its train sample (None where there is none), the join named in `notes`."""
    train_path = train_dump_for(path)
    if train_path is None:
        return [(s, None) for s in samples]
    try:
        train = load_train_dump(train_path, trust_pickle)
    except DumpError as e:
        if "format_version" not in e.message:
            raise
        notes.append(f"{e.message}: not joined (no trainer logprobs)")
        return [(s, None) for s in samples]
    by_index = {t.get("sample_index"): t for t in train if t.get("sample_index") is not None}
    indices = [sample_field(s, "index") for s in samples]
    # sample_index names one sample only where no two share it (on either side): a duplicate would hand
    # every rollout row of that index the last train sample's logprobs. Else the rollout position.
    unique = len(set(indices)) == len(indices) and len(by_index) == sum(
        t.get("sample_index") is not None for t in train
    )
    if samples and all(i is not None for i in indices) and by_index and unique:
        key, pairs = "sample_index", [(s, by_index.get(sample_field(s, "index"))) for s in samples]
        extra = len(set(by_index) - {sample_field(s, "index") for s in samples})
    else:  # no indices: the rollout position slime orders its train samples by
        by_pos = {t.get("rollout_position"): t for t in train if t.get("rollout_position") is not None}
        key, pairs = "rollout_position", [(s, by_pos.get(k)) for k, s in enumerate(samples)]
        extra = len(set(by_pos) - set(range(len(samples))))
    lacking = sum(1 for _, t in pairs if t is None)
    notes.append(
        f"the trainer's logprobs are the run's own: {train_path.name} (slime train dump v2) joined on {key}"
        + (f"; {lacking} rollout samples have no train sample (no trainer logprobs)" if lacking else "")
        + (f"; {extra} train samples match no rollout sample" if extra else "")
    )
    return pairs


def _kept_sets(s: Any, n: int) -> list[list[int]] | None:
    ids, offsets = sample_field(s, "rollout_top_p_token_ids"), sample_field(s, "rollout_top_p_token_offsets")
    if ids is None and offsets is None:
        return None
    if ids is None or offsets is None:
        raise DumpError(
            "rollout_top_p_token_ids and rollout_top_p_token_offsets come together (a CSR); one is missing", ""
        )
    ids, offsets = ints(ids, "rollout_top_p_token_ids"), ints(offsets, "rollout_top_p_token_offsets")
    if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
        raise DumpError(
            f"rollout_top_p_token_offsets has {len(offsets)} entries ending at {offsets[-1] if offsets else '-'} "
            f"for {n} response tokens and {len(ids)} kept ids",
            "slime writes response_length + 1 offsets from 0 to len(rollout_top_p_token_ids)",
        )
    return [ids[a:b] for a, b in zip(offsets, offsets[1:])]


def _facts(s: Any, t: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in ("index", "group_index", "rollout_id"):
        if sample_field(s, k) is not None:
            out[k] = sample_field(s, k)
    for k in ("prefix_cache_info", "spec_info"):
        v = sample_field(s, k)
        if v is not None and not isinstance(v, dict) and hasattr(v, "to_dict"):
            v = v.to_dict()
        if isinstance(v, dict) and any(v.values()):
            out[k] = dict(v)
    meta = sample_field(s, "metadata") or {}
    start = sample_field(s, "routed_experts_start_len")
    start = start if start is not None else (meta.get("routed_experts_start_len") if isinstance(meta, dict) else None)
    if start is not None:
        out["routed_experts_start_len"] = int(start)
    if t is not None and t.get("data_parallel_rank") is not None:
        out["rank"] = int(t["data_parallel_rank"])
    return out


def rollout_row(s: Any, i: int, where: str) -> RolloutRow:
    """A rollout sample's own fields as a RolloutRow (tokens, response_length, loss_mask, rollout_log_probs,
    weight_versions, rollout_routed_experts): what every slime / miles dump has."""
    tokens, rl = sample_field(s, "tokens"), sample_field(s, "response_length")
    if tokens is None or rl is None:
        raise DumpError("no tokens / response_length (a slime Sample has both)", "")
    ids = ints(tokens, "tokens")
    rl = int(rl)
    if not 0 < rl < len(ids):
        raise DumpError(f"response_length {rl} does not fit its {len(ids)} tokens", "")
    versions = sample_field(s, "weight_versions") or []
    mask = sample_field(s, "loss_mask")
    status = sample_field(s, "status")
    status = getattr(status, "value", status)
    return RolloutRow(
        index=i,
        where=where,
        prompt_ids=ids[:-rl],
        response_ids=ids[-rl:],
        rollout_logprobs=floats(sample_field(s, "rollout_log_probs"), "rollout_log_probs"),
        trainer_logprobs=None,
        loss_mask=ints(mask, "loss_mask") if mask is not None else None,
        sampling=None,
        policy_version=",".join(str(v) for v in dict.fromkeys(versions)) or None,
        has_routed_experts=sample_field(s, "rollout_routed_experts") is not None,
        routed_experts=routes_array(sample_field(s, "rollout_routed_experts"), "rollout_routed_experts"),
    )


def sample_row(rec: tuple[Any, Any], i: int, where: str) -> RolloutRow:
    """A rollout sample (and its train sample, or None) as a RolloutRow."""
    s, t = rec
    row = rollout_row(s, i, where)
    n = len(row.response_ids)
    row.kept_ids = _kept_sets(s, n)
    row.facts = _facts(s, t) or None
    if t is not None and t.get("log_probs") is not None:
        lps = floats(t["log_probs"], "log_probs (train dump)")
        if lps is not None and len(lps) != n:
            raise DumpError(
                f"the train dump's log_probs has {len(lps)} entries for {n} response tokens",
                "the train dump is not of this rollout step (or its sample_index does not match)",
            )
        row.trainer_logprobs = lps
    return row
