"""The request bodies of the OpenAI-compatible server: OpenAI's field names, types and
ranges as pydantic models, and errors in OpenAI's shape.

Strict, as a typed client would be: numbers must be JSON numbers (``"0.5"``, a
string, is refused), finite (no ``NaN`` or ``Infinity``), booleans JSON booleans,
and every string valid Unicode (a lone surrogate such as ``"\\ud800"`` is refused
by its field, before any tokenizer sees it).

Unknown fields are **ignored**, as vLLM does and as OpenAI's SDKs expect (they send
fields such as ``user`` or ``frequency_penalty: 0``). The exception is the fields of
OpenAI's schema that would change the answer and that this server does not
implement (:data:`UNSUPPORTED`): given anything but their neutral value (``null``,
``0``, ``false``), they are refused by name rather than silently dropped.

Logprobs follow OpenAI's two spellings: chat takes ``logprobs: bool`` and
``top_logprobs: int``; completions take ``logprobs: int`` (the top ``k``, plus
the sampled token). Both allow up to :data:`MAX_LOGPROBS` (vLLM's default
``max_logprobs``; OpenAI's own limits are 20 and 5)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

#: The most top logprobs a request may ask for (vLLM's default ``max_logprobs``).
MAX_LOGPROBS = 20
#: The largest seed (OpenAI's is a 64-bit integer).
MAX_SEED = 2**63 - 1

#: OpenAI's fields that change the answer and that this server does not implement:
#: refused unless null or their neutral value (``0`` or ``false``).
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "response_format",
               "logit_bias", "frequency_penalty", "presence_penalty", "best_of", "suffix",
               "audio", "modalities", "prediction", "parallel_tool_calls")


def _unicode(text: str) -> str:
    """Text a tokenizer can take: no lone surrogate (JSON's ``\\ud800`` escapes allow one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode: a lone surrogate at character {e.start}") \
            from None
    return text


#: A string: a JSON string (never a number), valid Unicode.
Text = Annotated[StrictStr, AfterValidator(_unicode)]
#: A number: a JSON number (never a string or a boolean), finite.
Number = Annotated[StrictFloat, Field(allow_inf_nan=False)]


def refuse_unsupported(body) -> None:
    """A 400 naming the first :data:`UNSUPPORTED` field ``body`` sets (a JSON object)."""
    if isinstance(body, dict):
        for name in UNSUPPORTED:
            if body.get(name) not in (None, 0, False, [], {}):
                raise APIError(400, f"{name}: this server does not implement {name!r}; "
                               "leave it out (or null)", name, "unsupported_parameter")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: Text


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    """The sampling knobs both endpoints share (OpenAI's ranges)."""

    model_config = ConfigDict(extra="ignore")       # unknown fields: ignored (see above)
    model: Text
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: Number = Field(default=1.0, ge=0.0)
    top_p: Number = Field(default=1.0, gt=0.0, le=1.0)
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: Text | list[Text] | None = None       # count and length: ServerConfig's limits
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
    prompt: Text | list[StrictInt]
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
    # The deepest complaint is the most telling (a union's string member says "a valid
    # string" when the list member found the bad item).
    err = max(e.errors(), key=lambda x: len(x["loc"]))
    # The field's path (``messages.0.role``), without pydantic's union-member tags
    # (``stop.str``, ``stop.list[str].0``): they name types, not fields.
    path = []
    for p in err["loc"]:
        if isinstance(p, str) and (p in _TYPE_TAGS or "[" in p):
            break
        path.append(str(p))
    param = ".".join(path) or None
    value = ""
    if "input" in err and err["type"] != "missing":
        shown = repr(err["input"])                      # a client's value, cut short
        value = f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
    msg = err["msg"].removeprefix("Value error, ")
    return APIError(400, f"{param}: {msg}{value}" if param else f"{msg}{value}", param,
                    "invalid_value")
