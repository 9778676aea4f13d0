"""The simulated engine's HTTP server: health and completions with each engine's semantics.

Owns the socket and the replies; the orchestrator decides when it binds, listens and is healthy.
Request bodies are parsed, never logged.
"""

from __future__ import annotations

import enum
import itertools
import json
import socketserver
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

from exporter_tooling.simulate.plan import SimEngine

#: Called after each request with (method, path, client address, status); writes the access line.
RequestHook = Callable[[str, str, str, int], None]

MAX_BODY_BYTES: Final = 1 << 20
MAX_TOKENS_CAP: Final = 256
_JSON: Final = "application/json"
_LLAMA_JSON: Final = "application/json; charset=utf-8"
#: llama.cpp answers every route with this while the model loads (ENGINES.md section 3).
LOADING_BODY: Final = b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
_WORDS: Final = ("the", "model", "is", "warm", "and", "ready", "to", "serve")


class Health(enum.StrEnum):
    """What the server says about itself."""

    LOADING = "loading"  # llama.cpp: listening, every route 503 "Loading model"
    WARMING = "warming"  # SGLang: health 503 while its own warm-up request runs
    READY = "ready"
    FAILING = "failing"  # flap: health 503 while the process stays alive
    SLEEPING = "sleeping"  # vLLM sleep mode: health 200, completions 503, weights offloaded


@dataclass(frozen=True, slots=True)
class Reply:
    """One HTTP response."""

    status: int
    body: bytes = b""
    content_type: str = _JSON


def health_paths(engine: SimEngine) -> frozenset[str]:
    """The readiness routes of ``engine``."""
    if engine is SimEngine.LLAMACPP:
        return frozenset({"/health", "/v1/health"})
    if engine is SimEngine.SGLANG:
        return frozenset({"/health", "/health_generate"})
    return frozenset({"/health"})


def respond(
    engine: SimEngine,
    health: Health,
    method: str,
    path: str,
    body: bytes,
    model: str,
    startup: Mapping[str, float] | None = None,
) -> Reply:
    """The reply of ``engine`` in state ``health`` to one request (pure, for the tests too).

    ``startup`` holds the seconds the start took (``load``, ``total``) once it is over:
    SGLang reports them on ``/metrics`` (ENGINES.md section 8).
    """
    if health is Health.LOADING:
        return Reply(503, LOADING_BODY, _LLAMA_JSON)
    if path in health_paths(engine):
        return _health_reply(engine, health)
    if path == "/metrics" and method == "GET" and engine is SimEngine.SGLANG and startup:
        return Reply(200, sglang_metrics(model, startup), "text/plain; version=0.0.4")
    if path == "/is_sleeping" and engine is SimEngine.VLLM and method == "GET":
        return _json_reply(engine, {"is_sleeping": health is Health.SLEEPING})
    if path == "/v1/completions":
        if method != "POST":
            return _error(engine, 405, "Method Not Allowed")
        if health is Health.FAILING:
            return _error(engine, 503, "Service Unavailable")
        if health is Health.SLEEPING:
            return _error(engine, 503, "The engine is sleeping; wake it up first")
        return complete(engine, body, model)
    if path == "/v1/models" and method == "GET":
        return _json_reply(engine, {"object": "list", "data": [{"id": model, "object": "model"}]})
    return _error(engine, 404, "Not Found")


def sglang_metrics(model: str, startup: Mapping[str, float]) -> bytes:
    """SGLang's /metrics with its startup gauges (the rest of its families left out)."""
    labels = f'{{model_name="{model}"}}'
    lines = [
        "# HELP sglang:engine_startup_time The time taken for the engine to start up.",
        "# TYPE sglang:engine_startup_time gauge",
        f"sglang:engine_startup_time{labels} {startup['total']:.6f}",
        "# HELP sglang:engine_load_weights_time The time taken for the engine to load weights.",
        "# TYPE sglang:engine_load_weights_time gauge",
        f"sglang:engine_load_weights_time{labels} {startup['load']:.6f}",
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{labels} 0.0",
    ]
    return ("\n".join(lines) + "\n").encode()


