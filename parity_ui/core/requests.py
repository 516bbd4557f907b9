"""What a side's engine is asked to do: the requests that cross the worker pipe as plain data.

The engines (parity_ui.engines) answer them inside a worker process; the run pipeline and the commands
build them. Defined here, below both, so a command can ask without importing an engine module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class LoadRequest:
    kind: str
    model_path: str
    args: dict[str, Any]  # the mapper's output for this side (VllmArgs/HfArgs as a dict)


@dataclass
class Problem:
    """Something the engine cannot do with this setup, found before loading the model."""

    code: str
    message: str
    fix: str
    severity: str = "error"  # "error" stops the run before anything loads; "warning" is reported


@dataclass
class Rows:
    """Full next-token rows (core.distribution, full_distribution=true), kept out of the pipe: where
    this sequence's own rows go, and which other rows it is compared with where its own are made."""

    write: str | None = (
        None  # write the own rows here: an .npy [tokens, vocabulary] (float32, or bfloat16 bits where exact) in the run's scratch dir
    )
    read: str | None = (
        None  # compare the own rows with the rows in this file (one per token); nothing crosses back but scalars
    )
    read_is: str = "side"  # whose rows `read` holds: "side" (this engine is the reference) or "ref"
    k: int = 5  # top-k containment's k


@dataclass
class GenerateRequest:
    prompts: list[list[int]]  # token ids, already templated/tokenized ONCE by the service
    sampling: dict[str, Any]  # the mapper's output for this side
    batch_size: int = 1
    logprobs: int = 5
    stream: bool = True
    # With stream False: the worker still tells how many tokens each prompt has so far (a "counts"
    # message, a few times a second), without sending the steps: a workload's progress inside a chunk.
    counts: bool = False
    # Image prompts: per prompt, its images as plain data ({"name", "data": bytes, "sha256"}; [] for a text
    # prompt), the image placeholder id the ids are expanded with, and this side's resize settings.
    images: list[list[dict[str, Any]]] | None = None
    image_token_id: int | None = None
    image_pixels: dict[str, int] | None = None
    rows: list[Rows] | None = None  # per prompt: where its full rows go (full_distribution), None: not asked
    # An engine with a prefix cache empties it before each batch of this request, so that no request
    # reads what an earlier one left there (an invariance audit's cold passes); engines without one ignore it.
    fresh_cache: bool = False

    def rows_of(self, i: int) -> Rows | None:
        return self.rows[i] if self.rows and i < len(self.rows) else None

    def images_of(self, i: int) -> list[dict[str, Any]]:
        return (self.images or [])[i] if self.images and i < len(self.images) else []


@dataclass
class ScoreRequest:
    """Teacher forcing: the logprob of each `continuation` token given the prompt and the
    continuation before it, plus the engine's own top-k there."""

    prompt: list[int]
    continuation: list[int]
    logprobs: int = 5
    rows: Rows | None = None  # full_distribution: the rows to write and to meet (None: not asked)


@dataclass
class ScoreBatch:
    """Many teacher-forced scorings in one request (a workload's reference scoring every generated
    sequence): each item is scored alone, exactly as a ScoreRequest would be; engines only save the
    round trips, and vLLM schedules the items together."""

    items: list[ScoreRequest]


@dataclass
class InputCheck:
    """What a side that tokenizes on its own (a server) must agree with before generating: each
    prompt's text (special tokens written out) with the ids the run's tokenizer makes of exactly that
    text, and the run's prompt ids, whose lengths the side must serve."""

    texts: list[str]
    text_ids: list[list[int]]  # the run's tokenizer on `texts`, adding no special tokens
    ids: list[list[int]]
    max_new_tokens: int


@dataclass
class CaptureRequest:
    """Layer-by-layer capture (parity_ui.commands.layers): one teacher-forced forward pass over `ids`, keeping
    what each decoder layer made at `positions` (indices into ids)."""

    ids: list[int]
    positions: list[int]
    noise_eps: float | None = None  # rounding-level noise after every layer (the noise-floor run)
    seed: int = 0


@dataclass
class OpTraceRequest:
    """The op map (parity_ui.core.op_map, parity_ui.engines.op_trace): one teacher-forced forward pass over
    `ids`. With `dump_to`, the reference: every op's output written there (a safetensors file) at the
    `window` positions, k and v and `full_ops` at every position. With `reference`, a side compared
    with that file: per op and window position its cumulative and added error (statistics only).
    `noise_eps`: the reference against itself with rounding-level noise (the floor). `swap`: [layer,
    op] whose output is replaced by the reference's at every position (the causal check)."""

    ids: list[int]
    window: list[int]
    dump_to: str | None = None
    reference: str | None = None
    full_ops: list[str] = field(default_factory=list)
    noise_eps: float | None = None
    seed: int = 0
    swap: list[Any] | None = None
    added: bool = True  # compute the added error (a swap's after-run needs the cumulative only)


@dataclass
class RoutesRequest:
    """Mixture-of-experts routes (parity_ui.engines.routes): one teacher-forced forward pass over `ids`,
    keeping every MoE layer's choice at `positions` (indices into ids)."""

    ids: list[int]
    positions: list[int]


@dataclass
class RouteReplayRequest:
    """Generate again while routing with recorded experts: `routes[i]` holds prompt i's routes for
    input positions 0, 1, ... (parity_ui.core.routes.Routes); mode "ids" or "ids+weights". With
    `score` (a scored workload) each item is teacher-forced instead, one forward pass each, routing
    with routes[i]: the cheap replay (no generation)."""

    generate: GenerateRequest | None
    routes: list[Any]
    mode: str = "ids"
    score: list[ScoreRequest] | None = None
