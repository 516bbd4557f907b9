"""The records that flow end to end: a side's output, the comparison of two sides, the run.

Plain dataclasses with typed fields, picklable (they cross process boundaries, also into a worker
that runs under another environment's interpreter: keep them plain data) and convertible to
JSON-ready dicts with `to_dict` / `*_from_dict` (they are stored in SQLite and printed by the CLI).

Nothing here names an engine: results are keyed by side name, and a comparison holds its two
sides' names (`a` is the reference).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Literal, overload

from .findings import (
    CrossScores,
    Explanation,
    ProbeReport,
    cross_scores_from_json,
    explanation_from_json,
    probe_report_from_json,
)
from .kept_mass import SAMPLING_COLUMNS  # noqa: F401 - re-exported: the sampling measure's step columns
from .measures import RECORDS, STEP_COLUMNS, read_records
from .routes import Routes, routes_from_json
from .workload_record import WorkloadReport, report_from_json

if TYPE_CHECKING:
    from .bisect_record import BisectReport

RunStatus = Literal["running", "ok", "diverged", "error", "cancelled", "interrupted"]
RUN_STATUSES: tuple[str, ...] = ("running", "ok", "diverged", "error", "cancelled", "interrupted")


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    logprob: float
    text: str
    raw: str | None = None  # the token's bytes as hex, set only when `text` cannot show them (U+FFFD)


@dataclass
class TokenStep:
    """One generated position of one side."""

    position: int
    token_id: int
    text: str
    logprob: float | None  # of the chosen token, float32 log-softmax of the side's logits
    rank: int | None  # 1 = the side's own argmax
    top: list[TopLogprob] = field(default_factory=list)  # best first
    raw: str | None = None  # bytes as hex when `text` is lossy (a partial UTF-8 byte token)
    # The optional columns, each declared by its measure (core.measures STEP_COLUMNS; None: not recorded).
    # Sampled decoding (the sampling measure, parity_ui.engines.shared_seed):
    margin: float | None = None  # the perturbed top-2 gap of a shared-seed draw, nats (1e30: one token kept)
    kept: int | None = None  # tokens in the kept set the token was drawn from
    kept_mass: float | None = None  # S: that set's mass under this side's raw distribution
    processed_logprob: float | None = None  # the token's logprob at temperature T, renormalised over the kept set
    kept_hash: int | None = None  # the kept set's fingerprint: equal on two sides = the same kept set
    # The whole distribution against the reference at this position (the distribution measure, core.distribution):
    kl: float | None = None  # KL(ref ‖ side), nats
    kl_rev: float | None = None  # KL(side ‖ ref), nats
    tv: float | None = None  # total variation distance
    top1: int | None = None  # 1: the same argmax on both sides
    topk: int | None = None  # 1: the reference's argmax is among the side's top k


class StepColumns(Sequence[TokenStep]):
    """A side's steps held as columns: how the store keeps them and reads them back.

    Reopening a stored 16k-token pair used to build 32k TokenSteps and 164k TopLogprobs (~0.4 s)
    before the view could read a single one. Here the views read whole columns (`column`,
    `top_logprobs`) and a TokenStep, with its top-k, is built only for a position read as one
    (and kept). It is a read-only Sequence[TokenStep], equal to the list it was made from; engines
    build plain lists. Plain data: it pickles and crosses processes like the records around it.

    Columns: position, token_id, text, logprob, rank (one entry per step); the top-k flat, best
    first per step (top_token_id, top_logprob, top_text), `top_n` entries for each step; the few
    byte strings (`raw`, `top_raw`) sparse, as {index: hex}."""

    STEP = ("position", "token_id", "text", "logprob", "rank")
    TOP = ("top_token_id", "top_logprob", "top_text")
    OPTIONAL = STEP_COLUMNS  # the measures' columns: one entry per step where recorded, else None (absent)
    __slots__ = (*STEP, *TOP, *OPTIONAL, "top_n", "raw", "top_raw", "_starts", "_built")
    # The fixed columns' types (the optional ones, declared by the measures, are read by name).
    position: list[int]
    token_id: list[int]
    text: list[str]
    logprob: list[float | None]
    rank: list[int | None]
    top_token_id: list[int]
    top_logprob: list[float]  # (None where a stored value was NaN)
    top_text: list[str]
    top_n: list[int]
    raw: dict[int, str]
    top_raw: dict[int, str]

    def __init__(self, columns: dict[str, Any]):
        for name in (*self.STEP, *self.TOP, "top_n"):
            setattr(self, name, columns[name])
        for name in self.OPTIONAL:
            setattr(self, name, columns.get(name))
        # JSON object keys are strings: the sparse byte columns are keyed by int here.
        self.raw = {int(k): v for k, v in (columns.get("raw") or {}).items()}
        self.top_raw = {int(k): v for k, v in (columns.get("top_raw") or {}).items()}
        if (
            len({len(columns[n]) for n in (*self.STEP, "top_n")}) != 1
            or len({len(columns[n]) for n in self.TOP} | {sum(self.top_n)}) != 1
        ):
            raise ValueError("step columns of different lengths: the stored steps are damaged")
        self._starts: list[int] | None = None
        self._built: dict[int, TokenStep] = {}

    @classmethod
    def from_steps(cls, steps: Sequence[TokenStep]) -> StepColumns:
        if isinstance(steps, StepColumns):
            return steps
        tops = [t for s in steps for t in s.top]
        optional = {
            name: [getattr(s, name) for s in steps]
            for name in cls.OPTIONAL
            if any(getattr(s, name) is not None for s in steps)
        }
        return cls(
            {
                **optional,
                "position": [s.position for s in steps],
                "token_id": [s.token_id for s in steps],
                "text": [s.text for s in steps],
                "logprob": [s.logprob for s in steps],
                "rank": [s.rank for s in steps],
                "top_n": [len(s.top) for s in steps],
                "top_token_id": [t.token_id for t in tops],
                "top_logprob": [t.logprob for t in tops],
                "top_text": [t.text for t in tops],
                "raw": {i: s.raw for i, s in enumerate(steps) if s.raw},
                "top_raw": {i: t.raw for i, t in enumerate(tops) if t.raw},
            }
        )

    def columns(self) -> dict[str, Any]:
        """JSON-ready columns (what from_steps or the store made it from)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in (*self.STEP, "top_n", *self.TOP)}
        out["raw"] = {str(k): v for k, v in self.raw.items()}
        out["top_raw"] = {str(k): v for k, v in self.top_raw.items()}
        out.update({name: getattr(self, name) for name in self.OPTIONAL if getattr(self, name) is not None})
        return out

    def column(self, name: str) -> list[Any]:
        """One step field for every position: "token_id", "text", "logprob", "rank", "position"."""
        if name in self.OPTIONAL:
            return getattr(self, name) or [None] * len(self)
        if name not in self.STEP:
            raise KeyError(f"no step column {name!r}; columns: {', '.join(self.STEP)}")
        return getattr(self, name)

    def top_logprobs(self, j: int) -> list[float | None]:
        """Every position's j-th best logprob (0 = best), None where its top-k is shorter."""
        starts, lp = self.top_starts(), self.top_logprob
        return [lp[o + j] if j < n else None for o, n in zip(starts, self.top_n)]

    @property
    def has_raw(self) -> bool:
        return bool(self.raw)

    def top_starts(self) -> list[int]:
        """Where each position's top-k starts in the flat top_* columns (one more: the end)."""
        if self._starts is None:
            self._starts = [0, *accumulate(self.top_n)]
        return self._starts

    def _step(self, i: int) -> TokenStep:
        built = self._built.get(i)
        if built is None:
            o = self.top_starts()[i]
            top = [
                TopLogprob(self.top_token_id[k], self.top_logprob[k], self.top_text[k], self.top_raw.get(k))
                for k in range(o, o + self.top_n[i])
            ]
            extra = {name: col[i] for name in self.OPTIONAL if (col := getattr(self, name)) is not None}
            built = self._built[i] = TokenStep(
                self.position[i],
                self.token_id[i],
                self.text[i],
                self.logprob[i],
                self.rank[i],
                top,
                self.raw.get(i),
                **extra,
            )
        return built

    def __len__(self) -> int:
        return len(self.token_id)

    @overload
    def __getitem__(self, i: int) -> TokenStep: ...
    @overload
    def __getitem__(self, i: slice) -> list[TokenStep]: ...

    def __getitem__(self, i: int | slice) -> TokenStep | list[TokenStep]:
        if isinstance(i, slice):
            return [self._step(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("step index out of range")
        return self._step(i % n)

    def __iter__(self):
        return (self._step(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepColumns):
            return self.columns() == other.columns()
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, so unhashable like one

    def __getstate__(self) -> dict[str, Any]:
        return self.columns()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state)  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"StepColumns({len(self)} steps)"


def step_column(steps: Sequence[TokenStep], name: str) -> list[Any]:
    """One field of every step, read from the columns when the steps are stored ones."""
    if isinstance(steps, StepColumns):
        return steps.column(name)
    return [getattr(s, name) for s in steps]


def top_ids(steps: Sequence[TokenStep], i: int) -> list[int]:
    """Position i's top-k token ids, best first, without building its step from columns."""
    if isinstance(steps, StepColumns):
        starts = steps.top_starts()
        return steps.top_token_id[starts[i] : starts[i + 1]]
    return [t.token_id for t in steps[i].top]


@dataclass
class SideTimings:
    load_s: float | None = None  # model load (0 when the worker was already warm)
    prefill_s: float | None = None  # request start to first generated token
    total_s: float | None = None  # request start to last token


@dataclass
class SideResult:
    """One side's output for one prompt. On failure, `error` is set and `steps` holds what was made."""

    side: str
    prompt_index: int
    token_ids: list[int] = field(default_factory=list)
    # A list while an engine makes it; a stored result reads back as StepColumns (the same steps).
    steps: list[TokenStep] | StepColumns = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | "error" | "cancelled"
    timings: SideTimings = field(default_factory=SideTimings)
    error: str | None = None
    routes: Routes | None = None  # MoE runs with routes=true: the experts each step routed to (core.routes)
    cached_tokens: int | None = None  # prompt tokens the engine served from its prefix cache (None: not reported)


@dataclass
class EngineInfo:
    """What an engine reports after loading: versions, device, and its settings as it resolved them."""

    kind: str
    version: str  # the engine's own version (vLLM's, or transformers')
    device: str  # "cuda:0 (NVIDIA H100 80GB HBM3)" or "cpu (x86_64)"
    dtype: str  # what the weights were loaded as
    versions: dict[str, str] = field(default_factory=dict)  # vllm / transformers / torch / python
    # Runtime settings as the engine actually resolved them, in parity-ui's common vocabulary
    # (see parity_ui.core.settings): what to diff between sides.
    resolved: dict[str, Any] = field(default_factory=dict)
    # Load options whose other values this loaded engine serves exactly alike: option -> {value: the
    # resolved row a side asking for that value reads}. The pool hands such a side this warm worker
    # (SidePlan.stand_ins) instead of loading another (vLLM forced_tokens=auto where trace replay is
    # not offered is forced_tokens=prompt).
    serves_also: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass
class SideInfo:
    """One side of a run, as it ran: the setup asked for and what the engine made of it."""

    name: str
    kind: str
    reference: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # the side's options (after defaults)
    model_path: str = ""
    python: str | None = None  # another environment's interpreter, or None for this one
    url: str | None = None  # server kinds
    version: str = ""
    device: str = ""
    dtype: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    resolved: dict[str, Any] = field(default_factory=dict)
    load_s: float | None = None


@dataclass
class Divergence:
    """The first position where two greedy streams pick different tokens. Pairs are [a, b]."""

    index: int
    token_ids: list[int | None]  # None: that stream ended here
    texts: list[str]
    # vLLM's own acceptance rule (tests/models/utils.py::check_logprobs_close): at the first
    # mismatch each side's token must be in the other's top-k. [a's token in b's, b's in a's].
    in_other_topk: list[bool | None] = field(default_factory=lambda: [None, None])
    accepted: bool | None = None
    reason: str = "token"  # "token" | "length" (one stream stopped earlier)


@dataclass
class Comparison:
    """Side `b` against the reference side `a` for one prompt (symmetric in a and b)."""

    a: str
    b: str
    identical: bool
    first_divergence: int | None
    compared: int  # positions compared (the shorter stream's length)
    lengths: list[int] = field(default_factory=lambda: [0, 0])  # [len a, len b]
    # Per position up to the divergence (where both chose the same token):
    logprob_gaps: list[float | None] = field(default_factory=list)  # b - a, chosen token
    topk_overlap: list[float | None] = field(default_factory=list)  # |A & B| / k of top-k id sets
    max_abs_gap: float | None = None
    mean_abs_gap: float | None = None
    divergence: Divergence | None = None
    explanation: Explanation | None = None  # parity_ui.analysis.explain
    cross_scores: CrossScores | None = None  # parity_ui.analysis.crossscore: each direction's teacher-forced figures
    # What the measures harvested from this pair, by record key (core.measures RECORDS: "routes", "route_replay",
    # "kept_mass", "distribution"; read one typed with core.measures.ROUTES.of(c)...). Absent: not recorded.
    # Stored and printed flat: each record under its key beside the fields above (every key, null when absent).
    measures: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: to_dict(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "measures"}
        out.update({key: to_dict(self.measures.get(key)) for key in RECORDS})
        out.update({k: to_dict(v) for k, v in self.measures.items() if k not in RECORDS})
        return out


@dataclass
class PromptResult:
    index: int
    prompt_text: str  # what the sides saw, decoded (chat template applied when chat=True)
    prompt_token_ids: list[int]
    messages: list[dict[str, Any]] | None = None
    results: dict[str, SideResult] = field(default_factory=dict)  # side name -> result
    # Image prompts: per image {name, sha256, width, height, format, bytes, tokens: {side: n}, resized}
    # (the bytes themselves are stored apart, by hash: parity_ui.store.runs.image_bytes)
    images: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)  # one per non-reference side
    given: dict[str, Any] | None = None  # the prompt as the user gave it: {"text", "messages"} (a rerun needs it)

    def comparison(self, b: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.b == b), None)


