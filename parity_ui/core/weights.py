"""Did the weights land? The records of a weight-sync check (issue 41).

A running engine that received new weights in flight (RL: the trainer pushes them between steps) is
checked two ways:

- tensors: every unit of the engine's live weights (a parameter, one slice of a fused one such as
  qkv_proj's k rows or one expert of a fused MoE tensor, a persistent buffer) against the same
  checkpoint loaded fresh by the same engine, so both are in the engine's own layout. A unit is equal
  when the bytes read are (SHA-256 of the raw bytes, vLLM's weight_checker's digest); else the size of
  the difference is measured where both tensors can be brought together.
- probe: a short teacher-forced logprob probe of the updated engine against the fresh load and
  against the reference (HF on the checkpoint), judged against the noise floor (core.pooled).

Here only the records and their verdict: no torch, no engine. The engines fill `SideWeights`
(parity_ui.engines.weight_units), analysis.weights compares two of them, commands.weights runs it.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .errors import ConfigError

SCHEMA = 1
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()  # what a digest of an emptied parameter reads (CPU packing)

# How a unit's values were read
READ_PARAM = "param"  # the parameter's (or buffer's) own bytes
READ_KERNEL = "kernel"  # read back through the layer's own kernel on an identity input (vLLM-CPU packs
# its linear weights into oneDNN / its own layout and empties the parameter: no bytes to hash)
READ_NONE = "none"  # not readable here

# A unit's status in the check
EQUAL = "equal"
DIFFERS = "differs"
# Quantised: bytes differ, the dequantised values within one step of the format. NOT landed: a fresh
# load of the same checkpoint by the same engine holds the same bytes, and a tensor left stale by a
# small update (an RL step moves most fp8 values by at most one step) reads exactly so.
TOLERATED = "within one quantisation step"
MISSING = "missing"  # on one side only (another layout, another model)
UNREADABLE = "not readable"
_ORDER = {DIFFERS: 0, MISSING: 1, UNREADABLE: 2, TOLERATED: 3, EQUAL: 4}

# Update paths an updated side can push its weights through (parity_ui.engines.weight_push)
PUSH_PATHS = ("auto", "load_weights", "reload")

# Exit codes of `parity weights`
EXIT_OK, EXIT_DIFFERS, EXIT_ERROR = 0, 1, 2


def checked_regex(key: str, value: str | None) -> re.Pattern[str] | None:
    """A --skip / --zero pattern compiled, or ConfigError naming the key and the regex error."""
    if value in (None, ""):
        return None
    try:
        return re.compile(str(value))
    except re.error as e:
        raise ConfigError(
            key, f"{value!r} is not a regular expression ({e})", "e.g. 'layers\\.3\\.mlp\\.down_proj'"
        ) from e


@dataclass
class TensorDigest:
    """One unit of a side's weights, as its engine read it."""

    rank: str  # "dp0:pp0:pcp0:tp0" (vLLM's weight_checker prefix, without the colon) or "tp0"
    name: str  # the engine's parameter (or buffer) name
    part: str | None  # the slice: "k_proj", "expert 3 up_proj", ...; None: the whole tensor
    sources: list[str]  # the checkpoint tensors this unit is loaded from (where the layout says so)
    index: list[list[int]]  # [start, stop) per leading dimension of the slice; [] = the whole tensor
    shape: list[int]
    dtype: str
    digest: str  # SHA-256 of the bytes read
    read: str = READ_PARAM
    norm: float = 0.0  # L2 norm of the values (float64)
    zero: bool = False  # every value is 0

    @property
    def key(self) -> str:
        return f"{self.rank}|{self.name}" + (f"[{self.part}]" if self.part else "")


@dataclass
class UpdateRecord:
    """What the updated side did: from which checkpoint it started, what it pushed and how."""

    start_from: str
    pushed_from: str
    path: str  # load_weights | reload
    pushed: int = 0  # checkpoint tensors pushed
    skipped: list[str] = field(default_factory=list)  # left out (skip=REGEX)
    zeroed: list[str] = field(default_factory=list)  # pushed as zeros (zero=REGEX: a planted fault)
    sleep: int = 0  # the sleep level around the push (0: none)
    sleep_note: str = ""  # what the sleep cycle did on this build
    seconds: float = 0.0
    where: str = ""  # where it ran ("in process", "2 workers")


