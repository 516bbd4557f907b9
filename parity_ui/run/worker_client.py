"""The verbs of one side's engine worker, typed: what a caller may ask an engine, and what it gets.

`parity_ui.run.workers.EngineWorker` is the transport (a process, a pipe, its failures as EngineError);
`parity_ui.run.worker_main` serves the same verbs on the other end. Every request and answer crosses the
pipe as the plain records of parity_ui.core.requests and parity_ui.core.types, so a worker running under
another environment's interpreter reads them too. The timeouts and the words a failure is reported
with live here, once per verb, rather than at every call site.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import CancelledError
from ..core.requests import (
    CaptureRequest,
    GenerateRequest,
    InputCheck,
    LoadRequest,
    OpTraceRequest,
    Problem,
    RouteReplayRequest,
    RoutesRequest,
    ScoreBatch,
    ScoreRequest,
)
from ..core.routes import Routes
from ..core.types import EngineInfo, SideResult, TokenStep
from ..core.weights import DiffFigure, DiffRequest, DumpRequest, SideWeights, WeightsRequest
from .workers import EngineWorker, EventCallback

TokenCallback = Callable[[int, TokenStep], None]  # (prompt index, step), in the order the engine made them
CountsCallback = Callable[[dict[int, int]], None]  # {prompt index: tokens so far}, for the prompts that moved

CHECK_TIMEOUT_S = 300.0  # the capability check imports the engine and calls tiny kernels
CHECK_INPUT_TIMEOUT_S = 600.0  # a server tokenizes every prompt
WEIGHTS_TIMEOUT_S = 1800.0  # an 8B model's tensors hashed (seconds on a GPU; a big CPU model much longer)


@dataclass
class Capture:
    """What one teacher-forced forward pass kept at the asked positions (parity_ui.engines.capture):
    per captured block a row of float32 bytes for each position, the divergence position first."""

    positions: list[int]
    names: list[str]  # blocks in forward order: "L<layer>.attn|mlp|residual", "final_norm", "logits"
    data: dict[str, bytes]  # name -> float32 rows, one per position
    dims: dict[str, int]  # name -> row length


class EngineClient:
    """One side's engine, spoken to in typed verbs. Not thread-safe, like the worker under it."""

    def __init__(self, worker: EngineWorker):
        self.worker = worker

    @property
    def side(self) -> str:
        return self.worker.label

    def check(self, req: LoadRequest) -> list[Problem]:
        """What the engine cannot run with this setup, found without loading the weights."""
        return self.worker.request("check", req, timeout=CHECK_TIMEOUT_S, what="checking what it can run")

    def load(self, req: LoadRequest, on_progress: Callable[[str], None] | None = None) -> EngineInfo:
        """Load the weights; the engine's own account of what it resolved. Raises EngineError."""
        return self.worker.request(
            "load", req, timeout=self.worker.load_timeout, what="loading the model", on_progress=on_progress
        )

    def check_input(self, req: InputCheck) -> list[Problem]:
        """After loading: what the engine (a server, tokenizing on its own) finds wrong with the prompts."""
        return self.worker.request(
            "check_input", req, timeout=CHECK_INPUT_TIMEOUT_S, what="checking the prompts against the server"
        )

    def generate(
        self, req: GenerateRequest, on_token: TokenCallback | None = None, on_counts: CountsCallback | None = None
    ) -> list[SideResult]:
        """Every prompt's result, in prompt order; tokens stream to `on_token` as they are made (or,
        with req.counts and not req.stream, each prompt's token count to `on_counts`, a few times a
        second). Raises CancelledError when the run is stopped, EngineError when the engine fails."""
        on_event: EventCallback | None
        if req.counts and not req.stream:
            on_event = on_counts
        else:
            on_event = None if on_token is None else (lambda item: on_token(*item))
        return self.worker.request("generate", req, on_event)

    def score(self, req: ScoreRequest) -> list[TokenStep]:
        """Teacher forcing: one step per continuation token, with the engine's own top-k there."""
        return self.worker.request("score", req, what="scoring tokens (teacher forcing)")

    def score_batch(self, req: ScoreBatch) -> list[list[TokenStep]]:
        """Each item scored alone, in order. Raises CancelledError when the run is stopped."""
        out = self.worker.request("score_batch", req, what=f"scoring {len(req.items)} sequence(s) (teacher forcing)")
        if len(out) < len(req.items) and self.worker.cancel_flag.is_set():
            raise CancelledError(f"side {self.side}: stopped while scoring", "")
        return out

    def routes(self, req: RoutesRequest) -> Routes:
        """Mixture-of-experts routes at the asked positions (parity_ui.engines.routes)."""
        return self.worker.request("routes", req, what="recording expert routes")

    def replay_routes(self, req: RouteReplayRequest) -> list[SideResult]:
        """Every prompt generated again, routing with the recorded experts."""
        return self.worker.request("replay_routes", req, what="replaying expert routes")

    def op_trace(self, req: OpTraceRequest) -> dict[str, Any]:
        """One pass of the op map (parity_ui.engines.op_trace): the reference's dump written to a file, or a
        side's figures against one, as plain data (float32 bytes)."""
        what = "dumping every op's output" if req.dump_to else "tracing every op against the reference"
        return self.worker.request("op_trace", req, what=what)

    def weights(self, req: WeightsRequest) -> SideWeights:
        """Its live weights digested unit by unit (issue 41), or readable=False with the reason."""
        return self.worker.request("weights", req, timeout=WEIGHTS_TIMEOUT_S, what="digesting its weights")

    def weights_dump(self, req: DumpRequest) -> dict[str, Any]:
        """The named units written to a scratch file for another side to meet."""
        return self.worker.request("weights_dump", req, timeout=WEIGHTS_TIMEOUT_S, what="writing weights to compare")

    def weights_diff(self, req: DiffRequest) -> list[DiffFigure]:
        """The units another side dumped, met with the live ones: the sizes of the differences."""
        return self.worker.request("weights_diff", req, timeout=WEIGHTS_TIMEOUT_S, what="measuring weight differences")

    def capture(self, req: CaptureRequest) -> Capture:
        """Per-layer activations at the asked positions (parity_ui.commands.layers)."""
        raw = self.worker.request("capture", req, what="capturing layer activations")
        return Capture(
            positions=list(raw["positions"]), names=list(raw["names"]), data=dict(raw["data"]), dims=dict(raw["dims"])
        )
