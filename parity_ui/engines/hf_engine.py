"""Hugging Face transformers `generate`, with logprobs rebuilt from RAW logits.

Runs only inside a worker process. Logprobs are log_softmax(float32(logits)) of `output_logits`,
as vLLM's own test suite does, never generate's processed `scores` (unless the config asks for
processed logprobs, to match vLLM's processed_logprobs mode).
"""

from __future__ import annotations

import platform
import sys
import time
from typing import TYPE_CHECKING, Any

from ..core.types import EngineInfo, SideResult, SideTimings, StepColumns, TokenStep
from .base import (
    CaptureRequest,
    Engine,
    GenerateRequest,
    LoadRequest,
    Problem,
    RouteReplayRequest,
    RoutesRequest,
    ScoreBatch,
    ScoreRequest,
    ShouldStop,
    StepCallback,
    make_step,
    result,
)

if TYPE_CHECKING:
    from .hf_greedy import GreedyDecoder


def _fp32_head(model: Any) -> None:
    """Compute the logits in float32: a float32 copy of the lm_head (untied: the embedding keeps its
    dtype) fed with the final hidden state upcast to float32."""
    import torch

    head = model.get_output_embeddings()
    fp32 = torch.nn.Linear(
        head.in_features, head.out_features, bias=head.bias is not None, device=head.weight.device, dtype=torch.float32
    )
    with torch.no_grad():
        fp32.weight.copy_(head.weight.float())
        if head.bias is not None:
            fp32.bias.copy_(head.bias.float())
    fp32.register_forward_pre_hook(lambda mod, args: (args[0].float(), *args[1:]))
    model.set_output_embeddings(fp32)
    model.config.tie_word_embeddings = False


