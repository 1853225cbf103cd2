"""The OpenAI-compatible HTTP front (FastAPI): ``/v1/models``, ``/v1/completions``,
``/v1/chat/completions`` (streamed as server-sent events or whole), ``/health``.

Each request is checked and tokenized here, submitted to the :class:`AsyncEngine`, and its
outputs are turned into OpenAI's response or chunk objects. Errors have OpenAI's shape
``{"error": {"message", "type", "param", "code"}}``: 400 for a bad field (named in
``param``), 404 for an unknown model, 500 when generation failed. A request's ``model`` is
the base model's name or a per-request adapter's (``--lora-modules``). A client that goes
away mid-request cancels it: its sequences are aborted and their blocks freed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from libai.serving.async_engine import AsyncEngine, Stream
from libai.serving.chat import render_chat
from libai.serving.protocol import ChatCompletionRequest, CompletionRequest
from libai.serving.sampling import InvalidParameter


@dataclass
class ServedModel:
    """What the front needs besides the engine."""

    name: str
    tokenizer: object
    max_model_len: int
    chat_template: str | None = None
    #: per-request LoRA adapters: name (the ``model`` a request sends) -> PEFT directory,
    #: in the order of the executor's adapters
    adapters: dict[str, str] = field(default_factory=dict)


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str, param=None, code=None):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code


def error_body(message: str, kind: str, param=None, code=None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def build_app(engine: AsyncEngine, served: ServedModel, on_shutdown=None) -> FastAPI:
    """The FastAPI application serving ``served`` through ``engine``; ``on_shutdown`` runs
    after the engine thread stopped (e.g. stopping tensor-parallel workers)."""

    @asynccontextmanager
    async def lifespan(app):
        yield
        engine.shutdown()
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="libai-serve", lifespan=lifespan)
    front = _Front(engine, served)

    @app.exception_handler(APIError)
    async def api_error(request, error: APIError):
        body = error_body(str(error), error.kind, error.param, error.code)
        return JSONResponse(body, status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, error: RequestValidationError):
        first = error.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
        return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

    @app.get("/health")
    async def health():
        if not engine.alive:
            raise APIError(503, "the engine thread has stopped", "server_error")
        return {}

    @app.get("/v1/models")
    async def models():
        def card(name: str, **extra) -> dict:
            return {
                "id": name,
                "object": "model",
                "created": front.created,
                "owned_by": "libai",
                "max_model_len": served.max_model_len,
                **extra,
            }

        adapters = [
            card(name, root=path, parent=served.name) for name, path in served.adapters.items()
        ]
        return {"object": "list", "data": [card(served.name, root=served.name), *adapters]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await front.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await front.chat(body, request)

    return app


class _Front:
    def __init__(self, engine: AsyncEngine, served: ServedModel):
        self.engine, self.served = engine, served
        self.created = int(time.time())

    # ---- checks ---------------------------------------------------------------------------
    def _adapter(self, name: str) -> int:
        """The adapter index a request's ``model`` names (-1: the base model)."""
        if name == self.served.name:
            return -1
        if name in self.served.adapters:
            return list(self.served.adapters).index(name)
        known = ", ".join(f"`{n}`" for n in [self.served.name, *self.served.adapters])
        raise APIError(
            404,
            f"The model `{name}` does not exist; this server serves {known}",
            "invalid_request_error",
            "model",
            "model_not_found",
        )

    def _encode(self, prompt, param: str, add_special_tokens=True) -> list[int]:
        if isinstance(prompt, list):
            return list(prompt)
        if self.served.tokenizer is None:
            raise APIError(
                400, "this model has no tokenizer: send token ids", "invalid_request_error", param
            )
        return self.served.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)

    async def _submit(self, prompt_ids, params, param: str, adapter: int) -> Stream:
        try:
            return await self.engine.submit(prompt_ids, params, adapter)
        except InvalidParameter as error:
            name = param if error.param == "prompt" else error.param
            raise APIError(400, str(error), "invalid_request_error", name) from error

    @staticmethod
    def _bad(error: InvalidParameter) -> APIError:
        return APIError(400, str(error), "invalid_request_error", error.param)

    # ---- /v1/completions ------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, request: Request):
        adapter = self._adapter(body.model)
        if body.echo:
            raise APIError(400, "echo is not supported", "invalid_request_error", "echo")
        try:
            params = body.sampling(body.max_tokens, body.logprobs)
        except InvalidParameter as error:
            raise self._bad(error) from error
        prompts = [self._encode(p, "prompt") for p in body.prompts()]
        streams = [await self._submit(ids, params, "prompt", adapter) for ids in prompts]
        rid, n = f"cmpl-{uuid.uuid4().hex}", params.n
        shape = _CompletionShape(self, rid, body.model, body.logprobs is not None)
        if body.stream:
            return self._sse(streams, prompts, n, shape, body.include_usage, request)
        return await self._whole(streams, prompts, n, shape, request)

    # ---- /v1/chat/completions -------------------------------------------------------------
    async def chat(self, body: ChatCompletionRequest, request: Request):
        adapter = self._adapter(body.model)
        try:
            params = body.sampling(body.max_new_tokens(), body.logprob_count())
            messages = [m.for_template() for m in body.messages]
        except InvalidParameter as error:
            raise self._bad(error) from error
        if self.served.chat_template is None:
            raise APIError(
                400,
                "this model has no chat template (chat_template.jinja or tokenizer_config.json); "
                "use /v1/completions",
                "invalid_request_error",
                "messages",
            )
        tok = self.served.tokenizer
        try:
            text = render_chat(
                self.served.chat_template,
                messages,
                bos_token=_token(tok, "bos_token_id"),
                eos_token=_token(tok, "eos_token_id"),
            )
        except ValueError as error:
            raise APIError(400, str(error), "invalid_request_error", "messages") from error
        prompt = self._encode(text, "messages", add_special_tokens=False)
        stream = await self._submit(prompt, params, "messages", adapter)
        shape = _ChatShape(self, f"chatcmpl-{uuid.uuid4().hex}", body.model, body.logprobs)
        if body.stream:
            return self._sse([stream], [prompt], params.n, shape, body.include_usage, request)
        return await self._whole([stream], [prompt], params.n, shape, request)

    # ---- collecting outputs ---------------------------------------------------------------
    async def _whole(self, streams, prompts, n, shape, request: Request):
        choices = {}
        try:
            for p, stream in enumerate(streams):
                pieces = [[] for _ in stream.seqs]
                done = 0
                while done < len(stream.seqs):
                    i, out = await _next(stream, request)
                    if out.error is not None:  # a Failed notice or a failed sequence
                        raise APIError(500, f"generation failed: {out.error}", "server_error")
                    pieces[i].append(out)
                    done += out.finished
                for i, outs in enumerate(pieces):
                    choices[p * n + i] = shape.choice(p * n + i, outs)
        except BaseException:
            for stream in streams:
                self.engine.cancel(stream)
            raise
        usage = _usage(prompts, streams)
        return shape.response([choices[k] for k in sorted(choices)], usage)

    def _sse(self, streams, prompts, n, shape, include_usage: bool, request: Request):
        async def events():
            finished = False
            try:
                for chunk in shape.opening(len(streams) * n):
                    yield _event(chunk, include_usage)
                for p, stream in enumerate(streams):
                    done = 0
                    while done < len(stream.seqs):
                        i, out = await _next(stream, request)
                        error = out.error  # a Failed notice or a failed sequence
                        if error is not None:
                            body = error_body(f"generation failed: {error}", "server_error")
                            yield f"data: {json.dumps(body)}\n\n"
                            return
                        done += out.finished
                        chunk = shape.chunk(p * n + i, out)
                        if chunk is not None:
                            yield _event(chunk, include_usage)
                if include_usage:
                    yield _event(shape.usage_chunk(_usage(prompts, streams)), False)
                yield "data: [DONE]\n\n"
                finished = True
            finally:
                if not finished:  # the client left (or an error): free its sequences
                    for stream in streams:
                        self.engine.cancel(stream)

        return StreamingResponse(events(), media_type="text/event-stream")


