"""The side-set contract: what a run's started sides answer, whoever hosts them.

Two side sets implement it: the in-process `Sides` (parity_ui.run.pipeline: one worker process per
side setup) and the Ray `ClusterSides` (parity_ui.run.cluster: each request handed to an idle replica
of its side). The commands and the measures (parity_ui.measures) are written once against this
Protocol, so a verb one of them lacks is a type error (mypy checks both, at the end of each module),
not an AttributeError in the middle of a run. What only a cluster has (its replicas, its driver
lock, its record) stays on ClusterSides; what only a comparison uses (which sides generated while
another loaded) stays on Sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..core.requests import CaptureRequest, GenerateRequest, RouteReplayRequest, RoutesRequest, ScoreRequest
from ..core.routes import Routes
from ..core.types import EngineInfo, SideResult, TokenStep
from .worker_client import Capture, CountsCallback, TokenCallback


@dataclass
class Loaded:
    info: EngineInfo
    load_s: float  # 0.0 when the worker was already warm


class SideSet(Protocol):
    """A run's sides once started: each verb asks one side (by name) and answers in the records of
    parity_ui.core (plain data, as a worker sends them)."""

    loaded: dict[str, Loaded]  # each side's engine as it loaded (its resolved settings, its load time)

    def info(self, side: str) -> EngineInfo:
        """What the side's engine resolved when it loaded."""
        ...

    def generate(
        self,
        side: str,
        req: GenerateRequest,
        on_token: TokenCallback | None = None,
        on_counts: CountsCallback | None = None,
    ) -> list[SideResult]:
        """Every prompt's result, in prompt order (steps as columns)."""
        ...

    def score(self, side: str, req: ScoreRequest) -> list[TokenStep]:
        """Teacher forcing of one continuation."""
        ...

    def score_batch(self, side: str, items: list[ScoreRequest]) -> list[list[TokenStep]]:
        """Each item teacher-forced alone, in order."""
        ...

    def routes(self, side: str, req: RoutesRequest) -> Routes:
        """Mixture-of-experts routes at the asked positions of one forced sequence."""
        ...

    def replay_routes(self, side: str, req: RouteReplayRequest) -> list[SideResult]:
        """Generate (or score) again, routing with recorded experts."""
        ...

    def capture(self, side: str, req: CaptureRequest) -> Capture:
        """Per-layer activations at the asked positions (parity layers)."""
        ...
