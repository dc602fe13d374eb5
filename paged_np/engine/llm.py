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
2. **size the cache once**: every engine option
   (:class:`~paged_np.engine.config.EngineConfig`'s fields: ``kv_cache_memory`` or
   ``num_pages``, ``prefix_cache``, ``schedule``, ``preemption_mode``, ...)
   goes into the one config the engine reads; ``kv_cache_memory`` bytes become
   pages there (:attr:`CacheConfig.bytes_per_page`);
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

What the LLM keeps of a request is only its *text side*, keyed by request
id (:class:`_TextState`: a detokenizer per sample, the text so far, the stop
strings). The request itself, its token ids, finish reasons and cached-token
count, is the engine's one record, read through
:meth:`Engine.request_output`; the LLM writes into that output only the
fields the engine cannot know (``prompt``, each sample's ``text``) and ends
samples through :meth:`Engine.finish_sample`. Text state stays here rather
than on the engine's record because the engine works on token ids and knows
nothing of tokenizers: a server or a benchmark drives the same engine
without it.

Compared with vLLM: one process and one thread, no async engine, no
tokenizer pool, no logprobs; ``max_model_len`` is the smaller of the
model's context and what the whole cache holds.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import numbers
from pathlib import Path

import numpy as np

from ..checks import check_int
from ..errors import DTypeError, InvalidArgument, UnknownRequest
from .config import EngineConfig
from .engine import Engine
from .logprobs import fill_decoded
from .outputs import RequestOutput
from .sampling import SamplingParams

#: Where the LLM's defaults differ from the engine's (more seats, longer steps,
#: as vLLM's offline LLM); the cache is 256 MiB unless sized (EngineConfig's default).
LLM_DEFAULTS = dict(max_num_seqs=16, max_num_batched_tokens=512)


class _TextState:
    """The text side of one request: what the engine, working on ids, cannot keep."""

    def __init__(self, output: RequestOutput, detoks: list, stops: tuple):
        self.output = output                  # the engine's: ids, finish reasons, our text
        self.detoks = detoks                  # one IncrementalDetokenizer per sample
        self.full = ["" for _ in detoks]      # each sample's whole text so far
        self.seen = [0 for _ in detoks]       # tokens of each sample already detokenized
        self.ended = [False for _ in detoks]  # whether a sample's end was reported
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.decoded = [0 for _ in range(len(detoks) + 1)]  # logprob entries decoded:
                                              # the prompt's, then each sample's


class LLM:
    """An instruct model served on the paged cache, with vLLM's offline API.

    Once built, it exposes ``engine`` (the :class:`~paged_np.Engine`, with
    its config, cache and metrics), ``tokenizer``, ``model_name`` and
    ``max_model_len``.

    Parameters
    ----------
    model : a known name (``"smollm2-135m-instruct"``), a ``.gguf`` file, a
        Hugging Face directory, or a :class:`~paged_np.models.llama.LlamaModel`
        (then ``tokenizer`` is required).
    tokenizer : a :class:`~paged_np.models.tokenizer.Tokenizer` (default: the checkpoint's).
    seed : default seed for sampling params that have none (reproducible runs).
    verbose : print the arena's size.
    config : an :class:`~paged_np.engine.config.EngineConfig`, optional.
    quantization : how a loaded checkpoint's weights are held: ``"gguf"`` (default:
        a ``.gguf`` file's quantized blocks, multiplied by :mod:`paged_np.quant`),
        ``"gguf_a8"`` (the same blocks times int8-quantized inputs, llama.cpp's
        arithmetic), ``None`` (float32) or ``"q8_0"`` (quantize on load); see
        :func:`paged_np.load_model`. Ignored for a model object.
    **options : any engine option, by its EngineConfig field name:
        ``kv_cache_memory`` (bytes, an int or ``"256MiB"``, the default) or
        ``num_pages``, ``page_size``, ``max_num_seqs`` (default 16 here),
        ``max_num_batched_tokens`` (default 512 here), ``prefix_cache``,
        ``schedule``, ``preemption_mode``, ``swap_pages``, ``eviction_policy``,
        ``backend``, ``record_events``. They replace fields of ``config``; the
        LLM's own defaults apply only when no ``config`` is given.

    """

    def __init__(self, model, *, tokenizer=None, seed: int | None = 0, verbose: bool = True,
                 config: EngineConfig | None = None, quantization="gguf", **options):
        from ..models import LlamaModel, Tokenizer, load_model
        from ..models.quantized import check_quantization

        check_quantization(quantization)

        if options.get("kv_cache_memory") is not None and options.get("num_pages") is not None:
            raise InvalidArgument("give kv_cache_memory or num_pages, not both")
        options = {k: v for k, v in options.items() if not (k in LLM_DEFAULTS and v is None)}
        if config is None:
            options = {**LLM_DEFAULTS, **options}
        engine_config = EngineConfig.from_options(config, **options)  # checked before loading
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
            model, own_tokenizer = load_model(model, quantization=quantization)
            tokenizer = tokenizer or own_tokenizer
        else:
            raise DTypeError(f"model must be a name, a path or a LlamaModel, got "
                             f"{type(model).__name__}")
        if tokenizer.vocab_size > model.cfg.vocab_size:
            raise InvalidArgument(f"tokenizer: its {tokenizer.vocab_size} ids do not fit the "
                                  f"model's vocab_size={model.cfg.vocab_size}")
        self.engine = Engine(model, engine_config)
        self.model = model
        self.tokenizer = tokenizer
        self.seed = None if seed is None else int(seed)
        ccfg = self.engine.cache.cfg
        # A sliding window keeps a bounded cache and cache-relative positions: no limit.
        self.max_model_len = (min(model.cfg.max_position_embeddings, ccfg.num_slots)
                              if self.engine.sliding_window is None else 2**31 - 1)
        self._live: dict = {}                 # request id -> _TextState, unfinished
        self._ids = itertools.count()
        if verbose:
            per_page = ccfg.bytes_per_page
            print(f"paged_np: KV cache {ccfg.num_pages} pages x {ccfg.page_size} tokens = "
                  f"{ccfg.num_slots:,} tokens, {ccfg.num_pages * per_page / 2**20:.1f} MiB "
                  f"({per_page / 1024:.0f} KiB a page), allocated once; "
                  f"max_model_len {self.max_model_len:,}")

    def get_tokenizer(self):
        return self.tokenizer

    # ------------------------------------------------------------ offline
    def generate(self, prompts, sampling_params=None) -> list[RequestOutput]:
        """Complete every prompt; one :class:`RequestOutput` per prompt, in order.

        ``prompts``: a string, a list of strings, or token ids (one list of
        ints, or a list of them); or vLLM's dicts, ``{"prompt": text}`` or
        ``{"prompt_token_ids": ids}``, with an optional ``"cache_salt"``: only
        prompts with the same salt share cached pages (tenants apart, in every
        tier). ``sampling_params``: one for all, or a list.
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
            for text, token_ids, params, index, salt in checked:
                rid = f"llm-{next(self._ids)}"
                self._add(rid, text, token_ids, params, index, salt)
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
        if isinstance(prompts, (str, dict)):
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
        """``(text or None, token ids, engine params, request index, cache salt)`` for one
        prompt, or a PagedNPError.

        A request's own ``seed`` makes it reproducible wherever it comes in the
        batch (its generators are keyed as request 0, as vLLM seeds per request);
        the LLM's default seed keys them by arrival, so that two identical
        prompts in one batch still draw different samples.
        """
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise DTypeError(f"sampling_params must be a SamplingParams, got "
                             f"{type(params).__name__}")
        prompt, salt = _unpack_prompt(prompt)
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
        if engine_params.n > self.engine.config.max_num_seqs:
            raise InvalidArgument(f"SamplingParams.n={params.n} exceeds "
                                  f"max_num_seqs={self.engine.config.max_num_seqs}")
        return text, token_ids, engine_params, (0 if own_seed else None), salt

    def _add(self, request_id, text, token_ids, params, request_index=None,
             cache_salt=None) -> None:
        from ..models import IncrementalDetokenizer

        self.engine.add_request(token_ids, params, request_id=request_id,
                                request_index=request_index, cache_salt=cache_salt)
        output = self.engine.request_output(request_id)
        output.prompt = text
        detoks = [IncrementalDetokenizer(self.tokenizer, token_ids) for _ in output.samples]
        self._live[request_id] = _TextState(output, detoks, params.stop)

    def step(self) -> list[RequestOutput]:
        """One engine step; the requests whose text or state changed, as snapshots.

        Each returned output holds the whole text and token ids so far
        (``finished`` is set on the last one of a request).
        """
        self.engine.step()                         # finished ones are also in our live view
        changed = []
        for rid, ts in list(self._live.items()):
            moved = self._advance(rid, ts)
            if ts.output.finished:
                del self._live[rid]
            if moved or ts.output.finished:
                changed.append(self._snapshot(ts.output))
        return changed

    def _advance(self, rid, ts: _TextState) -> bool:
        """Feed each sample's new tokens through its detokenizer and stop strings."""
        moved = False
        for j, sample in enumerate(ts.output.samples):
            for tok in sample.token_ids[ts.seen[j]:]:
                moved = True
                ts.seen[j] += 1
                old = len(ts.full[j])
                ts.full[j] += ts.detoks[j].push(tok)
                hit = self._find_stop(ts, ts.full[j], old)
                if hit is not None:
                    pos, stop = hit
                    ts.full[j] = ts.full[j][:pos]
                    if sample.finished:            # ended by the engine this very step:
                        sample.finish_reason, sample.stop_reason = "stop", stop  # text wins
                        sample.truncate(ts.seen[j])          # (speculation: tokens past it)
                    else:                          # keep no token past the stop's
                        self.engine.finish_sample(rid, j, "stop", stop_reason=stop,
                                                  num_tokens=ts.seen[j])
                    break
            if sample.finished and not ts.ended[j]:
                ts.ended[j] = moved = True
            held = max(0, len(ts.full[j]) - ts.hold)       # (a text shorter than the hold
            visible = ts.full[j] if sample.finished else ts.full[j][:held]  # shows nothing)
            if len(visible) > len(sample.text):
                sample.text = visible
        self._decode_logprobs(ts)
        return moved

    def _decode_logprobs(self, ts: _TextState) -> None:
        """Give the logprob entries recorded since the last step their ``decoded_token``."""
        lists = [ts.output.prompt_logprobs] + [s.logprobs for s in ts.output.samples]
        for j, entries in enumerate(lists):
            if entries is not None and len(entries) > ts.decoded[j]:
                fill_decoded(entries[ts.decoded[j]:], self.tokenizer)
                ts.decoded[j] = len(entries)

    @staticmethod
    def _find_stop(ts: _TextState, text: str, old: int):
        """The earliest stop string that ends after ``old``: ``(start, stop)`` or None."""
        best = None
        for stop in ts.stops:
            i = text.find(stop, max(0, old - len(stop) + 1))
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        return best

    @staticmethod
    def _snapshot(output: RequestOutput) -> RequestOutput:
        out = copy.copy(output)
        out.samples = [dataclasses.replace(
            s, token_ids=list(s.token_ids),
            logprobs=None if s.logprobs is None else list(s.logprobs)) for s in output.samples]
        out.prompt_token_ids = list(output.prompt_token_ids)
        if output.prompt_logprobs is not None:
            out.prompt_logprobs = list(output.prompt_logprobs)
        return out

    def abort(self, request_id) -> None:
        """Stop a request now: its pages go back to the pool; it is not returned by step()."""
        ts = self._live.pop(request_id, None)
        if ts is None:
            raise UnknownRequest(f"request_id {request_id!r} is not running or waiting")
        if not ts.output.finished:
            self.engine.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._live)


def _unpack_prompt(prompt) -> tuple:
    """``(text or token ids, cache_salt or None)`` of a prompt; vLLM's dict form
    (``{"prompt": ...}`` or ``{"prompt_token_ids": ...}``, ``"cache_salt"``) unpacked."""
    if not isinstance(prompt, dict):
        return prompt, None
    unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids", "cache_salt"})
    if unknown or ("prompt" in prompt) == ("prompt_token_ids" in prompt):
        raise InvalidArgument(f"prompt: a dict takes 'prompt' or 'prompt_token_ids' (one of "
                              f"them) and 'cache_salt', got keys {sorted(prompt)}")
    salt = prompt.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise DTypeError(f"cache_salt must be a str, got {type(salt).__name__}")
    return prompt.get("prompt", prompt.get("prompt_token_ids")), salt