@dataclass
class Finding:
    """A preflight or runtime observation with a stable code, e.g. 'eos-mismatch'.

    `fix` is prose that fits anywhere; `setting` is the concrete change when there is one
    ({"key": "dtype", "value": "float32"}, dotted for a side option: "b.enforce_eager"): the CLI
    shows it as --set/--side, the app as the control to change."""

    code: str
    severity: Literal["info", "warning", "error"]
    message: str
    fix: str = ""
    setting: dict[str, Any] | None = None
    side: str | None = None  # the side the finding is about, if one


@dataclass
class ModelInfo:
    """What a model resolves to, read from its folder without loading weights."""

    name: str  # what the user typed ("demo", an HF id, a path)
    path: str  # local folder the sides load (unless a side names its own)
    architecture: str = ""
    model_type: str = ""
    num_parameters: int | None = None
    config_dtype: str = ""
    weights_dtype: str = ""  # the safetensors' one floating dtype ("" when none or mixed)
    max_position_embeddings: int | None = None
    vocab_size: int | None = None
    has_chat_template: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)  # union of generation_config and config
    pad_token_id: int | None = None
    generation_config: dict[str, Any] = field(default_factory=dict)  # generation_config.json as is
    rope_scaling: dict[str, Any] | None = None  # scaling in effect in the model's own config
    rope_parameters: dict[str, Any] = field(default_factory=dict)  # the full dict, rope_theta included
    trust_remote_code: bool = False
    head_dim: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    num_hidden_layers: int | None = None
    sliding_window: int | None = None
    kv_layout: str = "standard"  # "standard" (K and V per KV head), "mla" or "hybrid": parity_ui.core.context
    vision: bool = False  # a vision-language model (its config has a vision_config)
    image_token_id: int | None = None
    # Mixture of experts (its config.json names them): experts per MoE layer and how many each token uses
    num_experts: int | None = None
    experts_per_token: int | None = None


