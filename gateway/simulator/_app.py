"""The simulator's Starlette application: provider routes and the observation routes."""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, ParamSpec

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from gateway.simulator._bedrock import EVENTSTREAM_TYPE
from gateway.simulator._continuation import (
    Refusal,
    continuation_of,
    continue_completion,
    continue_plan,
)
from gateway.simulator._knobs import FAULTS, SHAPES, KnobError, Knobs, read_knobs
from gateway.simulator._ollama import ollama_tags_body
from gateway.simulator._protocols import (
    ProtocolName,
    context_length_body,
    embeddings_body,
    error_body,
    make_plan,
    models_body,
)
from gateway.simulator._records import (
    RECORD_SCOPE_KEY,
    RecorderMiddleware,
    RecordStore,
    RequestRecord,
)
from gateway.simulator._renderers import make_renderer
from gateway.simulator._script import Step, Write, json_steps, stream_steps
from gateway.simulator._sse import dumps
from gateway.simulator._websocket import serve_responses_websocket
from gateway.simulator._wire import Closing, ScriptedResponse, install_abort_log_filter

__all__ = ["UNKNOWN_MODEL", "create_simulator_app"]

_RETRY_AFTER_STATUSES: Final = frozenset({429, 503, 529})
#: A model whose name starts so is refused (404, the provider's shape), as a real
#: provider refuses a model it does not have; any other name is answered.
UNKNOWN_MODEL: Final = "no-such-model"
_DEFAULT_LIST_LIMIT: Final = 100
#: The media type of a streamed answer where it is not ``text/event-stream``.
_STREAM_TYPES: Final = {
    "ollama": "application/x-ndjson",
    "ollama_generate": "application/x-ndjson",
    "bedrock_converse": EVENTSTREAM_TYPE,
    "bedrock_invoke": EVENTSTREAM_TYPE,
}

P = ParamSpec("P")


#: The header that carries a provider's own request id, where it is not ``x-request-id``.
_ID_HEADERS: Final = {
    "messages": "request-id",
    "bedrock_converse": "x-amzn-requestid",
    "bedrock_invoke": "x-amzn-requestid",
}


