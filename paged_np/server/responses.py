"""The bodies the OpenAI endpoints send: a whole response, or its server-sent events.

Both read :class:`~.loop.Update` snapshots of a request; logprobs are put in
OpenAI's shapes by :mod:`.logprobs_view`.
"""

from __future__ import annotations

import json

from .logprobs_view import chat_logprobs, completion_logprobs
from .loop import Update
from .schemas import APIError


def usage(u: Update) -> dict:
    """OpenAI's ``usage`` object for the request ``u`` describes."""
    completion = sum(u.num_tokens)
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": completion,
            "total_tokens": u.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def final_body(last: Update, chat: bool, n: int, k: int | None) -> dict:
    """A finished request's ``object``, ``choices`` and ``usage`` (not streamed)."""
    logprobs = [choice_logprobs(last, j, 0, chat, k) for j in range(n)]
    if chat:
        choices = [{"index": j, "message": {"role": "assistant", "content": t},
                    "logprobs": logprobs[j], "finish_reason": r}
                   for j, (t, r) in enumerate(zip(last.texts, last.finish_reasons))]
        obj = "chat.completion"
    else:
        choices = [{"index": j, "text": t, "logprobs": logprobs[j], "finish_reason": r}
                   for j, (t, r) in enumerate(zip(last.texts, last.finish_reasons))]
        obj = "text_completion"
    return {"object": obj, "choices": choices, "usage": usage(last)}


def choice_logprobs(u: Update, j: int, start: int, chat: bool, k: int | None, offset: int = 0):
    """Sample ``j``'s logprobs from token ``start`` on, in OpenAI's shape (None if not asked)."""
    if k is None or not u.logprobs:
        return None
    tokens, entries = u.token_ids[j][start:], u.logprobs[j][start:]
    return chat_logprobs(tokens, entries, k) if chat else completion_logprobs(
        tokens, entries, offset)


async def stream_events(updates, base, chat, n, include_usage, k=None):
    """Server-sent events: one chunk per sample per update, then ``data: [DONE]``.

    With logprobs (``k`` not None), each chunk carries those of the tokens
    generated since the sample's last chunk (the engine's token lists only
    grow: the LLM cuts a stop string's tokens before an update is taken).
    """
    obj = "chat.completion.chunk" if chat else "text_completion"
    sent = [0] * n                                       # characters sent, per sample
    sent_tokens = [0] * n                                # tokens whose logprobs were sent
    offsets = [0] * n                                    # completions: text_offset so far
    finished = [False] * n

    def chunk(choices, usage=None):
        body = {**base, "object": obj, "choices": choices}
        if include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    last = None
    try:
        if chat:                                         # OpenAI opens with the role
            yield chunk([{"index": j, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None} for j in range(n)])
        async for u in updates:
            last = u
            if u.error is not None:
                err = APIError(u.status, u.error, None, "engine_error", "server_error")
                yield f"data: {json.dumps(err.body())}\n\n"
                break
            choices = []
            for j in range(n):
                if finished[j]:
                    continue
                # The LLM's text never takes back what it showed: it holds back the
                # start of a possible stop string until it knows.
                text, reason = u.texts[j], u.finish_reasons[j]
                delta = text[sent[j]:]
                sent[j] = max(sent[j], len(text))
                if not delta and reason is None:
                    continue
                finished[j] = reason is not None
                lps = choice_logprobs(u, j, sent_tokens[j], chat, k, offsets[j])
                if lps is not None:
                    sent_tokens[j] = len(u.token_ids[j])
                    if not chat and lps["tokens"]:
                        offsets[j] = lps["text_offset"][-1] + len(lps["tokens"][-1])
                if chat:
                    choices.append({"index": j, "delta": {"content": delta} if delta else {},
                                    "logprobs": lps, "finish_reason": reason})
                else:
                    choices.append({"index": j, "text": delta, "logprobs": lps,
                                    "finish_reason": reason})
            if choices:
                yield chunk(choices)
        if include_usage and last is not None and last.error is None:
            yield chunk([], usage(last))
        yield "data: [DONE]\n\n"
    finally:
        # A client gone mid-stream closes this generator: close the inner one
        # now (not at garbage collection), so its request is aborted at once.
        await updates.aclose()
