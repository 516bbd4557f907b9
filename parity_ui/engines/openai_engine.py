"""A running OpenAI-compatible vLLM server as a side (kind `openai`).

The prompt goes as the run's token ids to /v1/completions, with every sampling field set (a server
fills omitted ones from the model's generation_config), top-k logprobs named by token id
(`return_tokens_as_token_ids`), streamed so the panes fill as tokens arrive. Teacher-forced scoring
uses `prompt_logprobs`. Before generating, the server's /tokenize must give the run's ids.

Standard library only: the worker may run under another environment's interpreter.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..core.types import EngineInfo, SideResult, TokenStep
from .base import (
    Engine,
    EngineFault,
    GenerateRequest,
    InputCheck,
    LoadRequest,
    Problem,
    ScoreBatch,
    ScoreRequest,
    ShouldStop,
    StepCallback,
    append_step,
    make_step,
    result,
)
from .http_client import HttpClient

TOKEN_PREFIX = "token_id:"


def token_id(name: str) -> int:
    """`token_id:123` (return_tokens_as_token_ids) or a bare id string (prompt_logprobs keys)."""
    text = str(name)
    try:
        return int(text[len(TOKEN_PREFIX) :] if text.startswith(TOKEN_PREFIX) else text)
    except ValueError:
        raise EngineFault(
            f"the server named a token {text[:40]!r}, not an id",
            "use a vLLM server: parity-ui asks for return_tokens_as_token_ids",
        ) from None


def step_from_choice(position: int, tok: str, logprob: float | None, top: dict[str, float] | None, k: int) -> TokenStep:
    """One generated token from a streamed completions chunk. The completions API gives no rank:
    it is the chosen token's place in the returned top-k, or None when it is outside."""
    tid = token_id(tok)
    ranked = sorted(((token_id(t), float(lp)) for t, lp in (top or {}).items()), key=lambda x: -x[1])
    in_top = [t for t, _ in ranked[:k]]
    rank = in_top.index(tid) + 1 if tid in in_top else None
    return make_step(position, tid, logprob, rank, ranked[:k])


def step_from_prompt_logprobs(position: int, tid: int, entry: dict[str, Any] | None, k: int) -> TokenStep:
    """One teacher-forced token from a prompt_logprobs entry: {"id": {"logprob", "rank", ...}}."""
    if not entry:
        return make_step(position, tid, None, None, [])
    parsed = {token_id(t): v for t, v in entry.items()}
    chosen = parsed.get(tid)
    ranked = sorted(parsed.items(), key=lambda kv: kv[1].get("rank") or 1 << 30)
    top = [(t, v["logprob"]) for t, v in ranked if (v.get("rank") or 1 << 30) <= k][:k]
    return make_step(position, tid, chosen["logprob"] if chosen else None, chosen.get("rank") if chosen else None, top)


