"""vLLM's offline API on the paged cache: text in, text out.

::

    llm = pnp.LLM("smollm2-135m-instruct", kv_cache_memory="256MiB")
    outs = llm.chat([{"role": "user", "content": "What is a KV cache?"}],
                    pnp.SamplingParams(max_tokens=64, temperature=0))
    print(outs[0].outputs[0].text)

:class:`LLM` is a thin layer over :class:`~paged_np.Engine`, which works on
token ids only. It adds what a caller holding text needs:

1. **tokenize** the prompt (a string), or render a conversation through the
   checkpoint's chat template first (:meth:`LLM.chat`);
2. **size the cache once**: ``kv_cache_memory`` bytes become a number of
   pages (every page holds K and V of ``page_size`` tokens in every layer);
3. **detokenize incrementally**: each new token goes through an
   :class:`~paged_np.models.tokenizer.IncrementalDetokenizer`, so a
   character split over two tokens is never printed half;
4. **stop strings**: after each token the new text is searched for
   ``SamplingParams.stop``; on a hit the text is cut before it, the sample
   ends with ``finish_reason == "stop"`` and the engine frees its pages. While a
   sample runs, its last ``len(longest stop) - 1`` characters are held back
   (they may be the start of a stop string), as vLLM does.

Two ways to drive it, as in vLLM:

- offline, :meth:`LLM.generate` / :meth:`LLM.chat`: everything to completion,
  outputs in the order of the prompts;
- step by step (what a server does): :meth:`LLM.add_request`,
  :meth:`LLM.step` (returns the requests that produced text this step, as
  snapshots), :meth:`LLM.abort`, :meth:`LLM.has_unfinished_requests`.

Compared with vLLM: one process and one thread, no async engine, no
tokenizer pool, no logprobs; ``max_model_len`` is the smaller of the
model's context and what the whole cache holds.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import numbers
import re
from pathlib import Path

import numpy as np

from ..checks import check_int, check_positive_int
from ..errors import DTypeError, InvalidArgument, UnknownRequest
from .engine import Engine
from .outputs import RequestOutput
from .sampling import SamplingParams

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_bytes(value, name: str = "kv_cache_memory") -> int:
    """``"256MiB"``, ``"1.5GB"``, ``"4096"`` or an int -> bytes (1 KiB = 1024, 1 KB = 1000)."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if m is None or m.group(2).lower() not in _UNITS:
            raise InvalidArgument(f"{name}: cannot read {value!r} as a size; write e.g. "
                                  "'256MiB', '1GiB' or a number of bytes")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        try:
            n = check_int(name, value)
        except DTypeError:
            raise DTypeError(f"{name} must be a number of bytes or a str like '256MiB', got "
                             f"{type(value).__name__}") from None
    if n <= 0:
        raise InvalidArgument(f"{name} must be > 0 bytes, got {value!r}")
    return n


def page_nbytes(model_cfg, page_size: int) -> int:
    """Bytes of one page: K and V, ``page_size`` tokens, every layer and KV head, float32."""
    return 2 * model_cfg.num_layers * model_cfg.num_kv_heads * page_size * model_cfg.head_dim * 4


class _Tracked:
    """The LLM's record of one request: the engine's live output and the text side."""

    def __init__(self, engine_out: RequestOutput, out: RequestOutput, detoks: list,
                 stops: tuple):
        self.engine_out = engine_out          # the engine's, token ids updated each step
        self.out = out                        # ours: text, cut token ids, finish reasons
        self.detoks = detoks                  # one IncrementalDetokenizer per sample
        self.full = ["" for _ in detoks]      # each sample's whole text so far
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1


