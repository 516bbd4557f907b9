"""Weights pushed into a running vLLM the way RL frameworks push them (issue 41): an iterator of
(name, tensor) into the model's loader, in every worker through `collective_rpc`, optionally around
a sleep/wake cycle, with chosen tensors left out or zeroed (the planted faults a check must catch).

Two update paths, both vLLM's own:
- load_weights: `model.load_weights(weights)` in each worker (TRL's, verl's and OpenRLHF's vLLM
  worker extensions; vLLM's IPC weight-transfer engine too). Writes the checkpoint tensors into the
  parameters as they are laid out after loading. vLLM's CPU build cannot take it: it packs linear
  weights into its kernels and empties the parameters ("Attempted to load weight ... into parameter
  (torch.Size([0]))"); the mapper refuses it there.
- reload: `worker.reload_weights(weights_iterator=...)` (vLLM 0.26 and 0.32): layerwise reloading,
  which restores each layer's checkpoint-format parameters, loads, and runs the layer's
  post-loading processing again (CPU packing, quantisation). What vLLM's own weight-transfer engines
  do for checkpoint-format weights.

Each worker reads the checkpoint itself (safetensors only: nothing is unpickled), so no tensor crosses
the RPC: the function and a few strings do.

Sleep: `llm.sleep(level)`, `llm.wake_up(tags=["weights"])`, the push, `llm.wake_up(tags=["kv_cache"])`:
the order verl and TRL use (level 1 offloads the weights to host memory and brings them back; level 2
discards them, so a tensor left out of the push holds whatever the re-allocated memory holds). vLLM's
CPU build has no sleep mode: its worker logs and ignores sleep and wake_up, and enable_sleep_mode is
refused on the platform; the cycle then pauses and resumes the scheduler only, and says so.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.weights import UpdateRecord
from .base import EngineFault

CPU_SLEEP_NOTE = (
    "vLLM's CPU build has no sleep mode (its CPU worker logs 'sleep mode is not supported on CPU, ignore it' "
    "and enable_sleep_mode is refused on the platform): the cycle paused and resumed the scheduler and reset "
    "the prefix cache, and the weights stayed resident"
)


def checkpoint_files(folder: str) -> list[str]:
    """A checkpoint's safetensors files. A folder with only PyTorch .bin files is refused: reading them
    means unpickling."""
    p = Path(folder)
    files = sorted(str(f) for f in p.glob("*.safetensors"))
    if not files:
        bins = sorted(f.name for f in p.glob("*.bin"))
        raise EngineFault(
            f"{folder} has no .safetensors files"
            + (f" (it has {', '.join(bins[:3])}: PyTorch pickles)" if bins else ""),
            "save the checkpoint as safetensors (model.save_pretrained(folder, safe_serialization=True)); "
            "parity-ui never unpickles a checkpoint",
            fatal=True,
        )
    return files


class Pushed:
    """What one worker's iterator handed over, filled as the loader consumes it."""

    def __init__(self) -> None:
        self.pushed: list[str] = []
        self.skipped: list[str] = []
        self.zeroed: list[str] = []


def checkpoint_items(folder: str, skip: str | None, zero: str | None, into: Pushed) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of every tensor of the checkpoint, in file order; names matching `skip` left out,
    those matching `zero` handed over as zeros."""
    import torch
    from safetensors import safe_open

    skip_re = re.compile(skip) if skip else None
    zero_re = re.compile(zero) if zero else None
    for path in checkpoint_files(folder):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                if skip_re is not None and skip_re.search(name):
                    into.skipped.append(name)
                    continue
                t = f.get_tensor(name)
                if zero_re is not None and zero_re.search(name):
                    t = torch.zeros_like(t)
                    into.zeroed.append(name)
                into.pushed.append(name)
                yield name, t


def push_in_worker(worker: Any, folder: str, skip: str | None, zero: str | None, path: str) -> dict[str, Any]:
    """One worker's push (collective_rpc's function): the checkpoint's tensors through `path`."""
    from .weight_units import model_of

    t0 = time.perf_counter()
    got = Pushed()
    items = checkpoint_items(folder, skip, zero, got)
    if path == "reload":
        worker.reload_weights(weights_iterator=items, is_checkpoint_format=True)
    else:
        model_of(worker).load_weights(items)
    return {
        "pushed": got.pushed,
        "skipped": got.skipped,
        "zeroed": got.zeroed,
        "seconds": time.perf_counter() - t0,
        "pid": os.getpid(),
    }