async def _next(stream: Stream, request: Request):
    """The request's next output; a disconnected client raises CancelledError."""
    while True:
        try:
            return await asyncio.wait_for(stream.queue.get(), timeout=0.25)
        except TimeoutError:
            if await request.is_disconnected():
                raise asyncio.CancelledError("the client disconnected") from None


def _event(chunk: dict, include_usage: bool) -> str:
    if include_usage:
        chunk = {**chunk, "usage": None}
    return f"data: {json.dumps(chunk)}\n\n"


def _usage(prompts, streams) -> dict:
    prompt_tokens = sum(len(p) for p in prompts)
    completion = sum(len(seq.output_ids) for s in streams for seq in s.seqs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def _token(tokenizer, attribute: str) -> str | None:
    token_id = getattr(tokenizer, attribute, None)
    if token_id is None:
        return None
    return tokenizer.convert_ids_to_tokens(token_id)


def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id]) if tokenizer is not None else str(token_id)


class _CompletionShape:
    """OpenAI's ``text_completion`` objects."""

    def __init__(self, front: _Front, rid: str, model: str, logprobs: bool):
        self.front, self.rid, self.model, self.logprobs = front, rid, model, logprobs
        self.created = int(time.time())
        self.offsets: dict[int, int] = {}

    def _head(self) -> dict:
        return {
            "id": self.rid,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
        }

    def _logprobs(self, index: int, outs) -> dict | None:
        if not self.logprobs:
            return None
        tok = self.front.served.tokenizer
        entries = [o for o in outs if o.logprob is not None and o.token_id is not None]
        tokens = [_token_text(tok, o.token_id) for o in entries]
        offsets, at = [], self.offsets.get(index, 0)
        for text in tokens:
            offsets.append(at)
            at += len(text)
        self.offsets[index] = at
        return {
            "tokens": tokens,
            "token_logprobs": [o.logprob[0] for o in entries],
            "top_logprobs": [{_token_text(tok, t): lp for t, lp in o.logprob[1]} for o in entries],
            "text_offset": offsets,
        }

    def choice(self, index: int, outs) -> dict:
        return {
            "index": index,
            "text": "".join(o.text for o in outs),
            "logprobs": self._logprobs(index, outs),
            "finish_reason": outs[-1].seq.finish_reason,
        }

    def response(self, choices, usage) -> dict:
        return {**self._head(), "choices": choices, "usage": usage}

    def opening(self, count: int):
        return []

    def chunk(self, index: int, out) -> dict | None:
        if not out.finished and not out.text and out.logprob is None:
            return None  # nothing to show yet (text held back)
        choice = (
            self.choice(index, [out])
            if out.finished
            else {
                "index": index,
                "text": out.text,
                "logprobs": self._logprobs(index, [out]),
                "finish_reason": None,
            }
        )
        return {**self._head(), "choices": [choice]}

    def usage_chunk(self, usage) -> dict:
        return {**self._head(), "choices": [], "usage": usage}