@dataclass
class Run:
    id: str
    created_utc: str
    model: ModelInfo
    config: dict[str, Any]
    status: RunStatus
    prompts: list[PromptResult] = field(default_factory=list)
    error: str | None = None
    error_code: str | None = None
    warnings: list[Finding] = field(default_factory=list)
    sides: list[SideInfo] = field(default_factory=list)  # the reference first
    versions: dict[str, str] = field(default_factory=dict)  # parity-ui's own and this python's
    duration_ms: int | None = None
    group_id: str | None = None  # runs of one sweep or probe share it
    # What made the run (the command, and so which record it carries): "compare" (one comparison: its
    # prompts' comparisons), "sweep" (a grid point; the points share group_id), "probe" (`probes`),
    # "workload" (`workload`: pooled figures, its prompts' steps in the store), "replay" (`workload`, with
    # its `replay` record: core.replay_record), "bisect" (`bisect`: the trials and the answer),
    # "bisect-trial" (a bisect's trial: a workload sharing the bisect's group_id), "check" (`parity check`:
    # its results in the store's gate tables; its cases are workloads or replays sharing its group_id).
    kind: str = "compare"
    probes: ProbeReport | None = None  # a probe run's findings (parity_ui.commands.probes)
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds (parity_ui.core.runlog.PHASES)
    owner: dict[str, Any] | None = None  # {pid, host, start}: who writes a running run
    workload: WorkloadReport | None = None  # a workload run's pooled figures (parity_ui.core.workload_record)
    bisect: BisectReport | None = None  # a bisect's trials and answer (parity_ui.core.bisect_record)

    @property
    def reference(self) -> str | None:
        return self.sides[0].name if self.sides else None

    def side(self, name: str) -> SideInfo | None:
        return next((s for s in self.sides if s.name == name), None)

    @property
    def comparisons(self) -> list[Comparison]:
        return [c for p in self.prompts for c in p.comparisons]

    @property
    def identical(self) -> bool | None:
        """True when every non-reference side matched the reference on every prompt; None when
        some comparison is missing (an error). A workload's, from its pooled figures (its prompts'
        steps are in the store, not in memory)."""
        if self.workload is not None:
            return self.workload.identical
        expected = max(len(self.sides) - 1, 1)
        if not self.prompts or any(len(p.comparisons) < expected for p in self.prompts):
            return None
        return all(c.identical for c in self.comparisons)

    @property
    def first_divergence(self) -> int | None:
        """The earliest first-divergence index over all prompts and sides (None when none diverged)."""
        if self.workload is not None:
            return self.workload.first_divergence
        idx = [c.first_divergence for c in self.comparisons if c.first_divergence is not None]
        return min(idx) if idx else None

    @property
    def device(self) -> str:
        return ", ".join(dict.fromkeys(s.device for s in self.sides if s.device))


