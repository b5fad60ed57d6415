"""The OpenAI-compatible HTTP server of rank 0 (vLLM ``vllm/entrypoints/openai/api_server.py``).

Endpoints: /health (200, 503 once the engine is dead), /version, /metrics, /v1/models,
/v1/completions, /v1/chat/completions (streaming as SSE or not). ``--api-key`` protects only
paths under /v1 with a 401 ``{"error": "Unauthorized"}``, as vLLM's middleware does.
Token pacing comes from the spec: ``ttft_s`` before the first token, ``token_s`` between tokens.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .args import ServeConfig
from .common import log
from .metrics import Metrics

WORDS = ["the", "lab", "stand", "in", "says", "hello", "from", "a", "simulated", "GPU",
         "replica", "over", "two", "nodes", "and", "it", "keeps", "talking"]


class EngineDead(Exception):
    """The engine can no longer serve (a peer rank or a Ray worker is gone)."""


class Api:
    """What the HTTP handler needs: the config, timings, metrics and the engine's step.

    Args:
        config: the checked serve configuration.
        spec: the host spec (``ttft_s``, ``token_s`` seconds; ``vllm`` version).
        step: called once per request before generating; raises :class:`EngineDead` when a
            peer is gone (that is when real vLLM notices: docs/measured.md).
        on_dead: called once after the first :class:`EngineDead` (rank 0 then exits).
    """

    def __init__(self, config: ServeConfig, spec: dict[str, Any], step: Callable[[], None],
                 on_dead: Callable[[], None]) -> None:
        self.config, self.spec, self.step, self.on_dead = config, spec, step, on_dead
        self.metrics = Metrics(config.served_model_name)
        self.dead = False
        self.dead_lock = threading.Lock()

    def mark_dead(self) -> None:
        """Flip /health to 503 and run ``on_dead`` once."""
        with self.dead_lock:
            if self.dead:
                return
            self.dead = True
        threading.Thread(target=self.on_dead, daemon=True).start()


class _Server(ThreadingHTTPServer):
    """A connection its client reset or closed mid-answer ends quietly, as uvicorn's does
    (socketserver's own ``handle_error`` would print a traceback to the journal)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def make_server(api: Api) -> ThreadingHTTPServer:
    """Bind ``--host``/``--port`` (all interfaces when no host) and return the server."""
    handler = type("Handler", (Handler,), {"api": api})
    return _Server((api.config.host or "0.0.0.0", api.config.port), handler)


class Handler(BaseHTTPRequestHandler):
    """One HTTP connection, kept alive between requests as uvicorn keeps it (HTTP/1.1: a
    body with its Content-Length, a stream in chunks)."""

    api: Api
    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        log("INFO", "launcher.py:1", f'{self.client_address[0]} - "{self.requestline}" '
            f"{args[1] if len(args) > 1 else ''}")

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if not self._authorized():
            return
        path = self.path.split("?")[0]
        if path == "/health":
            self._send(503 if self.api.dead else 200, b"", "application/json")
        elif path == "/version":
            self._json(200, {"version": self.api.spec["vllm"]})
        elif path == "/metrics":
            self._send(200, self.api.metrics.render().encode(),
                       "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/v1/models":
            config = self.api.config
            self._json(200, {"object": "list", "data": [{
                "id": config.served_model_name, "object": "model", "created": int(time.time()),
                "owned_by": "vllm", "root": config.model, "parent": None,
                "max_model_len": config.max_model_len, "permission": []}]})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        try:  # read first, whatever the answer: the connection is kept for the next request
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        except ValueError:
            self.close_connection = True
            raw = b""
        if not self._authorized():
            return
        path = self.path.split("?")[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, {"detail": "Not Found"})
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body is not an object")
        except ValueError as exc:
            self._error(400, f"Invalid JSON body: {exc}", "BadRequestError")
            return
        self._generate(body, chat=path.endswith("chat/completions"))

    def _authorized(self) -> bool:
        keys = self.api.config.api_keys
        if keys and self.path.startswith("/v1"):
            if self.headers.get("Authorization") not in {f"Bearer {key}" for key in keys}:
                self._json(401, {"error": "Unauthorized"})
                return False
        return True

    def _generate(self, body: dict[str, Any], chat: bool) -> None:
        config, spec = self.api.config, self.api.spec
        model = body.get("model", config.served_model_name)
        if model != config.served_model_name:
            self._error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
            return
        if chat:
            messages = body.get("messages") or []
            prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            prompt = body.get("prompt", "")
            prompt = " ".join(prompt) if isinstance(prompt, list) else str(prompt)
        prompt_tokens = max(1, len(prompt.split()))
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if prompt_tokens + max_tokens > config.max_model_len:
            self._error(400, f"This model's maximum context length is {config.max_model_len} "
                        f"tokens. However, you requested {prompt_tokens + max_tokens} tokens "
                        f"({prompt_tokens} in the messages, {max_tokens} in the completion). "
                        "Please reduce the length of the messages or completion.",
                        "BadRequestError")
            return
        arrived = time.monotonic()  # vLLM times TTFT and e2e from the request's arrival
        if self.api.dead:
            self._error(500, "EngineCore encountered an issue. See stack trace (above) for the "
                        "root cause.", "InternalServerError")
            return
        try:
            self.api.step()
        except EngineDead as exc:
            log("ERROR", "core_client.py:1", f"EngineCore encountered a fatal error: {exc}")
            self._error(500, "EngineCore encountered an issue. See stack trace (above) for the "
                        "root cause.", "InternalServerError")
            self.api.mark_dead()
            return
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        tokens = self._tokens(float(spec["ttft_s"]), float(spec["token_s"]), max_tokens,
                              arrived)
        if body.get("stream"):
            self._stream(request_id, model, tokens, chat, prompt_tokens, max_tokens)
        else:
            self._whole(request_id, model, tokens, chat, prompt_tokens, max_tokens)

    def _tokens(self, ttft_s: float, token_s: float, count: int,
                arrived: float) -> Iterator[str]:
        """Yield ``count`` tokens at the spec's pace and record the request's metrics.

        TTFT and end-to-end latency count from ``arrived`` (monotonic seconds, before the
        engine's step: a Ray actor call or the mp exchange), as vLLM's count from the
        request's arrival (vllm/v1/metrics/stats.py, ``arrival_time``); the first token comes
        ``ttft_s`` after generation starts."""
        start = arrived
        last = time.monotonic()
        first = 0.0
        itls: list[float] = []
        self.api.metrics.running += 1
        try:
            for i in range(count):
                time.sleep(ttft_s if i == 0 else token_s)
                now = time.monotonic()
                if i == 0:
                    first = now - start
                else:
                    itls.append(now - last)
                last = now
                yield " " + WORDS[i % len(WORDS)]
        finally:
            self.api.metrics.running -= 1
        self.api.metrics.finished("length", first, itls, time.monotonic() - start, 0, count)

    def _whole(self, request_id: str, model: str, tokens: Iterator[str], chat: bool,
               prompt_tokens: int, max_tokens: int) -> None:
        text = "".join(tokens)
        self.api.metrics.prompt_tokens += prompt_tokens
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                 "total_tokens": prompt_tokens + max_tokens}
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                                              "content": text},
                                      "logprobs": None, "finish_reason": "length",
                                      "stop_reason": None}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                      "stop_reason": None, "prompt_logprobs": None}
            kind = "text_completion"
        self._json(200, {"id": request_id, "object": kind, "created": int(time.time()),
                         "model": model, "choices": [choice], "usage": usage,
                         "system_fingerprint": None})

    def _stream(self, request_id: str, model: str, tokens: Iterator[str], chat: bool,
                prompt_tokens: int, max_tokens: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        kind = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())

        def write(data: bytes) -> None:  # one HTTP/1.1 chunk (RFC 9112 section 7.1)
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def chunk(choice: dict[str, Any]) -> None:
            data = {"id": request_id, "object": kind, "created": created, "model": model,
                    "choices": [choice]}
            write(f"data: {json.dumps(data)}\n\n".encode())

        try:
            if chat:
                chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                       "logprobs": None, "finish_reason": None})
            for n, token in enumerate(tokens, start=1):
                last = n == max_tokens
                if chat:
                    chunk({"index": 0, "delta": {"content": token}, "logprobs": None,
                           "finish_reason": "length" if last else None})
                else:
                    chunk({"index": 0, "text": token, "logprobs": None,
                           "finish_reason": "length" if last else None, "stop_reason": None})
            self.api.metrics.prompt_tokens += prompt_tokens
            write(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")  # the last chunk
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            log("INFO", "serving.py:1", f"request {request_id} aborted by the client")
            self.close_connection = True

    def _error(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": param,
                                      "code": status}})

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
