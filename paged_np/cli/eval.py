"""``python -m paged_np eval``: perplexity and KL divergence of the served model on real text.

::

    python -m paged_np eval                                  # SmolLM2, 2048 tokens
    python -m paged_np eval --num-tokens 256 --model tiny-random
    python -m paged_np eval --sweep page_size=8,32 --sweep max_num_batched_tokens=64
    python -m paged_np eval --json out.json                  # the numbers, for a table
    python -m paged_np eval --weights none,gguf --sweep kv_cache_dtype=float16,int8
    python -m paged_np eval --long-text --num-tokens 16000 --sliding-window 1024 \
        --sweep attention_sinks=0,4 --json benchmarks/long_text_perplexity.json

The text is a chapter of the Python Language Reference that ships with
Python (``pydoc_data``; :mod:`paged_np.engine.perplexity` says which and
why), served as one prompt with ``prompt_logprobs``. The first run is the
**reference**: the engine flags given, with float32 KV. Each ``--sweep
FIELD=V1,V2`` adds one run per value, that :class:`~paged_np.EngineConfig`
field replaced (any field: a new one, such as a KV dtype, needs no change
here); a run's perplexity change and KL divergence are against the reference.
``--weights F1,F2`` evaluates each weight format (``load_model``'s
``quantization``: ``none`` for float32, ``gguf`` for the file's blocks,
``q8_0``): the reference runs on the first, and every run is repeated on each
of the others, so one table holds every KV dtype on every weight format.

``--long-text`` scores the whole Language Reference instead
(:mod:`paged_np.engine.long_text`), per ``--segment`` tokens: first full
attention on as much of it as the model's positions allow, then the flags'
config (or each ``--sweep`` value), so ``--sliding-window 1024 --sweep
attention_sinks=0,4`` gives StreamingLLM's three curves; ``--plot`` draws them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..registry import WEIGHT_QUANTIZATIONS
from .options import add_engine_args, engine_config, load_quantization
from .serve import TINY_MODEL, tiny_model

#: What makes a config the reference, for the fields this EngineConfig has:
#: float32 KV pages (vLLM's ``kv_cache_dtype="auto"`` for a float32 model).
REFERENCE = {"kv_cache_dtype": "auto"}


def build_parser() -> argparse.ArgumentParser:
    from ..engine.perplexity import EVAL_TOKENS

    ap = argparse.ArgumentParser(prog="python -m paged_np eval",
                                 description="Perplexity (through prompt_logprobs) and KL "
                                             "divergence against float32 KV, on text that "
                                             "ships with Python.")
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help=f"known name, .gguf file, Hugging Face directory, or {TINY_MODEL!r}")
    ap.add_argument("--num-tokens", type=int, default=EVAL_TOKENS,
                    help=f"tokens of the text to score (default: {EVAL_TOKENS})")
    ap.add_argument("--sweep", action="append", default=[], metavar="FIELD=V1,V2",
                    help="one run per value of an EngineConfig field (repeatable)")
    ap.add_argument("--weights", default=None, metavar="F1,F2",
                    help="weight formats, each a load_model quantization (float32 for none): "
                         f"{', '.join(WEIGHT_QUANTIZATIONS)}; the first is the reference's "
                         "(default: load_model's default)")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the results here")
    ap.add_argument("--long-text", action="store_true",
                    help="perplexity per segment of the whole Language Reference: full "
                         "attention where it fits, then the flags' config or each sweep")
    ap.add_argument("--segment", type=int, default=1024, help="tokens per segment (--long-text)")
    ap.add_argument("--plot", default=None, metavar="PATH",
                    help="with --long-text: draw perplexity per segment into this image")
    add_engine_args(ap, "eval")
    return ap


def runs_from_args(args, parser) -> list:
    """The runs to evaluate: the reference, the flags' config if it differs, then sweeps."""
    from ..engine.config import EngineConfig
    from ..engine.perplexity import EvalRun
    from ..errors import PagedNPError

    base = engine_config(args, parser)
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    ref = dataclasses.replace(base, **{k: v for k, v in REFERENCE.items() if k in fields})
    runs = [EvalRun("reference", ref)]
    if base != ref:
        runs.append(EvalRun("flags", base))
    for spec in args.sweep:
        name, _, values = spec.partition("=")
        name = name.strip().replace("-", "_")
        if name not in fields or not values:
            parser.error(f"--sweep {spec!r}: expected FIELD=V1,V2 with FIELD one of "
                         f"{sorted(fields)}")
        for v in values.split(","):
            try:
                config = dataclasses.replace(base, **{name: _value(fields[name], v.strip())})
            except (PagedNPError, ValueError) as e:
                parser.error(f"--sweep {spec!r}: {e}")
            runs.append(EvalRun(f"{name}={v.strip()}", config))
    return runs


