"""What the engine hands back: one :class:`RequestOutput` per request.

Shaped like vLLM's ``RequestOutput`` / ``CompletionOutput``: a request holds
``n`` samples (``samples[j]``, vLLM's ``outputs[j]``), each with its generated
token ids and why it stopped. For the common ``n == 1`` case
``out.token_ids`` and ``out.finish_reason`` read sample 0 directly.

Finish reasons: ``"length"`` (``max_tokens`` reached), ``"stop"`` (a stop
token, kept in ``token_ids``, or a stop string: :class:`paged_np.LLM`),
``"abort"`` (:meth:`Engine.abort`),
``"error"`` (the request could not be served, e.g. its prompt needs more
pages than the whole cache holds; ``out.error`` says why).

The engine works on token ids and leaves the text fields empty;
:class:`paged_np.LLM` fills ``prompt`` and each sample's ``text`` (and the
``decoded_token`` of each :class:`~paged_np.engine.logprobs.Logprob`).

Logprobs (``SamplingParams.logprobs`` / ``prompt_logprobs``, see
:mod:`paged_np.engine.logprobs`): ``sample.logprobs`` holds one
``{token_id: Logprob}`` per generated token and ``sample.cumulative_logprob``
their sum; ``out.prompt_logprobs`` is ``[None, {...}, ...]``, one per prompt
token. Each is None when not asked for, as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SampleOutput:
    """One sample of a request (vLLM: ``CompletionOutput``)."""

    index: int
    token_ids: list = field(default_factory=list)
    finish_reason: str | None = None
    #: The generated text (filled by :class:`paged_np.LLM`; the engine has no tokenizer).
    text: str = ""
    #: What stopped it: the stop string, or the stop token id; None otherwise.
    stop_reason: object = None
    #: One ``{token_id: Logprob}`` per generated token (``SamplingParams.logprobs``), or None.
    logprobs: list | None = None
    #: The sum of the generated tokens' logprobs (None without ``logprobs``).
    cumulative_logprob: float | None = None

    def truncate(self, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` generated tokens (and their logprobs)."""
        del self.token_ids[num_tokens:]
        if self.logprobs is not None:
            del self.logprobs[num_tokens:]
            self.cumulative_logprob = float(sum(
                d[t].logprob for d, t in zip(self.logprobs, self.token_ids)))

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's state as seen by the caller."""

    request_id: object
    prompt_token_ids: list
    samples: list
    error: str | None = None
    #: Prompt tokens whose KV came from the prefix cache at first admission.
    num_cached_prompt_tokens: int = 0
    #: The prompt's text (filled by :class:`paged_np.LLM` for text prompts).
    prompt: str | None = None
    #: ``[None, {token_id: Logprob}, ...]``, one per prompt token
    #: (``SamplingParams.prompt_logprobs``), or None.
    prompt_logprobs: list | None = None

    @property
    def outputs(self) -> list:
        """vLLM's name for :attr:`samples`."""
        return self.samples

    @property
    def num_cached_tokens(self) -> int:
        """vLLM's name for :attr:`num_cached_prompt_tokens`."""
        return self.num_cached_prompt_tokens

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.samples)

    @property
    def token_ids(self) -> list:
        """Generated ids of sample 0 (the whole answer when ``n == 1``)."""
        return self.samples[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        """Why sample 0 stopped."""
        return self.samples[0].finish_reason