class HfEngine(Engine):
    kind = "hf"

    def __init__(self) -> None:
        self.model: Any = None
        self.args: dict[str, Any] = {}
        self.model_path = ""
        self._image_processor: Any = None
        self._greedy: Any = None  # the decode=graphed loop, kept: it holds the last captured graph
        self._scorer: Any = None  # score_batch's packing (hf_score.BatchScorer), set at load

    def preload(self) -> None:
        import torch  # noqa: F401 - the import is the work
        from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: F401

    def check(self, req: LoadRequest) -> list[Problem]:
        import torch
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        a = req.args
        problems = []
        config = _config(req)
        if (
            not a["load"]["trust_remote_code"]
            and config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and not any(arch.endswith("ForConditionalGeneration") for arch in config.architectures or [])
        ):
            problems.append(
                Problem(
                    "hf-unknown-architecture",
                    f"transformers {_version()} has no causal LM for model_type {config.model_type!r}",
                    "use an environment with a newer transformers (python=), or "
                    "trust_remote_code when the model ships its own code",
                )
            )
        device = a["device"]
        if device.startswith("cuda"):
            n = torch.cuda.device_count()
            index = int(device.split(":")[1]) if ":" in device and device != "balanced" else 0
            if n == 0:
                problems.append(
                    Problem(
                        "no-gpu",
                        f"device {device} asked for, but torch {torch.__version__} sees no CUDA device",
                        "set this side's device=cpu, or run on a GPU",
                    )
                )
            elif index >= n:
                problems.append(
                    Problem(
                        "no-such-gpu",
                        f"device {device} asked for, but only {n} GPU(s) are visible",
                        f"pick a device from cuda:0 to cuda:{n - 1}",
                    )
                )
        attn = a["load"].get("attn_implementation")
        if attn == "flash_attention_2":
            from transformers.utils import is_flash_attn_2_available

            if not is_flash_attn_2_available():
                problems.append(
                    Problem(
                        "attn-unavailable",
                        "attn_implementation=flash_attention_2 but the flash_attn package is not usable here",
                        "use sdpa or eager, or install flash-attn in this environment",
                    )
                )
        if a["decode"] == "graphed":  # on the config as loaded: a RoPE override decides what a graph can hold
            problems += self._graphed_problems(config, device)
        kernels = a.get("sdpa_kernels")
        if kernels:
            usable = _usable_sdpa_kernels(device, a["load"]["dtype"])
            if not usable & set(kernels):
                where = "the CPU" if device == "cpu" else f"{a['load']['dtype']} on a GPU"
                problems.append(
                    Problem(
                        "sdpa-kernel-unavailable",
                        f"sdpa_kernels: torch has no {' or '.join(kernels)} attention kernel for {where}",
                        f"use sdpa_kernels={' or '.join(sorted(usable))}, or no-cudnn",
                    )
                )
        return problems

    @staticmethod
    def _graphed_problems(config: Any, device: str) -> list[Problem]:
        fix = "use decode=static (a static cache without the graph) or decode=eager"
        if getattr(config, "vision_config", None) is not None:
            return [
                Problem(
                    "graphed-unsupported",
                    "decode=graphed decodes text models only: a vision-language "
                    "model places its positions from the images",
                    fix,
                )
            ]
        if device == "balanced":
            return [Problem("graphed-unsupported", "decode=graphed runs on one device, not spread over GPUs", fix)]
        if device.startswith("cuda"):
            from .hf_greedy import graph_problem

            why = graph_problem(config)
            if why:
                return [Problem("graphed-unsupported", f"decode=graphed: {why}", fix)]
        return []

    def load(self, req: LoadRequest) -> EngineInfo:
        a = self.args = req.args
        deterministic = bool(a.get("deterministic"))
        if deterministic:
            _deterministic_on()  # before the weights land and the warm-up's first kernels run
        with _NondeterministicOps(deterministic) as met:
            info = self._load(req)
            if deterministic:
                self._determinism_probe(info)
        info.resolved.update(_deterministic_state(met.ops if deterministic else None))
        return info

    def _load(self, req: LoadRequest) -> EngineInfo:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, GenerationConfig

        a = self.args
        config = _config(req)
        kwargs = {**a["load"], "dtype": getattr(torch, a["load"]["dtype"])}
        self.model_path = req.model_path
        auto: Any = AutoModelForCausalLM
        if getattr(config, "vision_config", None) is not None:  # a vision-language model (Qwen2-VL...)
            from transformers import AutoModelForImageTextToText

            auto = AutoModelForImageTextToText
        if a["device"] == "balanced":
            model = auto.from_pretrained(req.model_path, config=config, device_map="balanced", **kwargs)
        else:
            model = auto.from_pretrained(req.model_path, config=config, **kwargs)
            model.to(a["device"])
        model.eval()
        if a["fp32_logits"]:
            _fp32_head(model)
        if not a["keep_model_generation_config"]:
            # generate() fills every None field from model.generation_config, then from global
            # defaults. A neutral one (no sampling values, and no EOS: the mapper passes the EOS ids
            # explicitly, and ignore_eos must not get them back) keeps the model's
            # generation_config.json out of the run.
            text_config = getattr(config, "text_config", None)  # vision-language configs nest the LM's
            model.generation_config = GenerationConfig(
                bos_token_id=getattr(config, "bos_token_id", getattr(text_config, "bos_token_id", None)),
                pad_token_id=getattr(config, "pad_token_id", getattr(text_config, "pad_token_id", None)),
            )
        self.model = model
        self._greedy = None
        attn = getattr(model.config, "_attn_implementation", None)
        if a["decode"] == "graphed" and attn not in ("sdpa", "eager"):
            from .base import EngineFault

            # flash attention cuts a static cache to its filled length from the 2-D attention mask,
            # which the loop does not pass: it would attend over the empty slots.
            raise EngineFault(
                f"decode=graphed runs with sdpa or eager attention, and this model resolved to {attn}",
                "set attn_implementation=sdpa on this side, or use decode=static",
                fatal=True,
            )
        _enable_sdpa_kernels(a.get("sdpa_kernels"))
        warmup_s = self._warm_up(model)
        score_batch = self._set_up_scoring(model)
        dev = str(model.device)
        if dev.startswith("cuda"):
            dev = f"{dev} ({torch.cuda.get_device_name(model.device)})"
        else:
            dev = f"cpu ({platform.machine()})"
        head = model.get_output_embeddings()
        device_map = getattr(model, "hf_device_map", None)
        return EngineInfo(
            kind="hf",
            version=transformers.__version__,
            device=dev,
            dtype=str(model.dtype).replace("torch.", ""),
            versions={
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "python": sys.version.split()[0],
            },
            resolved={
                "dtype": str(model.dtype).replace("torch.", ""),
                "device": dev if not device_map else f"spread: {sorted(set(map(str, device_map.values())))}",
                "cpu_threads": torch.get_num_threads() if dev.startswith("cpu") else None,
                "attention": getattr(model.config, "_attn_implementation", None),
                "sdpa_kernels": (
                    _sdpa_kernels_enabled() if a.get("sdpa_kernels") or a.get("deterministic") else "torch's choice"
                ),
                "logits_dtype": str(head.weight.dtype).replace("torch.", ""),
                "kv_cache": "static" if a["decode"] != "eager" else "dynamic",
                "decode": a["decode"],
                "cuda_graphs": {
                    "compiled": "torch.compile",
                    "graphed": "one per decode step" if dev.startswith("cuda") else "off (CPU)",
                }.get(a["decode"], "off"),
                "logprobs_mode": "processed" if a["logprobs_source"] == "scores" else "raw",
                "generation_config": "model" if a["keep_model_generation_config"] else "neutral",
                "engine": f"transformers {transformers.__version__}",
                "torch": torch.__version__,
                "python": sys.version.split()[0],
                "warmup_s": warmup_s,
                "score_batch": score_batch,
            },
        )

    def _determinism_probe(self, info: EngineInfo) -> None:
        """A 2-token generate of a left-padded batch of two rows, so that the ops a run's generate meets
        (its padded prefill, its decode steps) name themselves here, at load, where torch has no
        deterministic implementation of them (the load's own warm-up and scoring check already ran).
        A model the probe cannot drive is named, not refused: the run would meet the same error."""
        import torch
        from transformers import GenerationConfig

        model = self.model
        vocab = int(model.get_output_embeddings().weight.shape[0])
        pad = self.args["sampling"].get("pad_token_id")
        pad = int(pad) if isinstance(pad, int) and 0 <= pad < vocab else 0
        ids = torch.tensor([[pad, *(i % vocab for i in (11, 12, 13))], [i % vocab for i in (21, 22, 23, 24)]])
        mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
        gen = GenerationConfig(max_new_tokens=2, do_sample=False, pad_token_id=pad, eos_token_id=None)
        try:
            with torch.inference_mode():
                model.generate(
                    input_ids=ids.to(model.device), attention_mask=mask.to(model.device), generation_config=gen
                )
        except Exception as e:  # noqa: BLE001 - named in the resolved settings, the run goes on
            info.resolved["deterministic_probe"] = f"could not run: {type(e).__name__}: {str(e)[:160]}"
        else:
            info.resolved["deterministic_probe"] = "a 2-token generate of a padded batch of 2, at load"

    def _warm_up(self, model: Any) -> float | None:
        """One short forward pass on a GPU at load time: the CUDA context, cuBLAS handles and kernel
        selection otherwise land in the first generate's timings (seconds), not in the load's. The
        graphed path also decodes a few tokens through a captured graph, so the one-time costs of a
        first capture (cuBLAS workspaces, kernel loading) are paid here; each run captures its own.

        What no warm-up removes (measured on an H100, bench/hf_decode.py): in bf16, SDPA decodes with
        cuDNN attention, which builds an execution plan for every new KV length, and a dynamic cache
        grows by one each step. A fresh process's first 256-token generate took 16.5 s against 5.6 s
        for the next one, 5.1 s with cuDNN attention off, and 19.6 s after an 8-token warm-up. The
        reference keeps torch's kernel choice; decode=static/graphed have one length per prompt."""
        import torch

        if model.device.type != "cuda":
            return None
        t = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=torch.zeros((1, 8), dtype=torch.long, device=model.device))
            if self.args["decode"] == "graphed":
                self._decoder(5).decode([0] * 8, 4, set(), lambda i, tid: None, lambda: False)
        torch.cuda.synchronize()
        return round(time.perf_counter() - t, 3)

    def _set_up_scoring(self, model: Any) -> str:
        """How score_batch packs its rows (parity_ui.engines.hf_score): the side's score_batch, `auto`
        decided here on a GPU by scoring a few rows alone and together; what was decided, as recorded."""
        from .hf_score import BatchScorer, check, describe, token_budget

        asked = self.args.get("score_batch") or "auto"
        head = model.get_output_embeddings().weight
        budget = token_budget(self.args.get("score_tokens"), str(model.device), head.shape[0], head.element_size())
        found = None
        if asked in ("auto", "padded") and model.device.type == "cuda":  # padded: to name what it moves
            try:
                found = check(model)
            except Exception as e:  # noqa: BLE001 - a model the check cannot drive scores one row a forward
                self._scorer = BatchScorer(model, "one-row", budget, False, _log)
                return f"one row per forward (auto: the check could not run: {type(e).__name__}: {str(e)[:120]})"
        mode = (found.mode() if found is not None else "same-length") if asked == "auto" else asked
        self._scorer = BatchScorer(model, mode, budget, asked == "auto" and mode != "one-row", _log)
        return describe(mode, budget, found, asked)

    def _decoder(self, k: int) -> GreedyDecoder:
        from .hf_greedy import GreedyDecoder

        if self._greedy is None or self._greedy.k != max(k, 1):
            self._greedy = GreedyDecoder(self.model, k)
        return self._greedy

    def _steps_from_logits(self, logits: list[Any], row: int, tokens: list[int], k: int) -> list[TokenStep]:
        """One step per token from its logits row: the chosen token's logprob (float32 log-softmax),
        its rank and the top-k. All positions at once: a handful of device syncs per sequence rather
        than four per token (128k tokens of a workload's scoring took tens of seconds of syncs)."""
        import torch

        if not tokens:
            return []
        rows = torch.stack([logits[i][row] for i in range(len(tokens))]).float()  # [n, vocab]
        lp = torch.log_softmax(rows, dim=-1)
        ids = torch.tensor(tokens, device=lp.device)
        chosen = lp.gather(1, ids[:, None])  # [n, 1]
        ranks = ((lp > chosen).sum(dim=-1) + 1).tolist()
        top_v, top_i = torch.topk(lp, k, dim=-1)
        chosen_l, top_v_l, top_i_l = chosen[:, 0].tolist(), top_v.tolist(), top_i.tolist()
        return [
            make_step(i, tid, chosen_l[i], int(ranks[i]), list(zip(top_i_l[i], top_v_l[i])))
            for i, tid in enumerate(tokens)
        ]

    def generate(self, req: GenerateRequest, on_step: StepCallback, should_stop: ShouldStop) -> list[SideResult]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        a = self.args
        gen = dict(req.sampling)
        stops = set(gen.get("eos_token_id") or [])
        results: list[SideResult] = []
        k = max(req.logprobs, 1)

        if a["decode"] == "graphed":
            return self._generate_graphed(req, on_step, should_stop, stops, k)

        class _Cancel(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kw: Any) -> Any:
                return torch.full((input_ids.shape[0],), should_stop(), dtype=torch.bool, device=input_ids.device)

        # Image prompts go one at a time (their pixel values are per prompt).
        batch = 1 if req.images and any(req.images) else req.batch_size
        for start in range(0, len(req.prompts), batch):
            chunk = list(range(start, min(start + batch, len(req.prompts))))
            vision = self._vision_inputs(req, chunk[0]) if batch == 1 else {}
            width = max(len(req.prompts[i]) for i in chunk)
            pad = gen["pad_token_id"]
            # Left padding: every row's next token sits at the same column.
            ids = torch.tensor([[pad] * (width - len(req.prompts[i])) + req.prompts[i] for i in chunk])
            mask = torch.tensor([[0] * (width - len(req.prompts[i])) + [1] * len(req.prompts[i]) for i in chunk])
            t0 = time.perf_counter()
            first: list[float | None] = [None]
            streamed = [0] * len(chunk)
            done = [False] * len(chunk)

            class _Stream(BaseStreamer):
                primed = False

                def put(self, value: Any) -> None:
                    if not self.primed:  # generate() first hands over the prompt
                        self.primed = True
                        return
                    if first[0] is None:
                        first[0] = time.perf_counter() - t0
                    if not req.stream:
                        return
                    for row, tid in enumerate(value.view(-1).tolist()):
                        if done[row]:
                            continue
                        on_step(chunk[row], make_step(streamed[row], tid, None, None, []))
                        streamed[row] += 1
                        if tid in stops:
                            done[row] = True

                def end(self) -> None:
                    pass

            if a["seed"] is not None:
                torch.manual_seed(a["seed"])
            # transformers compiles the decode step by itself when the cache is static (on a GPU):
            # "static" means a static cache WITHOUT compilation, "compiled" lets it compile.
            gc = GenerationConfig(
                **gen,
                return_dict_in_generate=True,
                disable_compile=a["decode"] != "compiled",
                output_logits=a["logprobs_source"] == "logits",
                output_scores=a["logprobs_source"] == "scores",
            )
            drawer = None
            if a.get("shared_seed"):
                from .shared_seed import HfSharedSeedProcessor, Settings

                drawer = HfSharedSeedProcessor(
                    Settings.from_dict(a["shared_seed"]), [req.prompts[i] for i in chunk], width
                )
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=ids.to(self.model.device),
                    attention_mask=mask.to(self.model.device),
                    **{k: v.to(self.model.device) for k, v in vision.items()},
                    generation_config=gc,
                    streamer=_Stream(),
                    stopping_criteria=StoppingCriteriaList([_Cancel()]),
                    **({"logits_processor": LogitsProcessorList([drawer])} if drawer else {}),
                )
            total = time.perf_counter() - t0
            logits = out.logits if a["logprobs_source"] == "logits" else out.scores
            cancelled = should_stop()
            for row, i in enumerate(chunk):
                new = out.sequences[row, width:].tolist()
                tokens, reason = [], "length"
                for tid in new:
                    tokens.append(tid)
                    if tid in stops:
                        reason = "stop"
                        break
                if cancelled and reason == "length" and len(tokens) < gen["max_new_tokens"]:
                    reason = "cancelled"
                steps = self._steps_from_logits(logits, row, tokens, k)
                rows = req.rows_of(i)
                if rows is not None and tokens:  # full_distribution: this side's rows for the scorer to meet
                    from .full_distribution import handle

                    handle(torch.stack([logits[t][row] for t in range(len(tokens))]), rows, steps)
                if drawer is not None:
                    for step, d in zip(steps, drawer.records[row]):
                        step.margin, step.kept, step.kept_mass = d.margin, d.kept, d.kept_mass
                        step.processed_logprob, step.kept_hash = d.processed_logprob, d.kept_hash
                results.append(
                    result(
                        i,
                        token_ids=tokens,
                        steps=steps,
                        finish_reason=reason,
                        timings=SideTimings(prefill_s=first[0], total_s=total),
                    )
                )
        return results

    def _generate_graphed(
        self, req: GenerateRequest, on_step: StepCallback, should_stop: ShouldStop, stops: set[int], k: int
    ) -> list[SideResult]:
        """decode=graphed: one prompt at a time through parity-ui's greedy loop (hf_greedy)."""
        if req.images and any(req.images):
            from .base import EngineFault

            raise EngineFault(
                "decode=graphed decodes text prompts only, and this run has images",
                "use decode=eager or decode=static for image prompts",
            )
        decoder = self._decoder(k)
        if self.args["seed"] is not None:
            import torch

            torch.manual_seed(self.args["seed"])  # as the other paths do, though greedy draws nothing
        max_new = req.sampling["max_new_tokens"]
        # One cache (and one capture) for the whole request, sized as generate() would for its longest prompt.
        length = max(decoder.cache_len(len(p), max_new) for p in req.prompts)
        results = []
        for i, prompt in enumerate(req.prompts):

            def on_token(position: int, tid: int, i: int = i) -> None:
                if req.stream:
                    on_step(i, make_step(position, tid, None, None, []))

            out = decoder.decode(prompt, max_new, stops, on_token, should_stop, cache_len=length)
            steps = [
                make_step(j, tid, lp, rank, top)
                for j, (tid, lp, rank, top) in enumerate(zip(out.tokens, out.chosen, out.ranks, out.top))
            ]
            results.append(
                result(
                    i,
                    token_ids=out.tokens,
                    steps=steps,
                    finish_reason=out.stopped,
                    timings=SideTimings(prefill_s=out.first_token_s, total_s=out.total_s),
                )
            )
        return results

    def _vision_inputs(self, req: GenerateRequest, i: int) -> dict[str, Any]:
        """pixel_values and image_grid_thw of prompt i's images, made by the model's image processor with
        this side's resize settings; checked against the image tokens in the run's ids."""
        images = req.images_of(i)
        if not images:
            return {}
        from ..inputs.images import decode_image

        if self._image_processor is None:
            from transformers import AutoImageProcessor

            self._image_processor = AutoImageProcessor.from_pretrained(
                self.model_path, trust_remote_code=self.args["load"]["trust_remote_code"]
            )
        ip = self._image_processor
        px = dict(req.image_pixels or self.args.get("image_pixels") or {})
        enc = ip(images=[decode_image(x["data"]) for x in images], return_tensors="pt", **px)
        merge = int(getattr(ip, "merge_size", 2) or 2)
        grid = enc["image_grid_thw"]
        expected = int((grid.prod(-1) // (merge * merge)).sum())
        ids = list(req.prompts[i])
        got = ids.count(req.image_token_id) if req.image_token_id is not None else 0
        if got != expected:
            from .base import EngineFault

            raise EngineFault(
                f"the sides did not see the same prompt: transformers' image processor made "
                f"{expected} image tokens for prompt {i}, the run's processor {got}",
                "pass the same min_pixels/max_pixels to every side and use one processor version",
            )
        import inspect

        import torch

        out = {"pixel_values": enc["pixel_values"].to(self.model.dtype), "image_grid_thw": grid}
        if "mm_token_type_ids" in inspect.signature(self.model.forward).parameters:
            # transformers >= 5 places the image's 3-D rope positions (mrope) from these; without them
            # generate() silently treats the image tokens as text positions (other tokens from token 0).
            out["mm_token_type_ids"] = torch.tensor([[int(t == req.image_token_id) for t in ids]])
        return out

    def score(self, req: ScoreRequest) -> list[TokenStep]:
        return list(self._score_columns(req))

    def score_batch(self, req: ScoreBatch) -> list[StepColumns]:
        """Each item's steps as columns, built from the tensors (the worker sends columns anyway): no
        TokenStep and TopLogprob per position. Rows without full rows to write or meet are packed by
        length into forwards of up to a token budget (parity_ui.engines.hf_score: how, and what
        padding does to the bits); the others go one forward each, their rows read ahead."""
        reads = [it.rows.read if it.rows is not None else None for it in req.items]
        ahead = None
        if any(reads):  # full_distribution: the other side's rows read ahead while this side's forwards run
            from .full_distribution import ReadAhead

            ahead = ReadAhead(reads, pin=self.model.device.type == "cuda")

        def alone(i: int) -> StepColumns:
            take = (lambda: ahead.take(i)) if ahead is not None and reads[i] else None
            return self._score_columns(req.items[i], take)

        try:
            return self._batch_scorer().score(req.items, self.should_stop, alone)
        finally:
            if ahead is not None:
                ahead.close()

    def _batch_scorer(self) -> Any:
        if self._scorer is None:  # an engine loaded before batching was configured: one row a forward
            from .hf_score import BatchScorer

            self._scorer = BatchScorer(self.model, "one-row", 1, False, lambda m: None)
        return self._scorer

    def _score_columns(self, req: ScoreRequest, ahead: Any = None) -> StepColumns:
        """One teacher-forced forward pass; the continuation's steps: each token's logprob (float32
        log-softmax of its logits row), rank and top-k, the same numbers _steps_from_logits gives,
        with four device-to-host copies in all."""
        import torch

        from .hf_score import columns

        ids = torch.tensor([req.prompt + req.continuation], device=self.model.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0]
        base = len(req.prompt)
        tokens, k = req.continuation, max(req.logprobs, 1)
        n = len(tokens)
        # logits[j] predicts ids[j + 1]: continuation token j is predicted at base - 1 + j. One slice,
        # not a view per position stacked again (n small tensor ops per row, ~2x the forward on a GPU).
        own = logits[base - 1 : base - 1 + n]
        with torch.inference_mode():
            # full_distribution: this side's rows written and/or met with the other side's, per position.
            from .full_distribution import columns_for

            dist = columns_for(own, req.rows, n, ahead) if req.rows is not None and n else {}
        return columns(own, list(tokens), k, dist)

    def routes(self, req: RoutesRequest) -> Any:
        from .routes import routes_hf

        return routes_hf(self.model, req.ids, req.positions)

    def replay_routes(self, req: RouteReplayRequest) -> list[SideResult]:
        """Each prompt generated alone (a gate counts positions for one sequence), routing with its
        recorded experts (parity_ui.engines.routes.ForcedRoutes)."""
        from dataclasses import replace as _replace

        from .routes import ForcedRoutes

        out = []
        if req.score is not None:  # a scored workload: each sequence teacher-forced once, routing as recorded
            for i, (item, routes) in enumerate(zip(req.score, req.routes)):
                with ForcedRoutes(self.model, routes, 0, req.mode):
                    steps = self.score(item)
                out.append(
                    SideResult(
                        side="", prompt_index=i, token_ids=list(item.continuation), steps=steps, finish_reason="scored"
                    )
                )
            return out
        g = req.generate
        if g is None:
            raise ValueError("a route replay request holds neither prompts to generate nor items to score")
        for i, (prompt, routes) in enumerate(zip(g.prompts, req.routes)):
            one = _replace(g, prompts=[prompt], batch_size=1, stream=False)
            with ForcedRoutes(self.model, routes, 0, req.mode):
                res = self.generate(one, lambda i, s: None, lambda: False)[0]
            res.prompt_index = i
            out.append(res)
        return out

    def capture(self, req: CaptureRequest) -> dict[str, Any]:
        from .capture import capture_hf

        return capture_hf(self.model, req, getattr(self.model.config, "num_hidden_layers", None), req.noise_eps)

    def op_trace(self, req: Any) -> dict[str, Any]:
        from .op_hooks import hf_ops
        from .op_trace import run_pass

        return run_pass(hf_ops(self.model), req)


def _log(message: str) -> None:
    """A line in the worker's log (its stderr)."""
    print(f"parity-ui: {message}", file=sys.stderr, flush=True)


def _config(req: LoadRequest) -> Any:
    """The model's config with the run's overrides (RoPE scaling) set, as the weights will load with it."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(req.model_path, trust_remote_code=req.args["load"]["trust_remote_code"])
    for key, value in req.args["config_overrides"].items():
        setattr(config, key, value)
    return config


def _version() -> str:
    import transformers

    return transformers.__version__


# torch's warning (use_deterministic_algorithms with warn_only) for an op with no deterministic kernel:
# "<op> does not have a deterministic implementation, but you set 'torch.use_deterministic_algorithms(...)".
_NO_DETERMINISTIC = " does not have a deterministic implementation"


def _deterministic_on() -> None:
    """torch's deterministic algorithms in this worker (process-wide; the worker serves this side alone).
    warn_only: an op torch has no deterministic kernel for warns (and is named in the resolved settings)
    instead of failing the run. cuBLAS's fixed workspace is in the worker's environment already
    (core.mapping, set before the CUDA context exists); cuDNN's autotuner would pick kernels by timing.
    cuDNN's attention is switched off too: torch's flag does not cover it, and on an H200 (torch 2.11,
    bf16, sdpa) the same padded batch twice still differed with the flag alone and held bit for bit
    without cuDNN's attention (bench/figures/gpu-2026-11-28c). An explicit sdpa_kernels choice, applied
    after this at load, still wins."""
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.enable_cudnn_sdp(False)


class _NondeterministicOps:
    """Records torch's no-deterministic-implementation warnings raised inside it (`ops`: the ops, in the
    order met), and lets every other warning through as before. Off: records nothing, changes nothing."""

    def __init__(self, on: bool):
        self.on = on
        self.ops: list[str] = []
        self._keep: Any = None
        self._seen: list[Any] = []

    def __enter__(self) -> _NondeterministicOps:
        if self.on:
            import warnings

            self._keep = warnings.catch_warnings(record=True)
            self._seen = self._keep.__enter__()  # the list warnings land in (empty now: not `or []`)
            warnings.simplefilter("always")
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.on:
            return
        import warnings

        seen = self._seen
        self._keep.__exit__(*exc)
        for w in seen:
            text = str(w.message)
            if _NO_DETERMINISTIC in text:
                op = text.split(_NO_DETERMINISTIC, 1)[0].strip()
                if op not in self.ops:
                    self.ops.append(op)
            else:  # not ours: shown as it would have been
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _deterministic_state(ops: list[str] | None) -> dict[str, Any]:
    """The resolved settings of torch's determinism in this worker, read back from torch itself (what
    took effect, not what was asked). `ops`: the ops met at load with no deterministic implementation
    (None: the side did not ask for determinism, nothing was watched)."""
    import os

    import torch

    on = torch.are_deterministic_algorithms_enabled()
    warn_only = on and torch.is_deterministic_algorithms_warn_only_enabled()
    out: dict[str, Any] = {"deterministic": ("on (warn_only)" if warn_only else "on") if on else "off"}
    if ops is not None:
        out["deterministic_settings"] = (
            f"torch.use_deterministic_algorithms({on}{', warn_only=True' if warn_only else ''}); "
            f"cudnn.deterministic={torch.backends.cudnn.deterministic}, cudnn.benchmark={torch.backends.cudnn.benchmark}, "
            f"cuDNN attention {'on' if torch.backends.cuda.cudnn_sdp_enabled() else 'off'}; "
            f"CUBLAS_WORKSPACE_CONFIG={os.environ.get('CUBLAS_WORKSPACE_CONFIG') or 'unset'}"
        )
        out["nondeterministic_ops"] = list(ops)
    return out


SDPA_SWITCHES = {"flash": "flash", "efficient": "mem_efficient", "math": "math", "cudnn": "cudnn"}


def _enable_sdpa_kernels(kernels: list[str] | None) -> None:
    """Leave only `kernels` enabled for scaled_dot_product_attention, in this worker process (the
    switches are process-wide; the worker serves this side alone). None: torch's choice."""
    if not kernels:
        return
    import torch

    for name, switch in SDPA_SWITCHES.items():
        getattr(torch.backends.cuda, f"enable_{switch}_sdp")(name in kernels)


def _usable_sdpa_kernels(device: str, dtype: str) -> set[str]:
    """The SDPA kernels torch has for a device and dtype (the fused ones also have shape limits,
    which SDPA reports itself when it finds no kernel)."""
    if device == "cpu":
        return {"flash", "math"}
    return {"efficient", "math"} if dtype == "float32" else set(SDPA_SWITCHES)


def _sdpa_kernels_enabled() -> str:
    import torch

    return ", ".join(
        name for name, switch in SDPA_SWITCHES.items() if getattr(torch.backends.cuda, f"{switch}_sdp_enabled")()
    )
