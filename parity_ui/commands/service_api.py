"""What the commands built on the service need from it: the two contexts, preparation and the
store (parity_ui.store.Store: every read and write they make, by name; no Database, no SQL).
parity_ui.service.ParityService is the one implementation; the commands (a comparison, a workload, a
probe, a layer localisation, a bisect, a gate) take any object with this shape, so they sit below
the service and the service may call them without an import running back up.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..core.cluster import ClusterSpec
    from ..core.requests import InputCheck
    from ..core.runlog import EventCallback
    from ..core.types import Finding, Run
    from ..inputs.prompts import PromptSpec
    from ..run.cluster import ClusterSides
    from ..run.pipeline import Sides
    from ..run.plan import Prepared, RunRequest, SidePlan
    from ..run.recorder import RunRecorder
    from ..run.sideset import Loaded
    from ..store import Store


class Service(Protocol):
    store: Store

    @property
    def on_gpu(self) -> bool: ...

    @property
    def stopped(self) -> bool: ...

    def prepare(self, req: RunRequest) -> Prepared: ...

    def head_start(self, req: RunRequest) -> None: ...

    def recording(
        self,
        model: str,
        config: dict[str, Any],
        prompts: list[PromptSpec],
        *,
        kind: str = "compare",
        group_id: str | None = None,
        resume: Run | None = None,
        refuse: bool = False,
    ) -> AbstractContextManager[RunRecorder]: ...

    def sides(
        self,
        plans: list[SidePlan],
        *,
        gpu: bool | None = None,
        gated: bool = True,
        emit: EventCallback | None = None,
        inputs: Callable[[], InputCheck] | None = None,
        then: Callable[[Sides, SidePlan], None] | None = None,
        on_loaded: Callable[[SidePlan, Loaded], None] | None = None,
        findings: list[Finding] | None = None,
        timings: dict[str, float] | None = None,
    ) -> AbstractContextManager[Sides]: ...

    def cluster_sides(
        self,
        plans: list[SidePlan],
        spec: ClusterSpec,
        *,
        gpu: bool | None = None,
        emit: EventCallback | None = None,
        on_loaded: Callable[[SidePlan, Loaded], None] | None = None,
        findings: list[Finding] | None = None,
        timings: dict[str, float] | None = None,
    ) -> AbstractContextManager[ClusterSides]: ...

    def run(self, req: RunRequest, on_event: EventCallback | None = None) -> Run: ...

    def record_failure(
        self,
        model: str,
        prompts: list[PromptSpec],
        config: dict[str, Any],
        error: Exception,
        kind: str = "compare",
        group_id: str | None = None,
    ) -> Run: ...

    def drop_workers(self, plans: list[SidePlan]) -> None: ...

    def cancel(self) -> None: ...