def weight_formats(args, parser) -> list:
    """``--weights`` as ``[(label, quantization)]`` (empty: the model's default only).

    A label is a name of :data:`~paged_np.registry.WEIGHT_QUANTIZATIONS`, or
    ``float32`` for its ``none``.
    """
    if args.weights is None:
        return []
    known = ("float32", *WEIGHT_QUANTIZATIONS)
    labels = [w.strip().lower() for w in args.weights.split(",") if w.strip()]
    bad = [w for w in labels if w not in known]
    if not labels or bad:
        parser.error(f"--weights {args.weights!r}: expected a comma list of {sorted(known)}")
    return [(w, None if w == "float32" else load_quantization(w)) for w in labels]


def _value(field, text: str):
    """A sweep value as its field's type (int, bool or str, as the flags read it)."""
    if isinstance(field.default, bool):
        return text.lower() in ("1", "true", "yes", "on")
    if isinstance(field.default, int) or field.name == "num_pages":
        return int(text)
    return text


def main(argv: list[str] | None = None) -> int:
    from ..engine.perplexity import eval_text_info, eval_token_ids, evaluate, format_table

    parser = build_parser()
    args = parser.parse_args(argv)
    runs = runs_from_args(args, parser)          # a refused option exits here, before loading
    if args.num_tokens < 2:
        parser.error(f"--num-tokens: perplexity needs at least 2 tokens, got {args.num_tokens}")
    formats = weight_formats(args, parser)
    if args.model == TINY_MODEL:
        if formats:
            parser.error("--weights: the tiny random model has float32 weights only")
        model, tok = tiny_model()
    else:
        from ..models import load_model

        model, tok = load_model(args.model, **({"quantization": formats[0][1]} if formats
                                               else {}))
        base_runs = list(runs)
        for label, quantization in formats[1:]:
            other, _ = load_model(args.model, quantization=quantization)
            runs += [dataclasses.replace(r, label=f"{r.label}, weights={label}", model=other)
                     for r in base_runs]
    if args.long_text:
        return long_main(args, runs, model, tok)
    ids = eval_token_ids(tok, args.num_tokens)
    info = {**eval_text_info(), "num_tokens": len(ids), "model": args.model}
    print(f"model {args.model}; scoring {len(ids)} tokens of {info['source']}", flush=True)
    from ..errors import PagedNPError

    try:
        evaluate(model, ids[:8], runs[:1])       # warm-up: the first run's time is not a JIT's
        results = evaluate(model, ids, runs)
    except PagedNPError as e:                    # e.g. a cache too small for the slice
        print(f"eval: {e}", file=sys.stderr)
        return 1
    print(format_table(results, info))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"text": info, "runs": [
                {**dataclasses.asdict(r), "pages_per_mib": r.pages_per_mib,
                 "config": dataclasses.asdict(run.config)} for r, run in zip(results, runs)]},
                f, indent=1, default=str)
    return 0


def long_runs(runs: list, model_cfg, num_tokens: int) -> tuple[list, dict]:
    """``--long-text``'s runs: full attention on what fits the model's positions (an
    arena that holds it), then the flags' run or the sweeps, each labelled by its mask."""
    from ..engine.perplexity import EvalRun

    base = runs[0].config
    fit = min(num_tokens, model_cfg.max_position_embeddings)
    full = dataclasses.replace(base, sliding_window=None, attention_sinks=0,
                               kv_cache_memory=None, num_pages=-(-fit // base.page_size) + 2)
    rest = [r for r in runs[1:] if not r.label.startswith("flags")] or runs[-1:]
    out = [EvalRun("full attention", full)]
    for r in rest:
        w, s = r.config.attention_window(model_cfg)
        label = ("full attention" if w is None else f"window {w}" if not s
                 else f"{s} sinks + window {w}")
        out.append(dataclasses.replace(r, label=label if label not in [o.label for o in out]
                                       else r.label))
    return out, {"full attention": fit}


def long_main(args, runs, model, tok) -> int:
    """``--long-text``: the table per segment, the JSON and the plot."""
    from ..engine.long_text import format_segments, long_text_info, long_token_ids, score_segments
    from ..errors import PagedNPError

    ids = long_token_ids(tok, args.num_tokens)
    runs, cut = long_runs(runs, model.cfg, len(ids))
    info = {**long_text_info(), "num_tokens": len(ids), "model": args.model}
    print(f"model {args.model}; scoring {len(ids)} tokens of {info['source']} per "
          f"{args.segment} tokens", flush=True)
    try:
        results = score_segments(model, ids, runs, args.segment, cut)
    except PagedNPError as e:
        print(f"eval: {e}", file=sys.stderr)
        return 1
    print(format_segments(results, info))
    data = {"text": info, "segment": args.segment, "runs": [
        {**dataclasses.asdict(r), "config": dataclasses.asdict(run.config)}
        for r, run in zip(results, runs)]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1, default=str)
    if args.plot:
        from ..viz.perplexity import draw_segment_perplexity

        draw_segment_perplexity(data).savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0
