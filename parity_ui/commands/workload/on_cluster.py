"""A workload (or a replay) whose sides run as replicas on a Ray cluster (WorkloadOptions.cluster):
the replicas started through the service (ParityService.cluster_sides), the chunks run as blocks
(parity_ui.commands.workload.blocks), and the run's record of the cluster: its nodes, CPUs and GPUs,
the replicas of each side, the blocks retried and the replicas lost, and the note that batch
composition differs per replica. Everything else (the store, the figures, the floor, Stop, resume)
is the in-process workload's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ...core.cluster import ALL, BATCH_NOTE, ClusterSpec, check_sides
from ...core.runlog import EventCallback, RunEvent, phase
from ...core.types import Finding
from ...core.workload_record import WorkloadOptions
from .blocks import BlockProgress, run_blocks

if TYPE_CHECKING:
    from ...run.plan import Prepared, SidePlan
    from ...run.recorder import RunRecorder
    from ...run.sideset import SideSet
    from ..service_api import Service

CLUSTER_NOTE = "cluster-batches"  # the finding's code


class ChunkRunner(Protocol):
    """What the cluster path needs of a workload (parity_ui.commands.workload.run.Workload, a replay):
    its run, options and plan, and its chunk function, which a block runs on the replicas' side set
    as it runs on the in-process one."""

    service: Service
    rec: RunRecorder
    opts: WorkloadOptions
    prep: Prepared
    emit: EventCallback
    progress: Any  # the workload's progress (here a BlockProgress): its generate and scoring calls report to it

    def calls_per_chunk(self) -> int: ...

    def run_chunk(self, sides: SideSet, chunk: list[int]) -> None: ...


def run_on_cluster(
    w: ChunkRunner, plans: list[SidePlan], todo: list[int], on_loaded: Callable[[Any, Any], None]
) -> None:
    """Start the replicas, run every block of `todo`, keep the cluster's record in the run's report.
    Raises as the in-process path does (CapabilityError, CancelledError, EngineError); the finished
    blocks are stored either way."""
    run, o, prep = w.rec.run, w.opts, w.prep
    spec = ClusterSpec(o.cluster or "local", dict(o.replicas) or {ALL: 1})
    check_sides(spec.replicas, [p.name for p in plans])
    report = run.workload
    assert report is not None  # made before any side starts (Workload.run)
    with w.service.cluster_sides(
        plans,
        spec,
        gpu=prep.resolved.on_gpu,
        emit=w.emit,
        findings=run.warnings,
        timings=run.timings,
        on_loaded=on_loaded,
    ) as sides:
        record = sides.record(o.chunk)
        report.cluster = record.to_dict()
        if not any(f.code == CLUSTER_NOTE for f in run.warnings):
            run.warnings.append(
                Finding(
                    code=CLUSTER_NOTE,
                    severity="info",
                    message=BATCH_NOTE,
                    fix="compare against the floor measured on the same cluster, or run in "
                    "process (without --cluster) for in-process batches",
                )
            )
        w.rec.save_header()
        w.emit(RunEvent("status", record.describe()))
        n_blocks = -(-len(todo) // o.chunk) if todo else 0
        progress = BlockProgress(
            w.emit,
            report,
            len(todo),
            prep.config.max_new_tokens,
            n_blocks,
            w.calls_per_chunk(),
            sides.busy,
            sides.concurrency,
        )
        w.progress = progress
        t0, finished = time.perf_counter(), [0]

        def on_done(block: list[int]) -> None:
            finished[0] += len(block)
            report.done += len(block)
            report.rate = finished[0] / max(time.perf_counter() - t0, 1e-9)
            report.cluster = sides.record(o.chunk).to_dict()
            w.rec.save_header()

        w.emit(
            RunEvent(
                "status",
                f"generating {len(todo)} prompt(s) in {n_blocks} block(s) of up to {o.chunk} "
                f"on {sides.concurrency} replica(s)",
            )
        )
        try:
            with phase(run, "generate"):
                run_blocks(w.run_chunk, sides, todo, o.chunk, progress, on_done)
        finally:
            report.cluster = sides.record(o.chunk).to_dict()