def _health_reply(engine: SimEngine, health: Health) -> Reply:
    ok = health in (Health.READY, Health.SLEEPING)
    if engine is SimEngine.LLAMACPP:
        return Reply(200, b'{"status":"ok"}', _LLAMA_JSON) if ok else _error(engine, 503, "")
    # vLLM and SGLang answer with an empty body either way.
    return Reply(200 if ok else 503)


_counter = itertools.count(1)


def complete(engine: SimEngine, body: bytes, model: str) -> Reply:
    """An OpenAI-style text completion of ``max_tokens`` words, or 400 for a bad request."""
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        return _error(engine, 400, "request body is not valid JSON")
    if not isinstance(request, dict):
        return _error(engine, 400, "request body must be a JSON object")
    tokens = request.get("max_tokens", 16)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        return _error(engine, 400, "max_tokens must be a positive integer")
    name = request.get("model")
    doc = completion_doc(
        model=name if isinstance(name, str) else model,
        prompt_tokens=max(1, len(str(request.get("prompt", "")).split())),
        tokens=min(tokens, MAX_TOKENS_CAP),
    )
    return _json_reply(engine, doc)


def completion_doc(model: str, prompt_tokens: int, tokens: int) -> dict[str, object]:
    """The completion response body: deterministic text, always cut by length."""
    return {
        "id": f"cmpl-sim-{next(_counter)}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "text": "".join(f" {_WORDS[i % len(_WORDS)]}" for i in range(tokens)),
                "index": 0,
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": tokens,
            "total_tokens": prompt_tokens + tokens,
        },
    }


def _json_reply(engine: SimEngine, doc: object, status: int = 200) -> Reply:
    ctype = _LLAMA_JSON if engine is SimEngine.LLAMACPP else _JSON
    return Reply(status, json.dumps(doc, separators=(",", ":")).encode(), ctype)


def _error(engine: SimEngine, status: int, message: str) -> Reply:
    if engine is SimEngine.LLAMACPP:
        kind = "unavailable_error" if status == 503 else "invalid_request_error"
        doc: object = {"error": {"code": status, "message": message, "type": kind}}
    elif status == 404:
        doc = {"detail": "Not Found"}  # FastAPI's default
    else:
        doc = {"object": "error", "message": message, "type": "BadRequestError", "code": status}
    return _json_reply(engine, doc, status)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, sim: SimServer, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler, bind_and_activate=False)
        self.sim = sim

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, a DNS query we neither need nor have.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server: _HTTPServer

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def version_string(self) -> str:
        return self.server.sim.server_header

    def log_message(self, format: str, *args: object) -> None:
        pass  # access lines go to the engine log, in the engine's format

    def _serve(self, method: str) -> None:
        sim = self.server.sim
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            reply = _error(sim.engine, 413, "request body too large")
            self.close_connection = True
        else:
            body = self.rfile.read(length) if length > 0 else b""
            path = self.path.split("?", 1)[0]
            reply = respond(sim.engine, sim.health, method, path, body, sim.model, sim.startup)
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        sim.on_request(method, self.path.split("?", 1)[0], client, reply.status)


class SimServer:
    """The engine's HTTP server; binding, listening and health are the orchestrator's calls.

    Args:
        engine: whose semantics to follow.
        host: address to bind.
        port: port to bind.
        model: model name served by ``/v1/models`` and echoed in completions.
        on_request: called after every request (access log, GPU utilisation).
    """

    def __init__(
        self, engine: SimEngine, host: str, port: int, model: str, on_request: RequestHook
    ) -> None:
        self.engine = engine
        self.model = model
        self.on_request = on_request
        self.health = Health.LOADING
        #: Seconds the start took (``load``, ``total``), set once it is over.
        self.startup: dict[str, float] = {}
        self.server_header = "llama.cpp" if engine is SimEngine.LLAMACPP else "uvicorn"
        self._httpd = _HTTPServer(self, (host, port))
        self._bound = False
        self._thread: threading.Thread | None = None

    def bind(self) -> None:
        """Bind without listening: connections are refused, as vLLM's pre-bound socket does."""
        if not self._bound:
            self._httpd.server_bind()
            self._bound = True

    def listen(self) -> None:
        """Bind if needed, listen, and serve in a background thread."""
        self.bind()
        self._httpd.server_activate()
        # A short poll interval keeps SIGTERM prompt: shutdown() waits for the next poll.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="http"
        )
        self._thread.daemon = True
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=2)
        self._httpd.server_close()