class OpenAIEngine(Engine):
    kind = "openai"

    def __init__(self) -> None:
        self.client: HttpClient | None = None
        self.model_name = ""
        self.max_model_len: int | None = None
        self.conn: dict[str, Any] = {}

    # -- connecting ---------------------------------------------------------------------------

    @property
    def http(self) -> HttpClient:
        """The server's client, made when the side connects (preflight or load)."""
        if self.client is None:
            raise EngineFault(
                "the server side is used before it connected", "load the side (or run its preflight) first"
            )
        return self.client

    def _client(self, conn: dict[str, Any]) -> HttpClient:
        key = None
        if conn.get("api_key_env"):
            key = os.environ.get(conn["api_key_env"])
            if not key:
                raise EngineFault(
                    f"the environment variable {conn['api_key_env']} (api_key_env) is not set",
                    f"export {conn['api_key_env']}=<the server's API key> before starting parity-ui",
                )
        return HttpClient(
            conn["url"], key, timeout_s=conn.get("timeout_s", 600.0), verify_tls=conn.get("verify_tls", True)
        )

    def _served(self, models: Any, asked: str | None, local_path: str) -> tuple[dict[str, Any], list[Problem]]:
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data:
            raise EngineFault(
                f"{self.http.base}/models lists no model: {str(models)[:200]}",
                "point url= at a vLLM OpenAI-compatible server's /v1 base",
            )
        names = [str(m.get("id")) for m in data]
        if asked:
            match = next((m for m in data if m.get("id") == asked), None)
            if match is None:
                raise EngineFault(
                    f"the server does not serve {asked!r}; it serves {', '.join(names)}",
                    "set served_model= to one of those, or point url= at the right server",
                )
            return match, []
        if len(data) > 1:
            raise EngineFault(f"the server serves several models ({', '.join(names)})", "choose one with served_model=")
        m = data[0]
        problems = []
        served = os.path.basename(str(m.get("root") or m.get("id")).rstrip("/"))
        local = os.path.basename(local_path.rstrip("/"))
        if served != local:
            problems.append(
                Problem(
                    "server-model-name",
                    f"the server serves {m.get('root') or m.get('id')!r}, the run's model is "
                    f"{local_path!r}: the comparison assumes the same weights",
                    "serve the same checkpoint, or check the names; the tokenizer check runs before generating",
                    severity="warning",
                )
            )
        return m, problems

    def _connect(self, req: LoadRequest) -> list[Problem]:
        self.conn = req.args["connection"]
        self.client = self._client(self.conn)
        models = self.http.get("/models")
        model, problems = self._served(models, self.conn.get("served_model"), req.model_path)
        self.model_name = str(model["id"])
        self.max_model_len = model.get("max_model_len")
        return problems

    def check(self, req: LoadRequest) -> list[Problem]:
        try:
            return self._connect(req)
        except EngineFault as e:
            return [Problem("server-unreachable", e.message, e.fix)]

    def load(self, req: LoadRequest) -> EngineInfo:
        self._connect(req)
        version = self._version()
        resolved = {
            "server": self.http.base,
            "served_model": self.model_name,
            "max_model_len": self.max_model_len,
            "engine": f"vLLM {version}" if version else "unknown",
            # every sampling field is sent, so the model's generation_config.json cannot leak in
            "generation_config": "neutral",
            **self._server_config(),
        }
        return EngineInfo(
            kind=self.kind,
            version=version or "unknown",
            device=f"server {self.http.base}",
            dtype=str(resolved.get("dtype", "unknown (the server does not say)")),
            versions={"vllm": version or "unknown"},
            resolved=resolved,
        )

    def weights(self, req: Any) -> Any:
        """A running vLLM server's per-parameter digests, where it serves them: POST /weight_checker
        {"action": "checksum"} (vLLM 0.32 with VLLM_SERVER_DEV_MODE=1: SHA-256 of each parameter's raw
        bytes, keyed "dp0:pp0:pcp0:tp0:<name>"). vLLM 0.26 has no such endpoint (its dev mode's
        /collective_rpc takes a worker method's name and string arguments, and none of its worker
        methods returns a tensor or a digest): there the weights are not readable and the probe is
        the whole check."""
        from ..core.weights import SideWeights

        t0 = time.perf_counter()
        if self.client is None:
            return SideWeights(readable=False, why="the server is not connected", how="POST /weight_checker")
        try:
            got = self.http.post("/weight_checker", {"action": "checksum"}, root=True)
        except EngineFault as e:
            version = self._version() or "unknown"
            return SideWeights(
                readable=False,
                why=f"the server (vLLM {version}) does not serve its weight digests ({e.message.split(': ')[-1]}); "
                "vLLM 0.32 serves POST /weight_checker when started with VLLM_SERVER_DEV_MODE=1, 0.26 has no way "
                "to read them",
                how="POST /weight_checker",
            )
        checksums = got.get("checksums") if isinstance(got, dict) else None
        if not isinstance(checksums, dict):
            return SideWeights(
                readable=False, why="POST /weight_checker answered without checksums", how="POST /weight_checker"
            )
        return SideWeights(
            params={str(k): str(v) for k, v in checksums.items()},
            how="POST /weight_checker (per parameter)",
            seconds=time.perf_counter() - t0,
        )

    def _version(self) -> str | None:
        try:
            return str(self.http.get("/version", root=True).get("version"))
        except EngineFault:
            return None  # not every OpenAI-compatible server has /version

    def _server_config(self) -> dict[str, Any]:
        """What the server says of its engine setup. vLLM exposes its full config at /server_info
        only in its development mode (VLLM_SERVER_DEV_MODE=1); otherwise we say so."""
        try:
            info = self.http.get("/server_info?config_format=json", root=True)
        except EngineFault:
            return {"engine_config": "not exposed (start the server with VLLM_SERVER_DEV_MODE=1 to record it)"}
        vc = info.get("vllm_config") if isinstance(info, dict) else None
        return config_from_server_info(vc) if isinstance(vc, dict) else {}

    # -- before generating --------------------------------------------------------------------

    def check_input(self, req: InputCheck) -> list[Problem]:
        problems = []
        need = max((len(i) for i in req.ids), default=0) + req.max_new_tokens
        if self.max_model_len and need > self.max_model_len:
            problems.append(
                Problem(
                    "server-too-short",
                    f"the server serves at most {self.max_model_len} positions; "
                    f"the longest prompt needs {need} with max_new_tokens",
                    "restart the server with a larger --max-model-len, or shorten the prompt / lower max_new_tokens",
                )
            )
        if not self.conn.get("check_tokenizer", True):
            return problems
        for i, (text, ids) in enumerate(zip(req.texts, req.text_ids)):
            try:
                got = self.http.post(
                    "/tokenize", {"model": self.model_name, "prompt": text, "add_special_tokens": False}, root=True
                )
            except EngineFault as e:
                problems.append(
                    Problem(
                        "server-tokenize",
                        f"cannot check the server's tokenizer: {e.message}",
                        "use a vLLM server (it has /tokenize), or set check_tokenizer=false "
                        "to compare without this check",
                    )
                )
                break
            tokens = got.get("tokens") if isinstance(got, dict) else None
            if tokens != ids:
                at = next(
                    (j for j, (x, y) in enumerate(zip(tokens or [], ids)) if x != y), min(len(tokens or []), len(ids))
                )
                problems.append(
                    Problem(
                        "server-tokenizer",
                        f"the server tokenizes prompt {i} differently from the run's model "
                        f"({len(tokens or [])} vs {len(ids)} tokens, first difference at token {at}): "
                        "it serves another model or tokenizer",
                        "serve the run's model (the same tokenizer files), or pick the model the server serves",
                    )
                )
                break
        return problems

    # -- generating ---------------------------------------------------------------------------

    def _body(self, prompt: Any, sampling: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"model": self.model_name, "prompt": prompt, **sampling, **extra}

    def generate(self, req: GenerateRequest, on_step: StepCallback, should_stop: ShouldStop) -> list[SideResult]:
        results = [result(i) for i in range(len(req.prompts))]
        for start in range(0, len(req.prompts), req.batch_size):
            chunk = list(range(start, min(start + req.batch_size, len(req.prompts))))
            prompt = [req.prompts[i] for i in chunk] if len(chunk) > 1 else req.prompts[chunk[0]]
            t0 = time.perf_counter()
            events = self.http.stream("/completions", self._body(prompt, req.sampling, stream=True))
            try:
                for event in events:
                    if should_stop():
                        for i in chunk:
                            results[i].finish_reason = results[i].finish_reason or "cancelled"
                        break  # closing the stream makes the server abort the request
                    for choice in event.get("choices") or []:
                        self._take(choice, chunk, results, req, on_step, t0)
            finally:
                events.close()
            if should_stop():
                break
        return results

    def _take(
        self,
        choice: dict[str, Any],
        chunk: list[int],
        results: list[SideResult],
        req: GenerateRequest,
        on_step: StepCallback,
        t0: float,
    ) -> None:
        idx = int(choice.get("index", 0))
        if idx >= len(chunk):
            raise EngineFault(
                f"the server answered for prompt {idx} of a request with {len(chunk)}",
                "a vLLM server answers one choice per prompt; check the server",
            )
        i = chunk[idx]
        res, lp = results[i], choice.get("logprobs") or {}
        tokens = lp.get("tokens") or []
        if choice.get("text") and not tokens:
            raise EngineFault(
                "the server sent text without token logprobs",
                "use a vLLM server: parity-ui needs logprobs with token ids",
            )
        now = time.perf_counter() - t0
        lps, tops = lp.get("token_logprobs") or [None] * len(tokens), lp.get("top_logprobs") or [None] * len(tokens)
        for tok, logprob, top in zip(tokens, lps, tops):
            step = step_from_choice(len(res.steps), tok, logprob, top, req.logprobs)
            append_step(res, step, now)
            if req.stream:
                on_step(i, step)
        if choice.get("finish_reason"):
            res.finish_reason = choice["finish_reason"]
            res.timings.total_s = now

    def score_batch(self, req: ScoreBatch) -> list[list[TokenStep]]:
        """The items as concurrent requests, at most `max_in_flight` at a time (the server batches
        them as it would production traffic); answers in order."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, int(self.conn.get("max_in_flight") or 8))) as pool:
            futures = [pool.submit(self.score, item) for item in req.items]
            out = []
            for f in futures:
                if self.should_stop():
                    for rest in futures:
                        rest.cancel()
                    break
                out.append(f.result())
            return out

    def score(self, req: ScoreRequest) -> list[TokenStep]:
        ids = req.prompt + req.continuation
        body = self._body(
            ids,
            {"max_tokens": 1, "temperature": 0.0, "skip_special_tokens": False, "return_tokens_as_token_ids": True},
            prompt_logprobs=max(req.logprobs, 1),
        )
        answer = self.http.post("/completions", body)
        choices = answer.get("choices") if isinstance(answer, dict) else None
        lps = choices[0].get("prompt_logprobs") if choices else None
        if not isinstance(lps, list) or len(lps) != len(ids):
            raise EngineFault(
                f"the server returned no usable prompt_logprobs ({type(lps).__name__})",
                "use a vLLM server (it supports prompt_logprobs), or turn cross_score off",
            )
        base = len(req.prompt)
        return [
            step_from_prompt_logprobs(j, req.continuation[j], lps[base + j], req.logprobs)
            for j in range(len(req.continuation))
        ]


def config_from_server_info(vc: dict[str, Any]) -> dict[str, Any]:
    """The settings a vLLM server's /server_info reports, in parity-ui's common vocabulary."""

    def get(*path: str) -> Any:
        node: Any = vc
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        return node

    eager = get("model_config", "enforce_eager")
    graphs = str(get("compilation_config", "cudagraph_mode") or "")
    out = {
        "dtype": str(get("model_config", "dtype") or "").replace("torch.", "") or None,
        "max_model_len": get("model_config", "max_model_len"),
        "cuda_graphs": "off" if eager or graphs.upper().endswith("NONE") else (graphs or None),
        "prefix_caching": get("cache_config", "enable_prefix_caching"),
        "chunked_prefill": get("scheduler_config", "enable_chunked_prefill"),
        "async_scheduling": get("scheduler_config", "async_scheduling"),
        "max_num_seqs": get("scheduler_config", "max_num_seqs"),
        "tensor_parallel": get("parallel_config", "tensor_parallel_size"),
        "pipeline_parallel": get("parallel_config", "pipeline_parallel_size"),
        "seed": get("model_config", "seed"),
    }
    return {k: v for k, v in out.items() if v is not None}
