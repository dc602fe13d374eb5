"""The command line, ``python -m paged_np COMMAND``: one module per subcommand.

Nothing outside this folder imports from it; each module's ``main(argv)`` is
looked up by :mod:`paged_np.__main__` only when its command is asked for.
"""

import os

#: Where a command writes when not given ``--out``: a folder of its own in the
#: current directory, so a run from the repository root never overwrites the
#: committed figures (``benchmarks/``, ``docs/img/``). One name per command.
DEFAULT_OUT_DIR = "paged_np_out"
DEFAULT_OUT = {
    "demo": os.path.join(DEFAULT_OUT_DIR, "demo.png"),
    "walkthrough": os.path.join(DEFAULT_OUT_DIR, "walkthrough.png"),
    "bench": os.path.join(DEFAULT_OUT_DIR, "bench"),          # a folder: results.*, roofline
}


def make_parent(path: str) -> str:
    """Create the folder ``path`` will be written in; return ``path``."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    return path


def kv_capacity_line(cfg) -> str:
    """What the KV cache holds, for a command to print: its dtype and capacity in tokens.

    ``cfg`` is the engine's :class:`~paged_np.CacheConfig`, e.g.
    ``KV cache: int8 (+ a float32 scale per token and kv head), 1,024 pages of 16
    tokens = 16,384 tokens in 68.0 MiB``.
    """
    scales = " (+ a float32 scale per token and kv head)" if cfg.quantized else ""
    return (f"KV cache: {cfg.kv_cache_dtype}{scales}, {cfg.num_pages:,} pages of "
            f"{cfg.page_size} tokens = {cfg.num_slots:,} tokens in "
            f"{cfg.num_pages * cfg.bytes_per_page / 2**20:.1f} MiB")