_LEAVES = (int, float, str, bool, type(None))


def to_dict(obj: Any) -> Any:
    """A JSON-ready copy of a dataclass tree (stored steps as the list of steps they hold; a record
    with its own stored shape, parity_ui.core.findings, as its to_json())."""
    if type(obj) in _LEAVES:
        return obj
    to_json = getattr(obj, "to_json", None)
    if to_json is not None and not isinstance(obj, type):
        return to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple, StepColumns)):
        # A workload's token ids and gaps are long lists of numbers: no call per number.
        return [v if type(v) in _LEAVES else to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: v if type(v) in _LEAVES else to_dict(v) for k, v in obj.items()}
    return obj


def plain(obj: Any) -> Any:
    """A copy whose leaves are builtins: an enum as its name, a subclass of str, int or float (torch's
    version string, a numpy scalar) as the builtin; dataclasses, dicts, lists and tuples copied
    through, anything else as it is. A worker's answer must unpickle in a parent that never
    imported the engine: a vLLM IntEnum in a load result made the parent import vLLM (~5 s of every
    vLLM load, measured on an H100)."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if isinstance(obj, enum.Enum):
        return obj.name
    for base in (bool, str, int, float):
        if isinstance(obj, base):
            return base(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        )
    if isinstance(obj, dict):
        return {plain(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj) if type(obj) in (list, tuple) else [plain(v) for v in obj]
    return obj


@functools.cache
def _field_names(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _known(cls: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Only the fields `cls` has: a record written by a newer release still reads. (Called once per
    stored step and top-k entry: 200k times to reopen a 16k-token pair, hence the cached names.)"""
    names = _field_names(cls)
    if names.issuperset(data):  # the usual case, checked in C
        return data
    return {k: v for k, v in data.items() if k in names}


