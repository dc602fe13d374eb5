"""Perplexity through ``prompt_logprobs``: how well the served model predicts a text.

::

    ids = eval_token_ids(tokenizer, num_tokens=2048)
    runs = [EvalRun("float32 KV", EngineConfig()), EvalRun("chunks of 64",
            EngineConfig(max_num_batched_tokens=64))]
    for r in evaluate(model, ids, runs):
        print(r.label, r.perplexity, r.kl_mean)

**The text** is the chapter "Execution model" of the Python Language
Reference as CPython ships it for ``help()`` (``pydoc_data.topics``, key
``"execmodel"``): plain English prose that every Python install holds, so
nothing is downloaded. It is tokenized with the model's tokenizer (with the
special tokens it adds, if any: SmolLM2's adds none) and cut to the first
``num_tokens`` tokens (SmolLM2: 2212 in all, 2048 in the table);
:func:`eval_text_info` gives its SHA-256, since a new Python release may
edit the chapter (the numbers of two runs compare only on the same text).

**Perplexity** is ``exp(-mean log p(token_i | tokens_<i))`` over tokens
``1 .. N-1`` of one sequence: the whole slice is one prompt, served by the
engine (chunked prefill, paged cache) with ``prompt_logprobs=0``, so it
measures the engine's numbers, not a side path. Lower is better; an exact
engine and transformers agree to float32 rounding.

**KL divergence** against the reference run (the first of ``runs``, float32
KV): at each position, ``sum_v p_ref(v) (log p_ref(v) - log p_run(v))`` over
the whole vocabulary, read through :meth:`Engine.add_logits_listener`; its
mean says how far a cheaper cache (float16, int8 pages) moves the model's
whole distribution, which perplexity alone can hide. ``top1`` is the share
of positions where both runs' most likely token is the same.

Compared with llama.cpp's ``perplexity`` tool: one window over the slice (no
sliding windows of ``n_ctx`` scoring only their second half).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgument
from .engine import Engine
from .logprobs import log_softmax, perplexity
from .sampling import SamplingParams

#: Where the text comes from: ``pydoc_data.topics.topics[EVAL_TOPIC]``.
EVAL_TOPIC = "execmodel"
#: Tokens in the committed table's slice (the CI test uses a shorter one).
EVAL_TOKENS = 2048


def eval_text() -> str:
    """The evaluation text: the Language Reference's "Execution model" chapter."""
    from pydoc_data.topics import topics

    return topics[EVAL_TOPIC]


def eval_text_info() -> dict:
    """Where the text comes from and its SHA-256 (to compare runs on the same text)."""
    import sys

    text = eval_text()
    return {"source": f"pydoc_data.topics.topics[{EVAL_TOPIC!r}] (Python "
                      f"{sys.version.split()[0]})", "chars": len(text),
            "sha256": hashlib.sha256(text.encode()).hexdigest()}


def eval_token_ids(tokenizer, num_tokens: int = EVAL_TOKENS) -> list[int]:
    """The first ``num_tokens`` tokens of the text; fewer if the text is shorter."""
    if num_tokens < 2:
        raise InvalidArgument(f"num_tokens: perplexity needs at least 2 tokens, got {num_tokens}")
    return tokenizer.encode(eval_text(), add_special_tokens=True)[:num_tokens]


@dataclass(frozen=True)
class EvalRun:
    """One configuration to evaluate: a label, an EngineConfig, and optionally its own model
    (a weight format); ``None`` uses the model given to :func:`evaluate`."""

    label: str
    config: object                 # EngineConfig
    model: object = None


@dataclass
class EvalResult:
    """What :func:`evaluate` measured for one run."""

    label: str
    num_scored: int                # tokens scored (the slice minus its first)
    perplexity: float
    delta_pct: float               # perplexity change against the reference, percent
    kl_mean: float                 # mean KL(reference || run) per position, nats
    kl_max: float
    top1: float                    # share of positions with the reference's top token
    bytes_per_page: int
    page_size: int
    seconds: float

    @property
    def pages_per_mib(self) -> float:
        return 2 ** 20 / self.bytes_per_page


def evaluate(model, token_ids, runs: list) -> list[EvalResult]:
    """Perplexity and KL divergence of each run on ``token_ids``; ``runs[0]`` is the reference.

    Each run serves the whole slice as one prompt with ``prompt_logprobs=0``.
    The reference's log-probability rows are kept (float32 ``[N-1, V]``) only
    when there is another run to compare with it.
    """
    if not runs:
        raise InvalidArgument("runs: give at least one EvalRun (the first is the reference)")
    ids = list(token_ids)
    ref_rows = None
    results = []
    for i, run in enumerate(runs):
        eng = Engine(run.model or model, config=run.config)
        n = len(ids) - 1                                         # positions scored
        if i == 0 and len(runs) > 1:
            ref_rows = np.empty((n, (run.model or model).cfg.vocab_size), np.float32)
        kl = np.zeros(n)                                         # [N-1] per position
        agree = np.ones(n, dtype=bool)                           # [N-1]
        eng.add_logits_listener(_listener(i, ref_rows, kl, agree, n))
        t0 = time.perf_counter()
        out = eng.generate([ids], SamplingParams(max_tokens=1, temperature=0,
                                                 prompt_logprobs=0))[0]
        seconds = time.perf_counter() - t0
        if out.error:
            raise InvalidArgument(f"runs[{i}] ({run.label}): the engine could not serve the "
                                  f"slice: {out.error}")
        ppl = perplexity(out.prompt_logprobs)
        base = results[0].perplexity if results else ppl
        cache = eng.cache.cfg
        results.append(EvalResult(run.label, n, ppl, 100.0 * (ppl / base - 1.0),
                                  float(kl.mean()), float(kl.max()), float(agree.mean()),
                                  cache.bytes_per_page, cache.page_size, seconds))
    return results


def _listener(run: int, ref_rows, kl: np.ndarray, agree: np.ndarray, n: int):
    """The logits listener of run ``run``: keep the reference's rows, or compare with them."""

    def on_logits(request_id, sample_index, position, logits):
        if position >= n or ref_rows is None:                    # the sampled token's row
            return
        lp = log_softmax(logits[None, :])[0]                     # [V] float64
        if run == 0:
            ref_rows[position] = lp
            return
        ref = log_softmax(ref_rows[position][None, :])[0]        # [V] float64, renormalised
        kl[position] = float(np.exp(ref) @ (ref - lp))           # KL(ref || run), nats
        agree[position] = int(np.argmax(ref)) == int(np.argmax(lp))

    return on_logits


def format_table(results: list, info: dict | None = None) -> str:
    """The results as a Markdown table (perplexity, change, KL, top-1, pages per MiB, time)."""
    lines = []
    if info:
        lines += [f"text: {info['source']}, {info['num_tokens']} tokens, "
                  f"sha256 {info['sha256'][:16]}", ""]
    lines += ["| run | perplexity | vs reference | KL mean (nats) | KL max | same top-1 "
              "| pages/MiB | time (s) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.label} | {r.perplexity:.4f} | {r.delta_pct:+.3f}% | "
                     f"{r.kl_mean:.2e} | {r.kl_max:.2e} | {100 * r.top1:.1f}% | "
                     f"{r.pages_per_mib:.2f} | {r.seconds:.1f} |")
    return "\n".join(lines)
