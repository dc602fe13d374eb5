"""The request bodies of the OpenAI-compatible server: OpenAI's field names, types and
ranges as pydantic models, and errors in OpenAI's shape. Fields the server does not
implement are refused by name rather than silently ignored.

Logprobs follow OpenAI's two spellings: chat takes ``logprobs: bool`` and
``top_logprobs: int``; completions take ``logprobs: int`` (the top ``k``, plus
the sampled token). Both allow up to :data:`MAX_LOGPROBS` (vLLM's default
``max_logprobs``; OpenAI's own limits are 20 and 5)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

#: The most top logprobs a request may ask for (vLLM's default ``max_logprobs``).
MAX_LOGPROBS = 20


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    """The sampling knobs both endpoints share (OpenAI's ranges)."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: StrictInt | None = Field(default=None, ge=0)
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt = Field(default=1, ge=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False          # vLLM's extra: generate max_tokens whatever comes
    # vLLM's extra: enters the prompt's page hashes, so only requests with the same salt
    # share cached pages (one tenant's prompts are never found by another's timing).
    cache_salt: StrictStr | None = Field(default=None, min_length=1, max_length=256)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)  # OpenAI's newer name
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)


class CompletionRequest(_SamplingFields):
    prompt: StrictStr | list[StrictInt]
    max_tokens: StrictInt | None = Field(default=16, ge=1)      # OpenAI's default here
    echo: Literal[False] = False
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)


class APIError(Exception):
    """A request the server refuses; becomes OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type_)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def validation_error(e: ValidationError) -> APIError:
    """pydantic's first complaint, as a 400 naming the field (``messages.0.role``)."""
    err = e.errors()[0]
    # The field's path (``messages.0.role``), without pydantic's union-member tags
    # (``stop.str``, ``stop.list[str].0``): they name types, not fields.
    path = []
    for p in err["loc"]:
        if isinstance(p, str) and (p in _TYPE_TAGS or "[" in p):
            break
        path.append(str(p))
    param = ".".join(path) or None
    value = f" (got {err['input']!r})" if "input" in err and err["type"] != "missing" else ""
    return APIError(400, f"{param}: {err['msg']}{value}", param, "invalid_value")
