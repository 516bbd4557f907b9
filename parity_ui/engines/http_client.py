"""A small JSON-over-HTTP client for OpenAI-compatible servers, standard library only (a worker may
run under another environment's interpreter).

Every network failure becomes an EngineFault whose message says what happened at which URL and
whose fix says what to do about it: connection refused, DNS, TLS, timeouts, HTTP errors with the
server's own message, malformed or truncated answers.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Generator
from typing import Any
from urllib.parse import urlsplit

from .base import EngineFault


class HttpClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        verify_tls: bool = True,
    ):
        self.base = base_url.rstrip("/")
        self.root = self.base[: -len("/v1")] if self.base.endswith("/v1") else self.base  # /version lives here
        self.api_key = api_key
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self._ssl = None if verify_tls else ssl._create_unverified_context()  # noqa: S323 - the user asked

    def _request(self, method: str, url: str, body: Any, timeout: float) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=timeout, context=self._ssl)
        except urllib.error.HTTPError as e:
            raise http_fault(url, e.code, e.read()) from None
        except urllib.error.URLError as e:
            raise network_fault(url, e.reason, timeout) from None
        except TimeoutError as e:
            raise network_fault(url, e, timeout) from None
        except (http.client.HTTPException, ConnectionError) as e:
            raise network_fault(url, e, timeout) from None

    def get(self, path: str, *, root: bool = False) -> Any:
        url = (self.root if root else self.base) + path
        with self._request("GET", url, None, self.connect_timeout_s + 20) as resp:
            return _json(url, _read(url, resp))

    def post(self, path: str, body: dict[str, Any], *, root: bool = False) -> Any:
        url = (self.root if root else self.base) + path
        with self._request("POST", url, body, self.timeout_s) as resp:
            return _json(url, _read(url, resp))

    def stream(self, path: str, body: dict[str, Any]) -> Generator[dict[str, Any], None, None]:
        """Server-sent events of a streamed completion, one parsed JSON object each. Raises an
        EngineFault when the stream ends before the server's [DONE] (the server died or the
        connection dropped)."""
        url = self.base + path
        resp = self._request("POST", url, body, self.timeout_s)
        done = False
        try:
            while True:
                try:
                    line = resp.readline()
                except TimeoutError as e:
                    raise network_fault(url, e, self.timeout_s) from None
                except (http.client.HTTPException, ConnectionError, OSError) as e:
                    raise EngineFault(
                        f"the connection to {url} broke mid-stream ({type(e).__name__}: {e})",
                        "check that the server is still running (its log); the tokens received so far are kept",
                    ) from None
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                event = _json(url, payload)
                if isinstance(event, dict) and "error" in event:
                    raise EngineFault(
                        f"{url} reported an error mid-stream: {_message(event)}",
                        "see the server's log; the tokens received so far are kept",
                    )
                yield event
        finally:
            resp.close()
        if not done:
            raise EngineFault(
                f"{url} closed the stream before it finished (no [DONE]): the server died or the connection dropped",
                "check that the server is still running (its log); the tokens received so far are kept",
            )


def _read(url: str, resp: Any) -> bytes:
    try:
        return resp.read()
    except (http.client.IncompleteRead, ConnectionError, OSError) as e:
        raise EngineFault(
            f"{url} sent a truncated answer ({type(e).__name__})", "check that the server is still running (its log)"
        ) from None


def _json(url: str, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        excerpt = raw[:120].decode("utf-8", "replace")
        raise EngineFault(
            f"{url} answered with something that is not JSON: {excerpt!r}",
            "point url= at an OpenAI-compatible vLLM server (its /v1 base URL)",
        ) from None


def _message(body: Any) -> str:
    """The server's own error message from an OpenAI-style or FastAPI-style error body."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)[:600]
        if isinstance(body.get("detail"), (str, list)):
            return str(body["detail"])[:600]
        return str(err)[:600]
    return str(body)[:600]


def http_fault(url: str, status: int, raw: bytes) -> EngineFault:
    try:
        msg = _message(json.loads(raw))
    except (json.JSONDecodeError, UnicodeDecodeError):
        msg = raw[:300].decode("utf-8", "replace").strip() or "(no body)"
    if status in (401, 403):
        fix = (
            "the server wants an API key: export it in an environment variable and name that variable with "
            "the side option api_key_env=VAR (the key itself is never stored)"
        )
    elif status == 404:
        fix = (
            "check url= (it is the server's /v1 base, e.g. http://127.0.0.1:8000/v1) and served_model= "
            "(GET /v1/models lists what the server serves)"
        )
    elif status == 400:
        fix = "the server refused the request's settings; change the setting it names (or the server's own limits)"
    elif status >= 500:
        fix = "the server failed internally: see its log"
    else:
        fix = "see the server's log"
    return EngineFault(f"{url} answered HTTP {status}: {msg}", fix)


def network_fault(url: str, reason: Any, timeout: float) -> EngineFault:
    host = urlsplit(url).netloc
    if isinstance(reason, ssl.SSLError) or "SSL" in type(reason).__name__ or "CERTIFICATE" in str(reason).upper():
        return EngineFault(
            f"TLS failed talking to {host}: {reason}",
            "use the right scheme (http:// vs https://), install the server's CA certificate, "
            "or set verify_tls=false for a self-signed server you trust",
        )
    if isinstance(reason, socket.gaierror):
        return EngineFault(f"cannot resolve the host in {url} ({reason})", "check the host name in url=")
    if isinstance(reason, ConnectionRefusedError) or "refused" in str(reason).lower():
        return EngineFault(
            f"nothing is listening at {host} (connection refused)",
            "start the server (vllm serve MODEL --port PORT), check url=, or let parity-ui start "
            "one with kind vllm-server",
        )
    if isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in str(reason).lower():
        return EngineFault(
            f"{url} did not answer within {timeout:.0f} s",
            "check that the server is up and not overloaded, or raise the side's timeout_s",
        )
    return EngineFault(
        f"cannot reach {url}: {type(reason).__name__}: {reason}", "check url= and that the server is running"
    )
