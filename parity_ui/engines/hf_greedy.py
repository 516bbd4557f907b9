"""HF's model, decoded greedily by parity-ui's own loop: a static KV cache, and on a GPU the decode step
replayed as ONE CUDA graph (HF side option `decode=graphed`).

Why: transformers' `generate` pays tens of Python-side milliseconds per token at batch 1 (about 30 ms
for a 30-layer model on an H100, where vLLM with CUDA graphs needs 3), and its own fast path,
`torch.compile` of the decode step, costs a compile of tens of seconds in every fresh process. A CUDA
graph of one eager decode step captures in a few tens of milliseconds and replays the same kernels.

What stays the reference: the numbers come from the model's own `forward` with transformers'
`StaticCache`, exactly as `generate(cache_implementation="static")` calls it: the prompt in one
forward with `logits_to_keep=1`, then one token per forward, the causal mask over the whole static
cache, argmax over the float32 logits (greedy has no logits processor here: the mapper refuses every
setting that would add one). The logprobs are made the way the eager path makes them from
`output_logits`: log_softmax of the float32 logits, the chosen token's rank and the top k. On the
CPU the same loop runs without the graph, which is what the float32 tests check against `generate`.

Runs only inside a worker process (imports torch lazily).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .base import EngineFault


@dataclass
class GreedyOutput:
    tokens: list[int]
    chosen: list[float]
    ranks: list[int]
    top: list[list[tuple[int, float]]]
    first_token_s: float | None
    total_s: float
    stopped: str  # "stop" | "length" | "cancelled"


@dataclass
class _Buffers:
    """Tensors at fixed addresses: what a captured graph reads and writes on every replay."""

    token: Any  # [1, 1] the token fed to the next step
    step: Any  # [] how many tokens have been generated (index into the histories)
    ids: Any  # [max_new] the chosen token of every step
    chosen: Any  # [max_new] its logprob
    ranks: Any  # [max_new] its rank among the raw logprobs
    top_v: Any  # [max_new, k]
    top_i: Any  # [max_new, k]


class GreedyDecoder:
    """One model, many prompts: `decode(prompt, ...)` per prompt. The cache (and on a GPU the captured
    graph, which holds the cache's addresses) is kept and reused while the next prompt asks for the
    same cache length and max_new; `cache_len` lets a caller size one cache for a whole batch."""

    def __init__(self, model: Any, top_k: int) -> None:
        import torch

        self.model = model
        self.k = max(top_k, 1)
        self.device = model.device
        self.use_graph = self.device.type == "cuda"
        self._torch = torch
        self._keep_last = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._length: tuple[int, int] | None = None  # (cache length, max_new) of the kept cache
        self._cache: Any = None
        self._bufs: _Buffers | None = None
        self._graph: Any = None

    def describe(self) -> str:
        return "one CUDA graph per decode step" if self.use_graph else "off (CPU: the same loop, not captured)"

    @staticmethod
    def cache_len(prompt_len: int, max_new: int) -> int:
        """generate()'s own static cache size: the last token is never fed back."""
        return prompt_len + max(max_new, 1) - 1

    # -- one prompt -------------------------------------------------------------------------------
    def decode(
        self,
        prompt: list[int],
        max_new: int,
        stops: set[int],
        on_token: Callable[[int, int], None],
        should_stop: Callable[[], bool],
        cache_len: int | None = None,
    ) -> GreedyOutput:
        torch = self._torch
        length = max(cache_len or 0, self.cache_len(len(prompt), max_new))
        # On cuda:N the graph must be captured on N's streams: capture uses the current device's.
        on_device = torch.cuda.device(self.device) if self.use_graph else contextlib.nullcontext()
        t0 = time.perf_counter()
        with torch.inference_mode(), on_device:
            bufs = self._prepare(length, max_new)
            self._reset(bufs)
            self._prefill(prompt, bufs)
            first = self._sync_token(bufs, 0)
            first_s = time.perf_counter() - t0
            tokens = [first]
            on_token(0, first)
            stopped = "stop" if first in stops else "length"
            if stopped != "stop" and max_new > 1 and self.use_graph and self._graph is None:
                self._capture(bufs)
            while stopped == "length" and len(tokens) < max_new:
                if should_stop():
                    stopped = "cancelled"
                    break
                if self._graph is not None:
                    self._graph.replay()
                else:
                    self._step(bufs)
                tid = self._sync_token(bufs, len(tokens))
                on_token(len(tokens), tid)
                tokens.append(tid)
                if tid in stops:
                    stopped = "stop"
            n = len(tokens)
            out = GreedyOutput(
                tokens=tokens,
                chosen=bufs.chosen[:n].tolist(),
                ranks=bufs.ranks[:n].tolist(),
                top=[list(zip(i, v)) for i, v in zip(bufs.top_i[:n].tolist(), bufs.top_v[:n].tolist())],
                first_token_s=first_s,
                total_s=0.0,
                stopped=stopped,
            )
        out.total_s = time.perf_counter() - t0
        return out

    def _prefill(self, prompt: list[int], bufs: _Buffers) -> None:
        torch = self._torch
        ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
        extra = {"logits_to_keep": 1} if self._keep_last else {}  # as generate() passes it
        logits = self.model(input_ids=ids, past_key_values=self._cache, use_cache=True, **extra).logits
        seen = int(self._cache.get_seq_length())
        if seen != len(prompt):  # a forward that ignores the cache would decode without any history
            raise EngineFault(
                f"decode=graphed: the model's forward left {seen} positions in the static cache "
                f"for a {len(prompt)}-token prompt (it does not use transformers' cache)",
                "use decode=eager",
                fatal=True,
            )
        self._pick(logits, bufs)

    def _sync_token(self, bufs: _Buffers, i: int) -> int:
        return int(bufs.ids[i].item())  # the one host sync per token: streaming and stop checks need it

    # -- the step, eager or captured ----------------------------------------------------------------
    def _pick(self, logits: Any, bufs: _Buffers) -> None:
        """Greedy choice and logprobs of one step, written at index `step`; then the chosen token
        becomes the next input. Device ops only, so a graph can hold them."""
        torch = self._torch
        raw = logits[0, -1].float()  # generate takes argmax over the float32 copy of the logits
        nxt = torch.argmax(raw, dim=-1)
        lp = torch.log_softmax(raw, dim=-1)
        chosen = lp.gather(0, nxt.view(1))
        rank = (lp > chosen).sum() + 1
        top_v, top_i = torch.topk(lp, self.k)
        at = bufs.step.view(1)
        bufs.ids.index_copy_(0, at, nxt.view(1))
        bufs.chosen.index_copy_(0, at, chosen)
        bufs.ranks.index_copy_(0, at, rank.view(1))
        bufs.top_v.index_copy_(0, at, top_v.view(1, -1))
        bufs.top_i.index_copy_(0, at, top_i.view(1, -1))
        bufs.token.copy_(nxt.view(1, 1))
        bufs.step.add_(1)

    def _step(self, bufs: _Buffers) -> None:
        out = self.model(input_ids=bufs.token, past_key_values=self._cache, use_cache=True)
        self._pick(out.logits, bufs)

    def _capture(self, bufs: _Buffers) -> None:
        """Warm the step up once on a side stream (cuBLAS handles, lazy kernel loads), put back what
        that step moved, then capture it. The warm-up wrote this step's keys and values at the
        position the first replay writes again, and later positions are masked."""
        torch = self._torch
        lengths = [layer.cumulative_length.clone() for layer in self._cache.layers]
        saved = (bufs.token.clone(), bufs.step.clone())
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(stream):
                self._step(bufs)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self._restore(bufs, lengths, saved)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step(bufs)
            self._restore(bufs, lengths, saved)  # capture records the step, it does not run it
        except Exception as e:  # noqa: BLE001 - any capture failure means this model cannot take this path
            raise EngineFault(
                f"decode=graphed could not capture this model's decode step as a CUDA graph ({type(e).__name__}: {e})",
                "use decode=static (the same static cache without the graph) or decode=eager",
                fatal=True,
            ) from e
        self._graph = graph

    def _restore(self, bufs: _Buffers, lengths: list[Any], saved: tuple[Any, Any]) -> None:
        for layer, n in zip(self._cache.layers, lengths):
            layer.cumulative_length.copy_(n)
        bufs.token.copy_(saved[0])
        bufs.step.copy_(saved[1])

    # -- buffers and the cache ----------------------------------------------------------------------
    def _prepare(self, length: int, max_new: int) -> _Buffers:
        torch = self._torch
        if self._length == (length, max_new) and self._bufs is not None:
            return self._bufs
        from transformers import StaticCache

        self._graph = None  # a graph holds the old cache's addresses
        self._cache = StaticCache(config=self.model.config, max_cache_len=length)
        dev = self.device
        self._bufs = _Buffers(
            token=torch.zeros((1, 1), dtype=torch.long, device=dev),
            step=torch.zeros((), dtype=torch.long, device=dev),
            ids=torch.zeros(max_new, dtype=torch.long, device=dev),
            chosen=torch.zeros(max_new, dtype=torch.float32, device=dev),
            ranks=torch.zeros(max_new, dtype=torch.long, device=dev),
            top_v=torch.zeros((max_new, self.k), dtype=torch.float32, device=dev),
            top_i=torch.zeros((max_new, self.k), dtype=torch.long, device=dev),
        )
        self._length = (length, max_new)
        return self._bufs

    def _reset(self, bufs: _Buffers) -> None:
        """A new prompt on a kept cache: zeroed in place (a graph holds its addresses), so every prompt
        starts from the state a fresh cache has, as `generate` resets its own static cache."""
        bufs.step.zero_()
        self._cache.reset()


def graph_problem(config: Any) -> str | None:
    """Why this model's decode step cannot be replayed as a CUDA graph, or None. A graph replays
    device work only: every layer must keep its length in a device tensor (transformers' StaticLayer
    does since 5.x); sliding-window layers also keep a Python counter, and dynamic RoPE rescales by
    the longest position seen, a host-side decision: a graph would freeze both."""
    import torch
    import transformers
    from transformers import StaticCache

    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type") or rope.get("type") if isinstance(rope, dict) else None
    if kind in ("dynamic", "longrope"):
        return f"its RoPE scaling ({kind}) is recomputed from the positions seen, which a CUDA graph cannot do"
    cache = StaticCache(config=config, max_cache_len=1)
    layers = getattr(cache, "layers", None)
    if layers is None:
        return f"transformers {transformers.__version__}'s static cache has no per-layer state (needs 5.x)"
    odd = sorted(
        {
            type(layer).__name__
            for layer in layers
            if type(layer).__name__ != "StaticLayer"
            or not isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)
        }
    )
    if odd:
        return f"its static cache has {', '.join(odd)} layers, whose state a CUDA graph cannot carry"
    return None
