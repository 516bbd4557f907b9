"""A broken axis's two streams stored as a run of their own (kind "audit-pair", in the audit's group),
so that the token view opens it at the first break and `parity layers` / `parity bisect` take it like
any run: its two sides are the axis's two setups (named after what they are: alone / batched, cold /
warm, base / chunked...), their options as each engine ran, their resolved settings as each reported.

Where the ids agree and only logprob bits part, the token view reads "identical" for the ids: the
run carries a finding that names the break, and the audit view opens the panes at its token.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ...analysis.compare import compare
from ...core.audit_record import PAIR_KIND, Break
from ...core.config import ParityConfig
from ...core.sides import SideSpec
from ...core.types import EngineInfo, Finding, SideInfo
from ...run.plan import Prepared, SidePlan
from ...run.recorder import decode_result
from .axes import PAIR_NAMES
from .passes import Stream

if TYPE_CHECKING:
    from ..service_api import Service


def _engine(info: SideInfo) -> EngineInfo:
    return EngineInfo(
        kind=info.kind,
        version=info.version,
        device=info.device,
        dtype=info.dtype,
        versions=dict(info.versions),
        resolved=dict(info.resolved),
    )


def store_pair(
    service: Service,
    prep: Prepared,
    audit_id: str,
    axis: str,
    plans: tuple[SidePlan, SidePlan],
    infos: tuple[SideInfo | None, SideInfo | None],
    a: dict[int, Stream],
    b: dict[int, Stream],
    breaks: list[Break],
    title: str,
) -> str:
    """Store the prompts both `a` and `b` hold as a pair run; returns its id. `breaks`: each broken
    prompt's first break (prompt = the audit's prompt index), named in the run's findings."""
    names = PAIR_NAMES.get(axis, ("a", "b"))
    indices = [i for i in sorted(a) if i in b]
    specs: list[SideSpec] = [dataclasses.replace(p.spec, name=n) for p, n in zip(plans, names)]
    pair_plans = [dataclasses.replace(p, spec=s) for p, s in zip(plans, specs)]
    cfg: ParityConfig = prep.config.with_sides(specs)
    pair = dataclasses.replace(
        prep,
        config=cfg,
        sides=pair_plans,
        prompts=[prep.prompts[i] for i in indices],
        kept=list(range(len(indices))),
        skipped_too_long=[],
        side_prompts={},
        warnings=[],
    )
    where = {i: j for j, i in enumerate(indices)}
    with service.recording(
        prep.model.name, cfg.to_dict(), [e.spec for e in pair.prompts], kind=PAIR_KIND, group_id=audit_id
    ) as rec:
        rec.prepared(pair)
        for name, info in zip(names, infos):
            if info is not None:
                rec.loaded(name, _engine(info), info.load_s or 0.0)
        results = []
        for j, i in enumerate(indices):
            for name, stream in ((names[0], a[i]), (names[1], b[i])):
                res = dataclasses.replace(stream.result, side=name, prompt_index=j)
                decode_result(prep.tokenizer, res)
                results.append(res)
        rec.keep(results)
        for pr in rec.run.prompts:
            pr.comparisons = [compare(pr.results[names[0]], pr.results[names[1]])]
        rec.compared(rec.run.prompts)
        for brk in breaks:
            if brk.prompt in where:
                rec.run.warnings.append(
                    Finding(
                        code="audit-break",
                        severity="warning",
                        message=f"{title}: {names[0]} and {names[1]} part at prompt {where[brk.prompt]} "
                        f"(the audit's prompt {brk.prompt}), token {brk.token}: {brk.describe().split(': ', 1)[-1]}",
                        fix="parity layers on this run names the first layer that differs where the two setups differ",
                    )
                )
        rec.run.status = "diverged" if breaks else "ok"
    return rec.run.id
