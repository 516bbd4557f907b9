"""Two checkpoints of one model told apart before any weight loads (issue 41): the tensors a
checkpoint holds (names, dtypes, shapes from the safetensors headers: 8-byte length + JSON, nothing
loaded, nothing unpickled) and the problems of pushing one into an engine that loaded the other.

- another architecture or shape (config.json: architectures, layers, widths, heads, experts,
  vocabulary) is named before loading;
- a tensor of the pushed checkpoint the started one does not have is listed by name (the engine was
  built from the started one: it has no place for it), not guessed at;
- a tensor of the same name with another shape is listed with both shapes;
- a tensor the pushed checkpoint lacks stays as the engine loaded it: listed as a warning.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ModelError

# config.json keys that make two checkpoints another model, not another version of one
SHAPE_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "moe_intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "num_experts",
    "n_routed_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "tie_word_embeddings",
)
SHOWN = 8  # names listed in a message before "and N more"


@dataclass
class TensorIndex:
    """A checkpoint's tensors, read from the safetensors headers."""

    folder: str
    tensors: dict[str, tuple[str, list[int]]]  # name -> (dtype, shape)
    files: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return list(self.tensors)


def read_header(path: str | Path) -> tuple[int, dict[str, Any]]:
    """A .safetensors file's header: (its length n, the JSON) from its first 8 + n bytes; the tensors'
    data start at byte 8 + n."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return n, json.loads(fh.read(n))


def tensor_index(folder: str | Path) -> TensorIndex:
    """Every tensor of a checkpoint folder's .safetensors files. Raises ModelError for a folder without
    them (PyTorch .bin files are pickles: parity-ui does not open them)."""
    p = Path(folder)
    files = sorted(p.glob("*.safetensors"))
    if not files:
        bins = sorted(f.name for f in p.glob("*.bin"))
        raise ModelError(
            f"{p} has no .safetensors files" + (f" ({', '.join(bins[:3])}: PyTorch pickles)" if bins else ""),
            "save the checkpoint as safetensors (save_pretrained(folder, safe_serialization=True)); "
            "parity-ui never unpickles a checkpoint",
        )
    tensors: dict[str, tuple[str, list[int]]] = {}
    for f in files:
        try:
            _, header = read_header(f)
        except (OSError, struct.error, ValueError) as e:
            raise ModelError(
                f"{f} is not a readable safetensors file ({e})", "give a checkpoint saved with safetensors"
            ) from e
        for k, v in header.items():
            if k != "__metadata__":
                tensors[k] = (str(v.get("dtype")), [int(x) for x in v.get("shape", [])])
    return TensorIndex(str(p), tensors, [str(f) for f in files])


def _locations(folder: str | Path) -> dict[str, tuple[str, int, int]]:
    """name -> (file, first byte, end byte) of every tensor's data in a checkpoint's .safetensors files."""
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        n, header = read_header(f)
        for k, v in header.items():
            if k != "__metadata__":
                begin, end = v["data_offsets"]
                out[k] = (str(f), 8 + n + int(begin), 8 + n + int(end))
    return out


def changed_tensors(a: str | Path, b: str | Path, names: list[str], chunk: int = 1 << 24) -> list[str]:
    """Which of `names` hold other bytes in checkpoint `b` than in `a` (a tensor only one holds counts as
    changed). Reads only those tensors' bytes, in chunks."""
    where_a, where_b = _locations(a), _locations(b)
    changed = []
    for name in names:
        la, lb = where_a.get(name), where_b.get(name)
        if la is None or lb is None or la[2] - la[1] != lb[2] - lb[1]:
            changed.append(name)
            continue
        with open(la[0], "rb") as fa, open(lb[0], "rb") as fb:
            fa.seek(la[1])
            fb.seek(lb[1])
            left = la[2] - la[1]
            while left > 0:
                size = min(chunk, left)
                if fa.read(size) != fb.read(size):
                    changed.append(name)
                    break
                left -= size
    return changed


def _config(folder: str | Path) -> dict[str, Any]:
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{folder}/config.json cannot be read ({e})", "give a Hugging Face model folder") from e
    return dict(cfg.get("text_config", cfg), architectures=cfg.get("architectures"))


def _listed(names: list[str]) -> str:
    head = ", ".join(names[:SHOWN])
    return head + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


@dataclass
class Compatibility:
    """What pushing `pushed` into an engine started from `started` would meet, before loading."""

    errors: list[str] = field(default_factory=list)  # another model, unknown or reshaped tensors
    warnings: list[str] = field(default_factory=list)  # tensors the push leaves as loaded
    unknown: list[str] = field(default_factory=list)  # tensors of `pushed` the started checkpoint lacks
    not_pushed: list[str] = field(default_factory=list)


def compatibility(started: str | Path, pushed: str | Path) -> Compatibility:
    """Another architecture or shape, unknown tensors, reshaped tensors: named, from the headers."""
    out = Compatibility()
    a, b = _config(started), _config(pushed)
    if (a.get("architectures") or [None])[0] != (b.get("architectures") or [None])[0]:
        out.errors.append(
            f"{pushed} is a {(b.get('architectures') or ['?'])[0]}, the engine was started from "
            f"{started}, a {(a.get('architectures') or ['?'])[0]}"
        )
    shape = [f"{k} {a.get(k)} -> {b.get(k)}" for k in SHAPE_KEYS if a.get(k) != b.get(k)]
    if shape:
        out.errors.append(f"{pushed} has another shape than {started}: " + ", ".join(shape))
    ta, tb = tensor_index(started), tensor_index(pushed)
    out.unknown = [n for n in tb.tensors if n not in ta.tensors]
    if out.unknown:
        out.errors.append(
            f"{len(out.unknown)} tensor(s) of {pushed} are unknown to an engine started from {started}: "
            + _listed(out.unknown)
        )
    reshaped = [
        f"{n} {ta.tensors[n][1]} -> {tb.tensors[n][1]}"
        for n in tb.tensors
        if n in ta.tensors and ta.tensors[n][1] != tb.tensors[n][1]
    ]
    if reshaped:
        out.errors.append(f"{len(reshaped)} tensor(s) change shape: " + _listed(reshaped))
    out.not_pushed = [n for n in ta.tensors if n not in tb.tensors]
    if out.not_pushed:
        out.warnings.append(
            f"{len(out.not_pushed)} tensor(s) of {started} are not in {pushed} and stay as loaded: "
            + _listed(out.not_pushed)
        )
    return out