#: A route's answer to a request.
Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(kw_only=True, eq=False)
class _Simulator:
    """The fake provider's routes, with the defaults of a request that sets no knob
    (the options of ``create_simulator_app``; a ValueError names one out of its range).

    ``default_tps`` paces content deltas per second (0: as fast as possible)
    and ``default_tokens`` is the number of content deltas, for requests that
    do not set ``x-sim-tps`` / ``x-sim-tokens``. The request records are
    kept in ``store`` (a new bounded store by default), also reachable as
    ``app.state.records``. ``default_fault`` (and ``default_status`` for
    fault ``status``) is the fault of every request that names none: a
    whole provider that fails, e.g. behind a gateway's pool of upstreams.

    The default fault may be passing: only the first ``fault_requests``
    requests (a 500 once: 1), or ``fault_seconds`` from the first request (a
    provider down for a while, then back). ``retry_after`` is the
    ``Retry-After`` of a 429, 503 or 529 (None: none); with
    ``context_length``, a 400 says the prompt is too long, in the provider's
    own words (OpenAI's ``context_length_exceeded``, Anthropic's "prompt is
    too long").

    A request whose last message is the assistant's (a prefill) is continued:
    the answer is the rest of the scripted one after that text, exactly. Which
    continuation requests are taken (``continuation``): ``any`` (a plain
    prefill, ``continue_final_message`` or ``"prefix": true``), one of those
    styles only, or ``reject`` (a 400, as a model that rejects prefill);
    ``restart`` takes a prefill and answers from the start all the same (an
    upstream that ignores it), ``empty`` answers it with a finish and no text.
    ``default_seed`` is the seed of a request that sets no ``x-sim-seed``: a
    provider whose answer to the same request differs from another's.
    ``default_structured`` is the structured answer's shape (``SHAPES``) of a request
    that sets no ``x-sim-structured``: a provider whose model breaks the schema.
    """

    store: RecordStore = field(default_factory=RecordStore)
    default_tps: float = 0
    default_tokens: int = 20
    default_fault: str = "none"
    default_status: int = 500
    fault_requests: int | None = None
    fault_seconds: float | None = None
    retry_after: str | None = "1"
    context_length: bool = False
    continuation: str = "any"
    default_seed: int = 0
    default_structured: str = ""
    #: When each provider request arrived (monotonic), for tests of retry timing.
    arrivals: list[float] = field(init=False, default_factory=list)
    #: Set when the server shuts down: responses still being written are cut.
    closing: Closing = field(init=False, default_factory=Closing)

    def __post_init__(self) -> None:
        if self.default_tps < 0 or self.default_tokens < 0:
            raise ValueError("default_tps and default_tokens must not be negative")
        fault = self.default_fault
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known faults: {', '.join(FAULTS)}")
        if not 300 <= self.default_status <= 599:
            raise ValueError("default_status must be between 300 and 599")
        shape = self.default_structured
        if shape and shape not in SHAPES:
            raise ValueError(f"unknown structured shape {shape!r}")

    # -- helpers -----------------------------------------------------------------

    def _default_fault_now(self) -> str:
        """The default fault for this request: it may last only the first
        ``fault_requests`` requests, or ``fault_seconds`` from the first request
        (a provider down for a while, then back)."""
        now = time.monotonic()
        arrivals = self.arrivals
        if len(arrivals) < 100_000:
            arrivals.append(now)
        if self.fault_requests is not None and len(arrivals) > self.fault_requests:
            return "none"
        if self.fault_seconds is not None and now - arrivals[0] >= self.fault_seconds:
            return "none"
        return self.default_fault

    @staticmethod
    def _id_headers(protocol: str) -> tuple[str, list[tuple[str, str]]]:
        upstream_id = f"req_sim_{uuid.uuid4().hex}"
        own = _ID_HEADERS.get(protocol, "x-request-id")
        return upstream_id, [("x-upstream-sim-id", upstream_id), (own, upstream_id)]

    def _json(
        self,
        status: int,
        payload: Any,
        headers: list[tuple[str, str]],
        *,
        stall_before: float = 0.0,
    ) -> ScriptedResponse:
        data = dumps(payload).encode()
        steps: list[Step] = [Write(data)]
        all_headers = [
            ("content-type", "application/json"),
            ("content-length", str(len(data))),
            *headers,
        ]
        if status in _RETRY_AFTER_STATUSES and self.retry_after is not None:
            all_headers.append(("retry-after", self.retry_after))
        return ScriptedResponse(
            status_code=status,
            headers=all_headers,
            steps=steps,
            stall_before=stall_before,
            closing=self.closing,
        )

    async def _read(
        self, request: Request, protocol: str
    ) -> tuple[dict[str, Any], int, Knobs, str, list[tuple[str, str]]] | ScriptedResponse:
        """The JSON body, its size, the knobs and the id headers; or a 400 response."""
        upstream_id, id_headers = self._id_headers(protocol)
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            body = None
        if not isinstance(body, dict):
            message = "The request body is not a JSON object."
            payload = error_body(protocol, 400, message, upstream_id)
            return self._json(400, payload, id_headers)
        try:
            knobs = read_knobs(
                request.headers,
                body,
                default_tps=self.default_tps,
                default_tokens=self.default_tokens,
                default_fault=self._default_fault_now(),
                default_status=self.default_status,
                default_seed=self.default_seed,
                default_structured=self.default_structured,
            )
        except KnobError as exc:
            return self._json(400, error_body(protocol, 400, str(exc), upstream_id), id_headers)
        record = request.scope.get(RECORD_SCOPE_KEY)
        if isinstance(record, RequestRecord):
            record.fault = knobs.fault
        return body, len(raw), knobs, upstream_id, id_headers

    # -- provider routes ---------------------------------------------------------

    async def _generate(
        self,
        request: Request,
        protocol: ProtocolName,
        *,
        stream: bool | None = None,
        model: str | None = None,
    ) -> Response:
        """One answer; ``stream`` and ``model`` when the URL says them, else the body."""
        read = await self._read(request, protocol)
        if isinstance(read, ScriptedResponse):
            return read
        body, size, knobs, upstream_id, id_headers = read
        stall = knobs.stall_seconds if knobs.fault == "stall_before_headers" else 0.0
        if knobs.fault == "status":
            message = f"Simulated upstream error (status {knobs.status})."
            payload = error_body(protocol, knobs.status, message, upstream_id)
            if knobs.status == 400 and self.context_length:
                payload = context_length_body(protocol)
            return self._json(knobs.status, payload, id_headers)
        named = model if model is not None else body.get("model")
        if knobs.fault == "none" and isinstance(named, str) and named.startswith(UNKNOWN_MODEL):
            payload = error_body(protocol, 404, "The model does not exist.", upstream_id)
            return self._json(404, payload, id_headers)

        prefill = continuation_of(protocol, body, self.continuation)
        if isinstance(prefill, Refusal):
            payload = error_body(protocol, 400, prefill.message, upstream_id)
            return self._json(400, payload, id_headers)
        plan = make_plan(protocol, body, knobs, size, model=model)
        if prefill is not None and not continue_plan(plan, knobs, prefill, self.continuation):
            message = "The prefill is not a prefix of the simulator's scripted answer."
            return self._json(400, error_body(protocol, 400, message, upstream_id), id_headers)
        if protocol == "completions" and self.continuation != "reject":
            continue_completion(plan, knobs, body.get("prompt"))
        renderer = make_renderer(plan, crlf=knobs.crlf)
        partition_seed = knobs.seed if knobs.partition else None
        if stream is None:
            stream = body.get("stream") is True
        if stream:
            headers = [
                ("content-type", _STREAM_TYPES.get(protocol, "text/event-stream; charset=utf-8")),
                ("cache-control", "no-cache"),
                *id_headers,
            ]
            return ScriptedResponse(
                status_code=200,
                headers=headers,
                steps=stream_steps(renderer, knobs),
                tps=knobs.tps,
                partition_seed=partition_seed,
                stall_before=stall,
                closing=self.closing,
            )
        steps, length = json_steps(renderer, knobs)
        headers = [("content-type", "application/json"), *id_headers]
        if length is not None:
            headers.insert(1, ("content-length", str(length)))
        return ScriptedResponse(
            status_code=200,
            headers=headers,
            steps=steps,
            partition_seed=partition_seed,
            stall_before=stall,
            closing=self.closing,
        )

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completions")

    async def responses(self, request: Request) -> Response:
        return await self._generate(request, "responses")

    async def responses_websocket(self, websocket: WebSocket) -> None:
        await serve_responses_websocket(
            websocket,
            default_tps=self.default_tps,
            default_tokens=self.default_tokens,
            default_fault=self.default_fault,
        )

    async def messages(self, request: Request) -> Response:
        return await self._generate(request, "messages")

    async def gemini_stream(self, request: Request) -> Response:
        if request.query_params.get("alt") != "sse":
            # Without alt=sse Google streams one JSON array; the simulator speaks SSE only.
            _, id_headers = self._id_headers("gemini")
            message = "The simulator streams Gemini answers only with alt=sse."
            return self._json(400, error_body("gemini", 400, message, ""), id_headers)
        model = request.path_params["model"]
        return await self._generate(request, "gemini", stream=True, model=model)

    def at_model(self, protocol: ProtocolName, *, stream: bool) -> Endpoint:
        """The answers at a URL that names the model and whether they stream (Gemini's,
        Bedrock's)."""

        async def endpoint(request: Request) -> Response:
            model = request.path_params["model"]
            return await self._generate(request, protocol, stream=stream, model=model)

        return endpoint

    async def ollama_chat(self, request: Request) -> Response:
        return await self._ollama(request, "ollama")

    async def ollama_generate(self, request: Request) -> Response:
        return await self._ollama(request, "ollama_generate")

    async def _ollama(self, request: Request, protocol: ProtocolName) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            body = None
        stream = not isinstance(body, dict) or body.get("stream") is not False
        return await self._generate(request, protocol, stream=stream)

    async def ollama_tags(self, request: Request) -> Response:
        _, id_headers = self._id_headers("ollama")
        return self._json(200, ollama_tags_body(), id_headers)

    async def embeddings(self, request: Request) -> Response:
        read = await self._read(request, "embeddings")
        if isinstance(read, ScriptedResponse):
            return read
        body, _, knobs, upstream_id, id_headers = read
        if knobs.fault == "status":
            message = f"Simulated upstream error (status {knobs.status})."
            payload = error_body("embeddings", knobs.status, message, upstream_id)
            return self._json(knobs.status, payload, id_headers)
        stall = knobs.stall_seconds if knobs.fault == "stall_before_headers" else 0.0
        return self._json(200, embeddings_body(body), id_headers, stall_before=stall)

    async def models(self, request: Request) -> Response:
        anthropic = "anthropic-version" in request.headers
        _, id_headers = self._id_headers("messages" if anthropic else "models")
        return self._json(200, models_body(anthropic=anthropic), id_headers)

    # -- observation routes ------------------------------------------------------

    async def get_record(self, request: Request) -> Response:
        record = self.store.get(request.path_params["request_id"])
        if record is None:
            return JSONResponse({"error": {"message": "unknown request id"}}, status_code=404)
        return JSONResponse(record.to_json())

    async def list_records(self, request: Request) -> Response:
        try:
            limit = int(request.query_params.get("limit", _DEFAULT_LIST_LIMIT))
        except ValueError:
            return JSONResponse({"error": {"message": "limit must be an integer"}}, 400)
        data = [record.to_json() for record in self.store.latest(limit)]
        return JSONResponse({"object": "list", "data": data, "total": len(self.store)})

    async def clear_records(self, request: Request) -> Response:
        self.store.clear()
        return Response(status_code=204)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def faults(self, request: Request) -> Response:
        return JSONResponse({"faults": list(FAULTS)})