class _ChatShape(_CompletionShape):
    """OpenAI's ``chat.completion`` and ``chat.completion.chunk`` objects."""

    def _head(self, chunk: bool = False) -> dict:
        kind = "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.rid, "object": kind, "created": self.created, "model": self.model}

    def _logprobs(self, index: int, outs) -> dict | None:
        if not self.logprobs:
            return None
        tok = self.front.served.tokenizer

        def entry(token_id: int, logprob: float) -> dict:
            text = _token_text(tok, token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        content = []
        for o in outs:
            if o.logprob is None or o.token_id is None:
                continue
            item = entry(o.token_id, o.logprob[0])
            item["top_logprobs"] = [entry(t, lp) for t, lp in o.logprob[1]]
            content.append(item)
        return {"content": content}

    def choice(self, index: int, outs) -> dict:
        return {
            "index": index,
            "message": {"role": "assistant", "content": "".join(o.text for o in outs)},
            "logprobs": self._logprobs(index, outs),
            "finish_reason": outs[-1].seq.finish_reason,
        }

    def response(self, choices, usage) -> dict:
        return {**self._head(), "choices": choices, "usage": usage}

    def opening(self, count: int):
        for index in range(count):
            delta = {"role": "assistant", "content": ""}
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            yield {**self._head(chunk=True), "choices": [choice]}

    def chunk(self, index: int, out) -> dict | None:
        if not out.finished and not out.text and out.logprob is None:
            return None  # nothing to show yet (text held back)
        choice = {
            "index": index,
            "delta": {"content": out.text} if out.text or not out.finished else {},
            "logprobs": self._logprobs(index, [out]),
            "finish_reason": out.seq.finish_reason if out.finished else None,
        }
        return {**self._head(chunk=True), "choices": [choice]}

    def usage_chunk(self, usage) -> dict:
        return {**self._head(chunk=True), "choices": [], "usage": usage}
