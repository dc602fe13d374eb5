"""Shared pieces of the server tests: a tiny model, an LLM over it, metrics parsing."""

from __future__ import annotations

import re
import time

import httpx

import paged_np as pnp
from paged_np.cli.serve import tiny_model

TINY_NAME = "tiny-random"


def make_llm(model, tok, num_pages=256, max_num_seqs=32, name=TINY_NAME, **kw):
    """The LLM a test server drives (numpy backend: nothing to compile)."""
    llm = pnp.LLM(model, tokenizer=tok, num_pages=num_pages, page_size=16,
                  max_num_seqs=max_num_seqs, max_num_batched_tokens=512, backend="numpy",
                  verbose=False, **kw)
    llm.model_name = name
    return llm


def tiny():
    return tiny_model(seed=0)


def reference(llm, prompt_ids, max_tokens, stop=None):
    """Greedy ``(text, finish_reason, number of tokens)`` of each prompt from ``llm.generate``."""
    params = pnp.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop)
    outs = llm.generate([list(p) for p in prompt_ids], params)
    return [(o.outputs[0].text, o.outputs[0].finish_reason, len(o.outputs[0].token_ids))
            for o in outs]


def chat_ids(tok, messages):
    return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))


_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$")


def metrics(url) -> dict:
    """``GET /metrics`` as {"name{labels}": value}."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def wait_for(url, pred, timeout=20.0):
    """Poll /metrics until ``pred(metrics)`` holds; return the last metrics."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        if pred(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)
