"""The embedding engine: the one entry of a request's texts — validated, tokenised, admitted and queued — and the
admission that decides before a body is read (TEI's core: validation, tokenisation, permits, queue).

`Engine.embed` is what ``/v1/embeddings``, ``/embed`` and ``/similarity`` share; the API layer (``service.api``)
only turns its request shape into texts and the resulting matrix into its response shape, and counts the request.
The engine owns the served models (`ModelManager`) and the admission (`Admission`), so a batch launched by a model
wakes the admission here, not through the API.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.text import not_unicode
from service.auth import ANONYMOUS
from service.backend.base import Token
from service.engine.admission import Admission, Ticket
from service.engine.served import ModelManager, ServedModel
from service.errors import ErrorKind, ServiceError
from service.metrics import ServiceMetrics
from service.observability import RequestContext
from service.settings import ServiceSettings

INLINE_TOKENIZE_CHARS = 4096  # smaller requests tokenise on the event loop: a thread hop costs more than the work


@dataclass
class EmbedResult:
    """A request's embeddings, and the timings the response headers report (seconds)."""

    model: ServedModel
    embeddings: np.ndarray  # (n, dim) float32
    tokens: int
    timings: dict[str, float]


@dataclass
class TokensResult:
    """A /tokenize request's tokens, and the timings its response headers report (seconds)."""

    tokens: list[list[Token]]
    timings: dict[str, float]


