"""The interface every engine implements, with the same method names and the same result shapes.

Engines run inside a worker process, possibly under another environment's interpreter: what
crosses the pipe is plain data (dicts and the dataclasses of parity_ui.core.types and parity_ui.core.requests),
never the mapper's own classes. Native argument names stay inside the dicts the mapper made.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from ..core.requests import (  # noqa: F401
    CaptureRequest,
    GenerateRequest,
    InputCheck,
    LoadRequest,
    OpTraceRequest,
    Problem,
    RouteReplayRequest,  # what an engine is asked: defined in core, used here
    RoutesRequest,
    ScoreBatch,
    ScoreRequest,
)
from ..core.types import EngineInfo, SideResult, TokenStep, TopLogprob

StepCallback = Callable[[int, TokenStep], None]  # (prompt index, step) as tokens are made
ShouldStop = Callable[[], bool]


class EngineFault(Exception):
    """A failure the engine can explain: the message says what happened, the fix what to do.
    The worker sends both to the parent as they are (no "see the log" stand-in)."""

    def __init__(self, message: str, fix: str, *, fatal: bool = False):
        super().__init__(message)
        self.message, self.fix = message, fix
        self.fatal = fatal  # the engine cannot serve another request: the parent stops its worker


class CancelledByUser(Exception):
    """The user pressed stop while the engine was busy with something long (a server starting)."""


class Engine(ABC):
    kind: str
    # Set by the worker: is the run being stopped? / a line of progress for the user (long loads).
    should_stop: ShouldStop = staticmethod(lambda: False)
    progress: Callable[[str], None] = staticmethod(lambda message: None)

    def preload(self) -> None:  # noqa: B027 (a hook with a default: most engines need none)
        """Import the engine's libraries ahead of any request (a worker started as a head start,
        while the parent still prepares the run). The default imports nothing."""

    def check(self, req: LoadRequest) -> list[Problem]:
        """What this engine, as installed here, cannot do with this setup, found without loading
        the model (cheap: tables and tiny kernel calls). The default finds nothing."""
        return []

    @abstractmethod
    def load(self, req: LoadRequest) -> EngineInfo:
        """Load the model; raises on failure (the worker reports it)."""

    def check_input(self, req: InputCheck) -> list[Problem]:
        """After load: problems with this run's prompts on this engine (a server's tokenizer or
        length limit). Engines fed the run's token ids directly find nothing."""
        return []

    @abstractmethod
    def generate(self, req: GenerateRequest, on_step: StepCallback, should_stop: ShouldStop) -> list[SideResult]:
        """Generate for every prompt; results in prompt order. Stops early when should_stop()."""

    @abstractmethod
    def score(self, req: ScoreRequest) -> list[TokenStep]:
        """One TokenStep per continuation token, scored with this engine's forward pass."""

    def score_batch(self, req: ScoreBatch) -> Sequence[Sequence[TokenStep]]:
        """Each item's steps, in order (one forward pass per item: the same numbers as `score`): a list
        of steps, or their columns (StepColumns, what the worker sends anyway). Stops between items
        when the run is stopped (the parent then reports the Stop)."""
        out: list[Sequence[TokenStep]] = []
        for item in req.items:
            if self.should_stop():
                break
            out.append(self.score(item))
        return out

    def capture(self, req: CaptureRequest) -> dict[str, Any]:
        """Per-layer activations at the asked positions (parity_ui.commands.layers). Engines that cannot
        hook their layers raise NotImplementedError with the reason."""
        raise NotImplementedError(f"{self.kind} cannot capture layer activations")

    def op_trace(self, req: OpTraceRequest) -> dict[str, Any]:
        """One pass of the op map (parity_ui.engines.op_trace): the reference's dump, or a side's figures
        against it. Engines that cannot hook their layers raise NotImplementedError with the reason."""
        raise NotImplementedError(f"{self.kind} cannot trace its ops (the op map needs the model in process)")

    def routes(self, req: RoutesRequest) -> Any:
        """Mixture-of-experts routes at the asked positions (parity_ui.engines.routes): a
        parity_ui.core.routes.Routes. Engines that cannot watch their routers raise EngineFault."""
        raise EngineFault(
            f"a {self.kind} side cannot record expert routes", "record routes on a vllm or hf side, or set routes=false"
        )

    def replay_routes(self, req: RouteReplayRequest) -> list[SideResult]:
        """Generate again while routing with recorded experts (HF sides)."""
        raise EngineFault(f"a {self.kind} side cannot route with recorded experts", "replay routes on an hf side")

    def weights(self, req: Any) -> Any:
        """Its live weights, digested unit by unit (a core.weights.SideWeights; issue 41). An engine
        that cannot expose them answers readable=False with the reason: the check then runs the
        behavioural probe alone."""
        from ..core.weights import SideWeights

        return SideWeights(readable=False, why=f"a {self.kind} side does not expose its weights")

    def weights_dump(self, req: Any) -> dict[str, Any]:
        raise EngineFault(f"a {self.kind} side cannot hand over its weights", "compare weights on vllm sides")

    def weights_diff(self, req: Any) -> list[Any]:
        raise EngineFault(f"a {self.kind} side cannot meet another side's weights", "compare weights on vllm sides")


def same_prompt_error(what: str, expected: list[int], got: list[int], image_token_id: int | None) -> EngineFault:
    """The engine's own expansion of an image prompt differs from the run's processor: the sides would
    not be compared on the same input."""
    at = next((j for j, (x, y) in enumerate(zip(expected, got)) if x != y), min(len(expected), len(got)))
    n_exp = expected.count(image_token_id) if image_token_id is not None else "?"
    n_got = got.count(image_token_id) if image_token_id is not None else "?"
    return EngineFault(
        f"the sides did not see the same prompt: {what} made {len(got)} prompt tokens "
        f"({n_got} image tokens), the run's processor {len(expected)} ({n_exp} image tokens); "
        f"first difference at token {at}",
        "pass the same min_pixels/max_pixels to every side and use one processor version "
        "(the engine's image processor resized the image differently)",
    )


def clean_logprob(x: float) -> float:
    """-inf (a masked token) is kept as a very negative finite number so JSON can carry it."""
    return x if math.isfinite(x) else -1e30


def make_step(
    position: int, token_id: int, logprob: float | None, rank: int | None, top: list[tuple[int, float]]
) -> TokenStep:
    return TokenStep(
        position=position,
        token_id=int(token_id),
        text="",  # filled by the service with ONE tokenizer, so every pane decodes alike
        logprob=None if logprob is None else clean_logprob(float(logprob)),
        rank=rank,
        top=[TopLogprob(int(t), clean_logprob(float(lp)), "") for t, lp in top],
    )


def append_step(res: SideResult, step: TokenStep, elapsed: float) -> None:
    """Add a generated token to a result; the first one stamps the time to the first token."""
    # An engine builds its result's steps as a list; columns (StepColumns) are a stored run's, read-only.
    assert isinstance(res.steps, list), "append_step on a stored result's columns"
    res.steps.append(step)
    res.token_ids.append(step.token_id)
    if res.timings.prefill_s is None:
        res.timings.prefill_s = elapsed


def result(prompt_index: int, **kw: Any) -> SideResult:
    """A SideResult whose side name the service fills in (an engine does not know its side's name)."""
    return SideResult(side="", prompt_index=prompt_index, **kw)
