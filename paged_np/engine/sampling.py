"""Sampling: how the next token is chosen from a row of logits.

:class:`SamplingParams` holds vLLM's usual knobs (``temperature``, ``top_k``,
``top_p``, ``seed``, ``max_tokens``, ``stop_token_ids``, ``n``, and the
``logprobs`` to report: :mod:`paged_np.engine.logprobs`). The choice
itself is made by :func:`sample_tokens`:

- ``temperature < 1e-5`` (:data:`SAMPLING_EPS`, vLLM's bound; ``0`` above all) is
  **greedy**: the argmax, taken for every greedy row of the batch in one
  vectorised call. (Dividing logits by a smaller temperature overflows: 1e-320
  would make every logit infinite and sample the last token of the vocabulary.)
- otherwise the logits are divided by the temperature, cut to the ``top_k``
  largest and then to the smallest set whose probability reaches ``top_p``,
  and one token is drawn from what is left.

Reproducibility. Every sample of every request owns its own
``np.random.Generator``, seeded from ``(seed, request index, sample index)``,
and draws exactly **one** uniform number per token it samples (greedy
samples draw none). So a sample's
tokens do not depend on which other requests share its batches, nor on
whether it was preempted and recomputed: recomputing the KV of tokens it has
already generated samples nothing, and its generator stays where it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import check_int, check_positive_int
from ..errors import DTypeError, InvalidArgument

#: Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``).
SAMPLING_EPS = 1e-5


def _real(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise DTypeError(f"SamplingParams.{name} must be a real number, got "
                         f"{type(value).__name__}")
    if not math.isfinite(value):
        raise InvalidArgument(f"SamplingParams.{name} must be finite, got {value}")
    return float(value)


def _stop_strings(stop) -> tuple:
    """``None``, a string or a sequence of strings -> a tuple of non-empty strings."""
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    try:
        items = tuple(items)
    except TypeError:
        raise DTypeError("SamplingParams.stop must be a str or a list of str, got "
                         f"{type(stop).__name__}") from None
    for s in items:
        if not isinstance(s, str):
            raise DTypeError(f"SamplingParams.stop must hold strings, got {type(s).__name__}")
        if not s:
            raise InvalidArgument("SamplingParams.stop: an empty stop string would stop at once")
    return items


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request (vLLM's names and defaults).

    Parameters
    ----------
    max_tokens : int >= 1, tokens to generate at most.
    temperature : float >= 0; ``0`` (or anything below 1e-5, as in vLLM) means greedy.
    top_k : int; keep the ``top_k`` most likely tokens (``0`` or ``-1``: all).
    top_p : float in (0, 1]; keep the smallest set of tokens whose probability
        sums to at least ``top_p`` (nucleus sampling).
    seed : int >= 0 or None; with a seed, the request's tokens are reproducible.
    stop_token_ids : token ids that end a sample (the stop token is kept in
        its ``token_ids``).
    n : int >= 1, samples per prompt; they share the prompt's pages (fork).
    stop : a string or a list of strings that end a sample when its text
        contains one; the text is cut before it. Applied by
        :class:`paged_np.LLM`, which detokenizes (the engine sees ids only).
    ignore_eos : keep generating past the tokenizer's EOS (:class:`paged_np.LLM`).
    logprobs : int >= 0, -1 or None; for each generated token, its log
        probability and the ``logprobs`` most likely tokens (``-1``: all), in
        ``SampleOutput.logprobs`` (see :mod:`paged_np.engine.logprobs`).
    prompt_logprobs : int >= 0, -1 or None; the same for every prompt token,
        in ``RequestOutput.prompt_logprobs``. The request then computes its
        whole prompt (no prefix-cache hits until its logprobs are recorded).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple = ()
    n: int = 1
    stop: tuple | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "max_tokens", check_positive_int("SamplingParams.max_tokens", self.max_tokens))
        set_(self, "n", check_positive_int("SamplingParams.n", self.n))
        set_(self, "top_k", check_int("SamplingParams.top_k", self.top_k, -1))
        set_(self, "temperature", _real("temperature", self.temperature))
        if self.temperature < 0:
            raise InvalidArgument(
                f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        set_(self, "top_p", _real("top_p", self.top_p))
        if not 0 < self.top_p <= 1:
            raise InvalidArgument(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            set_(self, "seed", check_int("SamplingParams.seed", self.seed, 0))
        try:
            stops = tuple(self.stop_token_ids)
        except TypeError:
            raise DTypeError("SamplingParams.stop_token_ids must be a sequence of ints, got "
                             f"{type(self.stop_token_ids).__name__}") from None
        set_(self, "stop_token_ids",
             tuple(check_int("SamplingParams.stop_token_ids", t, 0) for t in stops))
        set_(self, "stop", _stop_strings(self.stop))
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise DTypeError(f"SamplingParams.ignore_eos must be a bool, got "
                             f"{type(self.ignore_eos).__name__}")
        set_(self, "ignore_eos", bool(self.ignore_eos))
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:          # -1: the whole vocabulary
                set_(self, name, check_int(f"SamplingParams.{name}", getattr(self, name), -1))

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


def make_rng(seed: int | None, request_index: int, sample_index: int) -> np.random.Generator:
    """One sample's generator, keyed by (seed, request, sample); unseeded: fresh entropy."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([seed, request_index, sample_index])


def sample_tokens(logits: np.ndarray, params: list, rngs: list) -> np.ndarray:
    """One token per row: logits float32 [S, V] -> int64 [S].

    ``params[i]`` and ``rngs[i]`` belong to row ``i``. Greedy rows take one
    vectorised argmax; the others draw one uniform number each.
    """
    tokens = np.argmax(logits, axis=-1)                          # [S] greedy for everyone
    for i, (p, rng) in enumerate(zip(params, rngs)):
        if not p.greedy:
            tokens[i] = sample_one(logits[i], p, rng)
    return tokens


def sample_one(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """Temperature, top-k, top-p, then one draw: [V] -> a token id."""
    return draw(probs(logits, p), rng)


def probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The distribution a sampled token is drawn from: [V] logits -> float64 [V] probs.

    Temperature, then top-k, then top-p, in that order. Speculative decoding's
    acceptance test (:mod:`paged_np.engine.rejection`) uses this same function
    for its target distribution, so the two paths cannot drift apart.
    """
    x = logits.astype(np.float64) / p.temperature                # [V]
    if 0 < p.top_k < x.shape[0]:
        kth = np.partition(x, -p.top_k)[-p.top_k]                # the k-th largest value
        x = np.where(x >= kth, x, -np.inf)                       # [V]
    out = np.exp(x - x.max())                                    # [V] unnormalised
    out /= out.sum()
    if p.top_p < 1.0:
        order = np.argsort(-out, kind="stable")                  # [V] most likely first
        cum = np.cumsum(out[order])                              # [V]
        keep = int(np.searchsorted(cum, p.top_p)) + 1            # smallest set reaching top_p
        mask = np.zeros_like(out)
        mask[order[:keep]] = 1.0
        out = out * mask
        out /= out.sum()
    return out


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from ``probs`` ([V], need not be normalised), with one uniform draw."""
    u = rng.random()                                             # the one draw of this token
    cdf = np.cumsum(probs)                                       # [V]
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(cdf) - 1))
