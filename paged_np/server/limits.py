"""What one client may make the server do: a body read only up to its limit, JSON
parsed strictly, and the sizes :class:`~.config.ServerConfig` leaves to the model.

Each limit is a ``ServerConfig`` field (so a ``serve`` flag); the ones left at
None are sized here from the model served:

- ``max_prompt_chars``: ``max_model_len`` x the vocabulary's longest token, in
  characters (:func:`longest_token_chars`). A byte-level tokenizer's token stands
  for at most that many bytes, and a character is at least one byte, so a longer
  text needs more tokens than the context holds: refusing it before tokenizing
  never refuses a prompt that would fit.
- ``max_body_bytes``: 1 MiB for the rest of a body plus 6 bytes per character of
  ``max_prompt_chars`` (JSON's ``\\uXXXX`` escape is the longest a character gets).

What a client sees: 413 for a body past the limit (decided from
``Content-Length`` before anything is read, or while a chunked body comes in);
400 with OpenAI's error body for JSON that is not valid, nested past Python's
recursion limit, holds ``NaN``/``Infinity`` or an integer of more than 4,300
digits (Python's own limit on reading one).
"""

from __future__ import annotations

import json

from starlette.requests import ClientDisconnect, Request

from .schemas import APIError

#: What a body may hold besides its prompt (messages' fields, stop strings ...).
BODY_OVERHEAD_BYTES = 1 << 20
#: The most bytes one character of a prompt takes in JSON (``\\u00e9``).
JSON_BYTES_PER_CHAR = 6


def longest_token_chars(tokenizer) -> int:
    """The most characters of text one token can stand for: its longest vocabulary entry.

    Byte-level vocabularies (GPT-2's, SmolLM2's) write one character per byte, and a
    special token (``<|im_start|>``) as the text that stands for it.
    """
    longest = 1
    for i in range(int(tokenizer.vocab_size)):
        entry = tokenizer.id_to_token(i)
        if entry:
            longest = max(longest, len(entry))
    return longest


def default_prompt_chars(tokenizer, max_model_len: int) -> int:
    """``max_prompt_chars`` when not given: no text longer can fit the context."""
    return int(max_model_len) * longest_token_chars(tokenizer)


def default_body_bytes(max_prompt_chars: int) -> int:
    """``max_body_bytes`` when not given: the longest prompt, escaped, plus 1 MiB."""
    return BODY_OVERHEAD_BYTES + JSON_BYTES_PER_CHAR * int(max_prompt_chars)


class ClientGone(Exception):
    """The client hung up before its body was whole: nobody to answer."""


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it is known to be over ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:                             # a chunked body: stop reading now
                raise _too_large(size, limit, at_least=True)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)


def _too_large(size: int, limit: int, at_least: bool = False) -> APIError:
    return APIError(413, f"the body is {'over ' if at_least else ''}{size:,} bytes; this "
                    f"server reads at most {limit:,} (--max-body-bytes)", None,
                    "request_too_large")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(body: bytes):
    """The body as JSON, or a 400 that says what is wrong (never the exception's repr)."""
    try:
        return json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise APIError(400, "the body is not valid JSON: it is nested too deeply", None,
                       "invalid_json") from None
    except json.JSONDecodeError as e:
        raise APIError(400, f"the body is not valid JSON: {e.msg} at line {e.lineno} column "
                       f"{e.colno}", None, "invalid_json") from None
    except UnicodeDecodeError:
        raise APIError(400, "the body is not valid JSON: it is not UTF-8 text", None,
                       "invalid_json") from None
    except ValueError as e:                              # NaN, or an integer too long to read
        what = str(e) if "JSON number" in str(e) else "a number has too many digits"
        raise APIError(400, f"the body is not valid JSON: {what}", None,
                       "invalid_json") from None