@dataclass
class WeightsRequest:
    """Digest every unit. `names`: the compared checkpoint's tensor names (a unit's sources are named
    only where the checkpoint has them); None: trust the layout."""

    names: list[str] | None = None


@dataclass
class DumpRequest:
    """Write the units `keys` (as read; quantised ones dequantised) to `path` ("{rank}" in it: one
    file per rank), for another side to meet them."""

    keys: list[str]
    path: str
    names: list[str] | None = None


@dataclass
class DiffRequest:
    """Meet the units another side dumped at `path` with the live ones: the sizes of the differences."""

    path: str
    names: list[str] | None = None


@dataclass
class SideWeights:
    """A side's answer to a `weights` request: its units, a digest per rank, vLLM's per-parameter digests."""

    units: list[TensorDigest] = field(default_factory=list)
    ranks: dict[str, str] = field(default_factory=dict)  # rank -> SHA-256 over its units' keys and digests
    params: dict[str, str] = field(default_factory=dict)  # "<rank>:<name>" -> SHA-256 of the raw parameter
    readable: bool = True
    why: str = ""  # why not readable (a server without a weight checker, ...)
    how: str = ""  # where the digests came from ("in process", "POST /weight_checker")
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    update: UpdateRecord | None = None  # an updated side: what it pushed (its load did)


@dataclass
class DiffFigure:
    """The size of one unit's difference, measured where both tensors were brought together."""

    key: str
    max_abs: float | None
    rel_l2: float | None  # ||live - ref|| / ||ref|| (inf over a zero reference)
    n_differ: int  # elements that differ (bitwise, or beyond the tolerance when dequantised)
    numel: int
    tolerance: str = ""  # quantised: the format and its tolerance; "" = exact
    within_tolerance: bool = False
    nonfinite: int = 0  # live values that are NaN or infinite (uninitialised memory, a broken push)


@dataclass
class TensorFigure:
    """The check's row for one unit: live (the updated engine) against the fresh load."""

    key: str
    rank: str
    name: str
    part: str | None
    sources: list[str]
    shape: list[int]
    dtype: str
    status: str  # EQUAL | DIFFERS | TOLERATED | MISSING | UNREADABLE
    live_digest: str | None
    ref_digest: str | None
    read: str = READ_PARAM
    max_abs: float | None = None
    rel_l2: float | None = None
    n_differ: int | None = None
    numel: int | None = None
    live_zero: bool = False  # the live values are all zero while the reference's are not
    nonfinite: int = 0  # live values that are NaN or infinite
    norm_live: float | None = None
    norm_ref: float | None = None
    note: str = ""

    @property
    def label(self) -> str:
        """How a person reads it: the checkpoint's name where one source, else the engine's with its slice."""
        if len(self.sources) == 1 and self.part is not None:
            return f"{self.sources[0]} (in {self.name})"
        return self.name + (f"[{self.part}]" if self.part else "")


def ordered(figures: list[TensorFigure]) -> list[TensorFigure]:
    """Differing units first, then missing, unreadable, tolerated, equal; the model's order within each."""
    return [f for _, f in sorted(enumerate(figures), key=lambda x: (_ORDER.get(x[1].status, 9), x[0]))]


@dataclass
class ProbeComparison:
    """One pairing of the probe (the updated side against the fresh load, or against the reference),
    its token figures and its verdict against its floor."""

    side: str
    against: str
    floor: str  # what the floor is: "fresh against itself", "fresh against hf"
    tokens: int
    abs_dlogp_max: float | None
    abs_dlogp_mean: float | None
    floor_abs_dlogp_max: float | None
    floor_abs_dlogp_mean: float | None
    verdict: str  # core.pooled's: "within noise" | "exceeds noise" | "too few prompts to tell" | "not comparable"
    summary: str
    exceeded: list[str] = field(default_factory=list)
    first_token: int | None = None  # the first probe token (in probe order) whose gap leaves the floor
    judged: bool = True  # False: shown, not part of the verdict (a server against the local fresh load)

    @property
    def at_floor(self) -> bool:
        return self.verdict == "within noise"