class Engine:
    """The served models, their admission, and the request path into their queues."""

    def __init__(self, settings: ServiceSettings, models: ModelManager, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.models = models
        self.metrics = metrics
        self.admission = Admission(
            self.room, hold_seconds=settings.overload_hold_seconds, max_waiting=settings.max_concurrent_requests
        )
        models.on_room = self.admission.wake

    # ------------------------------------------------------------------------------------ admission
    def room(self, tenant: str = ANONYMOUS) -> ServiceError | None:
        """Admission's question for a request of key ``tenant``, asked before its body is read: None if it may go
        on; else the 429 for ``max_concurrent_requests`` requests in flight, or for every served model over its
        bound for that key (`Batcher.refusal`). Which model a request wants is in its body, so with several models
        only a state that refuses any request is refused here; the rest is checked again once the body names its
        model."""
        limit = self.settings.max_concurrent_requests
        models = self.models.models()
        if self.admission.in_flight >= limit:
            retry = min((m.batcher.retry_after() for m in models), default=1)
            return ServiceError(
                ErrorKind.overloaded,
                f"the server is overloaded: {self.admission.in_flight} requests in flight, limit "
                f"max_concurrent_requests={limit}; retry after the number of seconds in Retry-After",
                headers={"Retry-After": str(retry)},
            )
        refusals = []
        for model in models:
            err = model.batcher.refusal(1, tenant)
            if err is None or err.kind is not ErrorKind.overloaded:
                return None
            refusals.append(err)
        return min(refusals, key=lambda err: int(err.headers["Retry-After"]), default=None)

    # ------------------------------------------------------------------------------------ the request path
    def resolve(self, model_name: str | None) -> ServedModel:
        """The served model a request names (the default when it names none); 404 or 503 otherwise."""
        return self.models.get(model_name)

    def check_texts(
        self, texts: list[str], field_name: str, *, names: Sequence[str] | None = None, uncounted: int = 0
    ) -> None:
        """Per-request limits, checked before any tokenisation or queueing; an error names the text as
        ``field_name[index]``, or as ``names[index]`` when the texts come from several fields. The first
        ``uncounted`` texts do not count against ``max_client_batch_size`` (the similarity's source sentence)."""
        if not texts:
            raise ServiceError(ErrorKind.invalid_request, f"{field_name} is empty: send at least one text")
        limit = self.settings.max_client_batch_size
        if len(texts) - uncounted > limit:
            raise ServiceError(
                ErrorKind.invalid_request,
                f"{field_name} has {len(texts) - uncounted} texts, more than max_client_batch_size={limit}; split the "
                "request (LangChain's OpenAIEmbeddings: chunk_size)",
            )
        max_chars = self.settings.max_input_chars
        for index, text in enumerate(texts):
            if not text:
                problem = "is an empty string: every text needs content"
            elif len(text) > max_chars:
                problem = f"has {len(text)} characters, more than max_input_chars={max_chars}"
            elif (unicode := not_unicode(text)) is not None:
                problem = f"{unicode}; send the text as UTF-8"
            else:
                continue  # the text's name is formatted only for an error: this loop runs on every request
            raise ServiceError(ErrorKind.invalid_request, f"{_text_name(field_name, names, index)} {problem}")

    async def embed(
        self,
        model: ServedModel,
        texts: list[str],
        *,
        truncate: bool,
        field_name: str,
        names: Sequence[str] | None = None,
        uncounted: int = 0,
        prompt_name: str | None = None,
        truncation_direction: str = "right",
        context: RequestContext | None = None,
    ) -> EmbedResult:
        """Validate, tokenise, admit and queue ``texts`` for ``model`` (a `resolve`d one), as the request of
        ``context`` (its key's share of the queue; its trace's stages), and await their embeddings. Each text is
        embedded after the model's prompt ``prompt_name`` (its default prompt, if it has one, when None); with
        ``truncate``, an over-long one loses its end (``truncation_direction`` "right") or its start ("left")."""
        self.check_texts(texts, field_name, names=names, uncounted=uncounted)
        sent = texts
        ticket: Ticket | None = context.ticket if context is not None else None
        tenant = ticket.tenant if ticket is not None else ANONYMOUS
        while True:
            model = self._current(model)
            backend = model.backend
            texts, prompt = _after_prompt(model, sent, prompt_name)
            model.batcher.check_admission(len(texts), tenant)  # again in submit: a flood's 429s cost no tokenising
            started = time.perf_counter()
            if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:
                tokens = backend.tokenize(texts, truncation_direction)
            else:
                tokens = await asyncio.to_thread(backend.tokenize, texts, truncation_direction)
            tokenized = time.perf_counter()
            self.metrics.tokenization_time.labels(model.name).observe(tokenized - started)
            if not truncate:
                for index, item in enumerate(tokens):
                    if item.truncated:
                        count = await asyncio.to_thread(backend.count_tokens, texts[index])
                        limit = backend.info.max_seq_length
                        with_prompt = f" with the prompt {prompt!r}" if prompt else ""
                        raise ServiceError(
                            ErrorKind.input_too_long,
                            f"{_text_name(field_name, names, index)} has {count} tokens{with_prompt}, more than "
                            f"model {model.name!r} accepts ({limit}); shorten it or send truncate=true",
                        )
            if self._current(model) is model:  # else a newer version was promoted while these were tokenised
                break
        job = model.batcher.submit(tokens, tenant)
        if ticket is not None:
            ticket.queued()
        try:
            await job.future
        except asyncio.CancelledError:  # the request was given up (its client left): its texts leave the queue
            model.batcher.cancel(job)
            raise
        if context is not None:
            context.stage("tokenization", started, tokenized)
            context.stage("queue", job.enqueued_at, job.started_at)
            context.stage("batch", job.started_at, job.finished_at)
        n_tokens = 0
        input_length = self.metrics.input_length.labels(model.name)
        for item in tokens:
            n_tokens += item.n_tokens
            input_length.observe(item.n_tokens)
        self.metrics.queue_time.labels(model.name).observe(job.queue_time)
        self.metrics.tokens.labels(model.name).inc(n_tokens)
        self.metrics.embeddings.labels(model.name).inc(len(tokens))
        timings = {"tokenization": tokenized - started, "queue": job.queue_time, "inference": job.inference_time}
        return EmbedResult(model=model, embeddings=job.out, tokens=n_tokens, timings=timings)

    def _current(self, model: ServedModel) -> ServedModel:
        """The version of ``model`` that takes texts now: ``model`` itself, or, once a newer version has replaced it
        (a hot reload while a request was being validated or tokenised), that newer one — so a request never fails
        because a model was promoted under it. While the server stops, ``model`` (whose queue then refuses)."""
        if not model.batcher.closing:
            return model
        newer = self.models.current(model.name)
        return newer if newer is not None else model

    async def tokens(
        self, model: ServedModel, texts: list[str], *, add_special_tokens: bool, prompt_name: str | None,
        field_name: str, context: RequestContext | None = None,
    ) -> TokensResult:  # fmt: skip
        """Every token of each of ``texts`` after the model's prompt ``prompt_name`` (as `embed` puts it), none
        cut, checked as `embed` checks texts; large requests are tokenised off the event loop. Timed and measured as
        `embed` is: the tokenisation's time (its metric, the request's trace stage, the answer's header) and each
        text's length (`ServiceMetrics.tokenize_length`: none cut, so apart from the embedded texts')."""
        self.check_texts(texts, field_name)
        texts, _ = _after_prompt(model, texts, prompt_name)
        started = time.perf_counter()
        if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:
            tokens = model.backend.tokens(texts, add_special_tokens)
        else:
            tokens = await asyncio.to_thread(model.backend.tokens, texts, add_special_tokens)
        tokenized = time.perf_counter()
        self.metrics.tokenization_time.labels(model.name).observe(tokenized - started)
        lengths = self.metrics.tokenize_length.labels(model.name)
        for text in tokens:
            lengths.observe(len(text))
        if context is not None:
            context.stage("tokenization", started, tokenized)
        return TokensResult(tokens, {"tokenization": tokenized - started})


def _after_prompt(model: ServedModel, texts: list[str], prompt_name: str | None) -> tuple[list[str], str]:
    """``texts`` each after the model's prompt ``prompt_name`` (`core.model_folder.Prompts.text_for`), and that
    prompt ("" for none); 422 for a name the model lacks."""
    try:
        prompt = model.backend.info.prompts.text_for(prompt_name)
    except ValueError as err:
        raise ServiceError(ErrorKind.invalid_request, f"{err} (model {model.name!r})") from None
    return ([prompt + text for text in texts] if prompt else texts), prompt


def _text_name(field_name: str, names: Sequence[str] | None, index: int) -> str:
    """How an error names text ``index`` of a request: its own name, or its place in ``field_name``."""
    return names[index] if names is not None else f"{field_name}[{index}]"
