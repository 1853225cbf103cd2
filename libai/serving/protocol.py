"""The OpenAI request bodies the server accepts, as pydantic models.

Fields the OpenAI API defines and this server honours are typed here; vLLM's extensions
(``top_k``, ``ignore_eos``, ``stop_token_ids``) too. Anything else is a 400 naming the field
(``extra="forbid"``), so a client never silently gets a setting it did not ask for.
``frequency_penalty`` / ``presence_penalty`` are accepted at 0 only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from libai.serving.sampling import InvalidParameter, SamplingParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # vLLM's extensions
    top_k: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)

    def sampling(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) != 0:
                raise InvalidParameter(name, f"{name} is not supported by this server (use 0)")
        if self.stream_options is not None and not self.stream:
            raise InvalidParameter("stream_options", "stream_options needs stream=true")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            n=self.n,
            logprobs=logprobs,
        )
        params.validate()
        return params

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    #: OpenAI's legacy completions default
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: passed to the template
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] | None = None

    def for_template(self) -> dict:
        data = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):  # [{"type": "text", "text": ...}, ...]
            texts = []
            for part in self.content:
                if part.get("type") != "text":
                    raise InvalidParameter(
                        "messages", f"content parts of type {part.get('type')!r} are not supported"
                    )
                texts.append(part.get("text", ""))
            data["content"] = "".join(texts)
        return data


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def max_new_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

    def logprob_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidParameter("top_logprobs", "top_logprobs needs logprobs=true")
        return (self.top_logprobs or 0) if self.logprobs else None
