"""``python -m paged_np chat``: a terminal chat with a real model, streamed token by token.

Each turn sends the whole conversation again, rendered by the chat template.
The previous turns' full pages are still in the cache (finished requests
leave their pages cached, findable by prefix hash), so only the new tail is
computed. After each answer a status line shows it::

    [reused R of P prompt tokens from the cache | pages: U in use, C cached of N | T tokens/s]

With ``--sliding-window W --attention-sinks S`` the chat never runs out of
room: each query sees the first S tokens and the last W, the pages behind the
window go back to the pool as it slides, and positions are cache-relative, so
the conversation may outgrow the arena and the model's position limit. The
status line then adds the context length and the most pages the turn held.

Type a message and press Enter; ``/exit`` or end of input (Ctrl-D) quits,
``/reset`` starts a new conversation. ``--model tiny`` chats with the random
toy model (gibberish, but fast: for tests). Every engine option is a flag
(``--prefix-cache radix``, ``--num-pages``...: see ``--help``).

With a disk tier (``--disk-cache-dir DIR``) the conversation is kept in
``DIR/chat.json`` after each turn and its pages in ``DIR``'s files; ``--resume``
starts from that conversation, and its first turn reads the earlier turns'
pages back from disk instead of recomputing them (the status line says how
many tokens came from disk, or from ``--host-cache-memory``).
"""

from __future__ import annotations

import argparse
import sys
import time

from . import kv_capacity_line
from .options import add_engine_args, add_quantization_arg, engine_config, quantization_of


def build_parser() -> argparse.ArgumentParser:
    """The command's flags: its own, then one per engine option."""
    p = argparse.ArgumentParser(prog="python -m paged_np chat",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="a known name, a .gguf file, a Hugging Face directory, or 'tiny'")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens per answer at most")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--system", default=None, help="a system prompt (default: the template's)")
    p.add_argument("--resume", action="store_true",
                   help="continue the conversation kept under --disk-cache-dir (its earlier "
                   "turns' pages come back from disk)")
    add_quantization_arg(p)
    add_engine_args(p, "chat")                     # every EngineConfig field, as a flag
    return p


def parse_args(argv):
    """The parsed flags, with ``args.config`` the :class:`~paged_np.EngineConfig` they give."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.max_tokens < 1:
        p.error("--max-tokens must be >= 1")
    if args.temperature < 0:
        p.error("--temperature must be >= 0")
    args.config = engine_config(args, p)           # a refused engine option exits here
    if args.resume and args.config.disk_cache_dir is None:
        p.error("--resume needs --disk-cache-dir (where the conversation was kept)")
    quantization_of(args, p, random_model=args.model == "tiny")
    return args


def make_llm(args):
    from ..engine.llm import LLM

    if args.model == "tiny":
        from ..config import ModelConfig
        from ..models import LlamaModel, Tokenizer

        tok = Tokenizer.tiny()
        model = LlamaModel.random(ModelConfig(vocab_size=tok.vocab_size), seed=0)
        return LLM(model, tokenizer=tok, config=args.config)
    return LLM(args.model, quantization=quantization_of(args), config=args.config)


def answer(llm, messages, params, write) -> tuple[str, object, float]:
    """Stream one answer through ``write``; returns (text, final output, seconds)."""
    prompt = llm.tokenizer.apply_chat_template(messages)
    llm.add_request("turn", prompt, params)
    shown, final = "", None
    t0 = time.perf_counter()
    while llm.has_unfinished_requests():
        for out in llm.step():
            text = out.outputs[0].text
            write(text[len(shown):])
            shown = text
            final = out
    return shown, final, time.perf_counter() - t0


def status_line(llm, out, seconds: float, first_step: int = 0,
                tiers_before: dict | None = None) -> str:
    """What the turn reused and took; ``first_step``: the engine's step count before it;
    ``tiers_before``: ``engine.stats()["tiers"]`` before it (what each tier served)."""
    pool = llm.engine.cache.pool
    n = len(out.outputs[0].token_ids)
    window = below = ""
    if llm.engine.sliding_window is not None:  # the context, and the pages it took at most
        held = llm.engine.metrics["series"]["num_in_use"][first_step:]
        window = (f" | context {len(out.prompt_token_ids) + n:,} tokens, at most "
                  f"{max(held, default=0)} pages in use")
    if tiers_before is not None:                   # tokens each tier served this turn
        from ..registry import KV_TIERS

        now = llm.engine.stats()["tiers"]
        got = [f"{now[t]['loaded_tokens'] - tiers_before[t]['loaded_tokens']} from "
               f"{KV_TIERS[t].label if t in KV_TIERS else t}" for t in now]
        below = f" ({', '.join(got)})"
    return (f"[reused {out.num_cached_tokens} of {len(out.prompt_token_ids)} prompt tokens from "
            f"the cache{below} | pages: {pool.num_in_use} in use, {pool.num_cached} cached of "
            f"{llm.engine.cache.cfg.num_pages}{window} | {n / seconds:.1f} tokens/s]")


def conversation_file(cfg):
    """Where a chat with a disk tier keeps its conversation, or None."""
    from pathlib import Path

    return None if cfg.disk_cache_dir is None else Path(cfg.disk_cache_dir) / "chat.json"


def save_conversation(path, messages) -> None:
    """Write the conversation atomically (a temporary file renamed over the old one)."""
    import json

    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(messages, indent=1))
        tmp.replace(path)
    except OSError as e:
        print(f"chat: cannot keep the conversation in {path}: {e}", file=sys.stderr)


def main(argv: list[str], stdin=None, stdout=None) -> int:
    from ..engine.sampling import SamplingParams
    from ..errors import ModelLoadError

    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    args = parse_args(argv)
    try:
        llm = make_llm(args)
    except ModelLoadError as e:
        print(f"chat: cannot load {args.model!r}: {e}", file=sys.stderr)
        return 1
    from ..engine.replay import warm_up

    cfg = args.config
    compile_s = warm_up(llm.model, cfg.page_size, cfg.backend, cfg.kv_cache_dtype)
    print(f"JIT compile + first calls (kept out of tokens/s): {compile_s:.2f} s", file=stdout)
    print(kv_capacity_line(llm.engine.cache.cfg), file=stdout)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    kept = conversation_file(cfg)
    if args.resume and kept.is_file():
        import json

        messages = json.loads(kept.read_text())
        turns = sum(m["role"] == "user" for m in messages)
        print(f"(resumed a conversation of {turns} turns from {kept}; its pages are read "
              "back from disk)", file=stdout)

    def write(s):
        stdout.write(s)
        stdout.flush()

    write("chat with the paged cache: /reset starts over, /exit quits\n")
    while True:
        write("you> ")
        line = stdin.readline()
        if not line or line.strip() == "/exit":
            write("\n")
            return 0
        line = line.strip()
        if not line:
            continue
        if line == "/reset":
            messages = list(start)
            write("(new conversation)\n")
            continue
        messages.append({"role": "user", "content": line})
        write("bot> ")
        first_step = llm.engine.metrics["steps"]
        before = llm.engine.stats()["tiers"] if cfg.tiers else None
        text, out, seconds = answer(llm, messages, params, write)
        messages.append({"role": "assistant", "content": text})
        write("\n" + status_line(llm, out, seconds, first_step, before) + "\n")
        if kept is not None:
            save_conversation(kept, messages)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
