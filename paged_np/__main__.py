"""Command line: ``python -m paged_np {demo,chat,walkthrough,bench,simulate,serve,eval,lab,info}``.

Each subcommand lives in its own module and is imported only when asked for,
so ``python -m paged_np info`` stays fast and never compiles a kernel.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help)
COMMANDS = {
    "demo": ("paged_np.cli.demo",
             "serve SmolLM2 (--model tiny: a toy) under memory pressure, check it, draw it"),
    "chat": ("paged_np.cli.chat", "chat with SmolLM2 in the terminal, streamed, cache status"),
    "walkthrough": ("paged_np.cli.walkthrough",
                    "a narrated tour of the cache: prefixes, forks, eviction"),
    "bench": ("paged_np.cli.bench",
              "benchmark the attention kernels against bandwidth and PyTorch"),
    "simulate": ("paged_np.cli.simulate", "reproduce the vLLM paper's memory-waste figures"),
    "serve": ("paged_np.cli.serve", "an OpenAI-compatible HTTP server over the engine"),
    "eval": ("paged_np.cli.eval",
             "perplexity and KL divergence on text shipped with Python (prompt_logprobs)"),
    "lab": ("paged_np.cli.lab",
            "run the engine on your lab's code (labs/): accepted when every token is ours"),
    "info": ("paged_np.cli.info", "versions, backends and the machine"),
}


def usage() -> str:
    lines = ["usage: python -m paged_np COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
