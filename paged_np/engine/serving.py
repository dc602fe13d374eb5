"""Text in, text out, one step at a time: the engine as the HTTP server drives it.

:class:`~paged_np.engine.engine.Engine` speaks token ids and hands a request
back only when it has finished. A server needs more: it takes text, streams
each token's text as soon as it is sampled, and stops at stop *strings* as
well as stop tokens. :class:`ServingLLM` adds exactly that, and nothing
else, on top of one ``Engine``::

    llm = ServingLLM(model, tokenizer, num_pages=64)
    llm.add_request("a", "Hello", SamplingParams(max_tokens=8, temperature=0))
    while llm.has_unfinished_requests():
        for out in llm.step():              # requests that produced text this step
            print(out.request_id, out.outputs[0].text, out.finished)

Its step-level methods (``add_request``, ``step``, ``abort``,
``has_unfinished_requests``) and outputs (``out.outputs[j].text``,
``.token_ids``, ``.finish_reason``, ``out.num_cached_tokens``) have the names
of ``pnp.LLM``'s, so the server runs on either.

Compared with vLLM: detokenizing and stop-string matching run in the engine's
thread, after each step (vLLM moves them to a separate process).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import DTypeError, InvalidArgument
from ..models.tokenizer import IncrementalDetokenizer
from .engine import Engine
from .sampling import SamplingParams


@dataclass
class CompletionOutput:
    """One sample's text so far (vLLM: ``CompletionOutput``)."""

    index: int
    text: str = ""
    token_ids: list = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class ServingOutput:
    """A request's state after a step (vLLM: ``RequestOutput``)."""

    request_id: object
    prompt_token_ids: list
    outputs: list
    num_cached_tokens: int = 0
    error: str | None = None

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)


class _Sample:
    """Bookkeeping of one sample: how many of its engine tokens became text."""

    def __init__(self, index, tokenizer, prompt_ids):
        self.out = CompletionOutput(index)
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.num_seen = 0                 # engine tokens already pushed through detok


class ServingLLM:
    """An :class:`Engine` plus a tokenizer: text prompts, streamed text, stop strings.

    Parameters
    ----------
    model : LlamaModel; tokenizer : paged_np.models.Tokenizer
    model_name : the name clients use (OpenAI's ``model`` field).
    engine_kwargs : passed to :class:`Engine` (``num_pages``, ``page_size``, ...).
    """

    def __init__(self, model, tokenizer, model_name: str = "paged-np", **engine_kwargs):
        self.engine = Engine(model, **engine_kwargs)
        self.tokenizer = tokenizer
        self.model_name = model_name
        cfg = self.engine.cache.cfg
        # Longest prompt + output one request may reach: the model's context, and
        # never more than the whole cache holds.
        self.max_model_len = min(model.cfg.max_position_embeddings,
                                 cfg.num_pages * cfg.page_size)
        self._live: dict = {}             # request id -> (engine output, stops, samples)

    def get_tokenizer(self):
        return self.tokenizer

    def add_request(self, request_id, prompt, params: SamplingParams, stop=None) -> None:
        """Queue one request (text or token ids); bad input raises, nothing queued."""
        if isinstance(prompt, str):
            prompt = self.tokenizer.encode(prompt)
        if not isinstance(params, SamplingParams):
            raise DTypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stop):
            raise InvalidArgument("stop must be a non-empty string or a list of them")
        if request_id in self._live:
            raise InvalidArgument(f"request_id {request_id!r} is already in the engine")
        # Generation also ends at the tokenizer's end-of-turn tokens.
        stops = tuple(dict.fromkeys(tuple(params.stop_token_ids)
                                    + tuple(self.tokenizer.stop_token_ids)))
        params = SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                                top_k=params.top_k, top_p=params.top_p, seed=params.seed,
                                stop_token_ids=stops, n=params.n)
        # With a seed, the samples' generators depend on (seed, sample) only, as in vLLM:
        # the same request sent twice gets the same text.
        index = 0 if params.seed is not None else None
        self.engine.add_request(prompt, params, request_id=request_id, request_index=index)
        samples = [_Sample(j, self.tokenizer, prompt) for j in range(params.n)]
        self._live[request_id] = (self._engine_output(request_id), stop, samples)

    def _engine_output(self, request_id):
        parent = self.engine._requests.get(request_id)
        if parent is not None:
            return parent.output
        # Refused at once (a prompt that can never fit): it waits in the done list.
        return next(o for o in self.engine._done if o.request_id == request_id)

    def abort(self, request_id) -> None:
        """Stop a request now; its pages go back to the pool."""
        self._live.pop(request_id, None)
        if request_id in self.engine._requests:
            self.engine.abort(request_id)
            self.engine._done = [o for o in self.engine._done if o.request_id != request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self._live)

    def step(self) -> list[ServingOutput]:
        """One engine step; the requests whose text or state changed in it."""
        self.engine.step()
        changed = []
        for rid, (eout, stop, samples) in list(self._live.items()):
            moved = False
            for s, es in zip(samples, eout.samples):
                if s.out.finish_reason is not None:
                    continue
                new = es.token_ids[s.num_seen:]
                s.num_seen = len(es.token_ids)
                for tok in new:
                    s.out.token_ids.append(tok)
                    s.out.text += s.detok.push(tok)
                    moved = True
                    cut = _find_stop(s.out.text, stop)
                    if cut is not None:                          # a stop string: cut it off
                        s.out.text = s.out.text[:cut]
                        s.out.finish_reason = "stop"
                        break
                if s.out.finish_reason is None and es.finish_reason is not None:
                    s.out.finish_reason = es.finish_reason
                    moved = True
            done = all(s.out.finish_reason is not None for s in samples)
            if not moved and not done:
                continue
            out = ServingOutput(rid, list(eout.prompt_token_ids), [s.out for s in samples],
                                eout.num_cached_prompt_tokens, eout.error)
            changed.append(out)
            if done:
                del self._live[rid]
                if rid in self.engine._requests:             # stopped by a string: free it now
                    self.engine.abort(rid)
        self.engine._done = [o for o in self.engine._done if o.request_id in self._live]
        return changed

    def generate(self, prompts, params: SamplingParams, stop=None) -> list[ServingOutput]:
        """Serve every prompt to completion (the reference the server is tested against)."""
        ids = [f"gen-{i}" for i in range(len(prompts))]
        for rid, p in zip(ids, prompts):
            self.add_request(rid, p, params, stop=stop)
        final = {}
        while self.has_unfinished_requests():
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]


def _find_stop(text: str, stop: list[str]) -> int | None:
    """Where the first stop string starts in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(hits) if hits else None