class LLM:
    """An instruct model served on the paged cache, with vLLM's offline API.

    Once built, it exposes ``engine`` (the :class:`~paged_np.Engine`, with
    its cache and metrics), ``tokenizer``, ``model_name`` and ``max_model_len``.

    Parameters
    ----------
    model : a known name (``"smollm2-135m-instruct"``), a ``.gguf`` file, a
        Hugging Face directory, or a :class:`~paged_np.models.llama.LlamaModel`
        (then ``tokenizer`` is required).
    tokenizer : a :class:`~paged_np.models.tokenizer.Tokenizer` (default: the checkpoint's).
    kv_cache_memory : bytes for the arena (an int or ``"256MiB"``); or
    num_pages : the arena's size in pages (give one of the two; default ``"256MiB"``).
    page_size, max_num_seqs, max_num_batched_tokens, backend, eviction_policy,
    preemption_mode : passed to :class:`~paged_np.Engine`
        (``max_num_batched_tokens`` defaults to 512).
    seed : default seed for sampling params that have none (reproducible runs).
    verbose : print the arena's size.

    """

    def __init__(self, model, *, tokenizer=None, kv_cache_memory=None, num_pages=None,
                 page_size: int = 16, max_num_seqs: int = 16, max_num_batched_tokens=None,
                 backend: str = "auto", eviction_policy: str = "lru",
                 preemption_mode: str = "recompute", seed: int | None = 0,
                 verbose: bool = True):
        from ..models import LlamaModel, Tokenizer, load_model

        if kv_cache_memory is not None and num_pages is not None:
            raise InvalidArgument("give kv_cache_memory or num_pages, not both")
        if seed is not None:
            seed = check_int("seed", seed, low=0)
        if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
            raise DTypeError(f"tokenizer must be a Tokenizer, got {type(tokenizer).__name__}")
        if isinstance(model, LlamaModel):
            if tokenizer is None:
                raise InvalidArgument("tokenizer: required when model is a model object "
                                      "(pass tokenizer=Tokenizer.tiny() for the random model)")
            self.model_name = type(model).__name__
        elif isinstance(model, (str, Path)):
            self.model_name = str(model)
            model, own_tokenizer = load_model(model)
            tokenizer = tokenizer or own_tokenizer
        else:
            raise DTypeError(f"model must be a name, a path or a LlamaModel, got "
                             f"{type(model).__name__}")
        if tokenizer.vocab_size > model.cfg.vocab_size:
            raise InvalidArgument(f"tokenizer: its {tokenizer.vocab_size} ids do not fit the "
                                  f"model's vocab_size={model.cfg.vocab_size}")
        page_size = check_positive_int("page_size", page_size)
        per_page = page_nbytes(model.cfg, page_size)
        if num_pages is None:
            budget = parse_bytes("256MiB" if kv_cache_memory is None else kv_cache_memory)
            num_pages = budget // per_page
            if num_pages < 1:
                raise InvalidArgument(f"kv_cache_memory={kv_cache_memory!r} is less than one "
                                      f"page ({per_page:,} bytes)")
        if max_num_batched_tokens is None:
            max_num_batched_tokens = 512
        self.engine = Engine(model, num_pages=num_pages, page_size=page_size,
                             max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens,
                             preemption_mode=preemption_mode, eviction_policy=eviction_policy,
                             backend=backend)
        self.model = model
        self.tokenizer = tokenizer
        self.seed = None if seed is None else int(seed)
        cache_tokens = self.engine.cache.cfg.num_pages * self.engine.cache.cfg.page_size
        self.max_model_len = min(model.cfg.max_position_embeddings, cache_tokens)
        self._live: dict = {}                 # request id -> _Tracked, unfinished
        self._ids = itertools.count()
        if verbose:
            n = self.engine.cache.cfg.num_pages
            print(f"paged_np: KV cache {n} pages x {page_size} tokens = {cache_tokens:,} tokens, "
                  f"{n * per_page / 2**20:.1f} MiB ({per_page / 1024:.0f} KiB a page), "
                  f"allocated once; max_model_len {self.max_model_len:,}")

    def get_tokenizer(self):
        return self.tokenizer

    # ------------------------------------------------------------ offline
    def generate(self, prompts, sampling_params=None) -> list[RequestOutput]:
        """Complete every prompt; one :class:`RequestOutput` per prompt, in order.

        ``prompts``: a string, a list of strings, or token ids (one list of
        ints, or a list of them). ``sampling_params``: one for all, or a list.
        """
        prompts = self._as_prompt_list(prompts)
        return self._run(prompts, sampling_params)

    def chat(self, messages, sampling_params=None, add_generation_prompt: bool = True
             ) -> list[RequestOutput]:
        """Answer one conversation (a list of ``{"role", "content"}`` dicts) or a list of them.

        Each conversation is rendered with the checkpoint's chat template.
        """
        if isinstance(messages, (list, tuple)) and messages \
                and all(isinstance(m, dict) for m in messages):
            conversations = [messages]
        elif isinstance(messages, (list, tuple)) and messages \
                and all(isinstance(c, (list, tuple)) for c in messages):
            conversations = list(messages)
        else:
            raise InvalidArgument("messages must be a conversation (a non-empty list of "
                                  "{'role', 'content'} dicts) or a list of conversations")
        prompts = [self.tokenizer.apply_chat_template(list(c), add_generation_prompt)
                   for c in conversations]
        return self._run(prompts, sampling_params)

    def _run(self, prompts, sampling_params):
        if self._live:
            raise InvalidArgument("generate/chat: requests added with add_request are still "
                                  "running; step() them to the end or abort() them first")
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        sampling_params = list(sampling_params)
        if len(sampling_params) != len(prompts):
            raise InvalidArgument(f"sampling_params: {len(sampling_params)} for "
                                  f"{len(prompts)} prompts")
        checked = [self._check(p, sp) for p, sp in zip(prompts, sampling_params)]  # all first
        ids = []
        try:
            for text, token_ids, params, index in checked:
                rid = f"llm-{next(self._ids)}"
                self._add(rid, text, token_ids, params, index)
                ids.append(rid)
            results = {}
            while len(results) < len(ids):
                for out in self.step():
                    if out.finished:
                        results[out.request_id] = out
        except BaseException:
            for rid in ids:                          # leave nothing half-served behind
                if rid in self._live:
                    self.abort(rid)
            raise
        return [results[rid] for rid in ids]

    @staticmethod
    def _as_prompt_list(prompts) -> list:
        if isinstance(prompts, str):
            return [prompts]
        if isinstance(prompts, np.ndarray):
            prompts = prompts.tolist()
        if isinstance(prompts, (list, tuple)) and prompts and all(
                isinstance(t, numbers.Integral) and not isinstance(t, (bool, np.bool_))
                for t in prompts):
            return [list(prompts)]                    # one prompt as token ids
        if isinstance(prompts, (list, tuple)) and prompts:
            return list(prompts)
        raise InvalidArgument("prompts must be a str, a non-empty list of str, or token ids "
                              "(a list of ints or a list of them)")

    # --------------------------------------------------------- step by step
    def add_request(self, request_id, prompt, params: SamplingParams | None = None) -> None:
        """Queue one request (``prompt``: text or token ids); checked first, nothing
        changes if it is refused."""
        if not isinstance(request_id, (str, int, np.integer)) or isinstance(request_id, bool):
            raise DTypeError(f"request_id must be a str or an int, got "
                             f"{type(request_id).__name__}")
        if request_id in self._live:
            raise InvalidArgument(f"request_id {request_id!r} is already running")
        self._add(request_id, *self._check(prompt, params))

    def _check(self, prompt, params):
        """``(text or None, token ids, engine params, request index)`` for one prompt, or a
        PagedNPError.

        A request's own ``seed`` makes it reproducible wherever it comes in the
        batch (its generators are keyed as request 0, as vLLM seeds per request);
        the LLM's default seed keys them by arrival, so that two identical
        prompts in one batch still draw different samples.
        """
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise DTypeError(f"sampling_params must be a SamplingParams, got "
                             f"{type(params).__name__}")
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
            if not token_ids:
                raise InvalidArgument("prompt: the empty string has no tokens")
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            text, token_ids = None, list(np.asarray(prompt).tolist()) if len(prompt) else []
            if not token_ids or not all(isinstance(t, int) and not isinstance(t, bool)
                                        for t in token_ids):
                raise InvalidArgument("prompt: token ids must be a non-empty list of ints")
        else:
            raise DTypeError(f"prompt must be a str or a list of token ids, got "
                             f"{type(prompt).__name__}")
        vocab = self.model.cfg.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidArgument(f"prompt: token id {bad[0]} is outside the vocabulary "
                                  f"[0, {vocab})")
        room = self.max_model_len - len(token_ids)
        if room < 1:
            raise InvalidArgument(f"prompt: {len(token_ids)} tokens leave no room under "
                                  f"max_model_len={self.max_model_len}")
        stops = params.stop_token_ids
        if not params.ignore_eos:                   # EOS and end-of-turn ids end a sample
            stops = tuple(dict.fromkeys(stops + self.tokenizer.stop_token_ids))
        own_seed = params.seed is not None
        seed = params.seed if own_seed else self.seed
        engine_params = dataclasses.replace(params, max_tokens=min(params.max_tokens, room),
                                            stop_token_ids=stops, seed=seed)
        if engine_params.n > self.engine.max_num_seqs:
            raise InvalidArgument(f"SamplingParams.n={params.n} exceeds "
                                  f"max_num_seqs={self.engine.max_num_seqs}")
        return text, token_ids, engine_params, (0 if own_seed else None)

    def _add(self, request_id, text, token_ids, params, request_index=None) -> None:
        from ..models import IncrementalDetokenizer

        self.engine.add_request(token_ids, params, request_id=request_id,
                                request_index=request_index)
        engine_out = self.engine.request_output(request_id)
        out = RequestOutput(request_id, list(token_ids),
                            [dataclasses.replace(s, token_ids=[]) for s in engine_out.samples],
                            prompt=text)
        detoks = [IncrementalDetokenizer(self.tokenizer, token_ids) for _ in out.samples]
        self._live[request_id] = _Tracked(engine_out, out, detoks, params.stop)

    def step(self) -> list[RequestOutput]:
        """One engine step; the requests whose text or state changed, as snapshots.

        Each returned output holds the whole text and token ids so far
        (``finished`` is set on the last one of a request).
        """
        self.engine.step()                         # finished ones are also in our live view
        changed = []
        for rid, tr in list(self._live.items()):
            moved = self._advance(rid, tr)
            if tr.out.finished:
                del self._live[rid]
            if moved or tr.out.finished:
                changed.append(self._snapshot(tr))
        return changed

    def _advance(self, rid, tr: _Tracked) -> bool:
        """Feed each sample's new tokens through its detokenizer and stop strings."""
        moved = False
        eng = tr.engine_out
        tr.out.num_cached_prompt_tokens = eng.num_cached_prompt_tokens
        tr.out.error = eng.error
        for j, (src, dst) in enumerate(zip(eng.samples, tr.out.samples)):
            if dst.finished:
                continue
            for tok in src.token_ids[len(dst.token_ids):]:
                moved = True
                dst.token_ids.append(tok)
                old = len(tr.full[j])
                tr.full[j] += tr.detoks[j].push(tok)
                hit = self._find_stop(tr, tr.full[j], old)
                if hit is not None:
                    pos, stop = hit
                    tr.full[j] = tr.full[j][:pos]
                    dst.finish_reason, dst.stop_reason = "stop", stop
                    if not src.finished:
                        self.engine.finish_sample(rid, j, "stop")
                    break
            if not dst.finished and src.finished and len(dst.token_ids) == len(src.token_ids):
                dst.finish_reason = src.finish_reason
                moved = True
                if src.finish_reason == "stop" and src.token_ids:
                    dst.stop_reason = src.token_ids[-1]
            visible = tr.full[j] if dst.finished else tr.full[j][:len(tr.full[j]) - tr.hold]
            if len(visible) > len(dst.text):
                dst.text = visible
        if eng.error is not None and not tr.out.finished:     # finished by the engine at once
            for s in tr.out.samples:
                s.finish_reason = s.finish_reason or "error"
        return moved

    @staticmethod
    def _find_stop(tr: _Tracked, text: str, old: int):
        """The earliest stop string that ends after ``old``: ``(start, stop)`` or None."""
        best = None
        for stop in tr.stops:
            i = text.find(stop, max(0, old - len(stop) + 1))
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        return best

    @staticmethod
    def _snapshot(tr: _Tracked) -> RequestOutput:
        out = copy.copy(tr.out)
        out.samples = [dataclasses.replace(s, token_ids=list(s.token_ids)) for s in tr.out.samples]
        out.prompt_token_ids = list(tr.out.prompt_token_ids)
        return out

    def abort(self, request_id) -> None:
        """Stop a request now: its pages go back to the pool; it is not returned by step()."""
        tr = self._live.pop(request_id, None)
        if tr is None:
            raise UnknownRequest(f"request_id {request_id!r} is not running or waiting")
        if not tr.engine_out.finished:
            self.engine.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._live)
