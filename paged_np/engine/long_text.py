"""Perplexity past the window: a long text scored per segment (StreamingLLM's figure).

::

    ids = long_token_ids(tokenizer, 16_000)
    runs = [EvalRun("full", EngineConfig(num_pages=520)),
            EvalRun("window", EngineConfig(sliding_window=1024)),
            EvalRun("sinks + window", EngineConfig(sliding_window=1024, attention_sinks=4))]
    for r in score_segments(model, ids, runs, max_tokens={"full": 8192}):
        print(r.label, [round(p, 2) for p in r.segment_perplexity])

``python -m paged_np eval --long-text`` runs it (:mod:`paged_np.cli.eval`).

**The text** is the whole Python Language Reference as CPython ships it for
``help()``: every topic of ``pydoc_data.topics.topics``, in sorted key order,
joined by blank lines (about 465,000 characters, 100,000 SmolLM2 tokens;
nothing is downloaded; :func:`long_text_info` gives its SHA-256). The
perplexity text of :mod:`.perplexity` is one of its chapters.

**Per segment**: each run serves its slice as one prompt with
``prompt_logprobs=0`` (chunked prefill through the paged cache, as any
prompt), and the perplexity of tokens ``[i * segment, (i + 1) * segment)``
is ``exp(-mean log p)`` over the scored ones among them (token 0 has no
prediction). A run may stop early (``max_tokens``): full attention "where it
fits", the model's ``max_position_embeddings``. Pages in use are read from
the engine's per-step series, so the table shows memory staying flat.

Compared with StreamingLLM's evaluation (PG19, token by token): the same
mask and positions, but the text is prefilled in chunks, so each chunk's
queries share one step; the numbers are the same as a token-by-token run
would give (the engine's chunked prefill equals its decode, tested).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgument
from .engine import Engine
from .sampling import SamplingParams

#: Tokens per segment of the table (StreamingLLM's figure uses the same idea).
SEGMENT = 1024


def long_text() -> str:
    """Every topic of the Python Language Reference shipped with Python, in key order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def long_text_info() -> dict:
    """Where the long text comes from and its SHA-256 (runs compare only on the same text)."""
    import sys

    text = long_text()
    return {"source": f"pydoc_data.topics.topics, every key in sorted order (Python "
                      f"{sys.version.split()[0]})", "chars": len(text),
            "sha256": hashlib.sha256(text.encode()).hexdigest()}


def long_token_ids(tokenizer, num_tokens: int) -> list[int]:
    """The first ``num_tokens`` tokens of the long text."""
    if num_tokens < 2:
        raise InvalidArgument(f"num_tokens: perplexity needs at least 2 tokens, got {num_tokens}")
    return tokenizer.encode(long_text(), add_special_tokens=True)[:num_tokens]


@dataclass
class SegmentResult:
    """One run over the long text: perplexity per segment and pages in use per step."""

    label: str
    num_tokens: int                          # tokens of the slice this run served
    segment: int
    segment_perplexity: list                 # [ceil(num_tokens / segment)]
    perplexity: float                        # over the whole slice
    pages_in_use: list = field(repr=False)   # per engine step
    num_pages: int = 0                       # the arena's size
    page_size: int = 16
    seconds: float = 0.0

    @property
    def peak_pages(self) -> int:
        return max(self.pages_in_use, default=0)


def segment_perplexity(logprobs: np.ndarray, segment: int) -> list:
    """``exp(-mean)`` of ``logprobs`` (float ``[N]``, NaN for token 0) per ``segment`` tokens."""
    out = []
    for start in range(0, len(logprobs), segment):
        part = logprobs[start:start + segment]                   # [<= segment]
        part = part[~np.isnan(part)]
        out.append(float(np.exp(-part.mean())) if len(part) else float("nan"))
    return out


def score_segments(model, token_ids, runs: list, segment: int = SEGMENT,
                   max_tokens: dict | None = None) -> list[SegmentResult]:
    """Each run (an :class:`~paged_np.engine.perplexity.EvalRun`) over ``token_ids``,
    its perplexity per ``segment`` tokens. ``max_tokens`` ``{label: n}`` cuts a run's
    slice (full attention where it fits)."""
    results = []
    for run in runs:
        ids = list(token_ids)[:(max_tokens or {}).get(run.label, len(token_ids))]
        eng = Engine(run.model or model, config=run.config)
        t0 = time.perf_counter()
        out = eng.generate([ids], SamplingParams(max_tokens=1, temperature=0,
                                                 prompt_logprobs=0))[0]
        seconds = time.perf_counter() - t0
        if out.error:
            raise InvalidArgument(f"run {run.label!r}: the engine could not serve the "
                                  f"slice: {out.error}")
        lps = np.array([np.nan if d is None else next(iter(d.values())).logprob
                        for d in out.prompt_logprobs])           # [N]
        cache = eng.cache.cfg
        results.append(SegmentResult(
            run.label, len(ids), segment, segment_perplexity(lps, segment),
            float(np.exp(-np.nanmean(lps))), list(eng.metrics["series"]["num_in_use"]),
            cache.num_pages, cache.page_size, seconds))
    return results


def format_segments(results: list, info: dict | None = None) -> str:
    """A Markdown table: one row per segment, one column per run, then peak pages."""
    lines = []
    if info:
        lines += [f"text: {info['source']}, {info['num_tokens']} tokens, "
                  f"sha256 {info['sha256'][:16]}", ""]
    seg = results[0].segment if results else SEGMENT
    n = max((len(r.segment_perplexity) for r in results), default=0)
    lines += ["| tokens | " + " | ".join(r.label for r in results) + " |",
              "|---|" + "---:|" * len(results)]
    for i in range(n):
        cells = [f"{r.segment_perplexity[i]:.2f}" if i < len(r.segment_perplexity) else "-"
                 for r in results]
        end = min((i + 1) * seg, max(r.num_tokens for r in results))
        lines.append(f"| {i * seg:,}-{end:,} | " + " | ".join(cells) + " |")
    lines.append("| all | " + " | ".join(f"{r.perplexity:.2f}" for r in results) + " |")
    lines.append("| peak pages in use (of the arena) | " + " | ".join(
        f"{r.peak_pages} of {r.num_pages}" for r in results) + " |")
    lines.append("| time (s) | " + " | ".join(f"{r.seconds:.0f}" for r in results) + " |")
    return "\n".join(lines)
