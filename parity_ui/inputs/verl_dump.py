"""verl's rollout skip dump (`skip.rollout.enable=true`), one step of it:
`<dump_dir>/<exp>_<project>/GBS{gbs}_N{n}_in{p}_out{r}/<step>/gen_batch.dp` and `meta.json`
(`{"global_steps": step}`, written after the batch: the step's completion marker).

`gen_batch.dp` is `pickle.dump` of a `verl.protocol.DataProto` (verl/utils/skip/rollout_skip.py,
verl/protocol.py `save_to_disk`): loading it imports verl and tensordict and runs whatever the file
names, so it is read only with trust_pickle AND where verl can be imported; elsewhere it is refused
with `CONVERT`, a snippet that writes parity-ui's rollout format from it in verl's own environment.
The batch, as the agent loop makes it (verl/experimental/agent_loop/agent_loop.py `_postprocess`):
`prompts` [B, P] (left-padded), `responses` [B, R] (right-padded), `response_mask` [B, R] (1 = a token
the model generated, 0 = a tool's or padding), `attention_mask` [B, P + R], `rollout_log_probs` [B, R]
(when the rollout returns logprobs), `routed_experts` [B, P + R, layers, top_k] (MoE, when recorded: the engine's rows placed from the
prompt's first real token). No trainer logprobs: a
replay of it needs the trainer as an engine.

May import: core (the package's rule).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .rollout_rows import DumpError, RolloutRow

GEN_BATCH = "gen_batch.dp"
META = "meta.json"

CONVERT = """# run where verl is installed (the environment that wrote the dump)
import json
from verl.protocol import DataProto

dp = DataProto.load_from_disk("STEP_DIR/gen_batch.dp")
b, P = dp.batch, dp.batch["prompts"].shape[1]
with open("STEP_DIR/rollouts.jsonl", "w") as f:
    for i in range(len(dp)):
        keep = b["attention_mask"][i]
        n = int(keep[P:].sum())
        row = {"prompt_ids": b["prompts"][i][keep[:P].bool()].tolist(),
               "response_ids": b["responses"][i][:n].tolist(),
               "loss_mask": (b["response_mask"][i][:n].tolist() if "response_mask" in b.keys() else [1] * n)}
        if "rollout_log_probs" in b.keys():
            row["rollout_logprobs"] = b["rollout_log_probs"][i][:n].tolist()
        f.write(json.dumps(row) + "\\n")"""


def is_step_dir(p: Path) -> bool:
    return p.is_dir() and (p / GEN_BATCH).is_file()


def step_dir_of(p: Path) -> Path:
    return p if p.is_dir() else p.parent


def step_number(step_dir: Path) -> int | None:
    """The step: meta.json's global_steps, else the directory's name."""
    meta = step_dir / META
    if meta.is_file():
        try:
            got = json.loads(meta.read_text())
            if isinstance(got, dict) and isinstance(got.get("global_steps"), int):
                return int(got["global_steps"])
        except ValueError:
            pass
    return int(step_dir.name) if step_dir.name.isdigit() else None


def verl_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("verl") is not None and importlib.util.find_spec("tensordict") is not None


def load(step_dir: Path, trust_pickle: bool) -> Any:
    """The step's DataProto. Raises DumpError: a pickle not trusted, verl not importable (with the
    conversion snippet), a file cut short."""
    path = step_dir / GEN_BATCH
    snippet = CONVERT.replace("STEP_DIR", str(step_dir))
    if not trust_pickle:
        raise DumpError(
            f"{path} is a pickle of verl's DataProto: loading it runs whatever code the file names, so "
            "parity-ui will not load it unasked",
            "if you trust the file (your run wrote it), pass --trust-pickle (verl and tensordict must be "
            f"importable here); or convert it to parity-ui's rollout format where verl is installed:\n{snippet}",
        )
    if not verl_importable():
        raise DumpError(
            f"{path} is a pickle of verl's DataProto and verl / tensordict cannot be imported here",
            f"convert it to parity-ui's rollout format where verl is installed, then replay the .jsonl:\n{snippet}",
        )
    import pickle

    try:
        with path.open("rb") as f:
            return pickle.load(f)  # noqa: S301 - trust_pickle: the user said the file is theirs
    except EOFError:
        raise DumpError(
            f"{path} ends early (a truncated pickle)", "wait for the step to finish, or copy it again"
        ) from None
    except Exception as e:  # noqa: BLE001 - whatever the classes it names raise
        raise DumpError(
            f"{path} could not be unpickled ({type(e).__name__}: {str(e)[:200]})",
            f"load it with the verl version that wrote it, or convert it there:\n{snippet}",
        ) from None


def records(data: Any) -> Iterator[tuple[int, str, Any]]:
    """One (i, where, record) per sample of a DataProto (or anything with `.batch`, a mapping of
    [B, ...] tensors, and `.meta_info`)."""
    batch = getattr(data, "batch", None)
    if batch is None or not hasattr(batch, "keys"):
        raise DumpError("the pickle holds no DataProto batch", "give verl's gen_batch.dp (skip.rollout dump) of a step")
    need = [k for k in ("prompts", "responses", "attention_mask") if k not in batch.keys()]
    if need:
        raise DumpError(
            f"the DataProto batch has no {', '.join(need)} (its keys: {', '.join(sorted(batch.keys()))})",
            "a gen_batch.dp from verl's agent loop holds prompts, responses and attention_mask",
        )
    for i in range(int(batch["prompts"].shape[0])):
        yield i, f"sample {i}", (batch, i, getattr(data, "meta_info", None) or {})


def row(rec: tuple[Mapping[str, Any], int, dict[str, Any]], i: int, where: str) -> RolloutRow:
    batch, b, meta = rec
    width = int(batch["prompts"].shape[1])
    keep = [int(x) for x in batch["attention_mask"][b].tolist()]
    prompt = [int(t) for t, k in zip(batch["prompts"][b].tolist(), keep[:width]) if k]
    n = sum(keep[width:])
    response = [int(t) for t in batch["responses"][b].tolist()[:n]]
    if not prompt or not response:
        raise DumpError(f"{'no prompt' if not prompt else 'no response'} token under its attention mask", "")
    keys = set(batch.keys())
    mask = [int(x) for x in batch["response_mask"][b].tolist()[:n]] if "response_mask" in keys else None
    lps = [float(x) for x in batch["rollout_log_probs"][b].tolist()[:n]] if "rollout_log_probs" in keys else None
    routes = None
    if "routed_experts" in keys:  # [P + R, layers, top_k]: the engine's rows placed after the prompt's left padding
        import numpy as np

        start = width - len(prompt)
        routes = np.asarray(batch["routed_experts"][b].cpu().numpy())[start : start + len(prompt) + n - 1]
    step = meta.get("global_steps") if isinstance(meta, dict) else None
    return RolloutRow(
        index=i,
        where=where,
        prompt_ids=prompt,
        response_ids=response,
        rollout_logprobs=lps,
        loss_mask=mask,
        policy_version=None if step is None else str(step),
        has_routed_experts=routes is not None,
        routed_experts=routes,
    )
