"""The embedding routes without FastAPI's request machinery, for a body that validates.

FastAPI's routing, dependency resolution and body handling cost about as much per request as everything else the
server does around one short text (tokenising, queueing, the response). `GuardMiddleware` hands an embedding
``POST`` with a JSON body here instead: the body is read through the same guarded ``receive`` (size and pace
bounds), parsed and validated by the route's own pydantic model in one step, and the route's own function runs
with a `Request` of the same scope; what it raises goes to the app's own exception handlers. Anything else — a
body that does not validate, another content type — is handed to FastAPI with the body replayed, so every error
answer is FastAPI's, as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from service.api.protocol import OpenAIEmbeddingRequest, TEIEmbedRequest, TEISimilarityRequest
from service.api.routes import openai_embeddings, tei_embed, tei_root, tei_similarity

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ROUTES: dict[str, tuple[type[BaseModel], Callable[[Any, Request], Awaitable[Response]]]] = {
    "/v1/embeddings": (OpenAIEmbeddingRequest, openai_embeddings),
    "/embed": (TEIEmbedRequest, tei_embed),
    "/": (TEIEmbedRequest, tei_root),
    "/similarity": (TEISimilarityRequest, tei_similarity),
}


def direct_route(scope: Scope) -> tuple[type[BaseModel], Callable[[Any, Request], Awaitable[Response]]] | None:
    """The model and function of an embedding ``POST`` whose body is declared JSON, or None."""
    if scope["method"] != "POST" or scope["path"] not in ROUTES:
        return None
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return ROUTES[scope["path"]] if value.split(b";", 1)[0].strip().lower() == b"application/json" else None
    return None


async def serve(
    route: tuple[type[BaseModel], Callable[[Any, Request], Awaitable[Response]]],
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """Answer one request of ``route`` (from `direct_route`); ``app`` is the FastAPI stack, for what is not ours."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left: let the framework see it as it would
            await app(scope, _replay(b"".join(chunks), receive, message), send)
            return
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    model, function = route
    try:
        parsed = model.model_validate_json(body)
    except ValidationError:
        await app(scope, _replay(body, receive), send)  # FastAPI's own answer to a body it rejects
        return
    request = Request(scope, receive)
    try:
        response = await function(parsed, request)
    except Exception as err:
        response = await _handled(scope["app"], request, err)
    await response(scope, receive, send)


async def _handled(app: Any, request: Request, err: Exception) -> Response:
    """The app's own exception handler for ``err`` (the closest class in its MRO), as FastAPI would pick it."""
    handlers = app.exception_handlers
    for cls in type(err).__mro__:
        if cls in handlers:
            return await handlers[cls](request, err)
    raise err


def _replay(body: bytes, receive: Receive, last: Message | None = None) -> Receive:
    """A ``receive`` that gives ``body`` back as one message (then ``last``, if any), then reads on."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": last is not None}]
    if last is not None:
        pending.append(last)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
