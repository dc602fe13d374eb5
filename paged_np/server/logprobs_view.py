"""Logprobs in OpenAI's two response shapes, from the engine's vLLM-shaped ones.

The engine gives, per generated token, ``{token_id: Logprob(logprob, rank,
decoded_token)}``: the token first, then the top ``k``
(:mod:`paged_np.engine.logprobs`). OpenAI's shapes:

- **chat** (``logprobs: true, top_logprobs: k``)::

      "logprobs": {"content": [{"token": "Paris", "logprob": -0.01,
                                "bytes": [80, 97, ...],
                                "top_logprobs": [{"token", "logprob", "bytes"}, ...k]}],
                   "refusal": null}

- **completions** (``logprobs: k``), four parallel lists::

      "logprobs": {"tokens": [...], "token_logprobs": [...],
                   "top_logprobs": [{"token text": logprob, ...}, ...],
                   "text_offset": [...]}

  where ``top_logprobs`` holds the top ``k`` *and* the sampled token (so up
  to ``k + 1`` entries, as OpenAI documents), and ``text_offset`` is where
  each token's text starts in the completion's text.

A token's text is its ``decoded_token`` (the token decoded alone, as vLLM
does); a byte-level token that is half of a UTF-8 character decodes to the
replacement character, and its ``bytes`` are those of that text. A logprob
of ``-inf`` is sent as ``-9999.0`` (JSON has no infinity; vLLM does the same).
"""

from __future__ import annotations


def _lp(value: float) -> float:
    return max(float(value), -9999.0)


def _text(t: int, lp) -> str:
    return lp.decoded_token if lp.decoded_token is not None else str(t)


def _top(d: dict, k: int) -> list:
    """The top ``k`` entries of one position (by rank), without the sampled token's extra one."""
    items = sorted(d.items(), key=lambda kv: kv[1].rank)
    return [(t, lp) for t, lp in items if lp.rank <= k][:k]


def chat_logprobs(token_ids, entries, k: int) -> dict:
    """OpenAI's chat ``logprobs`` object for ``token_ids`` (their dicts in ``entries``)."""
    content = []
    for tok, d in zip(token_ids, entries):
        lp = d[tok]
        text = _text(tok, lp)
        content.append({
            "token": text, "logprob": _lp(lp.logprob), "bytes": list(text.encode()),
            "top_logprobs": [{"token": _text(t, v), "logprob": _lp(v.logprob),
                              "bytes": list(_text(t, v).encode())} for t, v in _top(d, k)],
        })
    return {"content": content, "refusal": None}


def completion_logprobs(token_ids, entries, offset: int = 0) -> dict:
    """OpenAI's completions ``logprobs`` object; ``offset``: where the first token's text starts."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tok, d in zip(token_ids, entries):
        text = _text(tok, d[tok])
        out["tokens"].append(text)
        out["token_logprobs"].append(_lp(d[tok].logprob))
        out["top_logprobs"].append({_text(t, v): _lp(v.logprob) for t, v in d.items()})
        out["text_offset"].append(offset)
        offset += len(text)
    return out