def _top_from_dict(t: dict[str, Any]) -> TopLogprob:
    try:  # the hot path of reopening a run (5 per step): no filtering unless a field is unknown
        return TopLogprob(**t)
    except TypeError:
        return TopLogprob(**_known(TopLogprob, t))


def step_from_dict(s: dict[str, Any]) -> TokenStep:
    return TokenStep(**{**_known(TokenStep, s), "top": [_top_from_dict(t) for t in s.get("top", [])]})


def side_result_from_dict(d: dict[str, Any]) -> SideResult:
    """`steps` as a list of step dicts, or as StepColumns.columns() (how the store keeps them)."""
    steps = d.get("steps") or []
    return SideResult(
        **{
            **_known(SideResult, d),
            "steps": StepColumns(steps) if isinstance(steps, dict) else [step_from_dict(s) for s in steps],
            "timings": SideTimings(**_known(SideTimings, d.get("timings") or {})),
            "routes": routes_from_json(d.get("routes")),
        }
    )


def comparison_from_dict(d: dict[str, Any]) -> Comparison:
    """A comparison from its JSON (stored, or `--json`'s), its measure records each under its key."""
    div = d.get("divergence")
    expl, cross = d.get("explanation"), d.get("cross_scores")
    return Comparison(
        **{
            **_known(Comparison, d),
            "divergence": Divergence(**_known(Divergence, div)) if div else None,
            "explanation": expl if isinstance(expl, Explanation) else explanation_from_json(expl),
            "cross_scores": cross if isinstance(cross, CrossScores) else cross_scores_from_json(cross),
            "measures": read_records(d),
        }
    )


