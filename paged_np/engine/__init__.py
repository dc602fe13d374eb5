"""Serving on the paged cache: requests in, tokens out, many at a time.

Read in this order:

1. :mod:`.sampling` -- :class:`SamplingParams` and how a token is drawn from logits;
2. :mod:`.scheduler` -- which requests run this step, and preemption under pressure;
3. :mod:`.outputs` -- what a finished request returns (vLLM's names);
4. :mod:`.engine` -- :class:`Engine`, one step = schedule, model forward, sample;
5. :mod:`.llm` -- :class:`LLM`, vLLM's offline API: text in, text out.
"""

from .engine import Engine
from .llm import LLM
from .outputs import RequestOutput, SampleOutput
from .sampling import SamplingParams

__all__ = ["Engine", "LLM", "RequestOutput", "SampleOutput", "SamplingParams"]
