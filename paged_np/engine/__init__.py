"""Serving on the paged cache: requests in, tokens out, many at a time.

Read in this order:

1. :mod:`.sampling` -- :class:`SamplingParams` and how a token is drawn from logits
   (:mod:`.logprobs`: how likely the model found each token);
2. :mod:`.outputs` -- what a request returns (vLLM's names);
3. :mod:`.request` -- the engine's record of a request and the scheduler's of each
   sample, and which object keeps each count;
4. :mod:`.scheduler` -- which requests run this step, and preemption under pressure
   (:mod:`.admission` orders the queue, :mod:`.swap` keeps swapped pages);
5. :mod:`.engine` -- :class:`Engine`, one step = schedule, model forward, sample
   (:mod:`.stats` counts what happened);
6. :mod:`.llm` -- :class:`LLM`, vLLM's offline API: text in, text out;
7. :mod:`.server` -- the OpenAI-compatible HTTP server over an :class:`LLM`.
"""

from ..lazy import lazy_exports

_EXPORTS = {
    "Engine": ".engine", "LLM": ".llm", "Logprob": ".logprobs", "RequestOutput": ".outputs",
    "SampleOutput": ".outputs", "SamplingParams": ".sampling", "EngineConfig": ".config",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