def prompt_result_from_dict(d: dict[str, Any]) -> PromptResult:
    return PromptResult(
        **{
            **_known(PromptResult, d),
            "results": {k: side_result_from_dict(v) for k, v in (d.get("results") or {}).items()},
            "comparisons": [comparison_from_dict(c) for c in d.get("comparisons") or []],
        }
    )


def run_from_dict(d: dict[str, Any]) -> Run:
    return Run(
        **{
            **_known(Run, d),
            "model": ModelInfo(**_known(ModelInfo, d["model"])),
            "prompts": [prompt_result_from_dict(p) for p in d.get("prompts", [])],
            "warnings": [Finding(**_known(Finding, w)) for w in d.get("warnings", [])],
            "sides": [SideInfo(**_known(SideInfo, s)) for s in d.get("sides", [])],
            "probes": d["probes"]
            if isinstance(d.get("probes"), ProbeReport)
            else probe_report_from_json(d.get("probes")),
            "workload": _workload(d.get("workload")),
            "bisect": _bisect(d.get("bisect")),
        }
    )


def _bisect(data: Any) -> Any:
    if data is None or not isinstance(data, dict):
        return data
    from .bisect_record import report_from_json

    return report_from_json(data)


def _workload(data: Any) -> Any:
    return report_from_json(data) if isinstance(data, dict) else data


# What a localisation calls divergent (parity_ui.commands.layers measures, parity_ui.render.text shows it):
FLOOR_MULTIPLE = 10.0  # an error this many times the measured floor has left it
MIN_REL = 1e-6  # below this relative error nothing is "divergent", even over a zero floor


@dataclass
class Localisation:
    """Where inside the model two sides part (parity_ui.commands.layers), stored with its run."""

    run_id: str
    prompt_index: int
    a: str
    b: str
    position: int  # generated-token index whose prediction is examined
    token_positions: list[int]  # indices into the teacher-forced ids; the first is the examined one
    first_divergent_layer: int | None
    first_divergent_block: str | None
    noise_floor: dict[str, Any]  # method + per-layer residual floor at the examined position
    per_layer: list[dict[str, Any]]  # one entry per BlockFigure
    summary: str
    logits: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # a localisation that could not run is stored too, with why
    seconds: float = 0.0
    routes: dict[str, Any] | None = None  # MoE: both routers at the captured positions (commands.layer_routes)
    op_map: dict[str, Any] | None = None  # --ops: every layer x op x token (core.op_map.OpMap.to_dict)
    id: str = ""
    created_utc: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def localisation_from_dict(d: dict[str, Any]) -> Localisation:
    names = {f.name for f in dataclasses.fields(Localisation)}
    return Localisation(**{k: v for k, v in d.items() if k in names})