def _simulator_app(sim: _Simulator) -> Starlette:
    """The simulator's routes as an ASGI application (``create_simulator_app``)."""
    records = sim.store
    install_abort_log_filter()
    at = sim.at_model
    routes = [
        Route("/v1/chat/completions", sim.chat, methods=["POST"]),
        Route("/v1/completions", sim.completions, methods=["POST"]),
        Route("/v1/responses", sim.responses, methods=["POST"]),
        WebSocketRoute("/v1/responses", sim.responses_websocket),
        Route("/v1/messages", sim.messages, methods=["POST"]),
        Route("/v1beta/models/{model}:streamGenerateContent", sim.gemini_stream, methods=["POST"]),
        Route(
            "/v1beta/models/{model}:generateContent", at("gemini", stream=False), methods=["POST"]
        ),
        Route("/api/chat", sim.ollama_chat, methods=["POST"]),
        Route("/api/generate", sim.ollama_generate, methods=["POST"]),
        Route("/api/tags", sim.ollama_tags, methods=["GET"]),
        # Bedrock Runtime, at the root as on AWS: model ids hold ":" (quoted by botocore).
        Route(
            "/model/{model}/converse-stream", at("bedrock_converse", stream=True), methods=["POST"]
        ),
        Route("/model/{model}/converse", at("bedrock_converse", stream=False), methods=["POST"]),
        Route(
            "/model/{model}/invoke-with-response-stream",
            at("bedrock_invoke", stream=True),
            methods=["POST"],
        ),
        Route("/model/{model}/invoke", at("bedrock_invoke", stream=False), methods=["POST"]),
        Route("/v1/embeddings", sim.embeddings, methods=["POST"]),
        Route("/v1/models", sim.models, methods=["GET"]),
        Route("/_sim/requests", sim.list_records, methods=["GET"]),
        Route("/_sim/requests", sim.clear_records, methods=["DELETE"]),
        Route("/_sim/requests/{request_id:str}", sim.get_record, methods=["GET"]),
        Route("/_sim/health", sim.health, methods=["GET"]),
        Route("/_sim/faults", sim.faults, methods=["GET"]),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(RecorderMiddleware, store=records)])
    app.state.records = records
    app.state.closing = sim.closing
    app.state.arrivals = sim.arrivals
    return app


def _app_maker(options: Callable[P, _Simulator]) -> Callable[P, Starlette]:
    """A maker of the simulator's app that takes what ``options`` takes (its fields, by
    keyword), so the options are declared once and checked by type where they are given."""

    def create_simulator_app(*args: P.args, **kwargs: P.kwargs) -> Starlette:
        """The simulator as an ASGI application (its options: ``_Simulator``)."""
        return _simulator_app(options(*args, **kwargs))

    # help() and editors show the options' own signature (``inspect`` follows it).
    functools.update_wrapper(create_simulator_app, options, assigned=(), updated=())
    return create_simulator_app


create_simulator_app = _app_maker(_Simulator)