@dataclass
class ProbeRecord:
    """The behavioural probe: which tokens, and each comparison's verdict."""

    sequences: int
    tokens: int  # forced tokens scored per side
    comparisons: list[ProbeComparison] = field(default_factory=list)
    coverage: str = ""  # MoE: how many (layer, expert) pairs the probe routed to, as the reference saw it
    seconds: float = 0.0
    note: str = ""

    @property
    def judged(self) -> bool:
        """Whether any comparison is part of the verdict (none is where no floor was measured)."""
        return any(c.judged for c in self.comparisons)

    @property
    def at_floor(self) -> bool:
        judged = [c for c in self.comparisons if c.judged]
        return bool(judged) and all(c.at_floor for c in judged)


@dataclass
class WeightReport:
    """A weight-sync check, whole: what `parity weights --json` prints and the store keeps."""

    model: str  # the checkpoint the engine should serve now (B)
    start_from: str | None  # where the updated side started (A); None: a server updated elsewhere
    updated: str  # the updated side's name and kind
    fresh: str  # the fresh load's side
    reference: str | None  # the probe's reference side (hf on B)
    run_id: str = ""
    tensors: list[TensorFigure] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)  # rank, live, ref, equal
    readable: bool = True
    not_readable: str = ""  # why the tensors could not be read (the probe alone then)
    update: UpdateRecord | None = None
    probe: ProbeRecord | None = None
    unknown: list[str] = field(default_factory=list)  # checkpoint tensors the engine has no place for
    timings: dict[str, float] = field(default_factory=dict)  # tensor_check_s, probe_s, ...
    notes: list[str] = field(default_factory=list)
    error: str = ""
    schema: int = SCHEMA

    @property
    def differing(self) -> list[TensorFigure]:
        return [t for t in self.tensors if t.status in (DIFFERS, MISSING, TOLERATED)]

    @property
    def tensors_equal(self) -> bool:
        """Every unit read on both sides is equal bit for bit, none missing (a quantised unit within one
        step of the format is not: see TOLERATED)."""
        checked = any(t.status == EQUAL for t in self.tensors)
        return self.readable and checked and not self.differing and not self.unknown

    @property
    def probe_at_floor(self) -> bool:
        return self.probe is not None and self.probe.at_floor

    @property
    def exit_code(self) -> int:
        """0: every tensor equal (or, where none can be read, the probe alone) and the probe at the floor;
        1: a tensor differs or the probe is above the floor; 2: the check could not run."""
        if self.error:
            return EXIT_ERROR
        # A probe shown but not judged (no floor measured) counts for nothing either way: not a failure
        # of the weights, and no evidence where the tensors cannot be read.
        judged_probe = self.probe is not None and self.probe.judged
        if not judged_probe and not self.readable:
            return EXIT_ERROR
        tensors_ok = self.tensors_equal if self.readable else True
        probe_ok = self.probe_at_floor if judged_probe else True
        return EXIT_OK if tensors_ok and probe_ok else EXIT_DIFFERS

    @property
    def verdict(self) -> str:
        return {EXIT_OK: "LANDED", EXIT_DIFFERS: "NOT LANDED", EXIT_ERROR: "ERROR"}[self.exit_code]

    def headline(self) -> str:
        if self.error:
            return f"weights check failed: {self.error}"
        parts = []
        if not self.readable:
            parts.append(f"tensors not readable ({self.not_readable}): probe only")
        else:
            d = self.differing
            unchecked = sum(t.status == UNREADABLE for t in self.tensors)
            n = len(self.tensors) - unchecked
            parts.append(f"all {n} tensors equal" if not d and not self.unknown else f"{len(d)} of {n} tensors differ")
            if unchecked:
                parts[-1] += f" ({unchecked} not checked)"
            if d:
                parts[-1] += ": " + ", ".join(t.label for t in d[:3]) + (" ..." if len(d) > 3 else "")
            near = sum(t.status == TOLERATED for t in d)
            if near:
                parts.append(
                    f"{near} of them within one quantisation step (a fresh load holds the same bytes; a tensor "
                    "stale by a small update reads so)"
                )
            if self.unknown:
                parts.append(f"{len(self.unknown)} checkpoint tensors unknown to the engine")
        if self.probe is not None and not self.probe.judged:
            parts.append("probe shown, not judged (no floor measured)")
        elif self.probe is not None:
            parts.append("probe at the floor" if self.probe.at_floor else "probe above the floor")
        return f"{self.verdict}: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: a non-finite number (an infinite relative difference over a zero reference, the
        norm of an integer tensor) is written as its name ("inf", "nan")."""
        return _jsonable(self._dict())

    def _dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tensors"] = [{**asdict(t), "label": t.label} for t in self.tensors]
        d["differing"] = [t.key for t in self.differing]
        d["tensors_equal"] = self.tensors_equal
        d["probe_at_floor"] = self.probe_at_floor
        d["exit_code"] = self.exit_code
        d["verdict"] = self.verdict
        d["headline"] = self.headline()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WeightReport:
        def only(kind: type, data: dict[str, Any]) -> Any:
            names = {f.name for f in fields(kind)}
            return kind(**{k: v for k, v in data.items() if k in names})

        probe = d.get("probe")
        if probe is not None:
            probe = only(ProbeRecord, probe)
            probe.comparisons = [only(ProbeComparison, c) for c in probe.comparisons]
        update = d.get("update")
        out = only(cls, d)
        out.tensors = [only(TensorFigure, {k: _number(v) for k, v in t.items()}) for t in d.get("tensors") or []]
        for t in out.tensors:
            if t.status == "within tolerance":  # schema 1's name, read by the rule of now (not landed)
                t.status = TOLERATED
        out.probe = probe
        out.update = only(UpdateRecord, update) if update else None
        return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


def _number(v: Any) -> Any:
    return float(v) if v in ("inf", "-inf", "nan") else v


# -- the probe's tokens ----------------------------------------------------------------------------------

# Fixed texts of different kinds (code, prose, numbers, markup, another language): every token passes
# through every layer; varied tokens reach varied experts of a mixture-of-experts model.
PROBE_TEXTS = (
    "def merge(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0) if a[0] < b[0] else b.pop(0))\n"
    "    return out + a + b\n",
    "The committee met on Tuesday to review the budget. After a long discussion, they agreed to postpone "
    "the vote until the auditors had finished their report.",
    "1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181, 6765",
    '{"id": 42, "name": "parity", "tags": ["vllm", "hf"], "ok": true, "ratio": 0.875, "items": [1, 2, 3]}',
    "# Installation\n\n1. Create a virtual environment.\n2. Run `pip install -e .`\n3. Start the app with `make app`.",
    "Le chat dort sur le canape pendant que la pluie tombe doucement sur les toits de la ville endormie.",
    "import os\nimport sys\n\nclass Path:\n    def __init__(self, *parts):\n        self.parts = [str(p) for p in parts]\n",
    'for f in *.log; do grep -c error "$f" >> counts.txt; done && sort -n counts.txt | tail -3',
)
PROBE_SEED = 41


def probe_sequences(
    encode: Any, vocab_size: int, tokens: int = 256, sequences: int = 8, seed: int = PROBE_SEED
) -> list[list[int]]:
    """`sequences` id sequences of ceil(tokens / sequences) + 1 ids each (the first id is the context,
    the rest are forced and scored: `tokens` scored tokens in all): the fixed texts encoded by `encode`
    (text -> ids), cut to length, or filled with seeded random ids where a text is shorter or the set
    has fewer texts. Deterministic for a tokenizer."""
    import random

    if tokens < 1 or sequences < 1:
        raise ConfigError("probe_tokens", f"{tokens} tokens in {sequences} sequences", "at least 1 of each")
    rng = random.Random(seed)
    length = -(-tokens // sequences) + 1
    out = []
    for i in range(sequences):
        ids = list(encode(PROBE_TEXTS[i % len(PROBE_TEXTS)]))[:length] if i < len(PROBE_TEXTS) else []
        while len(ids) < length:
            ids.append(rng.randrange(vocab_size))
        out.append(ids)
    return out