def items_in_worker(worker: Any, items: list[tuple[str, Any]], path: str) -> dict[str, Any]:
    """One in-process worker's push of tensors it is handed (a training script's state dict): the same
    two paths. Only with vLLM's in-process executor do the tensors arrive without a copy."""
    from .weight_units import model_of

    t0 = time.perf_counter()
    if path == "reload":
        worker.reload_weights(weights_iterator=iter(items), is_checkpoint_format=True)
    else:
        model_of(worker).load_weights(iter(items))
    return {"pushed": [n for n, _ in items], "skipped": [], "zeroed": [], "seconds": time.perf_counter() - t0}


def sleep_supported() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


def push(
    llm: Any,
    folder: str,
    *,
    skip: str | None = None,
    zero: str | None = None,
    sleep: int = 0,
    path: str = "reload",
    start_from: str = "",
) -> UpdateRecord:
    """Push `folder`'s weights into the running `llm` (a vllm.LLM) through `path`, around a sleep/wake
    cycle of level `sleep` (0: none). Raises EngineFault naming what went wrong."""
    return _cycle(llm, (push_in_worker, (folder, skip, zero, path)), path, sleep, start_from, folder)


def push_state_dict(
    llm: Any,
    state_dict: dict[str, Any],
    *,
    skip: str | None = None,
    zero: str | None = None,
    sleep: int = 0,
    path: str = "reload",
) -> UpdateRecord:
    """Push a state dict's tensors (checkpoint names) into an in-process `llm`, as a trainer does between
    steps; `skip` / `zero` plant the same faults as for a folder."""
    import torch

    skip_re = re.compile(skip) if skip else None
    zero_re = re.compile(zero) if zero else None
    items, skipped, zeroed = [], [], []
    for name, t in state_dict.items():
        if skip_re is not None and skip_re.search(name):
            skipped.append(name)
            continue
        if zero_re is not None and zero_re.search(name):
            zeroed.append(name)
            t = torch.zeros_like(t)
        items.append((name, t.detach()))
    rec = _cycle(llm, (items_in_worker, (items, path)), path, sleep, "", "(state dict)")
    rec.skipped, rec.zeroed = skipped, zeroed
    return rec


def _cycle(
    llm: Any, call: tuple[Any, tuple[Any, ...]], path: str, sleep: int, start_from: str, source: str
) -> UpdateRecord:
    """The push `call` (a worker function and its arguments) around the sleep cycle, its faults explained."""
    t0 = time.perf_counter()
    note = ""
    if sleep:
        llm.sleep(level=sleep)
        llm.wake_up(tags=["weights"])
        note = (
            f"sleep(level={sleep}), wake_up(tags=['weights']), push, wake_up(tags=['kv_cache'])"
            if sleep_supported()
            else CPU_SLEEP_NOTE
        )
    try:
        answers = llm.collective_rpc(call[0], args=call[1])
    except AssertionError as e:
        raise EngineFault(
            f"the push through {path} failed in vLLM's loader: {e}",
            "use update_path=reload (vLLM's reload_weights re-runs each layer's post-loading processing)"
            if path == "load_weights"
            else "check that the checkpoint has this model's layout",
            fatal=True,
        ) from e
    except (KeyError, ValueError) as e:
        raise EngineFault(
            f"vLLM's loader refused a tensor of {source}: {e}",
            "push a checkpoint of the model the engine runs (the same architecture and tensor names)",
            fatal=True,
        ) from e
    finally:
        if sleep:
            llm.wake_up(tags=["kv_cache"])
    llm.reset_prefix_cache()  # KV blocks cached from the old weights must not be reused
    first = answers[0]
    return UpdateRecord(
        start_from=start_from,
        pushed_from=source,
        path=path,
        pushed=len(first["pushed"]),
        skipped=list(first["skipped"]),
        zeroed=list(first["zeroed"]),
        sleep=sleep,
        sleep_note=note,
        seconds=time.perf_counter() - t0,
        where=f"{len(answers)} worker{'s' if len(answers) != 1 else ''}",
    )
